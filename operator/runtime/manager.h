// The operator process's wiring, as controller-runtime's Manager: given options, it owns the API
// clients, the metrics server with /healthz and /readyz, the operator metrics, the Event
// recorder, the TrainingJob controller and the leader elector; starts them in order, waits for
// SIGTERM/SIGINT or the loss of leadership, and stops them in reverse (docs/operator.md, "What it
// does at start").
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "metrics/exposer.h"
#include "operator/controller/controller.h"
#include "operator/k8s/client.h"
#include "operator/k8s/config.h"
#include "operator/runtime/events.h"
#include "operator/runtime/health.h"
#include "operator/runtime/leader_election.h"
#include "operator/runtime/operator_metrics.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace meshwork::runtime {

struct ManagerOptions {
  std::string kubeconfig;  // "" = in a Pod the service account, else $KUBECONFIG or ~/.kube/config
  std::string version;     // meshwork_operator_info and the start line
  std::string metrics_bind_address = "0.0.0.0:8080";  // /metrics, /healthz and /readyz
  // The API client's limit (k8s::ClientOptions::qps, burst): 0 = none. The leader election's
  // own client is never limited, so a burst of reconciles cannot delay a renewal.
  double kube_api_qps = 0;
  int kube_api_burst = 0;
  op::ControllerOptions controller;  // namespace, workers, reconciler options
  // Campaign for the Lease before reconciling; without it, reconcile at once (one replica only).
  bool leader_elect = true;
  LeaderElectionOptions leader_election;  // its identity "" = DefaultIdentity()
  std::chrono::milliseconds event_flush_timeout{5000};  // queued Events sent at shutdown
  // Where the process logs, one line each; nullptr = std::cerr with a UTC timestamp.
  std::function<void(const std::string&)> log;
};

// Why Run() returned.
// A lost Lease is not one: the replica stops acting and campaigns again (Run() goes on).
enum class StopReason {
  kSignal,  // SIGTERM or SIGINT
};

class Manager {
 public:
  // Blocks SIGTERM and SIGINT (the main thread waits for them; call this before any other thread
  // starts), loads the kubeconfig, builds every component and starts serving /metrics, /healthz
  // and /readyz. InvalidConfig for a bad kubeconfig, client or leader-election option; the
  // metrics server's error (InvalidConfig, Unavailable) when it cannot serve. Each error is
  // logged.
  static Result<std::unique_ptr<Manager>> Create(ManagerOptions options);
  ~Manager();  // Stop()
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Starts the informers and waits until their caches are synced, then campaigns for the Lease
  // (or starts the workers at once), and waits for a signal or the loss of leadership; then
  // stops. A signal while waiting for the caches stops at once.
  StopReason Run();
  // Stops in reverse: the workers (reconciles in flight finish), the elector (the Lease is
  // released), then the Events still queued are sent. Idempotent.
  void Stop();

 private:
  explicit Manager(ManagerOptions options);
  // Create's work, in start order; each error is logged.
  Status Build();
  void BuildController();
  Status BuildElector(const k8s::Config& config);
  // Logs "operator: <what><message>" and returns `s`.
  Status Failed(const Status& s, const std::string& what = "") const;
  void Log(const std::string& line) const;
  // Beats the liveness heartbeat and waits up to a second for SIGTERM/SIGINT; the signal or 0.
  int WaitForSignal();

  ManagerOptions options_;
  sigset_t signals_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<k8s::Client> lease_client_;  // leader election only: short timeout, no retries
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<OperatorMetrics> metrics_;
  Heartbeat heartbeat_{std::chrono::seconds(30)};
  HealthChecks health_;
  std::unique_ptr<EventRecorder> recorder_;
  std::unique_ptr<op::Controller> controller_;
  std::unique_ptr<LeaderElector> elector_;
  std::atomic<bool> leadership_lost_{false};
  bool stopped_ = false;
  // Last: destroyed first, since its handlers read health_ and the controller.
  std::unique_ptr<metrics::MetricsServer> server_;
};

}  // namespace meshwork::runtime
