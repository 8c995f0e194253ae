// Gang failure: a failed rank, or a rank deleted after the whole gang was created (an eviction,
// or a user's `kubectl delete pod`), fails the gang, since a lone new rank cannot rejoin a running
// job. The whole gang restarts with the next generation, up to backoffLimit times, unless the
// failure is permanent (restartPolicy Never, or an exit code in permanentExitCodes). A rank the
// cluster stopped (its Pod has DisruptionTarget=True: preemption, eviction, a drain) restarts the
// gang without counting, as JobSet's and Job's pod failure policies let one say.
#include "operator/controller/policy/policy.h"

#include "operator/controller/desired.h"

namespace meshwork::op::policy {
namespace {

std::string DescribeFailure(const PodView& p) {
  std::string s = "pod " + p.name;
  if (p.exit_code) {
    s += " exited with code " + std::to_string(*p.exit_code);
    if (*p.exit_code > 128 && *p.exit_code < 160) s += " (signal " + std::to_string(*p.exit_code - 128) + ")";
  } else {
    s += " failed";
  }
  if (!p.reason.empty()) s += ", reason " + p.reason;
  if (!p.message.empty()) s += ": " + p.message;
  return s;
}

}  // namespace

std::optional<Decision> Failure(const JobState& job) {
  const JobSpec& spec = job.spec;
  std::optional<std::string> failure;
  bool permanent = false;
  std::string disruption;  // a failure the cluster caused: restarts without counting
  std::optional<std::string> disrupted;
  for (const auto& pod : job.Current()) {
    if (pod.phase != "Failed") continue;
    if (!pod.disruption.empty()) {  // a rank that failed on its own, if any, decides instead
      if (!disrupted) {
        disrupted = DescribeFailure(pod);
        disruption = pod.disruption;
      }
      continue;
    }
    failure = DescribeFailure(pod);
    if (spec.restart_policy == RestartPolicy::kNever) {
      permanent = true;
    } else if (spec.restart_policy == RestartPolicy::kExitCode && pod.exit_code &&
               spec.permanent_exit_codes.count(*pod.exit_code)) {
      permanent = true;
    }
    if (permanent) break;
  }
  if (failure) {
    disruption.clear();
  } else {
    failure = disrupted;
  }
  const std::vector<int> missing = job.Missing();
  const bool launched = IntOr(job.status, "launchedGeneration", -1) == job.generation();
  if (!failure && launched && !missing.empty()) {
    failure = "pod " + PodName(job.name(), missing.front()) + " was deleted";
    permanent = spec.restart_policy == RestartPolicy::kNever;
  }
  if (!failure) return std::nullopt;

  const int64_t restarts = job.restarts();
  if (!disruption.empty() && !permanent) {
    // Preempted, evicted or drained: not the job's failure. The gang restarts whatever
    // restartPolicy and backoffLimit say, and restarts does not move.
    const int64_t count = IntOr(job.status, "disruptionRestarts", 0) + 1;
    const std::string msg = *failure + " (DisruptionTarget: " + disruption +
                            "); restarting the gang, which does not count against backoffLimit (disruption " +
                            std::to_string(count) + ")";
    Decision d;
    d.phase = "Restarting";
    d.status["disruptionRestarts"] = count;
    d.status["restartGeneration"] = job.generation() + 1;
    d.conditions = {{"Restarting", "True", "Disruption", msg}, {"Running", "False", "Disruption", msg}};
    d.events.push_back({"Warning", "GangRestartAfterDisruption", msg});
    d.remove = NotTerminating(job.pods);
    d.status_first = true;
    return d;
  }
  auto fail = [&](const std::string& reason, const std::string& message) {
    Decision d = Finish(job.status, "Failed", reason, message, job.in.now);
    d.remove = Clean(spec.clean_pod_policy, job.pods);
    return d;
  };
  if (permanent) {
    const bool by_code = spec.restart_policy == RestartPolicy::kExitCode;
    return fail(by_code ? "PermanentExitCode" : "RestartPolicyNever",
                *failure + (by_code ? "; the exit code is in permanentExitCodes, so the gang is not restarted"
                                    : "; restartPolicy is Never"));
  }
  if (restarts >= spec.backoff_limit) {
    return fail("BackoffLimitExceeded", *failure + "; the gang was restarted " + std::to_string(restarts) +
                                            " time(s), backoffLimit is " + std::to_string(spec.backoff_limit));
  }
  const int64_t gen = job.generation() + 1;
  const std::string msg = *failure + "; restarting the gang (restart " + std::to_string(restarts + 1) + " of " +
                          std::to_string(spec.backoff_limit) + ")";
  Decision d;
  d.phase = "Restarting";
  d.status["restarts"] = restarts + 1;
  d.status["restartGeneration"] = gen;
  d.conditions = {{"Restarting", "True", "GangRestart", msg}, {"Running", "False", "GangRestart", msg}};
  d.events.push_back({"Warning", "GangRestart", msg});
  d.remove = NotTerminating(job.pods);
  d.status_first = true;
  return d;
}

}  // namespace meshwork::op::policy
