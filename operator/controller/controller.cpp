#include "operator/controller/controller.h"

#include "operator/controller/spec.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

k8s::InformerOptions ChildInformer() {
  k8s::InformerOptions o;
  o.label_selector = kJobLabel;  // has the label
  return o;
}

// The Pods that hold room on a node, whoever owns them (the API server drops one from the watch
// when it finishes).
k8s::InformerOptions HoldingPodsInformer() {
  k8s::InformerOptions o;
  o.field_selector = "status.phase!=Succeeded,status.phase!=Failed";
  return o;
}

}  // namespace

Controller::Controller(k8s::Client* client, ControllerOptions options, ControllerHooks hooks)
    : client_(client),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      jobs_(client, k8s::resources::Custom(kGroup, kVersion, kPlural), options_.ns),
      pods_(client, k8s::resources::Pods(), options_.ns, ChildInformer()),
      services_(client, k8s::resources::Services(), options_.ns, ChildInformer()),
      holding_pods_(client, k8s::resources::Pods(), options_.ns, HoldingPodsInformer()),
      nodes_(client, k8s::resources::Nodes(), ""),
      queue_(options_.queue) {
  ReconcilerOptions reconciler_options = options_.reconciler;
  reconciler_options.pods_namespace = options_.ns;
  reconciler_ = std::make_unique<Reconciler>(client_, &jobs_.store(), &pods_.store(), &services_.store(), &index_,
                                             reconciler_options, hooks_.reconciler);
  reconciler_->SetRoomLedger(&room_);
  reconciler_->SetNodes(&nodes_.store());

  k8s::EventHandlers job_handlers;
  job_handlers.on_add = [this](const json& obj) { Enqueue(k8s::ObjectKey(obj)); };
  job_handlers.on_update = [this](const json&, const json& obj) { Enqueue(k8s::ObjectKey(obj)); };
  job_handlers.on_delete = [this](const json& obj) {
    const std::string key = k8s::ObjectKey(obj);
    SetPhase(key, "");
    Enqueue(key);
  };
  jobs_.AddEventHandlers(job_handlers);

  k8s::EventHandlers pod_handlers;
  pod_handlers.on_add = [this](const json& obj) {
    const std::string job = PodIndex::JobKeyOf(obj);
    if (job.empty()) return;
    index_.Set(job, k8s::ObjectKey(obj));
    Enqueue(job);
  };
  pod_handlers.on_update = [this](const json& old_obj, const json& obj) {
    const std::string old_job = PodIndex::JobKeyOf(old_obj), job = PodIndex::JobKeyOf(obj);
    if (old_job != job && !old_job.empty()) {
      index_.Remove(old_job, k8s::ObjectKey(old_obj));
      Enqueue(old_job);
    }
    if (job.empty()) return;
    index_.Set(job, k8s::ObjectKey(obj));
    Enqueue(job);
  };
  pod_handlers.on_delete = [this](const json& obj) {
    const std::string job = PodIndex::JobKeyOf(obj);
    if (job.empty()) return;
    index_.Remove(job, k8s::ObjectKey(obj));
    Enqueue(job);
  };
  pods_.AddEventHandlers(pod_handlers);

  k8s::EventHandlers service_handlers;
  auto service_job = [](const json& obj) { return PodIndex::JobKeyOf(obj); };
  service_handlers.on_add = [this, service_job](const json& obj) {
    if (auto k = service_job(obj); !k.empty()) Enqueue(k);
  };
  service_handlers.on_update = [this, service_job](const json&, const json& obj) {
    if (auto k = service_job(obj); !k.empty()) Enqueue(k);
  };
  service_handlers.on_delete = [this, service_job](const json& obj) {
    if (auto k = service_job(obj); !k.empty()) Enqueue(k);
  };
  services_.AddEventHandlers(service_handlers);

  k8s::EventHandlers room_handlers;
  room_handlers.on_add = [this](const json& obj) { room_.Set(k8s::ObjectKey(obj), obj); };
  room_handlers.on_update = [this](const json&, const json& obj) { room_.Set(k8s::ObjectKey(obj), obj); };
  room_handlers.on_delete = [this](const json& obj) { room_.Remove(k8s::ObjectKey(obj)); };
  holding_pods_.AddEventHandlers(room_handlers);

  // Only a move of Ready matters (a node's status is written every heartbeat).
  k8s::EventHandlers node_handlers;
  node_handlers.on_update = [this](const json& old_obj, const json& obj) {
    auto ready = [](const json& node) {
      const json c = ReadyConditionOf(node);
      return c.is_null() ? std::string() : c.value("status", "");
    };
    if (ready(old_obj) != ready(obj)) EnqueueJobsOn(k8s::ObjectKey(obj));
  };
  node_handlers.on_delete = [this](const json& obj) { EnqueueJobsOn(k8s::ObjectKey(obj)); };
  nodes_.AddEventHandlers(node_handlers);
}

