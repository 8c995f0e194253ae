// Kubernetes resource quantities ("250m", "2", "1.5", "8Gi", "512M", "1e3"), parsed as the API
// server reads them: the local cluster's node agent and scheduler, and the operator's gang
// admission, share them.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace meshwork {

// Errors name the value. ParseBytes rounds a fractional byte count up, as Kubernetes does.
Result<double> ParseCpu(const std::string& quantity);
Result<int64_t> ParseBytes(const std::string& quantity);
// The same for a JSON value that may be a string ("500m") or a number (2).
Result<double> ParseCpu(const nlohmann::json& quantity);
Result<int64_t> ParseBytes(const nlohmann::json& quantity);

}  // namespace meshwork
