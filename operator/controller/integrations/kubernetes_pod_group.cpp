// gangAdmission PodGroup: Kubernetes' own gang scheduling. A PodGroup (scheduling.k8s.io/v1beta1,
// spec.schedulingPolicy.gang.minCount = replicas) that every Pod names in spec.schedulingGroup,
// placed all or nothing by kube-scheduler's GangScheduling plugin (GenericWorkload feature gate;
// PodGroup is scheduling.k8s.io/v1beta1 from Kubernetes 1.37).
#include "operator/controller/integrations/backends.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

class KubernetesPodGroupBackend final : public PodGroupBackend {
 public:
  std::string Name() const override { return "PodGroup"; }
  void MarkPod(const JobSpec&, const std::string& name, json* pod) const override {
    (*pod)["spec"]["schedulingGroup"] = {{"podGroupName", name}};
  }
  json GroupSpec(const JobSpec& spec) const override {
    return {{"schedulingPolicy", {{"gang", {{"minCount", spec.replicas}}}}}};
  }
  k8s::ResourceRef Api() const override { return k8s::resources::Custom("scheduling.k8s.io", "v1beta1", "podgroups"); }
  std::string ApiMissing() const override {
    return " (spec.runPolicy.schedulingPolicy.gangAdmission PodGroup needs the PodGroup API, scheduling.k8s.io/v1beta1: "
           "Kubernetes 1.37 with the GenericWorkload feature gate)";
  }
};

}  // namespace

const GangBackend& KubernetesPodGroup() {
  static const KubernetesPodGroupBackend backend;
  return backend;
}

}  // namespace meshwork::op
