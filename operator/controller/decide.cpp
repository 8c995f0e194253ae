// Decide: the policies of policy/ in their order, and the helpers every policy uses (times,
// conditions, Pod views).
#include "operator/controller/decide.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include "operator/controller/gang.h"
#include "operator/controller/policy/policy.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

// A label holding a non-negative decimal number, or -1.
int64_t LabelNumber(const json& labels, const char* key) {
  if (!labels.is_object() || !labels.contains(key) || !labels[key].is_string()) return -1;
  const std::string s = labels[key].get<std::string>();
  if (s.empty() || s.size() > 12 || !std::all_of(s.begin(), s.end(), ::isdigit)) return -1;
  return std::stoll(s);
}

}  // namespace

std::string FormatTime(SystemTime t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::optional<SystemTime> ParseTime(const std::string& s) {
  std::tm tm{};
  const char* end = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) return std::nullopt;
  if (*end == '.') {
    ++end;
    while (std::isdigit(static_cast<unsigned char>(*end))) ++end;
  }
  if (*end != 'Z' || end[1] != '\0') return std::nullopt;
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

bool ConditionTrue(const json& status, const std::string& type) {
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array()) return false;
  for (const auto& c : status["conditions"]) {
    if (c.value("type", "") == type) return c.value("status", "") == "True";
  }
  return false;
}

bool SetCondition(json& status, const std::string& type, const std::string& value, const std::string& reason,
                  const std::string& message, SystemTime now) {
  if (!status.contains("conditions") || !status["conditions"].is_array()) status["conditions"] = json::array();
  for (auto& c : status["conditions"]) {
    if (c.value("type", "") != type) continue;
    bool changed = false;
    if (c.value("status", "") != value) {
      c["status"] = value;
      c["lastTransitionTime"] = FormatTime(now);
      changed = true;
    }
    if (c.value("reason", "") != reason) c["reason"] = reason, changed = true;
    if (c.value("message", "") != message) c["message"] = message, changed = true;
    return changed;
  }
  status["conditions"].push_back({{"type", type},
                                  {"status", value},
                                  {"reason", reason},
                                  {"message", message},
                                  {"lastTransitionTime", FormatTime(now)}});
  return true;
}

PodView ViewPod(const json& pod) {
  PodView v;
  const json& meta = pod.contains("metadata") ? pod["metadata"] : json::object();
  v.name = meta.value("name", "");
  v.uid = meta.value("uid", "");
  v.terminating = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  const json labels = meta.value("labels", json::object());
  v.index = static_cast<int>(std::min<int64_t>(LabelNumber(labels, kIndexLabel), 1 << 20));
  v.generation = LabelNumber(labels, kGenerationLabel);
  v.world_size = LabelNumber(labels, kWorldSizeLabel);
  if (labels.contains(kMeshLabel) && labels[kMeshLabel].is_string()) v.mesh = labels[kMeshLabel].get<std::string>();
  const json spec = pod.value("spec", json::object());
  if (spec.is_object() && spec.contains("nodeName") && spec["nodeName"].is_string()) v.node = spec["nodeName"];
  const json status = pod.value("status", json::object());
  v.gang_gated = HasGangGate(pod);
  v.phase = status.value("phase", "Pending");
  v.reason = status.value("reason", "");
  v.message = status.value("message", "");
  auto say = [&v](const std::string& reason, const std::string& message) {
    for (const std::string* part : {&reason, &message}) {
      if (part->empty()) continue;
      if (!v.failure_text.empty()) v.failure_text += '\n';
      v.failure_text += *part;
    }
  };
  say(v.reason, v.message);
  for (const auto& c : status.value("conditions", json::array())) {
    const std::string type = c.value("type", "");
    if (type == "Ready") v.ready = c.value("status", "") == "True";
    if (c.value("status", "") == "True") v.true_conditions.emplace_back(type, c.value("reason", ""));
    if (type == "DisruptionTarget" && c.value("status", "") == "True") v.disruption = c.value("reason", "Disruption");
    if (type == "PodScheduled" && c.value("status", "") == "False" && v.reason.empty()) {
      v.reason = c.value("reason", "");
      v.message = c.value("message", "");
    }
  }
  for (const auto& cs : status.value("containerStatuses", json::array())) {
    if (cs.value("name", "") != kTrainerContainer) continue;
    const json state = cs.value("state", json::object());
    if (state.contains("terminated")) {
      const json& t = state["terminated"];
      if (t.contains("exitCode") && t["exitCode"].is_number_integer()) v.exit_code = t["exitCode"].get<int>();
      say(t.value("reason", ""), t.value("message", ""));
      if (v.reason.empty()) v.reason = t.value("reason", "");
      if (v.message.empty()) v.message = t.value("message", "");
    } else if (state.contains("waiting") && v.reason.empty()) {
      v.reason = state["waiting"].value("reason", "");
      v.message = state["waiting"].value("message", "");
    }
  }
  constexpr size_t kMaxFailureText = 4096;
  if (v.failure_text.size() > kMaxFailureText) v.failure_text.erase(0, v.failure_text.size() - kMaxFailureText);
  return v;
}

