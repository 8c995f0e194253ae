// gangAdmission Volcano: a Volcano PodGroup (scheduling.volcano.sh/v1beta1, spec.minMember =
// replicas, spec.queue and spec.priorityClassName from schedulingPolicy) named by every Pod's
// annotation scheduling.k8s.io/group-name, the Pods scheduled by Volcano.
#include "operator/controller/integrations/backends.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

class VolcanoBackend final : public PodGroupBackend {
 public:
  std::string Name() const override { return "Volcano"; }
  void MarkPod(const JobSpec&, const std::string& name, json* pod) const override {
    (*pod)["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = name;
    // Volcano places only the Pods it schedules; a template that names a scheduler keeps it.
    if (!(*pod)["spec"].contains("schedulerName")) (*pod)["spec"]["schedulerName"] = "volcano";
  }
  json GroupSpec(const JobSpec& spec) const override {
    json group = {{"minMember", spec.replicas}};
    if (!spec.scheduling_queue.empty()) group["queue"] = spec.scheduling_queue;
    if (!spec.scheduling_priority_class.empty()) group["priorityClassName"] = spec.scheduling_priority_class;
    return group;
  }
  k8s::ResourceRef Api() const override { return k8s::resources::Custom("scheduling.volcano.sh", "v1beta1", "podgroups"); }
  std::string ApiMissing() const override {
    return " (spec.runPolicy.schedulingPolicy.gangAdmission Volcano needs Volcano installed: its PodGroup API, "
           "scheduling.volcano.sh/v1beta1)";
  }
};

}  // namespace

const GangBackend& VolcanoPodGroup() {
  static const VolcanoBackend backend;
  return backend;
}

}  // namespace meshwork::op
