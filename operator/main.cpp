// meshwork-operator: reconciles TrainingJobs (docs/trainingjob.md) into gangs of Pods.
//
//   meshwork-operator [--kubeconfig PATH] [--namespace NS] [--metrics-bind-address HOST:PORT]
//                     [--leader-elect true|false] [--leader-election-namespace NS]
//                     [--leader-election-id NAME] [--identity ID] [--lease-duration-s N]
//                     [--renew-deadline-s N] [--retry-period-s N] [--workers N]
//                     [--report-interval-s N] [--pod-delete-grace-s N]
//                     [--kube-api-qps X] [--kube-api-burst N]
//
// Exit codes (docs/operator.md): 0 after SIGTERM/SIGINT (the lease is released first; a lost
// lease does not end the process: it stops reconciling and campaigns again), 2 for a bad flag, kubeconfig or
// leader-election timing, 5 when the metrics address cannot be bound. runtime::Manager
// (operator/runtime/manager.h) owns the process's components; this file parses the flags.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "operator/runtime/manager.h"

namespace {

using namespace meshwork;

constexpr const char* kVersion = "0.1.0";

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
  double kube_api_qps = 0;  // 0: no client-side limit
  int kube_api_burst = 0;   // 0: 1.5 x qps
};

constexpr const char* kUsage =
    "usage: meshwork-operator [--kubeconfig PATH] [--namespace NS] [--metrics-bind-address HOST:PORT]\n"
    "                         [--leader-elect true|false] [--leader-election-namespace NS]\n"
    "                         [--leader-election-id NAME] [--identity ID] [--lease-duration-s N]\n"
    "                         [--renew-deadline-s N] [--retry-period-s N] [--workers N]\n"
    "                         [--report-interval-s N] [--pod-delete-grace-s N]\n"
    "                         [--kube-api-qps X] [--kube-api-burst N]\n"
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

// Requests a second: a number in [0, 100000]; 0 turns the client-side limit off.
Status ParseQps(const std::string& value, double* out) {
  try {
    size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size() && v >= 0 && v <= 100000) {
      *out = v;
      return Status::Ok();
    }
  } catch (const std::exception&) {
  }
  return InvalidConfig("flag --kube-api-qps: \"" + value + "\" is not a number in [0, 100000] (requests a second; 0: no limit)");
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
    } else if (flag == "--kube-api-qps") {
      MW_ASSIGN_OR_RETURN(auto v, next());
      MW_RETURN_IF_ERROR(ParseQps(v, &f.kube_api_qps));
    } else {
      std::map<std::string, std::pair<int*, std::pair<int, int>>> ints = {
          {"--lease-duration-s", {&f.lease_duration_s, {1, 3600}}},
          {"--renew-deadline-s", {&f.renew_deadline_s, {1, 3600}}},
          {"--retry-period-s", {&f.retry_period_s, {1, 600}}},
          {"--workers", {&f.workers, {1, 256}}},
          {"--report-interval-s", {&f.report_interval_s, {1, 3600}}},
          {"--pod-delete-grace-s", {&f.pod_delete_grace_s, {0, 3600}}},
          {"--kube-api-burst", {&f.kube_api_burst, {1, 100000}}},
      };
      auto it = ints.find(flag);
      if (it == ints.end()) return InvalidConfig("unknown flag \"" + args[i] + "\"");
      MW_ASSIGN_OR_RETURN(auto v, next());
      MW_RETURN_IF_ERROR(ParseInt(flag, v, it->second.second.first, it->second.second.second, it->second.first));
    }
  }
  if (f.kube_api_burst > 0 && f.kube_api_qps <= 0) {
    return InvalidConfig("flag --kube-api-burst: " + std::to_string(f.kube_api_burst) +
                         " without --kube-api-qps: a burst limits nothing when requests are not limited");
  }
  if (f.lease_namespace.empty()) {
    const char* pod_ns = std::getenv("POD_NAMESPACE");
    f.lease_namespace = pod_ns && *pod_ns ? pod_ns : "default";
  }
  return f;
}

runtime::ManagerOptions OptionsFrom(const Flags& flags) {
  runtime::ManagerOptions o;
  o.kubeconfig = flags.kubeconfig;
  o.version = kVersion;
  o.metrics_bind_address = flags.metrics_bind;
  o.kube_api_qps = flags.kube_api_qps;
  o.kube_api_burst = flags.kube_api_burst;
  o.controller.ns = flags.ns;
  o.controller.workers = flags.workers;
  o.controller.reconciler.report_interval = std::chrono::seconds(flags.report_interval_s);
  if (flags.pod_delete_grace_s >= 0) o.controller.reconciler.pod_delete_grace_seconds = flags.pod_delete_grace_s;
  o.leader_elect = flags.leader_elect;
  o.leader_election.lease_namespace = flags.lease_namespace;
  o.leader_election.lease_name = flags.lease_name;
  o.leader_election.identity = flags.identity;
  o.leader_election.lease_duration = std::chrono::seconds(flags.lease_duration_s);
  o.leader_election.renew_deadline = std::chrono::seconds(flags.renew_deadline_s);
  o.leader_election.retry_period = std::chrono::seconds(flags.retry_period_s);
  return o;
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
  // Before any thread starts: the manager blocks SIGTERM and SIGINT for all of them.
  auto manager = runtime::Manager::Create(OptionsFrom(*flags));
  if (!manager.ok()) return ExitCodeFor(manager.status().code());  // logged by the manager
  switch ((*manager)->Run()) {
    case runtime::StopReason::kSignal: return exit_code::kOk;
  }
  return exit_code::kRuntime;
}