namespace {

// What every reconcile of the job writes, whatever is decided: observedGeneration, the label
// selector, and the Created condition (with its Event) the first time.
Plan Begin(const Observed& in) {
  Plan p;
  const json& meta = in.job["metadata"];
  const std::string name = meta.value("name", "");
  const std::string ns = meta.value("namespace", "default");
  p.status = in.job.contains("status") && in.job["status"].is_object() ? in.job["status"] : json::object();
  if (meta.contains("generation")) p.status["observedGeneration"] = meta["generation"];
  if (!p.status.contains("conditions")) {
    const std::string msg = "TrainingJob " + ns + "/" + name + " is created";
    SetCondition(p.status, "Created", "True", "TrainingJobCreated", msg, in.now);
    p.events.push_back({"Normal", "Created", msg});
  }
  p.status["selector"] = std::string(kJobLabel) + "=" + name;
  return p;
}

// The spec's shape and the gang counters, shown as soon as the spec parses.
// With spec.mesh.auto the dims are the trainer's to report (policy::RecordTrainerMesh): a
// reported mesh stays while the world size does; before that, or after a resize, "auto".
void RecordShape(const JobSpec& spec, json& status) {
  status["restartGeneration"] = policy::IntOr(status, "restartGeneration", 0);
  status["restarts"] = policy::IntOr(status, "restarts", 0);
  const bool same_world = policy::IntOr(status, "worldSize", -1) == spec.WorldSize();
  status["worldSize"] = spec.WorldSize();
  if (spec.mesh.chosen_by_trainer) {
    // The plan the operator chose for this world (status.plan, written as its gang started).
    if (!same_world) status.erase("plan");
    if (status.contains("plan") && status["plan"].is_object() &&
        status["plan"].value("worldSize", -1) == spec.WorldSize() && status["plan"].contains("mesh")) {
      status["mesh"] = status["plan"]["mesh"];
      status["meshShape"] = status["plan"].value("meshShape", "auto");
      return;
    }
    const bool reported = same_world && status.contains("meshShape") && status["meshShape"] != "auto" &&
                          status.contains("mesh");
    if (!reported) {
      status["meshShape"] = "auto";
      status.erase("mesh");
    }
    return;
  }
  status["mesh"] = {{"dpReplicate", spec.mesh.dp_replicate}, {"dpShard", spec.mesh.dp_shard}, {"tp", spec.mesh.tp},
                    {"pp", spec.mesh.pp}};
  status["meshShape"] = spec.mesh.ToString();
}

bool JobEnded(const std::string& phase) { return phase == "Succeeded" || phase == "Failed"; }

std::vector<PodView> Views(const Observed& in) {
  std::vector<PodView> pods;
  for (const auto& pod : in.pods) pods.push_back(ViewPod(pod));
  return pods;
}

// Applies a final decision; one that finishes the job also schedules its TTL, and counts as
// ready only the Pods that go on running after it.
void End(Plan& plan, const policy::Decision& d, const Observed& in) {
  policy::Apply(d, plan, in.now);
  if (!JobEnded(plan.phase)) return;
  plan.status.update(policy::FinishedCounts(plan.status, Views(in), d.remove));
  if (auto ttl = policy::Ttl(in.job, plan.status, in.now, /*may_delete=*/false)) policy::Apply(*ttl, plan, in.now);
}

}  // namespace

Plan Decide(const Observed& in) { return Decide(in, ParseSpec(in.job)); }

