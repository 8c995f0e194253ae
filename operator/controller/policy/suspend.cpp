// runPolicy.suspend: a suspended job has no Pods, and the time it spends suspended does not count
// towards activeDeadlineSeconds. Resuming starts a new gang, from the latest checkpoint.
#include "operator/controller/policy/policy.h"

#include <algorithm>

namespace meshwork::op::policy {

using std::chrono::seconds;

namespace {

// The Suspended condition's reason and message, when it is True.
std::pair<std::string, std::string> SuspendedBecause(const nlohmann::json& status) {
  for (const auto& c : status.value("conditions", nlohmann::json::array())) {
    if (c.value("type", "") == "Suspended" && c.value("status", "") == "True") {
      return {c.value("reason", ""), c.value("message", "")};
    }
  }
  return {"", ""};
}

}  // namespace

std::optional<Decision> Suspend(const JobState& job) {
  if (!job.spec.suspend && !job.in.queued) return std::nullopt;
  Decision d;
  d.phase = "Suspended";
  d.remove = Deletable(job.pods);
  // runPolicy.suspend first: a job the user suspended stays so whatever Kueue says.
  const std::string reason = job.spec.suspend ? "JobSuspended" : "Queued";
  const std::string msg = job.spec.suspend ? "the job is suspended: its Pods are deleted until runPolicy.suspend is false"
                                           : *job.in.queued;
  const auto [was_reason, was_message] = SuspendedBecause(job.status);
  const bool already = ConditionTrue(job.status, "Suspended") &&
                       (job.spec.suspend ? was_reason != "Queued" : was_reason == "Queued" && was_message == msg);
  if (already) return d;
  d.conditions = {{"Suspended", "True", reason, msg}, {"Running", "False", reason, msg}};
  // A restart the suspension cut short is over: the resumed job is Created until its gang runs,
  // not Restarting.
  if (ConditionTrue(job.status, "Restarting")) d.conditions.push_back({"Restarting", "False", reason, msg});
  if (auto start = ParseTime(job.status.value("startTime", ""))) {
    const auto ran = std::chrono::duration_cast<seconds>(job.in.now - *start).count();
    d.status["activeSeconds"] = IntOr(job.status, "activeSeconds", 0) + std::max<int64_t>(0, ran);
  }
  d.status["startTime"] = nullptr;
  d.events.push_back({"Normal", job.spec.suspend ? "Suspended" : "Queued", msg});
  d.status_first = true;  // else a lost write would leave a launched gang with no Pods
  return d;
}

std::optional<Decision> Resume(const JobState& job) {
  if (job.spec.suspend || job.in.queued || !ConditionTrue(job.status, "Suspended")) return std::nullopt;
  const int64_t gen = job.generation() + 1;
  const std::string msg = "the job is resumed with a new gang (generation " + std::to_string(gen) + ")";
  Decision d;
  d.status["restartGeneration"] = gen;
  d.conditions = {{"Suspended", "False", "JobResumed", msg}};
  d.events.push_back({"Normal", "Resumed", msg});
  return d;
}

}  // namespace meshwork::op::policy
