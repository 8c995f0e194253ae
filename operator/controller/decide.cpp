#include "operator/controller/decide.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <sstream>

#include "operator/controller/desired.h"

namespace meshwork::op {
namespace {

using nlohmann::json;
using std::chrono::seconds;

int64_t IntOr(const json& obj, const char* key, int64_t fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

// A label holding a non-negative decimal number, or -1.
int64_t LabelNumber(const json& labels, const char* key) {
  if (!labels.is_object() || !labels.contains(key) || !labels[key].is_string()) return -1;
  const std::string s = labels[key].get<std::string>();
  if (s.empty() || s.size() > 12 || !std::all_of(s.begin(), s.end(), ::isdigit)) return -1;
  return std::stoll(s);
}

bool Active(const PodView& p) { return !p.terminating && p.phase != "Succeeded" && p.phase != "Failed"; }

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

// Status counts from the current gang.
void SetCounts(json& status, int replicas, const std::vector<PodView>& current) {
  int ready = 0, active = 0, succeeded = 0, failed = 0;
  for (const auto& p : current) {
    if (p.ready && Active(p)) ++ready;
    if (Active(p)) ++active;
    if (p.phase == "Succeeded") ++succeeded;
    if (p.phase == "Failed") ++failed;
  }
  status["replicas"] = replicas;
  status["readyReplicas"] = ready;
  status["activeReplicas"] = active;
  status["succeededReplicas"] = succeeded;
  status["failedReplicas"] = failed;
  status["ready"] = std::to_string(ready) + "/" + std::to_string(replicas);
}

// The Pods cleanPodPolicy removes once the job has finished.
void Clean(Plan& p, CleanPodPolicy policy, const std::vector<PodView>& pods) {
  for (const auto& pod : pods) {
    if (pod.terminating) continue;
    const bool running = Active(pod);
    if (policy == CleanPodPolicy::kAll || (policy == CleanPodPolicy::kRunning && running)) {
      p.remove.push_back(pod);
    }
  }
}

void Finish(Plan& p, const Observed& in, const std::string& type, const std::string& reason,
            const std::string& message) {
  SetCondition(p.status, type, "True", reason, message, in.now);
  SetCondition(p.status, "Running", "False", reason, message, in.now);
  if (ConditionTrue(p.status, "Restarting")) {
    SetCondition(p.status, "Restarting", "False", reason, message, in.now);
  }
  p.status["completionTime"] = FormatTime(in.now);
  p.phase = type;
  // The outcome is recorded before cleanPodPolicy deletes anything: were the Pods gone first and
  // the status write then lost, the next reconcile would take them for deleted ranks.
  p.status_first = true;
  p.events.push_back({type == "Succeeded" ? "Normal" : "Warning", reason, message});
}

std::optional<int64_t> RawTtl(const json& job) {
  const json& spec = job.contains("spec") ? job["spec"] : json::object();
  if (!spec.is_object() || !spec.contains("runPolicy")) return std::nullopt;
  const int64_t ttl = IntOr(spec["runPolicy"], "ttlSecondsAfterFinished", -1);
  if (ttl < 0) return std::nullopt;
  return ttl;
}

// status.trainer, rounded for `kubectl get` (tokens/s to 0.1, loss to 1e-4). The job's tokens/s
// is rank 0's times the world size: every rank processes the same batch per step.
json ReportJson(const TrainerReport& r, SystemTime now, int world_size) {
  return {{"step", r.step},
          {"totalSteps", r.total_steps},
          {"loss", std::round(r.loss * 1e4) / 1e4},
          {"tokensPerSecond", std::round(r.tokens_per_second * world_size * 10) / 10},
          {"updateTime", FormatTime(now)}};
}

void RequeueNoLaterThan(Plan& p, seconds after) {
  if (after < seconds(1)) after = seconds(1);
  if (!p.requeue_after || *p.requeue_after > after) p.requeue_after = after;
}

// A finished job: apply cleanPodPolicy and ttlSecondsAfterFinished, create nothing, ever.
void PlanFinished(Plan& p, const Observed& in, const std::vector<PodView>& pods) {
  auto spec = ParseSpec(in.job);
  const CleanPodPolicy policy = spec.ok() ? spec->clean_pod_policy : CleanPodPolicy::kRunning;
  Clean(p, policy, pods);
  p.phase = ConditionTrue(p.status, "Succeeded") ? "Succeeded" : "Failed";
  const auto ttl = spec.ok() ? spec->ttl_seconds_after_finished : RawTtl(in.job);
  if (!ttl) return;
  auto done = ParseTime(p.status.value("completionTime", ""));
  if (!done) {
    // Finished before completionTime was recorded (should not happen): count from now.
    p.status["completionTime"] = FormatTime(in.now);
    done = in.now;
  }
  const auto expire = *done + seconds(*ttl);
  if (in.now >= expire) {
    p.delete_job = true;
  } else {
    RequeueNoLaterThan(p, std::chrono::duration_cast<seconds>(expire - in.now) + seconds(1));
  }
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
  const json status = pod.value("status", json::object());
  v.phase = status.value("phase", "Pending");
  v.reason = status.value("reason", "");
  v.message = status.value("message", "");
  for (const auto& c : status.value("conditions", json::array())) {
    const std::string type = c.value("type", "");
    if (type == "Ready") v.ready = c.value("status", "") == "True";
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
      if (v.reason.empty()) v.reason = t.value("reason", "");
      if (v.message.empty()) v.message = t.value("message", "");
    } else if (state.contains("waiting") && v.reason.empty()) {
      v.reason = state["waiting"].value("reason", "");
      v.message = state["waiting"].value("message", "");
    }
  }
  return v;
}

namespace {

Plan DecideOnce(const Observed& in) {
  Plan p;
  const json& job = in.job;
  const json& meta = job["metadata"];
  const std::string name = meta.value("name", "");
  const std::string ns = meta.value("namespace", "default");
  p.status = job.contains("status") && job["status"].is_object() ? job["status"] : json::object();
  json& status = p.status;
  if (meta.contains("generation")) status["observedGeneration"] = meta["generation"];
  if (!status.contains("conditions")) {
    const std::string msg = "TrainingJob " + ns + "/" + name + " is created";
    SetCondition(status, "Created", "True", "TrainingJobCreated", msg, in.now);
    p.events.push_back({"Normal", "Created", msg});
  }
  status["selector"] = std::string(kJobLabel) + "=" + name;

  std::vector<PodView> pods;
  for (const auto& pod : in.pods) pods.push_back(ViewPod(pod));

  if (ConditionTrue(status, "Succeeded") || ConditionTrue(status, "Failed")) {
    PlanFinished(p, in, pods);
    status["phase"] = p.phase;
    return p;
  }

  auto parsed = ParseSpec(job);
  if (!parsed.ok() || in.config_error) {
    const std::string msg = parsed.ok() ? *in.config_error : parsed.status().message();
    Finish(p, in, "Failed", "InvalidSpec", msg);
    Clean(p, CleanPodPolicy::kRunning, pods);
    status["phase"] = p.phase;
    return p;
  }
  const JobSpec& spec = *parsed;
  int64_t gen = IntOr(status, "restartGeneration", 0);
  int64_t restarts = IntOr(status, "restarts", 0);
  status["restartGeneration"] = gen;
  status["restarts"] = restarts;
  status["worldSize"] = spec.WorldSize();
  status["mesh"] = {{"dpReplicate", spec.mesh.dp_replicate}, {"dpShard", spec.mesh.dp_shard}, {"tp", spec.mesh.tp}};
  status["meshShape"] = spec.mesh.ToString();

  auto current_of = [&](int64_t g) {
    std::vector<PodView> out;
    for (const auto& pod : pods) {
      if (pod.generation == g && pod.index >= 0 && pod.index < spec.replicas) out.push_back(pod);
    }
    return out;
  };

  // Suspend: no Pods; the time suspended does not count towards activeDeadlineSeconds.
  if (spec.suspend) {
    for (const auto& pod : pods) {
      if (!pod.terminating) p.remove.push_back(pod);
    }
    if (!ConditionTrue(status, "Suspended")) {
      const std::string msg = "the job is suspended: its Pods are deleted until runPolicy.suspend is false";
      SetCondition(status, "Suspended", "True", "JobSuspended", msg, in.now);
      SetCondition(status, "Running", "False", "JobSuspended", msg, in.now);
      if (auto start = ParseTime(status.value("startTime", ""))) {
        const auto ran = std::chrono::duration_cast<seconds>(in.now - *start).count();
        status["activeSeconds"] = IntOr(status, "activeSeconds", 0) + std::max<int64_t>(0, ran);
      }
      status.erase("startTime");
      p.events.push_back({"Normal", "Suspended", msg});
      p.status_first = true;  // else a lost write would leave a launched gang with no Pods
    }
    p.phase = "Suspended";
    status["phase"] = p.phase;
    SetCounts(status, spec.replicas, current_of(gen));
    return p;
  }
  if (ConditionTrue(status, "Suspended")) {
    ++gen;  // a fresh gang, resuming from the latest checkpoint
    status["restartGeneration"] = gen;
    const std::string msg = "the job is resumed with a new gang (generation " + std::to_string(gen) + ")";
    SetCondition(status, "Suspended", "False", "JobResumed", msg, in.now);
    p.events.push_back({"Normal", "Resumed", msg});
  }

  // activeDeadlineSeconds: active time before the last suspension plus since the last start.
  if (spec.active_deadline_seconds) {
    if (auto start = ParseTime(status.value("startTime", ""))) {
      const int64_t active = IntOr(status, "activeSeconds", 0) +
                             std::chrono::duration_cast<seconds>(in.now - *start).count();
      if (active >= *spec.active_deadline_seconds) {
        Finish(p, in, "Failed", "DeadlineExceeded",
               "the job was active for " + std::to_string(active) + " s, reaching activeDeadlineSeconds " +
                   std::to_string(*spec.active_deadline_seconds));
        // A deadline stops the job whatever cleanPodPolicy says; the policy decides the rest.
        for (const auto& pod : pods) {
          if (Active(pod) || spec.clean_pod_policy == CleanPodPolicy::kAll) {
            if (!pod.terminating) p.remove.push_back(pod);
          }
        }
        status["phase"] = p.phase;
        SetCounts(status, spec.replicas, current_of(gen));
        return p;
      }
      RequeueNoLaterThan(p, seconds(*spec.active_deadline_seconds - active));
    }
  }

  // A resized job (kubectl scale, a new mesh) needs a new gang: the ranks of the old one were
  // started with the old shape. With checkpoints on it cannot go on at all (the CRD's CEL rule
  // refuses the change where CEL is evaluated): the trainer cannot reshard a checkpoint yet.
  for (const auto& pod : pods) {
    if (pod.generation != gen || pod.world_size < 0) continue;
    const std::string old_shape = std::to_string(pod.world_size) + " ranks, mesh " + (pod.mesh.empty() ? "?" : pod.mesh);
    const std::string new_shape = std::to_string(spec.WorldSize()) + " ranks, mesh " + spec.mesh.ToString();
    if (pod.world_size == spec.WorldSize() && (pod.mesh.empty() || pod.mesh == spec.mesh.ToString())) continue;
    if (spec.checkpoint_path) {
      Finish(p, in, "Failed", "InvalidSpec",
             "spec.replicas/spec.mesh: the gang changed from " + old_shape + " to " + new_shape +
                 " while checkpoints are on; the trainer cannot reshard a checkpoint yet: create a new TrainingJob");
      Clean(p, CleanPodPolicy::kRunning, pods);
      status["phase"] = p.phase;
      return p;
    }
    ++gen;
    status["restartGeneration"] = gen;
    const std::string msg = "the gang changed from " + old_shape + " to " + new_shape + "; starting a new gang (generation " +
                            std::to_string(gen) + ")";
    SetCondition(status, "Restarting", "True", "Resized", msg, in.now);
    SetCondition(status, "Running", "False", "Resized", msg, in.now);
    p.events.push_back({"Normal", "Resized", msg});
    p.status_first = true;
    break;
  }

  // Pods of an older gang, or beyond the replica count, go before anything is created: a new
  // gang must never meet a rank of the old one at the rendezvous.
  std::vector<PodView> stale;
  for (const auto& pod : pods) {
    if (pod.generation != gen || pod.index < 0 || pod.index >= spec.replicas) stale.push_back(pod);
  }
  std::vector<PodView> current = current_of(gen);
  SetCounts(status, spec.replicas, current);
  const bool restarting = ConditionTrue(status, "Restarting");
  if (!stale.empty()) {
    for (const auto& pod : stale) {
      if (!pod.terminating) p.remove.push_back(pod);
    }
    p.phase = restarting ? "Restarting" : (status.value("phase", "") == "Running" ? "Restarting" : "Created");
    status["phase"] = p.phase;
    RequeueNoLaterThan(p, seconds(5));
    return p;
  }

  std::map<int, const PodView*> by_index;
  for (const auto& pod : current) by_index.emplace(pod.index, &pod);
  std::vector<int> missing;
  for (int i = 0; i < spec.replicas; ++i) {
    if (!by_index.count(i)) missing.push_back(i);
  }
  const bool launched = IntOr(status, "launchedGeneration", -1) == gen;

  // A failed rank, or a rank deleted after the whole gang was created (an eviction, or a
  // user's `kubectl delete pod`), fails the gang: a lone new rank cannot rejoin a running job.
  std::optional<std::string> failure;
  bool permanent = false;
  for (const auto& pod : current) {
    if (pod.phase != "Failed") continue;
    failure = DescribeFailure(pod);
    if (spec.restart_policy == RestartPolicy::kNever) {
      permanent = true;
    } else if (spec.restart_policy == RestartPolicy::kExitCode && pod.exit_code &&
               spec.permanent_exit_codes.count(*pod.exit_code)) {
      permanent = true;
    }
    if (permanent) break;
  }
  if (!failure && launched && !missing.empty()) {
    failure = "pod " + PodName(name, missing.front()) + " was deleted";
    permanent = spec.restart_policy == RestartPolicy::kNever;
  }
  if (failure) {
    if (permanent) {
      const bool by_code = spec.restart_policy == RestartPolicy::kExitCode;
      Finish(p, in, "Failed", by_code ? "PermanentExitCode" : "RestartPolicyNever",
             *failure + (by_code ? "; the exit code is in permanentExitCodes, so the gang is not restarted"
                                 : "; restartPolicy is Never"));
      Clean(p, spec.clean_pod_policy, pods);
    } else if (restarts >= spec.backoff_limit) {
      Finish(p, in, "Failed", "BackoffLimitExceeded",
             *failure + "; the gang was restarted " + std::to_string(restarts) + " time(s), backoffLimit is " +
                 std::to_string(spec.backoff_limit));
      Clean(p, spec.clean_pod_policy, pods);
    } else {
      ++restarts;
      ++gen;
      status["restarts"] = restarts;
      status["restartGeneration"] = gen;
      const std::string msg = *failure + "; restarting the gang (restart " + std::to_string(restarts) + " of " +
                              std::to_string(spec.backoff_limit) + ")";
      SetCondition(status, "Restarting", "True", "GangRestart", msg, in.now);
      SetCondition(status, "Running", "False", "GangRestart", msg, in.now);
      p.events.push_back({"Warning", "GangRestart", msg});
      for (const auto& pod : pods) {
        if (!pod.terminating) p.remove.push_back(pod);
      }
      p.status_first = true;
      p.phase = "Restarting";
    }
    status["phase"] = p.phase;
    return p;
  }

  // Success: every rank of the current gang exited 0.
  if (missing.empty() &&
      std::all_of(current.begin(), current.end(), [](const PodView& x) { return x.phase == "Succeeded"; })) {
    Finish(p, in, "Succeeded", "AllRanksSucceeded",
           "all " + std::to_string(spec.WorldSize()) + " ranks in " + std::to_string(spec.replicas) +
               " pod(s) exited 0");
    Clean(p, spec.clean_pod_policy, pods);
    if (in.report) status["trainer"] = ReportJson(*in.report, in.now, spec.WorldSize());
    if (spec.ttl_seconds_after_finished) RequeueNoLaterThan(p, seconds(*spec.ttl_seconds_after_finished + 1));
    status["phase"] = p.phase;
    return p;
  }

  // Launch: the Service, the config, and every missing rank of this generation.
  if (in.config_wait && !missing.empty()) {
    SetCondition(status, "Running", "False", "ConfigMapNotReady", *in.config_wait, in.now);
    p.phase = restarting ? "Restarting" : "Created";
    status["phase"] = p.phase;
    RequeueNoLaterThan(p, seconds(10));
    return p;
  }
  p.ensure_service = !in.service_exists || !missing.empty();
  p.ensure_config_map = !missing.empty() && spec.config_map_name.empty();
  for (int i : missing) p.create.push_back(DesiredPod(job, spec, i, gen));
  if (missing.empty()) status["launchedGeneration"] = gen;
  if (!status.contains("startTime")) status["startTime"] = FormatTime(in.now);

  const bool all_running =
      missing.empty() && std::all_of(current.begin(), current.end(), [](const PodView& x) {
        return x.phase == "Running" || x.phase == "Succeeded";
      });
  if (all_running) {
    const std::string msg = std::to_string(spec.replicas) + " pod(s) running " + std::to_string(spec.WorldSize()) +
                            " rank(s), mesh " + spec.mesh.ToString() + " (dpReplicate x dpShard x tp)";
    if (!ConditionTrue(status, "Running")) p.events.push_back({"Normal", "Running", msg});
    SetCondition(status, "Running", "True", "AllPodsRunning", msg, in.now);
    if (restarting) SetCondition(status, "Restarting", "False", "GangRunning", "the new gang is running", in.now);
    p.phase = "Running";
  } else {
    std::string waiting;
    for (const auto& pod : current) {
      if (pod.phase == "Pending" && !pod.reason.empty()) {
        waiting = "; " + pod.name + ": " + pod.reason + (pod.message.empty() ? "" : " (" + pod.message + ")");
        break;
      }
    }
    SetCondition(status, "Running", "False", "PodsStarting",
                 std::to_string(current.size() - std::count_if(current.begin(), current.end(), [](const PodView& x) {
                                  return x.phase == "Pending";
                                })) +
                     " of " + std::to_string(spec.replicas) + " pod(s) started" + waiting,
                 in.now);
    p.phase = restarting ? "Restarting" : "Created";
  }
  if (in.report) status["trainer"] = ReportJson(*in.report, in.now, spec.WorldSize());
  if (!current.empty() && spec.metrics_port > 0) RequeueNoLaterThan(p, in.report_interval);
  status["phase"] = p.phase;
  return p;
}

}  // namespace

Plan Decide(const Observed& in) {
  Plan p = DecideOnce(in);
  // However the job finished, ttlSecondsAfterFinished counts from now on.
  if ((p.phase == "Succeeded" || p.phase == "Failed") && !p.delete_job) {
    if (const auto ttl = RawTtl(in.job)) {
      auto done = ParseTime(p.status.value("completionTime", ""));
      const auto expire = (done ? *done : in.now) + seconds(*ttl);
      RequeueNoLaterThan(p, std::chrono::duration_cast<seconds>(expire - in.now) + seconds(1));
    }
  }
  return p;
}

}  // namespace meshwork::op
