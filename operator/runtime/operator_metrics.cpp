// OperatorMetrics: names, help strings and buckets of the operator's metrics (see docs/metrics.md).
#include "operator/runtime/operator_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace meshwork::runtime {
namespace {

constexpr ReconcileResult kResults[] = {ReconcileResult::kSuccess, ReconcileResult::kError,
                                        ReconcileResult::kRequeue};
constexpr ReconcileErrorReason kReasons[] = {ReconcileErrorReason::kConflict, ReconcileErrorReason::kApi,
                                             ReconcileErrorReason::kInvalidSpec, ReconcileErrorReason::kOther};

prometheus::Counter& MakeCounter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram& MakeHistogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                                     prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}

// A reconcile is a few API calls: 1 ms (all from cache) to 10 s (a slow API server).
prometheus::Histogram::BucketBoundaries ReconcileBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
}

// A key can wait in the queue much longer than a reconcile takes (rate-limited retries back off
// to minutes), so the queue-wait histogram goes on to 5 min.
prometheus::Histogram::BucketBoundaries QueueBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0};
}

prometheus::Family<prometheus::Counter>& ReconcileTotal(prometheus::Registry& r) {
  auto& f = prometheus::BuildCounter()
                .Name("meshwork_operator_reconcile_total")
                .Help("Reconciles finished, by result (success, error, requeue).")
                .Register(r);
  for (ReconcileResult res : kResults) f.Add({{"result", ReconcileResultName(res)}});
  return f;
}

prometheus::Family<prometheus::Counter>& ReconcileErrors(prometheus::Registry& r) {
  auto& f = prometheus::BuildCounter()
                .Name("meshwork_operator_reconcile_errors_total")
                .Help("Reconciles that failed, by reason (conflict, api, invalid_spec, other).")
                .Register(r);
  for (ReconcileErrorReason reason : kReasons) f.Add({{"reason", ReconcileErrorReasonName(reason)}});
  return f;
}

}  // namespace

const char* ReconcileResultName(ReconcileResult r) {
  switch (r) {
    case ReconcileResult::kSuccess: return "success";
    case ReconcileResult::kError: return "error";
    case ReconcileResult::kRequeue: return "requeue";
  }
  return "error";
}

const char* ReconcileErrorReasonName(ReconcileErrorReason r) {
  switch (r) {
    case ReconcileErrorReason::kConflict: return "conflict";
    case ReconcileErrorReason::kApi: return "api";
    case ReconcileErrorReason::kInvalidSpec: return "invalid_spec";
    case ReconcileErrorReason::kOther: return "other";
  }
  return "other";
}

ReconcileErrorReason ErrorReasonFor(const k8s::Error& e) {
  if (e.ok()) return ReconcileErrorReason::kOther;
  if (k8s::IsConflict(e)) return ReconcileErrorReason::kConflict;
  return ReconcileErrorReason::kApi;
}

