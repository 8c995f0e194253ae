#include "operator/runtime/manager.h"

#include <pthread.h>

#include <algorithm>
#include <ctime>
#include <iostream>
#include <map>
#include <mutex>

#include "operator/controller/decide.h"

namespace meshwork::runtime {
namespace {

// One line on stderr, after a UTC timestamp; lines of different threads never interleave.
std::function<void(const std::string&)> StderrLog() {
  auto mu = std::make_shared<std::mutex>();
  return [mu](const std::string& line) {
    std::lock_guard<std::mutex> lock(*mu);
    std::cerr << op::FormatTime(std::chrono::system_clock::now()) << " " << line << std::endl;
  };
}

ReconcileResult ResultOf(const op::ReconcileOutcome& o) {
  if (!o.ok) return ReconcileResult::kError;
  return o.requeue_after ? ReconcileResult::kRequeue : ReconcileResult::kSuccess;
}

ReconcileErrorReason ReasonOf(const std::string& r) {
  if (r == "conflict") return ReconcileErrorReason::kConflict;
  if (r == "api") return ReconcileErrorReason::kApi;
  return ReconcileErrorReason::kOther;
}

}  // namespace

Result<std::unique_ptr<Manager>> Manager::Create(ManagerOptions options) {
  if (!options.log) options.log = StderrLog();
  std::unique_ptr<Manager> manager(new Manager(std::move(options)));
  MW_RETURN_IF_ERROR(manager->Build());
  return manager;
}

Manager::Manager(ManagerOptions options) : options_(std::move(options)) {
  // Signals go to the main thread's sigtimedwait only: blocked before any thread starts.
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

Manager::~Manager() { Stop(); }

void Manager::Log(const std::string& line) const { options_.log(line); }

Status Manager::Build() {
  auto config = options_.kubeconfig.empty() ? k8s::AutoConfig() : k8s::LoadKubeconfig(options_.kubeconfig);
  // Any kubeconfig or client problem is the configuration's (exit 2), whatever its kind.
  if (!config.ok()) return Failed(InvalidConfig(config.error().ToString()));
  k8s::ClientOptions client_options;
  client_options.qps = options_.kube_api_qps;
  client_options.burst = options_.kube_api_burst;
  // Requests start after Build, when metrics_ is set.
  client_options.on_throttled = [this](double seconds) {
    if (metrics_) metrics_->Throttled(seconds);
  };
  auto client = k8s::Client::FromConfig(*config, client_options);
  if (!client.ok()) return Failed(InvalidConfig(client.error().ToString()));
  client_ = std::move(*client);

  // /metrics first: the other components register their series in its registry.
  auto server = metrics::MetricsServer::Start(options_.metrics_bind_address);
  if (!server.ok()) return Failed(server.status(), "--metrics-bind-address: ");
  server_ = std::move(*server);
  registry_ = server_->registry();
  metrics_ = std::make_unique<OperatorMetrics>(*registry_, options_.version);
  health_.AddLivenessCheck("main-loop", [this] { return heartbeat_.Check(); });

  EventRecorderOptions event_options;
  event_options.log = [this](const std::string& line) { Log("events: " + line); };
  recorder_ = std::make_unique<EventRecorder>(client_.get(), event_options);
  BuildController();
  health_.AddReadinessCheck("informers", [this] { return controller_->NotSyncedReason(); });
  if (Status s = health_.Install(*server_); !s.ok()) return Failed(s);
  if (options_.leader_elect) MW_RETURN_IF_ERROR(BuildElector(*config));

  const std::string& ns = options_.controller.ns;
  Log("operator " + options_.version + ": API server " + config->server + " (" + config->source + "), namespace " +
      (ns.empty() ? std::string("(all)") : ns) + ", metrics http://" + options_.metrics_bind_address +
      "/metrics (port " + std::to_string(server_->port()) + ")");
  return Status::Ok();
}

void Manager::BuildController() {
  op::ControllerOptions controller_options = options_.controller;
  metrics_->InstrumentWorkQueue(&controller_options.queue);
  op::ControllerHooks hooks;
  hooks.reconciler.log = [this](const std::string& line) { Log("reconcile " + line); };
  hooks.reconciler.pod_created = [this] { metrics_->PodCreated(); };
  hooks.reconciler.pod_deleted = [this] { metrics_->PodDeleted(); };
  hooks.reconciler.record_event = [this](const nlohmann::json& job, const op::EventToRecord& ev) {
    recorder_->Record(ReferenceTo(job), ev.type == "Warning" ? EventType::kWarning : EventType::kNormal, ev.reason,
                      ev.message);
  };
  hooks.observe_reconcile = [this](const op::ReconcileOutcome& o, double seconds) {
    metrics_->ObserveReconcile(ResultOf(o), seconds);
    if (!o.ok) metrics_->CountError(ReasonOf(o.error_reason));
    if (o.invalid_spec) metrics_->CountError(ReconcileErrorReason::kInvalidSpec);
  };
  hooks.jobs_by_phase = [this](const std::map<std::string, int>& counts) {
    metrics_->SetJobsByPhase(std::map<std::string, int64_t>(counts.begin(), counts.end()));
  };
  controller_ = std::make_unique<op::Controller>(client_.get(), controller_options, hooks);
}

Status Manager::BuildElector(const k8s::Config& config) {
  LeaderElectionOptions le = options_.leader_election;
  if (le.identity.empty()) le.identity = DefaultIdentity();
  le.log = [this](const std::string& line) { Log("leader election: " + line); };
  LeaderElectionCallbacks cb;
  cb.on_leader_gauge = [this](bool leading) { metrics_->SetLeader(leading); };
  cb.on_started_leading = [this, identity = le.identity] {
    Log("leader election: " + identity + " leads; starting the workers (every job queued)");
    controller_->StartWorkers();
  };
  cb.on_stopped_leading = [this] { leadership_lost_ = true; };
  cb.on_new_leader = [this](const std::string& id) { Log("leader election: the leader is " + id); };
  // Its own client, with a request timeout well under the renew deadline: a renewal stuck in a
  // slow request must fail in time for the next try, not hold leadership hostage.
  k8s::ClientOptions lease_client_options;
  lease_client_options.request_timeout = std::max(std::chrono::milliseconds(500), le.renew_deadline / 3);
  lease_client_options.max_retries = 0;
  auto lease_client = k8s::Client::FromConfig(config, lease_client_options);
  if (!lease_client.ok()) return Failed(InvalidConfig(lease_client.error().ToString()));
  lease_client_ = std::move(*lease_client);
  auto elector = LeaderElector::Create(lease_client_.get(), le, cb);
  if (!elector.ok()) return Failed(elector.status());
  elector_ = std::move(*elector);
  return Status::Ok();
}

Status Manager::Failed(const Status& s, const std::string& what) const {
  Log("operator: " + what + s.message());
  return s;
}

int Manager::WaitForSignal() {
  heartbeat_.Beat();
  timespec wait{1, 0};
  return sigtimedwait(&signals_, nullptr, &wait);
}

StopReason Manager::Run() {
  // Workers must never act on a partial cache: a Pod not listed yet would look deleted. While
  // waiting, stay live and answer signals.
  controller_->StartInformers();
  for (int waited = 0; !controller_->HasSynced(); ++waited) {
    const int sig = WaitForSignal();
    if (sig == SIGTERM || sig == SIGINT) {
      Log("operator: signal while waiting for caches: shutting down");
      Stop();
      return StopReason::kSignal;
    }
    if (waited % 10 == 9) Log("operator: waiting for caches: " + controller_->NotSyncedReason());
  }

  if (elector_) {
    // A replica that has just lost the lease must not write while Run notices.
    controller_->SetMayReconcile([e = elector_.get()] { return e->IsLeader(); });
    elector_->Start();  // the workers start when this replica leads
  } else {
    metrics_->SetLeader(true);
    controller_->StartWorkers();
  }

  while (true) {
    const int sig = WaitForSignal();
    if (sig == SIGTERM || sig == SIGINT) {
      Log(std::string("operator: ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") + ": shutting down");
      break;
    }
    if (leadership_lost_.exchange(false)) {
      // A lost Lease stops the acting, not the process: the workers skip every reconcile while
      // IsLeader() is false, the caches stay warm, and the elector campaigns again. After an
      // API-server outage the Lease is still ours, so this replica takes it back at the first
      // try once the server answers; after a takeover it is a standby.
      Log("operator: leadership lost; standing by (no reconciles) and campaigning again");
      elector_->Start();
    }
  }
  Stop();
  Log("operator: stopped");
  return StopReason::kSignal;
}

void Manager::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // The workers started last (when leading), so they stop first: the reconciles in flight
  // finish before the Lease is released, and a standby that takes over never overlaps them.
  if (controller_) controller_->Stop();
  if (elector_) elector_->Stop();  // releases the lease: a standby takes over at once
  if (recorder_) recorder_->Flush(options_.event_flush_timeout);
}

}  // namespace meshwork::runtime
