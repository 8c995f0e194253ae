// What the policies share: applying a decision to the plan, finishing a job, the Pods
// cleanPodPolicy removes, the current gang and its counts.
#include "operator/controller/policy/policy.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace meshwork::op::policy {

using nlohmann::json;

int64_t IntOr(const json& obj, const char* key, int64_t fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

std::string JobState::name() const { return in.job["metadata"].value("name", ""); }

int64_t JobState::generation() const { return IntOr(status, "restartGeneration", 0); }

int64_t JobState::restarts() const { return IntOr(status, "restarts", 0); }

std::vector<PodView> JobState::Current() const {
  const int64_t gen = generation();
  std::vector<PodView> out;
  for (const auto& pod : pods) {
    if (pod.generation == gen && pod.index >= 0 && pod.index < spec.replicas) out.push_back(pod);
  }
  return out;
}

std::vector<int> JobState::Missing() const {
  std::map<int, bool> present;
  for (const auto& pod : Current()) present[pod.index] = true;
  std::vector<int> missing;
  for (int i = 0; i < spec.replicas; ++i) {
    if (!present.count(i)) missing.push_back(i);
  }
  return missing;
}

void Apply(const Decision& d, Plan& plan, SystemTime now) {
  for (const auto& c : d.conditions) SetCondition(plan.status, c.type, c.value, c.reason, c.message, now);
  for (const auto& field : d.status.items()) {
    if (field.value().is_null()) {
      plan.status.erase(field.key());
    } else {
      plan.status[field.key()] = field.value();
    }
  }
  plan.remove.insert(plan.remove.end(), d.remove.begin(), d.remove.end());
  plan.create.insert(plan.create.end(), d.create.begin(), d.create.end());
  plan.events.insert(plan.events.end(), d.events.begin(), d.events.end());
  plan.ensure_service = plan.ensure_service || d.ensure_service;
  plan.ensure_config_map = plan.ensure_config_map || d.ensure_config_map;
  plan.ensure_pod_group = plan.ensure_pod_group || d.ensure_pod_group;
  plan.status_first = plan.status_first || d.status_first;
  plan.delete_job = plan.delete_job || d.delete_job;
  if (d.requeue_after) {
    const auto after = std::max(*d.requeue_after, std::chrono::seconds(1));
    if (!plan.requeue_after || *plan.requeue_after > after) plan.requeue_after = after;
  }
  if (!d.phase.empty()) {
    plan.phase = d.phase;
    plan.status["phase"] = d.phase;
  }
}

Decision Finish(const json& status, const std::string& type, const std::string& reason, const std::string& message,
                SystemTime now) {
  Decision d;
  d.phase = type;
  d.conditions = {{type, "True", reason, message}, {"Running", "False", reason, message}};
  if (ConditionTrue(status, "Restarting")) d.conditions.push_back({"Restarting", "False", reason, message});
  d.status["completionTime"] = FormatTime(now);
  // The outcome is recorded before cleanPodPolicy deletes anything: were the Pods gone first and
  // the status write then lost, the next reconcile would take them for deleted ranks.
  d.status_first = true;
  d.events.push_back({type == "Succeeded" ? "Normal" : "Warning", reason, message});
  return d;
}

bool Active(const PodView& pod) { return !pod.terminating && pod.phase != "Succeeded" && pod.phase != "Failed"; }

std::vector<PodView> Deletable(const std::vector<PodView>& pods) {
  std::vector<PodView> out;
  for (const auto& pod : pods) {
    if (!pod.terminating || pod.node_lost) out.push_back(pod);
  }
  return out;
}

std::vector<PodView> Clean(CleanPodPolicy policy, const std::vector<PodView>& pods) {
  std::vector<PodView> out;
  for (const auto& pod : Deletable(pods)) {
    if (policy == CleanPodPolicy::kAll || (policy == CleanPodPolicy::kRunning && Active(pod))) out.push_back(pod);
  }
  return out;
}

json Counts(const JobState& job) {
  int ready = 0, active = 0, succeeded = 0, failed = 0;
  for (const auto& p : job.Current()) {
    if (p.ready && Active(p)) ++ready;
    if (Active(p)) ++active;
    if (p.phase == "Succeeded") ++succeeded;
    if (p.phase == "Failed") ++failed;
  }
  const int replicas = job.spec.replicas;
  return {{"replicas", replicas},
          {"readyReplicas", ready},
          {"activeReplicas", active},
          {"succeededReplicas", succeeded},
          {"failedReplicas", failed},
          {"ready", std::to_string(ready) + "/" + std::to_string(replicas)}};
}

json FinishedCounts(const json& status, const std::vector<PodView>& pods, const std::vector<PodView>& removed) {
  if (!status.contains("replicas")) return json::object();  // never counted: nothing to correct
  int ready = 0, active = 0;
  for (const auto& p : pods) {
    const bool going = std::any_of(removed.begin(), removed.end(), [&](const PodView& r) { return r.uid == p.uid; });
    if (going || !Active(p)) continue;
    ++active;
    if (p.ready) ++ready;
  }
  const int64_t replicas = IntOr(status, "replicas", 0);
  return {{"readyReplicas", ready},
          {"activeReplicas", active},
          {"ready", std::to_string(ready) + "/" + std::to_string(replicas)}};
}

std::string FormatDuration(int64_t seconds) {
  const int64_t h = seconds / 3600, m = seconds % 3600 / 60, s = seconds % 60;
  if (h > 0) return std::to_string(h) + "h" + (m < 10 ? "0" : "") + std::to_string(m) + "m";
  if (m > 0) return std::to_string(m) + "m" + (s < 10 ? "0" : "") + std::to_string(s) + "s";
  return std::to_string(s) + "s";
}

json ReportJson(const TrainerReport& r, SystemTime now, int world_size) {
  json report = {{"step", r.step}, {"totalSteps", r.total_steps}, {"updateTime", FormatTime(now)}};
  // A NaN or infinite loss (a diverging run) would be written as null, which the API server
  // prunes: the field is left out instead, as it is before the first step.
  if (std::isfinite(r.loss)) report["loss"] = std::round(r.loss * 1e4) / 1e4;
  if (std::isfinite(r.tokens_per_second)) {
    report["tokensPerSecond"] = std::round(r.tokens_per_second * world_size * 10) / 10;
  }
  if (r.resumed_from_step) report["resumedFromStep"] = *r.resumed_from_step;
  return report;
}

}  // namespace meshwork::op::policy
