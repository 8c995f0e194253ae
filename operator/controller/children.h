// The job's children besides its Pods, made or kept in step with the spec: its headless Service,
// its inline config's ConfigMap, and its rendezvous Secret. One of the same name that the job does
// not own is an error naming it, never taken over (a user's ConfigMap is not overwritten, a
// foreign Service would leave the ranks' names unresolved).
#pragma once

#include <nlohmann/json.hpp>

#include "operator/controller/spec.h"
#include "operator/k8s/object_api.h"

namespace meshwork::op {

k8s::Error EnsureService(k8s::ObjectApi* api, const nlohmann::json& job, const JobSpec& spec);
k8s::Error EnsureConfigMap(k8s::ObjectApi* api, const nlohmann::json& job, const JobSpec& spec);
// Creates the Secret with a fresh random token, once (the token stays for the job's life); one
// without a token is an error naming it.
k8s::Error EnsureRendezvousSecret(k8s::ObjectApi* api, const nlohmann::json& job);

}  // namespace meshwork::op
