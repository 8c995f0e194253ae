// The gang backends, one file each (internal to integrations/; the registry hands them out).
#pragma once

#include <string>

#include "operator/controller/integration.h"

namespace meshwork::op {

const GangBackend& OperatorGate();          // gang_gate.cpp
const GangBackend& KubernetesPodGroup();    // kubernetes_pod_group.cpp
const GangBackend& VolcanoPodGroup();       // volcano.cpp
const GangBackend& CoschedulingPodGroup();  // coscheduling.cpp

// A backend whose scheduler gangs the Pods by a PodGroup of its API (pod_group.cpp): the job's
// PodGroup is made before the Pods, or its size and the fields the operator sets brought in line
// with the spec (a resize, an edit), once the plan asks for it (Plan::ensure_pod_group); one of
// the job's name that the job does not own is an error naming it, never taken over.
class PodGroupBackend : public GangBackend {
 public:
  // The PodGroup the job's gang of `spec.replicas` needs: named as the job, owned by it, with
  // GroupSpec as its spec.
  nlohmann::json Want(const nlohmann::json& job, const JobSpec& spec) const;
  virtual nlohmann::json GroupSpec(const JobSpec& spec) const = 0;
  virtual k8s::ResourceRef Api() const = 0;
  // What is missing when the API is not served (appended to the error).
  virtual std::string ApiMissing() const = 0;
  std::vector<RbacRule> Rbac() const override;

 protected:
  std::optional<ReconcileOutcome> MoreBeforeCreate(ReconcileScope& scope, const Plan& plan) const override;
};

}  // namespace meshwork::op