Plan Decide(const Observed& in, const Result<JobSpec>& spec) {
  const Plan begun = Begin(in);
  Plan plan = begun;
  std::vector<PodView> pods = Views(in);

  // A finished job stays finished: its Pods are cleaned up and, after its TTL, it is deleted.
  if (ConditionTrue(plan.status, "Succeeded") || ConditionTrue(plan.status, "Failed")) {
    const CleanPodPolicy clean = spec.ok() ? spec->clean_pod_policy : CleanPodPolicy::kRunning;
    const policy::Decision finished = policy::Finished(plan.status, clean, pods);
    policy::Apply(finished, plan, in.now);
    plan.status.update(policy::FinishedCounts(plan.status, pods, finished.remove));
    if (auto ttl = policy::Ttl(in.job, plan.status, in.now, /*may_delete=*/true)) policy::Apply(*ttl, plan, in.now);
    return plan;
  }
  if (in.runtime_wait) {
    policy::Apply(policy::AwaitRuntime(plan.status, in.runtime_wait_reason, *in.runtime_wait), plan, in.now);
    return plan;
  }
  if (!spec.ok()) {
    End(plan, policy::InvalidSpec(plan.status, pods, spec.status().message(), in.now), in);
    return plan;
  }
  // The spec the gang runs: an elastic job that lost nodes runs smaller than spec.replicas until
  // they are back (policy::ElasticReplicas).
  JobSpec run = *spec;
  policy::ElasticSize size = policy::ElasticReplicas(in, *spec, plan.status);
  if (size.decision) policy::Apply(*size.decision, plan, in.now);
  if (size.replicas != run.replicas) {
    run.replicas = size.replicas;
    run.mesh = MeshAt(run, run.replicas);
  }
  plan.gang_replicas = run.replicas;
  RecordShape(run, plan.status);
  policy::RecordElastic(run, in.admitted_replicas, plan.status);
  std::optional<policy::Decision> node_wait = policy::MarkNodeLoss(in, run, &pods);
  const policy::JobState job{in, run, plan.status, std::move(pods)};

  // Runs one policy: true when it decided the phase. A decision about the gang carries the
  // gang's counts, as they are before the decision changes the generation.
  auto decided = [&](std::optional<policy::Decision> d) {
    if (!d) return false;
    if (d->phase.empty()) {
      policy::Apply(*d, plan, in.now);
      return false;
    }
    d->status.update(policy::Counts(job));
    End(plan, *d, in);
    return true;
  };
  decided(std::move(node_wait));
  if (decided(policy::Suspend(job))) return plan;
  decided(policy::Resume(job));
  if (decided(policy::Deadline(job))) return plan;
  // Like any spec failure, this one leaves the counts as they were.
  if (auto d = policy::ResizeWithCheckpoints(job)) {
    End(plan, *d, in);
    return plan;
  }
  decided(policy::Resize(job));
  // Success first: with successPolicy Rank0 a rank that failed once rank 0 was done does not
  // matter (with AllRanks, success leaves no failed rank to judge).
  if (decided(policy::StaleGang(job)) || decided(policy::Success(job)) || decided(policy::Failure(job))) return plan;

  // The trainer config is checked only when a gang is about to start: an edit applies to the
  // next gang and must not fail a running one. A bad config fails the job as a bad spec does,
  // from the status this reconcile found.
  if (!job.Missing().empty()) {
    ConfigCheck unchecked;
    unchecked.error = in.config_error;
    unchecked.wait = in.config_wait;
    const ConfigCheck config = in.check_config ? in.check_config() : unchecked;
    if (config.error) {
      Plan failed = begun;
      End(failed, policy::InvalidSpec(begun.status, job.pods, *config.error, in.now), in);
      return failed;
    }
    if (config.wait) {
      decided(policy::AwaitConfig(job, *config.wait));
      return plan;
    }
    if (config.pipeline.is_null()) {
      plan.status.erase("pipeline");
    } else {
      plan.status["pipeline"] = config.pipeline;
    }
    JobSpec launched = run;
    if (config.plan) {
      // mesh: auto: the gang starts with the plan chosen for it just now, recorded with its
      // prediction; a plan other than the one recorded (a new world, an edited config) is said.
      const json before = plan.status.value("plan", json());
      const bool same = before.is_object() && before.value("description", "") == config.plan->status.value("description", "") &&
                        before.value("worldSize", -1) == config.plan->status.value("worldSize", -2);
      plan.status["plan"] = config.plan->status;
      plan.status["mesh"] = config.plan->status["mesh"];
      plan.status["meshShape"] = config.plan->status["meshShape"];
      if (!same) plan.events.push_back({"Normal", "PlanChosen", config.plan->summary});
      launched.plan_overrides = config.plan->overrides;
      launched.planned_mesh = config.plan->mesh;
    }
    if (config.global_batch_size > 0) {
      // The gang starts with the elastic job's global batch, found in its config just now. A config
      // edit that changes it changes the run its checkpoints continue: said, not hidden.
      const int64_t before = policy::IntOr(plan.status["elastic"], "globalBatchSize", 0);
      if (before > 0 && before != config.global_batch_size) {
        plan.events.push_back({"Warning", "GlobalBatchChanged",
                               "the trainer config now makes a global batch of " +
                                   std::to_string(config.global_batch_size) + " rows a step, where the job's gangs ran " +
                                   std::to_string(before) + ": the run resumed from the checkpoint differs from one "
                                   "never interrupted"});
      }
      plan.status["elastic"]["globalBatchSize"] = config.global_batch_size;
      launched.global_batch_size = config.global_batch_size;
    }
    decided(policy::Launch(policy::JobState{in, launched, plan.status, job.pods}));
    return plan;
  }
  decided(policy::Launch(job));
  return plan;
}

}  // namespace meshwork::op
