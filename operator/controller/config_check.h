// The reads Decide makes only when a decision needs them (Observed::check_config, final_report):
// the trainer config a gang is about to start with, and rank 0's last log line once the job has
// succeeded.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/k8s/object_api.h"

namespace meshwork::op {

// The trainer config problem that makes the job InvalidSpec, if any (ValidateTrainerConfig on the
// inline config, or on the key of the ConfigMap it names). A ConfigMap that does not exist (yet)
// is not a spec error: `wait` says the job waits for it.
ConfigCheck CheckTrainerConfig(k8s::ObjectApi* api, const nlohmann::json& job, const JobSpec& spec);
// Rank 0's summary from the last lines of its trainer container's log; nullopt when unreadable.
std::optional<FinalReport> ReadFinalReport(k8s::ObjectApi* api, const nlohmann::json& job);

}  // namespace meshwork::op
