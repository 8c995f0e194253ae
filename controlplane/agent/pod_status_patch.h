// How the node agent writes a Pod's status, kept apart so that a test can put it to the real API
// server (tests/operator/k8s/cluster_test.cpp).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "operator/k8s/error.h"

namespace meshwork::controlplane::agent {

// A Pod's status as a merge patch that applies only to the Pod of that uid. A gang restart makes
// its ranks again under the same names, and the agent's view can still hold the old Pod when its
// last status goes out: by name alone, the old rank's exit (say code 9) would land on the new rank
// and fail it. With metadata.uid in the patch the API server refuses a Pod of another uid
// (kubelet's status manager patches the same way).
inline nlohmann::json PodStatusPatch(const std::string& uid, const nlohmann::json& status) {
  return {{"metadata", {{"uid", uid}}}, {"status", status}};
}

// The API server's refusal of PodStatusPatch on a Pod of another uid: 422, "metadata.uid: field is
// immutable". The status belongs to a Pod that is gone.
inline bool RecreatedUnderSameName(const k8s::Error& e) {
  if (!k8s::IsInvalid(e)) return false;
  for (const auto& cause : e.causes()) {
    if (cause.field == "metadata.uid") return true;
  }
  return false;
}

}  // namespace meshwork::controlplane::agent