OperatorMetrics::OperatorMetrics(prometheus::Registry& registry, const std::string& version)
    : reconcile_total_(ReconcileTotal(registry)),
      reconcile_errors_total_(ReconcileErrors(registry)),
      reconcile_duration_seconds_(MakeHistogram(registry, "meshwork_operator_reconcile_duration_seconds",
                                                "Wall time of one reconcile.", ReconcileBuckets())),
      workqueue_depth_(MakeGauge(registry, "meshwork_operator_workqueue_depth", "Keys waiting in the work queue.")),
      workqueue_adds_total_(MakeCounter(registry, "meshwork_operator_workqueue_adds_total",
                                        "Keys added to the work queue (not counting adds of a key already queued).")),
      workqueue_queue_duration_seconds_(
          MakeHistogram(registry, "meshwork_operator_workqueue_queue_duration_seconds",
                        "How long a key waited in the work queue before a worker took it.", QueueBuckets())),
      workqueue_work_duration_seconds_(MakeHistogram(registry, "meshwork_operator_workqueue_work_duration_seconds",
                                                     "How long a worker held a key (Get to Done).",
                                                     ReconcileBuckets())),
      workqueue_retries_total_(MakeCounter(registry, "meshwork_operator_workqueue_retries_total",
                                           "Rate-limited requeues of keys after a failed reconcile.")),
      jobs_(prometheus::BuildGauge()
                .Name("meshwork_operator_jobs")
                .Help("TrainingJobs seen by the operator, by phase.")
                .Register(registry)),
      pods_created_total_(MakeCounter(registry, "meshwork_operator_pods_created_total",
                                      "Pods the operator created.")),
      pods_deleted_total_(MakeCounter(registry, "meshwork_operator_pods_deleted_total",
                                      "Pods the operator deleted.")),
      leader_(MakeGauge(registry, "meshwork_operator_leader", "1 when this replica holds the leader lease, else 0.")),
      api_throttled_total_(MakeCounter(registry, "meshwork_operator_api_throttled_requests_total",
                                       "API requests that waited for the client-side rate limit (--kube-api-qps).")),
      api_throttled_seconds_total_(MakeCounter(registry, "meshwork_operator_api_throttled_seconds_total",
                                               "Seconds API requests waited for the client-side rate limit.")),
      info_(prometheus::BuildGauge()
                .Name("meshwork_operator_info")
                .Help("Always 1; the labels describe the operator build.")
                .Register(registry)) {
  for (const char* phase : kJobPhases) phase_series_[phase] = &jobs_.Add({{"phase", phase}});
  info_.Add({{"version", version}}).Set(1);
}

void OperatorMetrics::ObserveReconcile(ReconcileResult result, double seconds) {
  reconcile_total_.Add({{"result", ReconcileResultName(result)}}).Increment();
  reconcile_duration_seconds_.Observe(seconds);
}

void OperatorMetrics::CountError(ReconcileErrorReason reason) {
  reconcile_errors_total_.Add({{"reason", ReconcileErrorReasonName(reason)}}).Increment();
}

void OperatorMetrics::SetJobsByPhase(const std::map<std::string, int64_t>& counts) {
  std::lock_guard<std::mutex> lock(phase_mu_);
  for (auto& [phase, gauge] : phase_series_) {
    auto it = counts.find(phase);
    gauge->Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
  for (const auto& [phase, n] : counts) {
    if (phase_series_.count(phase)) continue;
    prometheus::Gauge* g = &jobs_.Add({{"phase", phase}});
    g->Set(static_cast<double>(n));
    phase_series_[phase] = g;
  }
}

void OperatorMetrics::PodCreated() { pods_created_total_.Increment(); }
void OperatorMetrics::PodDeleted() { pods_deleted_total_.Increment(); }
void OperatorMetrics::SetLeader(bool leading) { leader_.Set(leading ? 1.0 : 0.0); }
void OperatorMetrics::Throttled(double seconds) {
  api_throttled_total_.Increment();
  api_throttled_seconds_total_.Increment(seconds);
}

void OperatorMetrics::SetWorkQueueDepth(size_t depth) { workqueue_depth_.Set(static_cast<double>(depth)); }
void OperatorMetrics::WorkQueueAdded() { workqueue_adds_total_.Increment(); }
void OperatorMetrics::WorkQueueRetried() { workqueue_retries_total_.Increment(); }
void OperatorMetrics::ObserveQueueDuration(double seconds) { workqueue_queue_duration_seconds_.Observe(seconds); }
void OperatorMetrics::ObserveWorkDuration(double seconds) { workqueue_work_duration_seconds_.Observe(seconds); }

void OperatorMetrics::InstrumentWorkQueue(k8s::WorkQueueOptions* options) {
  options->on_depth = [this](size_t depth) { SetWorkQueueDepth(depth); };
  options->on_add = [this] { WorkQueueAdded(); };
  options->on_retry = [this] { WorkQueueRetried(); };
  options->on_queue_latency = [this](double s) { ObserveQueueDuration(s); };
  options->on_work_duration = [this](double s) { ObserveWorkDuration(s); };
}

}  // namespace meshwork::runtime
