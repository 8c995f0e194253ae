// gangAdmission Coscheduling: the scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1,
// spec.minMember = replicas, spec.scheduleTimeoutSeconds from schedulingPolicy) named by every
// Pod's label scheduling.x-k8s.io/pod-group. The plugin runs in kube-scheduler or in a second
// scheduler: the Pod template names which.
#include "operator/controller/integrations/backends.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

class CoschedulingBackend final : public PodGroupBackend {
 public:
  std::string Name() const override { return "Coscheduling"; }
  void MarkPod(const JobSpec&, const std::string& name, json* pod) const override {
    (*pod)["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = name;
  }
  json GroupSpec(const JobSpec& spec) const override {
    json group = {{"minMember", spec.replicas}};
    if (spec.schedule_timeout_seconds) group["scheduleTimeoutSeconds"] = *spec.schedule_timeout_seconds;
    return group;
  }
  k8s::ResourceRef Api() const override { return k8s::resources::Custom("scheduling.x-k8s.io", "v1alpha1", "podgroups"); }
  std::string ApiMissing() const override {
    return " (spec.runPolicy.schedulingPolicy.gangAdmission Coscheduling needs the scheduler-plugins PodGroup CRD, "
           "scheduling.x-k8s.io/v1alpha1, and a scheduler running the Coscheduling plugin)";
  }
};

}  // namespace

const GangBackend& CoschedulingPodGroup() {
  static const CoschedulingBackend backend;
  return backend;
}

}  // namespace meshwork::op
