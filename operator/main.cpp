// meshwork-operator: reconciles TrainingJobs (docs/trainingjob.md) into gangs of Pods.
//
//   meshwork-operator [--kubeconfig PATH] [--namespace NS] [--metrics-bind-address HOST:PORT]
//                     [--leader-elect true|false] [--leader-election-namespace NS]
//                     [--leader-election-id NAME] [--identity ID] [--lease-duration-s N]
//                     [--renew-deadline-s N] [--retry-period-s N] [--workers N]
//                     [--report-interval-s N] [--pod-delete-grace-s N]
//
// Exit codes: 0 after SIGTERM/SIGINT (the lease is released first), 1 when leadership was lost
// (a supervisor restarts it as a standby), 2 for a bad flag or kubeconfig, 5 when the metrics
// address cannot be bound.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <prometheus/registry.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/exposer.h"
#include "operator/controller/controller.h"
#include "operator/controller/decide.h"
#include "operator/controller/spec.h"
#include "operator/k8s/client.h"
#include "operator/k8s/config.h"
#include "operator/runtime/events.h"
#include "operator/runtime/health.h"
#include "operator/runtime/leader_election.h"
#include "operator/runtime/operator_metrics.h"

namespace {

using namespace meshwork;

constexpr const char* kVersion = "0.1.0";

std::mutex log_mu;

void Log(const std::string& line) {
  std::lock_guard<std::mutex> lock(log_mu);
  std::cerr << op::FormatTime(std::chrono::system_clock::now()) << " " << line << std::endl;
}

struct Flags {
  std::string kubeconfig;
  std::string ns;
  std::string metrics_bind = "0.0.0.0:8080";
  bool leader_elect = true;
  std::string lease_namespace;
  std::string lease_name = "meshwork-operator";
  std::string identity;
  int lease_duration_s = 15;
  int renew_deadline_s = 10;
  int retry_period_s = 2;
  int workers = 4;
  int report_interval_s = 10;
  int pod_delete_grace_s = -1;
};

constexpr const char* kUsage =
    "usage: meshwork-operator [--kubeconfig PATH] [--namespace NS] [--metrics-bind-address HOST:PORT]\n"
    "                         [--leader-elect true|false] [--leader-election-namespace NS]\n"
    "                         [--leader-election-id NAME] [--identity ID] [--lease-duration-s N]\n"
    "                         [--renew-deadline-s N] [--retry-period-s N] [--workers N]\n"
    "                         [--report-interval-s N] [--pod-delete-grace-s N]\n"
    "Reconciles meshwork.dev/v1alpha1 TrainingJobs; see docs/trainingjob.md and docs/operator.md.\n";

Status ParseInt(const std::string& flag, const std::string& value, int lo, int hi, int* out) {
  try {
    size_t used = 0;
    const long v = std::stol(value, &used);
    if (used == value.size() && v >= lo && v <= hi) {
      *out = static_cast<int>(v);
      return Status::Ok();
    }
  } catch (const std::exception&) {
  }
  return InvalidConfig("flag " + flag + ": \"" + value + "\" is not an integer in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
}

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    const bool inline_value = flag.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (flag == "--help" || flag == "-h") return InvalidConfig("help");
    if (flag == "--version") return InvalidConfig("version");
    auto next = [&]() -> Result<std::string> {
      if (inline_value) return value;
      if (i + 1 >= args.size()) return InvalidConfig("flag " + flag + " needs a value");
      return args[++i];
    };
    if (flag == "--kubeconfig") {
      MW_ASSIGN_OR_RETURN(f.kubeconfig, next());
    } else if (flag == "--namespace") {
      MW_ASSIGN_OR_RETURN(f.ns, next());
    } else if (flag == "--metrics-bind-address") {
      MW_ASSIGN_OR_RETURN(f.metrics_bind, next());
    } else if (flag == "--leader-elect") {
      MW_ASSIGN_OR_RETURN(auto v, next());
      if (v != "true" && v != "false") return InvalidConfig("flag --leader-elect: \"" + v + "\" is not true or false");
      f.leader_elect = v == "true";
    } else if (flag == "--leader-election-namespace") {
      MW_ASSIGN_OR_RETURN(f.lease_namespace, next());
    } else if (flag == "--leader-election-id") {
      MW_ASSIGN_OR_RETURN(f.lease_name, next());
    } else if (flag == "--identity") {
      MW_ASSIGN_OR_RETURN(f.identity, next());
    } else {
      std::map<std::string, std::pair<int*, std::pair<int, int>>> ints = {
          {"--lease-duration-s", {&f.lease_duration_s, {1, 3600}}},
          {"--renew-deadline-s", {&f.renew_deadline_s, {1, 3600}}},
          {"--retry-period-s", {&f.retry_period_s, {1, 600}}},
          {"--workers", {&f.workers, {1, 256}}},
          {"--report-interval-s", {&f.report_interval_s, {1, 3600}}},
          {"--pod-delete-grace-s", {&f.pod_delete_grace_s, {0, 3600}}},
      };
      auto it = ints.find(flag);
      if (it == ints.end()) return InvalidConfig("unknown flag \"" + args[i] + "\"");
      MW_ASSIGN_OR_RETURN(auto v, next());
      MW_RETURN_IF_ERROR(ParseInt(flag, v, it->second.second.first, it->second.second.second, it->second.first));
    }
  }
  if (f.lease_namespace.empty()) {
    const char* pod_ns = std::getenv("POD_NAMESPACE");
    f.lease_namespace = pod_ns && *pod_ns ? pod_ns : "default";
  }
  return f;
}

