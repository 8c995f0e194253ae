#include "operator/controller/reconciler.h"

#include <algorithm>
#include <chrono>

#include "operator/controller/children.h"
#include "operator/controller/config_check.h"
#include "operator/controller/desired.h"
#include "operator/controller/kueue.h"
#include "operator/controller/node_health.h"
#include "operator/controller/trainer_report.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

k8s::ResourceRef Jobs() { return k8s::resources::Custom(kGroup, kVersion, kPlural); }

}  // namespace

Reconciler::Reconciler(k8s::ObjectApi* api, const k8s::Store* jobs, const k8s::Store* pods,
                       const k8s::Store* services, const PodIndex* index, ReconcilerOptions options,
                       ReconcilerHooks hooks)
    : api_(api),
      jobs_(jobs),
      pods_(pods),
      services_(services),
      index_(index),
      options_(options),
      hooks_(std::move(hooks)),
      expectations_(options.expectation_timeout) {
  shared_.api = api;
  shared_.pods = pods;
  shared_.pods_namespace = options.pods_namespace;
}

void Reconciler::Log(const std::string& line) const {
  if (hooks_.log) hooks_.log(line);
}

void Reconciler::Forget(const std::string& key) {
  expectations_.Forget(key);
  runtimes_.Forget(key);
  {
    std::lock_guard<std::mutex> lock(shared_.mu);
    shared_.gang_waiting.erase(key);
  }
  std::lock_guard<std::mutex> lock(mu_);
  last_scrape_.erase(key);
}

std::vector<json> Reconciler::OwnedPods(const std::string& key, const std::string& uid,
                                         std::set<std::string>* seen_uids) const {
  std::vector<json> owned;
  for (const auto& pod_key : index_->Get(key)) {
    auto pod = pods_->Get(pod_key);
    if (!pod || !OwnedBy(*pod, uid)) continue;  // a Pod that only carries the label is not ours
    seen_uids->insert((*pod)["metadata"].value("uid", ""));
    owned.push_back(std::move(*pod));
  }
  return owned;
}

std::map<std::string, NodeHealth> Reconciler::UnhealthyNodes(const std::vector<json>& pods, const json& lost_nodes,
                                                              std::chrono::seconds back_after) const {
  return op::UnhealthyNodes(shared_.nodes, pods, lost_nodes, back_after);
}

