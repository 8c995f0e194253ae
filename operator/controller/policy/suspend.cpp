// runPolicy.suspend: a suspended job has no Pods, and the time it spends suspended does not count
// towards activeDeadlineSeconds. Resuming starts a new gang, from the latest checkpoint.
#include "operator/controller/policy/policy.h"

#include <algorithm>

namespace meshwork::op::policy {

using std::chrono::seconds;

std::optional<Decision> Suspend(const JobState& job) {
  if (!job.spec.suspend) return std::nullopt;
  Decision d;
  d.phase = "Suspended";
  d.remove = NotTerminating(job.pods);
  if (ConditionTrue(job.status, "Suspended")) return d;
  const std::string msg = "the job is suspended: its Pods are deleted until runPolicy.suspend is false";
  d.conditions = {{"Suspended", "True", "JobSuspended", msg}, {"Running", "False", "JobSuspended", msg}};
  if (auto start = ParseTime(job.status.value("startTime", ""))) {
    const auto ran = std::chrono::duration_cast<seconds>(job.in.now - *start).count();
    d.status["activeSeconds"] = IntOr(job.status, "activeSeconds", 0) + std::max<int64_t>(0, ran);
  }
  d.status["startTime"] = nullptr;
  d.events.push_back({"Normal", "Suspended", msg});
  d.status_first = true;  // else a lost write would leave a launched gang with no Pods
  return d;
}

std::optional<Decision> Resume(const JobState& job) {
  if (job.spec.suspend || !ConditionTrue(job.status, "Suspended")) return std::nullopt;
  const int64_t gen = job.generation() + 1;
  const std::string msg = "the job is resumed with a new gang (generation " + std::to_string(gen) + ")";
  Decision d;
  d.status["restartGeneration"] = gen;
  d.conditions = {{"Suspended", "False", "JobResumed", msg}};
  d.events.push_back({"Normal", "Resumed", msg});
  return d;
}

}  // namespace meshwork::op::policy