runtime::ReconcileResult ResultOf(const op::ReconcileOutcome& o) {
  if (!o.ok) return runtime::ReconcileResult::kError;
  return o.requeue_after ? runtime::ReconcileResult::kRequeue : runtime::ReconcileResult::kSuccess;
}

runtime::ReconcileErrorReason ReasonOf(const std::string& r) {
  if (r == "conflict") return runtime::ReconcileErrorReason::kConflict;
  if (r == "api") return runtime::ReconcileErrorReason::kApi;
  return runtime::ReconcileErrorReason::kOther;
}

int Run(const Flags& flags) {
  // Signals go to the main thread's sigtimedwait only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto config = flags.kubeconfig.empty() ? k8s::AutoConfig() : k8s::LoadKubeconfig(flags.kubeconfig);
  if (!config.ok()) {
    Log("operator: " + config.error().ToString());
    return exit_code::kConfig;
  }
  auto client = k8s::Client::FromConfig(*config);
  if (!client.ok()) {
    Log("operator: " + client.error().ToString());
    return exit_code::kConfig;
  }

  auto server = metrics::MetricsServer::Start(flags.metrics_bind);
  if (!server.ok()) {
    Log("operator: --metrics-bind-address: " + server.status().message());
    return ExitCodeFor(server.status().code());
  }
  runtime::OperatorMetrics metrics(*(*server)->registry(), kVersion);
  runtime::HealthChecks health;
  runtime::Heartbeat heartbeat(std::chrono::seconds(30));
  health.AddLivenessCheck("main-loop", [&heartbeat] { return heartbeat.Check(); });

  runtime::EventRecorderOptions event_options;
  event_options.log = [](const std::string& line) { Log("events: " + line); };
  runtime::EventRecorder recorder(client->get(), event_options);

  op::ControllerOptions options;
  options.ns = flags.ns;
  options.workers = flags.workers;
  options.reconciler.report_interval = std::chrono::seconds(flags.report_interval_s);
  if (flags.pod_delete_grace_s >= 0) options.reconciler.pod_delete_grace_seconds = flags.pod_delete_grace_s;
  metrics.InstrumentWorkQueue(&options.queue);

  op::ControllerHooks hooks;
  hooks.reconciler.log = [](const std::string& line) { Log("reconcile " + line); };
  hooks.reconciler.pod_created = [&metrics] { metrics.PodCreated(); };
  hooks.reconciler.pod_deleted = [&metrics] { metrics.PodDeleted(); };
  hooks.reconciler.record_event = [&recorder](const nlohmann::json& job, const op::EventToRecord& ev) {
    recorder.Record(runtime::ReferenceTo(job),
                    ev.type == "Warning" ? runtime::EventType::kWarning : runtime::EventType::kNormal, ev.reason,
                    ev.message);
  };
  hooks.observe_reconcile = [&metrics](const op::ReconcileOutcome& o, double seconds) {
    metrics.ObserveReconcile(ResultOf(o), seconds);
    if (!o.ok) metrics.CountError(ReasonOf(o.error_reason));
    if (o.invalid_spec) metrics.CountError(runtime::ReconcileErrorReason::kInvalidSpec);
  };
  hooks.jobs_by_phase = [&metrics](const std::map<std::string, int>& counts) {
    std::map<std::string, int64_t> c(counts.begin(), counts.end());
    metrics.SetJobsByPhase(c);
  };
  op::Controller controller(client->get(), options, hooks);
  health.AddReadinessCheck("informers", [&controller] { return controller.NotSyncedReason(); });
  if (Status s = health.Install(**server); !s.ok()) {
    Log("operator: " + s.message());
    return ExitCodeFor(s.code());
  }
  Log("operator " + std::string(kVersion) + ": API server " + config->server + " (" + config->source +
      "), namespace " +
      (flags.ns.empty() ? std::string("(all)") : flags.ns) + ", metrics http://" + flags.metrics_bind +
      "/metrics (port " + std::to_string((*server)->port()) + ")");
  controller.StartInformers();
  // Workers must never act on a partial cache: a Pod not listed yet would look deleted. While
  // waiting, stay live and answer signals.
  for (int waited = 0; !controller.HasSynced(); ++waited) {
    heartbeat.Beat();
    timespec wait{1, 0};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) {
      Log("operator: signal while waiting for caches: shutting down");
      controller.Stop();
      return exit_code::kOk;
    }
    if (waited % 10 == 9) Log("operator: waiting for caches: " + controller.NotSyncedReason());
  }

  std::atomic<bool> lost{false};
  std::unique_ptr<k8s::Client> elector_client;
  std::unique_ptr<runtime::LeaderElector> elector;
  if (flags.leader_elect) {
    runtime::LeaderElectionOptions le;
    le.lease_namespace = flags.lease_namespace;
    le.lease_name = flags.lease_name;
    le.identity = flags.identity.empty() ? runtime::DefaultIdentity() : flags.identity;
    le.lease_duration = std::chrono::seconds(flags.lease_duration_s);
    le.renew_deadline = std::chrono::seconds(flags.renew_deadline_s);
    le.retry_period = std::chrono::seconds(flags.retry_period_s);
    le.log = [](const std::string& line) { Log("leader election: " + line); };
    runtime::LeaderElectionCallbacks cb;
    cb.on_leader_gauge = [&metrics](bool leading) { metrics.SetLeader(leading); };
    cb.on_started_leading = [&controller, identity = le.identity] {
      Log("leader election: " + identity + " leads; starting the workers");
      controller.StartWorkers();
    };
    cb.on_stopped_leading = [&lost] { lost = true; };
    cb.on_new_leader = [](const std::string& id) { Log("leader election: the leader is " + id); };
    // Its own client, with a request timeout well under the renew deadline: a renewal stuck
    // in a slow request must fail in time for the next try, not hold leadership hostage.
    k8s::ClientOptions lease_client_options;
    lease_client_options.request_timeout = std::max(std::chrono::milliseconds(500), le.renew_deadline / 3);
    lease_client_options.max_retries = 0;
    auto lease_client = k8s::Client::FromConfig(*config, lease_client_options);
    if (!lease_client.ok()) {
      Log("operator: " + lease_client.error().ToString());
      return exit_code::kConfig;
    }
    elector_client = std::move(*lease_client);
    auto created = runtime::LeaderElector::Create(elector_client.get(), le, cb);
    if (!created.ok()) {
      Log("operator: " + created.status().message());
      return exit_code::kConfig;
    }
    elector = std::move(*created);
    // A replica that has just lost the lease must not write while main notices.
    controller.SetMayReconcile([e = elector.get()] { return e->IsLeader(); });
    elector->Start();
  } else {
    metrics.SetLeader(true);
    controller.StartWorkers();
  }

  int exit_code = 0;
  while (true) {
    heartbeat.Beat();
    timespec wait{1, 0};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) {
      Log(std::string("operator: ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") + ": shutting down");
      break;
    }
    if (lost) {
      Log("operator: leadership lost; exiting so that a supervisor restarts this replica as a standby");
      exit_code = 1;
      break;
    }
  }
  controller.Stop();  // finishes the reconciles in flight
  if (elector) elector->Stop();  // releases the lease: a standby takes over at once
  recorder.Flush(std::chrono::seconds(5));
  Log("operator: stopped");
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    if (flags.status().message() == "help") {
      std::cout << kUsage;
      return exit_code::kOk;
    }
    if (flags.status().message() == "version") {
      std::cout << "meshwork-operator " << kVersion << "\n";
      return exit_code::kOk;
    }
    std::cerr << "meshwork-operator: " << flags.status().message() << "\n" << kUsage;
    return exit_code::kConfig;
  }
  return Run(*flags);
}
