// Standard base64 (RFC 4648, "+/" alphabet), as Kubernetes uses it: kubeconfig "-data" keys,
// ConfigMap binaryData, list continue tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace meshwork {

// Padded encoding.
std::string Base64Encode(std::string_view in);
// Padding optional; ASCII whitespace ignored. nullopt on any other character or on data after
// padding, with the reason in `why` when given.
std::optional<std::string> Base64Decode(std::string_view in, std::string* why = nullptr);

}  // namespace meshwork
