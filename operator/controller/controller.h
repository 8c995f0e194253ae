// The TrainingJob controller: informers on TrainingJobs and on the Pods and Services labelled
// meshwork.dev/job, a de-duplicating rate-limited work queue of job keys, and worker threads
// that run the Reconciler. Informers start at once (a standby replica keeps a warm cache and
// is ready); workers start only when this replica leads.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/reconciler.h"
#include "operator/k8s/informer.h"
#include "operator/k8s/workqueue.h"

namespace meshwork::op {

struct ControllerOptions {
  std::string ns;  // "" = every namespace
  int workers = 4;
  ReconcilerOptions reconciler;
  k8s::WorkQueueOptions queue;
};

struct ControllerHooks {
  ReconcilerHooks reconciler;
  // After every reconcile: its outcome and how long it took.
  std::function<void(const ReconcileOutcome& outcome, double seconds)> observe_reconcile;
  // Jobs per phase, after every change; called under the controller's lock, in order (it must
  // not call back into the controller).
  std::function<void(const std::map<std::string, int>& jobs_by_phase)> jobs_by_phase;
};

class Controller {
 public:
  Controller(k8s::Client* client, ControllerOptions options, ControllerHooks hooks);
  ~Controller();  // Stop()
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  void StartInformers();
  // All three caches have their first list.
  bool HasSynced() const;
  bool WaitForSync(std::chrono::milliseconds timeout) const;
  // Why the caches are not synced (for /readyz), "" when they are.
  std::string NotSyncedReason() const;

  // Starts the workers (once) and queues every job, so a new leader, or one that leads again
  // after losing the lease, reconciles all.
  void StartWorkers();
  // Checked before every reconcile (e.g. "still the leader"); false skips it and retries the key
  // later. Set before StartWorkers.
  void SetMayReconcile(std::function<bool()> may_reconcile) { may_reconcile_ = std::move(may_reconcile); }
  // Shuts the queue down, joins the workers, stops the informers. Idempotent.
  void Stop();

  size_t QueueDepth() const { return queue_.Len(); }

 private:
  void Worker();
  void Enqueue(const std::string& key) { queue_.Add(key); }
  void SetPhase(const std::string& key, const std::string& phase);
  // Queues the jobs with a Pod on `node` (its Ready condition moved, or it was deleted).
  void EnqueueJobsOn(const std::string& node);

  k8s::Client* client_;
  ControllerOptions options_;
  ControllerHooks hooks_;
  k8s::Informer jobs_;
  k8s::Informer pods_;
  k8s::Informer services_;
  k8s::Informer holding_pods_;  // every Pod not Succeeded or Failed: what room_ is kept from
  RoomLedger room_;             // the room those Pods take, for gang admission
  k8s::Informer nodes_;         // every Node: a rank on one NotReady or gone is lost
  PodIndex index_;
  k8s::WorkQueue queue_;
  std::unique_ptr<Reconciler> reconciler_;
  std::function<bool()> may_reconcile_;

  std::mutex mu_;
  std::map<std::string, std::string> phases_;
  std::vector<std::thread> workers_;
  bool workers_started_ = false;
  bool stopped_ = false;
};

}  // namespace meshwork::op
