// Every metric the operator exports, declared in one place and created at zero (every known label
// value included) so dashboards and alerts see each series from the first scrape. Listed in
// docs/metrics.md ("Operator metrics").
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "operator/k8s/error.h"
#include "operator/k8s/workqueue.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace meshwork::runtime {

// How one reconcile ended (label `result` of meshwork_operator_reconcile_total).
enum class ReconcileResult { kSuccess, kError, kRequeue };
// Why a reconcile failed (label `reason` of meshwork_operator_reconcile_errors_total).
enum class ReconcileErrorReason { kConflict, kApi, kInvalidSpec, kOther };

const char* ReconcileResultName(ReconcileResult r);     // "success", "error", "requeue"
const char* ReconcileErrorReasonName(ReconcileErrorReason r);  // "conflict", "api", "invalid_spec", "other"
// A Kubernetes API error's reason: kConflict for 409 Conflict, else kApi (kOther for OK).
ReconcileErrorReason ErrorReasonFor(const k8s::Error& e);

// The TrainingJob phases pre-created in meshwork_operator_jobs{phase}.
inline constexpr const char* kJobPhases[] = {"Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed"};

class OperatorMetrics {
 public:
  // Registers the operator's metrics in `registry`, which must outlive this object.
  // `version` is the label of meshwork_operator_info.
  OperatorMetrics(prometheus::Registry& registry, const std::string& version);
  OperatorMetrics(const OperatorMetrics&) = delete;
  OperatorMetrics& operator=(const OperatorMetrics&) = delete;

  // One reconcile of one key ended with `result` after `seconds`.
  void ObserveReconcile(ReconcileResult result, double seconds);
  void CountError(ReconcileErrorReason reason);
  // Jobs per phase now. Every pre-created phase missing from `counts` is set to 0; an unknown
  // phase gets a series of its own (and 0 once a later call omits it).
  void SetJobsByPhase(const std::map<std::string, int64_t>& counts);
  void PodCreated();
  void PodDeleted();
  void SetLeader(bool leading);
  // An API request waited `seconds` for the client-side rate limit.
  void Throttled(double seconds);

  // Points the queue's metric hooks (depth, adds, retries, queue and work latency) at this
  // object's workqueue series. Call before constructing the WorkQueue; `options` keeps its other
  // fields. This object must outlive the queue.
  void InstrumentWorkQueue(k8s::WorkQueueOptions* options);

  // The workqueue series, for InstrumentWorkQueue's hooks and for tests.
  void SetWorkQueueDepth(size_t depth);
  void WorkQueueAdded();
  void WorkQueueRetried();
  void ObserveQueueDuration(double seconds);
  void ObserveWorkDuration(double seconds);

 private:
  prometheus::Family<prometheus::Counter>& reconcile_total_;
  prometheus::Family<prometheus::Counter>& reconcile_errors_total_;
  prometheus::Histogram& reconcile_duration_seconds_;
  prometheus::Gauge& workqueue_depth_;
  prometheus::Counter& workqueue_adds_total_;
  prometheus::Histogram& workqueue_queue_duration_seconds_;
  prometheus::Histogram& workqueue_work_duration_seconds_;
  prometheus::Counter& workqueue_retries_total_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Counter& pods_created_total_;
  prometheus::Counter& pods_deleted_total_;
  prometheus::Gauge& leader_;
  prometheus::Counter& api_throttled_total_;
  prometheus::Counter& api_throttled_seconds_total_;
  prometheus::Family<prometheus::Gauge>& info_;
  std::map<std::string, prometheus::Gauge*> phase_series_;  // guarded by phase_mu_
  std::mutex phase_mu_;
};

}  // namespace meshwork::runtime
