// A spec or trainer config the operator cannot run fails the job at once, and once: Failed with
// reason InvalidSpec and a message naming the field; a failed job is final, so nothing loops.
#include "operator/controller/policy/policy.h"

namespace meshwork::op::policy {

Decision InvalidSpec(const nlohmann::json& status, const std::vector<PodView>& pods, const std::string& message,
                     SystemTime now) {
  Decision d = Finish(status, "Failed", "InvalidSpec", message, now);
  // Running Pods go whatever cleanPodPolicy says: the spec that says it may not parse.
  d.remove = Clean(CleanPodPolicy::kRunning, pods);
  return d;
}

}  // namespace meshwork::op::policy
