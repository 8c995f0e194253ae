// Request bodies in Kubernetes' protobuf encoding, for the few kinds kubectl's generator commands
// send that way (`kubectl create namespace|configmap|service|serviceaccount`): decoded to the JSON the rest of
// the API layer handles. Other kinds, and fields not listed in the .cpp, are refused or dropped.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace meshwork::controlplane {

inline constexpr const char* kProtobufContentType = "application/vnd.kubernetes.protobuf";

// Decodes a "k8s\0"-prefixed runtime.Unknown envelope holding a Namespace, ConfigMap, Service or
// ServiceAccount.
// InvalidInput names what is wrong (bad envelope, unsupported kind, malformed field).
Result<nlohmann::json> DecodeProtobufObject(const std::string& body);

}  // namespace meshwork::controlplane
