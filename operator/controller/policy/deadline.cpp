// activeDeadlineSeconds: the job fails once its active time (before its last suspension, plus
// since its last start) reaches the deadline; until then it is looked at again by that time.
#include "operator/controller/policy/policy.h"

namespace meshwork::op::policy {

using std::chrono::seconds;

std::optional<Decision> Deadline(const JobState& job) {
  if (!job.spec.active_deadline_seconds) return std::nullopt;
  const auto start = ParseTime(job.status.value("startTime", ""));
  if (!start) return std::nullopt;  // not started, or suspended
  const int64_t deadline = *job.spec.active_deadline_seconds;
  const int64_t active =
      IntOr(job.status, "activeSeconds", 0) + std::chrono::duration_cast<seconds>(job.in.now - *start).count();
  if (active < deadline) {
    Decision d;
    d.requeue_after = seconds(deadline - active);
    return d;
  }
  Decision d = Finish(job.status, "Failed", "DeadlineExceeded",
                      "the job was active for " + std::to_string(active) + " s, reaching activeDeadlineSeconds " +
                          std::to_string(deadline),
                      job.in.now);
  // A deadline stops the job whatever cleanPodPolicy says; the policy decides the rest.
  for (const auto& pod : Deletable(job.pods)) {
    if (Active(pod) || job.spec.clean_pod_policy == CleanPodPolicy::kAll) d.remove.push_back(pod);
  }
  return d;
}

}  // namespace meshwork::op::policy