std::optional<TrainerReport> Reconciler::Scrape(const std::string& key, const json& job, const JobSpec& spec,
                                                const std::vector<json>& pods) {
  if (spec.metrics_port <= 0) return std::nullopt;
  const int64_t gen = job.value("status", json::object()).value("restartGeneration", int64_t{0});
  for (const auto& pod : pods) {
    const PodView v = ViewPod(pod);
    if (v.index != 0 || v.generation != gen || v.phase != "Running" || v.terminating) continue;
    const std::string ip = pod.value("status", json::object()).value("podIP", "");
    if (ip.empty()) return std::nullopt;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = last_scrape_.find(key);
      if (it != last_scrape_.end() && now - it->second < options_.report_interval - std::chrono::milliseconds(500)) {
        return std::nullopt;
      }
      last_scrape_[key] = now;
    }
    auto body = HttpGet(ip, spec.metrics_port, "/metrics", options_.scrape_timeout);
    if (!body.ok()) return std::nullopt;  // not listening yet, or just finished
    return ParseTrainerMetrics(*body);
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::DeleteJob(const std::string& key, const json& job) {
  const json& meta = job["metadata"];
  k8s::DeleteOptions opts;
  opts.precondition_uid = meta.value("uid", "");
  opts.propagation_policy = "Background";
  auto deleted = api_->Delete(Jobs(), meta.value("namespace", "default"), meta.value("name", ""), opts);
  if (!deleted.ok() && !k8s::IsNotFound(deleted.error()) && !k8s::IsConflict(deleted.error())) {
    return Failed(deleted.error(), "deleting " + key + " after ttlSecondsAfterFinished");
  }
  Log(key + ": deleted (ttlSecondsAfterFinished)");
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::CreateChildren(const std::string& key, const json& job,
                                                           const Result<JobSpec>& spec, const Plan& plan) {
  if (!spec.ok()) return std::nullopt;  // a spec that does not parse creates nothing
  if (plan.ensure_service) {
    if (auto e = EnsureService(api_, job, *spec); !e.ok()) return Failed(e, "creating Service " + key);
  }
  if (plan.ensure_config_map) {
    if (auto e = EnsureConfigMap(api_, job, *spec); !e.ok()) {
      return Failed(e, "writing ConfigMap " + ConfigMapName(job["metadata"].value("name", "")));
    }
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::CreatePods(const std::string& key, const json& job, const Plan& plan,
                                                       Applied* created) {
  const std::string ns = job["metadata"].value("namespace", "default");
  const std::string name = job["metadata"].value("name", "");
  if (!plan.create.empty()) {
    // Before the Pods that read it: a Pod whose Secret is missing cannot start.
    if (auto e = EnsureRendezvousSecret(api_, job); !e.ok()) {
      return Failed(e, "writing Secret " + ns + "/" + RendezvousSecretName(name));
    }
  }
  const std::string uid = job["metadata"].value("uid", "");
  created->all = !plan.create.empty();
  for (const auto& pod : plan.create) {
    auto made = api_->Create(k8s::resources::Pods(), ns, pod);
    if (made.ok()) {
      expectations_.ExpectPod(key, made->value("metadata", json::object()).value("uid", ""));
      if (hooks_.pod_created) hooks_.pod_created();
      continue;
    }
    created->all = false;
    // The name is taken: by this gang's Pod the cache has not shown yet, or by an old one
    // still terminating. The next reconcile sees which.
    if (k8s::IsAlreadyExists(made.error())) {
      created->requeue_after = std::chrono::seconds(1);
      const std::string pod_name = pod["metadata"].value("name", "");
      auto existing = api_->Get(k8s::resources::Pods(), ns, pod_name);
      if (existing.ok() && !OwnedBy(*existing, uid)) {
        // Not ours and never will be: say so, or the job waits without a word.
        const std::string msg = "pod " + pod_name + " already exists and is not owned by this TrainingJob; delete it, "
                                "or give the job another name";
        Log(key + ": PodNameTaken: " + msg);
        created->events.push_back({"Warning", "PodNameTaken", msg});
        created->requeue_after = std::chrono::seconds(10);
      }
      continue;
    }
    if (made.error().http_code() == 422 || made.error().http_code() == 400) {
      created->refused = "spec.template: the API server refused Pod " + pod["metadata"].value("name", "") +
                         " that the job's spec makes: " + made.error().message();
      return std::nullopt;
    }
    return Failed(made.error(), "creating Pod " + pod["metadata"].value("name", ""));
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::DeletePods(const std::string& ns, const std::vector<PodView>& pods) {
  for (const auto& pod : pods) {
    k8s::DeleteOptions opts;
    opts.precondition_uid = pod.uid;
    // On a lost node no kubelet will finish a graceful delete (and the name stays taken).
    opts.grace_period_seconds = pod.node_lost ? 0 : options_.pod_delete_grace_seconds;
    auto deleted = api_->Delete(k8s::resources::Pods(), ns, pod.name, opts);
    if (deleted.ok()) {
      if (hooks_.pod_deleted) hooks_.pod_deleted();
    } else if (!k8s::IsNotFound(deleted.error()) && !k8s::IsConflict(deleted.error())) {
      return Failed(deleted.error(), "deleting Pod " + pod.name);
    }
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::WriteStatus(const std::string& key, const json& job, const json& status) {
  if (status == job.value("status", json::object())) return std::nullopt;
  json updated = job;
  updated["status"] = status;
  auto put = api_->UpdateStatus(Jobs(), job["metadata"].value("namespace", "default"), updated);
  if (!put.ok()) return Failed(put.error(), "writing the status of " + key);
  // Wait for the cache to move past the version this write replaced, unless the write replaced
  // none: an update the API server found equal to what it stores (a field it pruned, such as a
  // null) keeps the resourceVersion, and waiting for a change would stop the job's reconciles.
  const std::string based_on = job["metadata"].value("resourceVersion", "");
  const std::string written = put->value("metadata", json::object()).value("resourceVersion", "");
  if (written != based_on) expectations_.WroteStatus(key, based_on);
  return std::nullopt;
}

ReconcileOutcome Reconciler::Reconcile(const std::string& key) {
  ReconcileOutcome out = ReconcileJob(key);
  // An API error that is not the stale cache's (a conflict, retried at once) is also a Warning
  // Event on the job, so that `kubectl describe tj` shows why nothing happens (a PodGroup of that
  // name the job does not own, a missing PodGroup or Kueue API, RBAC); repeats are aggregated.
  if (!out.ok && out.error_reason != "conflict" && hooks_.record_event) {
    if (auto job = jobs_->Get(key)) hooks_.record_event(*job, {"Warning", "ReconcileError", out.message});
  }
  return out;
}

ReconcileOutcome Reconciler::ReconcileJob(const std::string& key) {
  // 1. Observe: the job and its Pods as the caches show them, the spec parsed once.
  auto cached = jobs_->Get(key);
  if (!cached) {
    Forget(key);
    return {};  // deleted: owner references take the children with it
  }
  const json& job = *cached;
  const json& meta = job["metadata"];
  if (meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null()) return {};
  // Another controller runs this job (spec.managedBy, immutable): nothing here touches it, but
  // for MultiKueue the operator still makes the Workload it dispatches.
  if (const std::string manager = OtherManager(job); !manager.empty()) {
    Forget(key);
    if (manager == kMultiKueueManager) {
      if (auto failed = ReconcileForMultiKueue(api_, key, job)) return *failed;
    }
    return {};
  }
  const json status = job.value("status", json::object());
  ReconcileOutcome look_again;
  look_again.phase = status.value("phase", "Created");
  look_again.requeue_after = std::chrono::seconds(1);
  // Deciding on the object our last status write replaced would only end in a Conflict; the
  // watch event of that write queues the key again.
  if (expectations_.BehindOwnWrite(key, meta.value("resourceVersion", ""))) return look_again;
  Observed in;
  in.now = std::chrono::system_clock::now();
  in.report_interval = options_.report_interval;
  // The job's TrainingRuntime, merged under its spec: what every decision below reads. (The
  // status is written on the object as cached, `job`.)
  RuntimeMerge runtime = runtimes_.Merge(api_, key, job, FormatTime(in.now));
  in.job = std::move(runtime.job);
  in.runtime_wait = runtime.wait;
  std::vector<EventToRecord> runtime_events;
  if (!runtime.not_found.empty()) runtime_events.push_back({"Warning", "RuntimeNotFound", runtime.not_found});
  std::set<std::string> seen_uids;
  in.pods = OwnedPods(key, meta.value("uid", ""), &seen_uids);
  // Pods this operator created that the cache has not shown yet: deciding now would take them
  // for deleted ones (client-go's "expectations").
  if (!expectations_.PodsSeen(key, seen_uids)) return look_again;
  in.service_exists = services_->Get(key).has_value();
  const Result<JobSpec> spec = [&]() -> Result<JobSpec> {
    if (runtime.error) return *runtime.error;
    Result<JobSpec> parsed = ParseSpec(in.job);
    if (parsed.ok() || RuntimeName(job).empty() || in.runtime_wait) return parsed;
    // The value at fault may be the runtime's: say that the spec was merged with it.
    return Status(parsed.status().code(), parsed.status().message() + " (in the spec merged with TrainingRuntime " +
                                              RuntimeName(job) + ")");
  }();
  in.unhealthy_nodes = UnhealthyNodes(in.pods, status.value("elastic", json::object()).value("lostNodes", json::array()),
                                      std::chrono::seconds(spec.ok() ? spec->node_loss_grace_seconds : 30));
  const bool finished = ConditionTrue(status, "Succeeded") || ConditionTrue(status, "Failed");
  // A runtime edit (or a merge of it with the job's config) that makes the spec wrong must not kill
  // a running gang: as a bad config edit, it applies to the next gang, which waits until it is fixed.
  if (!spec.ok() && !finished && !in.runtime_wait && !RuntimeName(job).empty()) {
    const bool gang_running = std::any_of(in.pods.begin(), in.pods.end(), [](const json& p) {
      const PodView v = ViewPod(p);
      return !v.terminating && v.phase != "Succeeded" && v.phase != "Failed";
    });
    if (gang_running) {
      in.runtime_wait = spec.status().message() + "; the running gang goes on, and no new gang starts until this is fixed";
      in.runtime_wait_reason = "RuntimeInvalid";
    }
  }
  if (!finished && spec.ok()) in.report = Scrape(key, job, *spec, in.pods);
  // Reads that cost an API call, made by Decide only when a decision needs them: the trainer
  // config when a gang is about to start, rank 0's log when the job has just succeeded.
  if (spec.ok()) {
    in.check_config = [&] {
      ConfigCheck check = CheckTrainerConfig(api_, job, *spec);
      if (check.wait) Log(key + ": " + *check.wait);
      return check;
    };
  }
  in.final_report = [&] { return ReadFinalReport(api_, job); };
  // The integrations' observations (Kueue: whether the job is queued).
  ReconcileScope scope{&shared_, key, &job, &in, &spec, finished, {}};
  const std::vector<const Integration*> integrations = IntegrationsOf(job, spec);
  for (const Integration* i : integrations) {
    if (auto failed = i->Observe(scope, &in)) return *failed;
  }

  // 2. Decide, once.
  Plan plan = Decide(in, spec);
  ReconcileOutcome out;
  out.phase = plan.phase;
  out.requeue_after = plan.requeue_after;

  // 3. Apply. A plan that deletes Pods of the current gang (a gang restart, a resize, a
  // suspension, a finish) writes the status first: if the operator dies after that write, the
  // old gang is stale by its label and goes on the next reconcile; if it dies before, the Pods
  // are still there and the same decision is made again.
  if (plan.delete_job) {
    if (auto failed = DeleteJob(key, job)) return *failed;
    out.phase = "";
    return out;
  }
  // A transition's Events go out as soon as its status is written: a step after the write that
  // fails (a Pod delete, the Workload's status) must not lose them, and a later reconcile, which
  // finds the transition already made, has none to give.
  bool plan_events_recorded = false;
  if (plan.status_first) {
    if (auto failed = WriteStatus(key, job, plan.status)) return *failed;
    RecordEvents(key, job, plan.events, &out);
    plan_events_recorded = true;
  }
  Applied applied;
  if (auto failed = CreateChildren(key, job, spec, plan)) return *failed;
  for (const Integration* i : integrations) {
    if (auto failed = i->BeforeCreate(scope, &plan)) return *failed;
  }
  if (auto failed = CreatePods(key, job, plan, &applied)) return *failed;
  if (applied.refused) {
    // Retrying the same invalid Pod for ever would leave the job Created without a word: it is
    // the spec's fault, as a bad trainer config is. The plan is decided again with that as the
    // config error (the one second decision), unless this reconcile has written its status: then
    // the next one, refused again, makes it, so that a reconcile writes the status once.
    Log(key + ": " + *applied.refused);
    if (plan.status_first) {
      out.requeue_after = std::chrono::seconds(1);
      return out;
    }
    Observed refused = in;
    refused.check_config = nullptr;
    refused.config_error = applied.refused;
    refused.config_wait.reset();
    plan = Decide(refused, spec);
    out.phase = plan.phase;
    out.requeue_after = plan.requeue_after;
    const std::string why = *applied.refused;
    applied = Applied{};
    applied.refused = why;
    if (plan.status_first) {
      if (auto failed = WriteStatus(key, job, plan.status)) return *failed;
      RecordEvents(key, job, plan.events, &out);
      plan_events_recorded = true;
    }
  }
  if (applied.requeue_after) out.requeue_after = applied.requeue_after;
  if (auto failed = DeletePods(meta.value("namespace", "default"), plan.remove)) return *failed;
  for (const Integration* i : integrations) {
    if (auto failed = i->AfterApply(scope, plan, &applied)) return *failed;
  }
  if (applied.requeue_after && (!out.requeue_after || *applied.requeue_after < *out.requeue_after)) {
    out.requeue_after = applied.requeue_after;
  }

  // 4. The status, written once (here, unless it went first). launchedGeneration is recorded
  // only once every Pod of the gang has been created.
  if (!plan.status_first) {
    json next = plan.status;
    if (applied.all) {
      next["launchedGeneration"] = next.value("restartGeneration", int64_t{0});
      // The Pods just created count as active, as the Job controller counts them: otherwise the
      // next reconcile, seeing them in the cache, writes the status again only to say so.
      if (next.contains("activeReplicas") && next["activeReplicas"].is_number_integer()) {
        next["activeReplicas"] = next["activeReplicas"].get<int64_t>() + static_cast<int64_t>(plan.create.size());
      }
    }
    if (auto failed = WriteStatus(key, job, next)) return *failed;
  }

  // 5. The Events, once the status is written.
  if (!plan_events_recorded) RecordEvents(key, job, plan.events, &out);
  RecordEvents(key, job, applied.events, &out);
  RecordEvents(key, job, runtime_events, &out);
  if (applied.gang_waiting) {
    std::lock_guard<std::mutex> lock(shared_.mu);
    shared_.gang_waiting[key] = *applied.gang_waiting;
  }
  return out;
}

void Reconciler::RecordEvents(const std::string& key, const json& job, const std::vector<EventToRecord>& events,
                              ReconcileOutcome* out) {
  for (const auto& ev : events) {
    if (ev.reason == "InvalidSpec") out->invalid_spec = true;
    Log(key + ": " + ev.reason + ": " + ev.message);
    if (hooks_.record_event) hooks_.record_event(job, ev);
  }
}

}  // namespace meshwork::op
