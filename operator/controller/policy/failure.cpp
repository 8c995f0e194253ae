// Gang failure: a failed rank, or a rank deleted after the whole gang was created (an eviction,
// or a user's `kubectl delete pod`), fails the gang, since a lone new rank cannot rejoin a running
// job. What follows is decided per failed rank, then the most severe outcome wins:
//  - the first of spec.runPolicy.failurePolicy.rules that matches the rank (by exit code, a
//    condition on its Pod, or its termination message) says FailJob, RestartGang (counted
//    against backoffLimit) or RestartGangAndIgnoreBackoff;
//  - else a rank the cluster stopped (its Pod has DisruptionTarget=True: preemption, eviction,
//    a drain) restarts the gang without counting, as JobSet's and Job's pod failure policies
//    let one say; so does a rank whose node is lost (node_loss.cpp), whatever its phase says;
//  - else restartPolicy and permanentExitCodes decide between the end and a counted restart.
// A counted restart past backoffLimit ends the job.
#include "operator/controller/policy/policy.h"

#include <set>

#include "operator/controller/desired.h"

namespace meshwork::op::policy {
namespace {

using nlohmann::json;

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

bool Matches(const FailureRule& rule, const PodView& pod) {
  if (rule.exit_code_in) {
    if (!pod.exit_code) return false;  // no exit code (never started, or deleted): no match
    if (rule.exit_codes.count(*pod.exit_code) != (*rule.exit_code_in ? 1u : 0u)) return false;
  }
  if (!rule.pod_conditions.empty()) {
    bool any = false;
    for (const auto& [type, reason] : rule.pod_conditions) {
      for (const auto& [t, r] : pod.true_conditions) any = any || (t == type && (reason.empty() || r == reason));
    }
    if (!any) return false;
  }
  if (!rule.message_pattern.empty()) {
    const auto found = FindPattern(rule.message_pattern, pod.failure_text);
    if (!found.ok() || !*found) return false;  // ParseSpec refused a bad pattern already
  }
  return true;
}

// What one failed rank means for the gang, most severe last.
enum class Outcome { kUncounted, kCounted, kEnd };

struct RankVerdict {
  Outcome outcome = Outcome::kCounted;
  std::string failure;  // DescribeFailure
  std::string reason;   // the condition reason: GangRestart, Disruption, FailurePolicy, PermanentExitCode, ...
  std::string why;      // appended to the message
  bool disruption = false;  // an uncounted restart by the DisruptionTarget default, not by a rule
};

RankVerdict Judge(const JobSpec& spec, const PodView& pod) {
  RankVerdict v;
  v.failure = DescribeFailure(pod);
  for (size_t i = 0; i < spec.failure_rules.size(); ++i) {
    const FailureRule& rule = spec.failure_rules[i];
    if (!Matches(rule, pod)) continue;
    const std::string which = "failurePolicy rule " + std::to_string(i) +
                              (rule.name.empty() ? "" : " (" + rule.name + ")") + " matched: " +
                              FailureActionName(rule.action);
    v.reason = "FailurePolicy";
    v.why = which;
    v.outcome = rule.action == FailureAction::kFailJob       ? Outcome::kEnd
                : rule.action == FailureAction::kRestartGang ? Outcome::kCounted
                                                             : Outcome::kUncounted;
    return v;
  }
  if (!pod.disruption.empty()) {
    v.outcome = Outcome::kUncounted;
    v.reason = "Disruption";
    v.why = "DisruptionTarget: " + pod.disruption;
    v.disruption = true;
  } else if (spec.restart_policy == RestartPolicy::kNever) {
    v.outcome = Outcome::kEnd;
    v.reason = "RestartPolicyNever";
    v.why = "restartPolicy is Never";
  } else if (spec.restart_policy == RestartPolicy::kExitCode && pod.exit_code &&
             spec.permanent_exit_codes.count(*pod.exit_code)) {
    v.outcome = Outcome::kEnd;
    v.reason = "PermanentExitCode";
    v.why = "the exit code is in permanentExitCodes, so the gang is not restarted";
  } else {
    v.reason = "GangRestart";
  }
  return v;
}

// An elastic job that lost ranks with their nodes goes on without them where minReplicas allows:
// status.elastic with the smaller size, the size the user asked for (shrunkFrom) and the lost
// nodes, which ElasticReplicas watches to grow back. None when it would fall below minReplicas
// (the gang restarts at its size and waits for room) or the job is not elastic.
std::optional<json> ShrinkAfterNodeLoss(const JobState& job) {
  const JobSpec& spec = job.spec;
  if (!spec.elastic) return std::nullopt;
  std::set<int> lost_replicas;
  std::set<std::string> lost_nodes;
  for (const auto& pod : job.Current()) {
    if (!pod.node_lost || pod.phase == "Succeeded") continue;
    lost_replicas.insert(pod.index);
    lost_nodes.insert(pod.node);
  }
  const int left = spec.replicas - static_cast<int>(lost_replicas.size());
  if (lost_replicas.empty() || left < spec.elastic->min_replicas) return std::nullopt;
  json elastic = job.status.value("elastic", json::object());
  if (!elastic.contains("shrunkFrom")) elastic["shrunkFrom"] = spec.elastic->spec_replicas;
  for (const auto& node : elastic.value("lostNodes", json::array())) {
    if (node.is_string()) lost_nodes.insert(node.get<std::string>());
  }
  elastic["lostNodes"] = lost_nodes;
  elastic["shrunkTo"] = left;
  elastic["replicas"] = left;
  return WithResize(std::move(elastic), spec.replicas, left, job.generation() + 1, "NodeLost", job.in.now);
}

}  // namespace

std::optional<Decision> Failure(const JobState& job) {
  const JobSpec& spec = job.spec;
  std::optional<RankVerdict> worst;  // the first rank with the most severe outcome
  for (const auto& pod : job.Current()) {
    if (pod.phase != "Failed") continue;
    RankVerdict v = Judge(spec, pod);
    if (!worst || v.outcome > worst->outcome) worst = std::move(v);
  }
  // A rank on a lost node (node_loss.cpp) is gone whatever its phase says; that is the cluster's
  // doing, a disruption. A rank that ended there before is judged by how it ended, above.
  for (const auto& pod : job.Current()) {
    if (!pod.node_lost || pod.phase == "Failed" || pod.phase == "Succeeded") continue;
    RankVerdict v;
    v.outcome = Outcome::kUncounted;
    v.disruption = true;
    v.reason = "NodeLost";
    v.failure = "pod " + pod.name + " is lost with its node";
    v.why = pod.node_lost_why;
    if (!worst || v.outcome > worst->outcome) worst = std::move(v);
  }
  const std::vector<int> missing = job.Missing();
  const bool launched = IntOr(job.status, "launchedGeneration", -1) == job.generation();
  if (!worst && launched && !missing.empty()) {
    // A deleted rank: nothing to match rules against (no exit code, no Pod left).
    RankVerdict v;
    v.failure = "pod " + PodName(job.name(), missing.front()) + " was deleted";
    v.reason = spec.restart_policy == RestartPolicy::kNever ? "RestartPolicyNever" : "GangRestart";
    v.outcome = spec.restart_policy == RestartPolicy::kNever ? Outcome::kEnd : Outcome::kCounted;
    if (v.outcome == Outcome::kEnd) v.why = "restartPolicy is Never";
    worst = std::move(v);
  }
  if (!worst) return std::nullopt;
  const RankVerdict& w = *worst;

  auto restart = [&](const std::string& reason, const std::string& event, const std::string& msg) {
    Decision d;
    d.phase = "Restarting";
    d.status["restartGeneration"] = job.generation() + 1;
    d.conditions = {{"Restarting", "True", reason, msg}, {"Running", "False", reason, msg}};
    d.events.push_back({"Warning", event, msg});
    d.remove = Deletable(job.pods);
    d.status_first = true;
    return d;
  };
  if (w.outcome == Outcome::kUncounted) {
    // Preempted, evicted or drained, or a rule says so: not the job's failure. The gang restarts
    // whatever restartPolicy and backoffLimit say, and restarts does not move.
    const char* counter = w.disruption ? "disruptionRestarts" : "uncountedRestarts";
    const int64_t count = IntOr(job.status, counter, 0) + 1;
    const std::string msg = w.failure + " (" + w.why +
                            "); restarting the gang, which does not count against backoffLimit (" +
                            (w.disruption ? "disruption " : "uncounted restart ") + std::to_string(count) + ")";
    std::optional<json> shrunk = w.reason == "NodeLost" ? ShrinkAfterNodeLoss(job) : std::nullopt;
    std::string said = msg;
    if (shrunk) {
      said += "; the elastic job goes on at " + std::to_string((*shrunk)["replicas"].get<int>()) +
              " replicas without the lost node(s) until they are Ready again";
    }
    Decision d = restart(w.reason, w.disruption ? "GangRestartAfterDisruption" : "GangRestartUncounted", said);
    d.status[counter] = count;
    if (shrunk) d.status["elastic"] = *shrunk;
    return d;
  }
  auto fail = [&](const std::string& reason, const std::string& message) {
    Decision d = Finish(job.status, "Failed", reason, message, job.in.now);
    d.remove = Clean(spec.clean_pod_policy, job.pods);
    return d;
  };
  if (w.outcome == Outcome::kEnd) return fail(w.reason, w.failure + "; " + w.why);
  const int64_t restarts = job.restarts();
  const std::string by_rule = w.why.empty() ? "" : " (" + w.why + ")";
  if (restarts >= spec.backoff_limit) {
    return fail("BackoffLimitExceeded", w.failure + by_rule + "; the gang was restarted " + std::to_string(restarts) +
                                            " time(s), backoffLimit is " + std::to_string(spec.backoff_limit));
  }
  const std::string msg = w.failure + by_rule + "; restarting the gang (restart " + std::to_string(restarts + 1) +
                          " of " + std::to_string(spec.backoff_limit) + ")";
  Decision d = restart("GangRestart", "GangRestart", msg);
  d.status["restarts"] = restarts + 1;
  return d;
}

}  // namespace meshwork::op::policy
