// Pods of an older gang, or beyond the replica count, go before anything is created: a new gang
// must never meet a rank of the old one at the rendezvous (kubeflow/training-operator#1478).
#include "operator/controller/policy/policy.h"

namespace meshwork::op::policy {

std::optional<Decision> StaleGang(const JobState& job) {
  std::vector<PodView> stale;
  for (const auto& pod : job.pods) {
    if (pod.generation != job.generation() || pod.index < 0 || pod.index >= job.spec.replicas) stale.push_back(pod);
  }
  if (stale.empty()) return std::nullopt;
  Decision d;
  d.remove = Deletable(stale);
  const bool had_a_gang = ConditionTrue(job.status, "Restarting") || job.status.value("phase", "") == "Running";
  d.phase = had_a_gang ? "Restarting" : "Created";
  d.requeue_after = std::chrono::seconds(5);
  return d;
}

}  // namespace meshwork::op::policy