void Controller::EnqueueJobsOn(const std::string& node) {
  // A Ready transition is rare; a walk of the job Pods' cache then is cheaper than keeping a
  // second index up to date on every Pod event.
  for (const json& pod : pods_.store().List()) {
    if (pod.value("spec", json::object()).value("nodeName", "") != node) continue;
    if (const std::string job = PodIndex::JobKeyOf(pod); !job.empty()) Enqueue(job);
  }
}

Controller::~Controller() { Stop(); }

void Controller::StartInformers() {
  nodes_.Start();
  holding_pods_.Start();
  pods_.Start();
  services_.Start();
  jobs_.Start();
}

bool Controller::HasSynced() const {
  return jobs_.HasSynced() && pods_.HasSynced() && services_.HasSynced() && holding_pods_.HasSynced() &&
         nodes_.HasSynced();
}

bool Controller::WaitForSync(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const k8s::Informer* inf : {&jobs_, &pods_, &services_, &holding_pods_, &nodes_}) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!inf->WaitForSync(std::max(left, std::chrono::milliseconds(0)))) return false;
  }
  return true;
}

std::string Controller::NotSyncedReason() const {
  if (!jobs_.HasSynced()) return "TrainingJob cache not synced: " + jobs_.LastError();
  if (!pods_.HasSynced()) return "Pod cache not synced: " + pods_.LastError();
  if (!services_.HasSynced()) return "Service cache not synced: " + services_.LastError();
  if (!holding_pods_.HasSynced()) return "cache of Pods holding room not synced: " + holding_pods_.LastError();
  if (!nodes_.HasSynced()) return "Node cache not synced: " + nodes_.LastError();
  return "";
}

void Controller::StartWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  for (const auto& key : jobs_.store().Keys()) queue_.Add(key);
  if (workers_started_) return;
  workers_started_ = true;
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { Worker(); });
}

void Controller::Stop() {
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    workers.swap(workers_);
  }
  queue_.ShutDown();
  for (auto& t : workers) t.join();
  jobs_.Stop();
  pods_.Stop();
  services_.Stop();
  holding_pods_.Stop();
  nodes_.Stop();
}

void Controller::SetPhase(const std::string& key, const std::string& phase) {
  // The hook runs under the lock: called after it, a worker's counts could reach the gauges after
  // a later worker's and leave them stale for good (seen: 1,999 of 2,000 Succeeded jobs counted,
  // one still Created, once the last job had finished).
  std::lock_guard<std::mutex> lock(mu_);
  if (phase.empty()) {
    if (!phases_.erase(key)) return;
  } else {
    auto [it, inserted] = phases_.emplace(key, phase);
    if (!inserted && it->second == phase) return;
    it->second = phase;
  }
  std::map<std::string, int> counts;
  for (const auto& [k, p] : phases_) ++counts[p];
  if (hooks_.jobs_by_phase) hooks_.jobs_by_phase(counts);
}

void Controller::Worker() {
  while (auto key = queue_.Get()) {
    if (may_reconcile_ && !may_reconcile_()) {
      queue_.AddAfter(*key, std::chrono::seconds(2));
      queue_.Done(*key);
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    ReconcileOutcome outcome;
    try {
      outcome = reconciler_->Reconcile(*key);
    } catch (const std::exception& e) {
      // A bug must not take the operator down with every other job: count it, back off.
      outcome.ok = false;
      outcome.error_reason = "other";
      outcome.message = std::string("unexpected exception: ") + e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (hooks_.observe_reconcile) hooks_.observe_reconcile(outcome, seconds);
    if (outcome.ok) {
      SetPhase(*key, outcome.phase);
      queue_.Forget(*key);
      if (outcome.requeue_after) queue_.AddAfter(*key, *outcome.requeue_after);
    } else {
      if (hooks_.reconciler.log) hooks_.reconciler.log(*key + ": reconcile failed (" + outcome.error_reason + "): " + outcome.message);
      queue_.AddRateLimited(*key);
    }
    queue_.Done(*key);
  }
}

}  // namespace meshwork::op
