// The node agent's parts (docs/controlplane-agent.md): nodes and resource quantities, and a
// runtime that runs each Pod's containers as local processes in the Pod's own network namespace
// (pod_network.h; else with their own loopback address) with per-pod name resolution. JSON Pod objects in, status JSON out: the Kubelet (kubelet.h) connects
// them to the API server.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/quantity.h"
#include "common/status.h"
#include "controlplane/agent/pod_network.h"

namespace meshwork::controlplane::agent {

// ---- nodes and quantities ------------------------------------------------------------------

// Kubernetes resource quantities: common/quantity.h.
using meshwork::ParseBytes;
using meshwork::ParseCpu;

struct NodeConfig {
  std::string name;
  double cpu = 0;            // cores
  int64_t memory_bytes = 0;
  int64_t gpus = 0;          // nvidia.com/gpu
  std::map<std::string, std::string> labels;  // plus kubernetes.io/hostname=<name>, always
};

// Parses a nodes config, YAML or JSON: a list of nodes, or a map with a "nodes" list. Each node:
//   name: gpu-0          (required, a DNS-1123 label, unique)
//   cpu: "4" | 4 | 500m  (default: this machine's cores)
//   memory: 8Gi          (default: this machine's memory)
//   nvidia.com/gpu: 2    (default 0)
//   labels: {k: v}       (optional, for spec.nodeSelector)
// Errors name the node, the field and the value. An empty list is an error.
Result<std::vector<NodeConfig>> ParseNodes(const std::string& text);
// One node "local" with this machine's online cores and physical memory, and 0 GPUs.
NodeConfig DefaultNode();
// The Node object the API serves for a config (capacity = allocatable, Ready, 127.0.0.1).
nlohmann::json NodeObject(const NodeConfig& node);

// ---- requests ----------------------------------------------------------------------------

// What a container asks for (a limit stands in for an absent request, as in Kubernetes); the
// runtime hands out GPUs by it (internal::ContainerRequests).
struct PodRequests {
  double cpu = 0;
  int64_t memory_bytes = 0;
  std::map<std::string, int64_t> extended;  // "nvidia.com/gpu" and any other extended resource
};

// ---- names ---------------------------------------------------------------------------------

// The names a headless Service gives the pods it governs: for every Service with
// spec.clusterIP "None" and every pod in its namespace whose spec.subdomain is the Service's name
// and which has status.podIP: "<hostname>.<service>.<namespace>.svc" -> podIP (hostname:
// spec.hostname, else metadata.name). Pass the result to PodRuntime::SetHosts.
std::map<std::string, std::string> HeadlessServiceHosts(const std::vector<nlohmann::json>& pods,
                                                        const std::vector<nlohmann::json>& services);

// The same, built a Service and a Pod at a time (from a cache, without copying it): every
// Service first, then every Pod.
class HeadlessServiceHostsBuilder {
 public:
  void AddService(const nlohmann::json& service);
  void AddPod(const nlohmann::json& pod);
  std::map<std::string, std::string> Take() { return std::move(hosts_); }

 private:
  std::set<std::pair<std::string, std::string>> headless_;  // (namespace, name)
  std::map<std::string, std::string> hosts_;
};

// ---- the runtime ---------------------------------------------------------------------------

// How pods' processes resolve the names given to SetHosts (docs/controlplane-agent.md).
enum class Resolution {
  kAuto,            // kMountNamespace when this process may create one, else kPreload
  kMountNamespace,  // a private mount + UTS namespace per container, a per-pod /etc/hosts bind-mounted
  kPreload,         // LD_PRELOAD of meshwork_cp_hosts_preload.so reading MESHWORK_HOSTS_FILE
  kNone,            // nothing: pods only get their IP and a hosts file path in the env
};
const char* ResolutionName(Resolution r);

// Reads a ConfigMap's or Secret's data for env references (configMapKeyRef, secretKeyRef) and
// volumes (configMap, secret): (kind "ConfigMap" or "Secret", namespace, name) -> key -> value
// (a ConfigMap's binaryData and a Secret's data decoded), or an error that becomes the
// container's CreateContainerConfigError message.
using DataSource = std::function<Result<std::map<std::string, std::string>>(
    const std::string& kind, const std::string& ns, const std::string& name)>;

// What a Pod's service-account directory holds (docs/controlplane-agent.md): in a cluster kubelet
// mounts these at /var/run/secrets/kubernetes.io/serviceaccount; here all Pods share one
// filesystem, so each gets its own directory, named by MESHWORK_SERVICE_ACCOUNT_DIR.
struct ServiceAccountCredentials {
  std::string token;   // the control plane's bearer token (file "token", mode 0600)
  std::string ca_pem;  // the serving CA (file "ca.crt"); empty with --insecure-http
};

struct RuntimeOptions {
  std::string state_dir;            // per-pod logs and hosts files live under <state_dir>/pods/<uid>/
  int grace_seconds_default = 30;   // when neither Stop nor spec.terminationGracePeriodSeconds says
  std::chrono::milliseconds restart_backoff_initial{10000};  // 0, 10s, 20s, 40s, ... as kubelet
  std::chrono::milliseconds restart_backoff_max{300000};
  Resolution resolution = Resolution::kAuto;
  std::string preload_library;      // kPreload: the shim; empty = $MESHWORK_HOSTS_PRELOAD or the built one
  std::string first_pod_ip;         // e.g. "127.1.0.2"; empty = a random start (pods get 127.1-254.x.1-254)
  std::string host_ip = "127.0.0.1";  // status.hostIP
  std::string cluster_domain = "cluster.local";
  bool inherit_environment = true;  // start containers from this process' environment (PATH, HOME, ...)
  std::map<std::string, std::string> extra_env;  // added to every container (e.g. KUBERNETES_SERVICE_HOST)
  // nvidia.com/gpu of each node, by name. As NVIDIA's device plugin does, a container that asks
  // for N GPUs gets N devices of its Pod's node that no running container holds, named by
  // CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES ("0,1"); a container that asks for none gets
  // CUDA_VISIBLE_DEVICES="" and NVIDIA_VISIBLE_DEVICES=void, so it sees no GPU. The container's
  // own env entries still win. A container's devices are free again once it has stopped for good.
  std::map<std::string, int64_t> node_gpus;
  // Unset: configMapKeyRef/secretKeyRef and configMap/secret volumes are a config error.
  DataSource data_source;
  // Set: every Pod but those with spec.automountServiceAccountToken false gets
  // <state_dir>/pods/<uid>/serviceaccount/{token,ca.crt,namespace} and
  // MESHWORK_SERVICE_ACCOUNT_DIR naming it in every container.
  std::optional<ServiceAccountCredentials> service_account;
  std::chrono::milliseconds monitor_interval{50};  // how often exits and deadlines are checked
  // Set: every Pod but those with spec.hostNetwork true gets its own network namespace from it
  // (pod_network.h), whose eth0 address status.podIP reports, and its containers run in it. Unset,
  // and for hostNetwork Pods: the machine's namespace and a loopback address of the Pod's own.
  std::shared_ptr<PodNetwork> network;
  // KUBERNETES_SERVICE_HOST in a Pod with its own network namespace (the API server's address on
  // the Pods' bridge), in place of extra_env's; empty: extra_env's.
  std::string network_service_host;
};

class PodRuntime {
 public:
  // Validates the options (state_dir is created), settles the name resolution mechanism (a probe
  // for kAuto) and starts the monitor thread, which forks every container process.
  static Result<std::unique_ptr<PodRuntime>> Create(RuntimeOptions options);
  ~PodRuntime();  // stops every pod (SIGTERM, grace, SIGKILL) and waits for them, bounded by the grace

  PodRuntime(const PodRuntime&) = delete;
  PodRuntime& operator=(const PodRuntime&) = delete;

  // Starts every container of the pod as a local process group (command+args with $(VAR)
  // expansion, env incl. valueFrom.fieldRef, workingDir, volumes: see below), stdout+stderr to
  // its log file, in the pod's own network namespace (RuntimeOptions::network; its address is
  // status.podIP; a failure is Unavailable starting with kPodNetworkError), else with its own
  // loopback address (127.a.b.c, never 127.0.x.x), which status.podIP reports. Returns at once; the processes start on the monitor thread and Poll reports them.
  // Needs metadata.uid, metadata.name and spec.containers[].name; errors name the field. GPUs
  // are handed out here (RuntimeOptions::node_gpus); more than the node has free is kUnavailable.
  // Starting a uid that is already known does nothing and returns Ok.
  // `service_account_token`, when not empty, is the token written to this Pod's service-account
  // directory instead of RuntimeOptions::service_account's (a real API server's bound token).
  // Volumes (all containers share the machine's filesystem, so nothing is mounted): configMap
  // and secret volumes are written to <state_dir>/pods/<uid>/volumes/<name>/ (items, mode,
  // optional) when a container starts, emptyDir is that directory, and hostPath is its path. A
  // volumeMount maps its mountPath (plus subPath) to that directory, and every path under a
  // mountPath in the container's command, args, env values and workingDir is rewritten to it.
  // Other volume types are not provided: their mountPath is the machine's own.
  Status Start(const nlohmann::json& pod, const std::string& service_account_token = "");
  // SIGTERM to every container's process group, SIGKILL after the grace period (grace_seconds,
  // else spec.terminationGracePeriodSeconds, else the default; 0 = SIGKILL now). No restarts
  // after this. Does not block. Unknown uids are ignored.
  void Stop(const std::string& uid, std::optional<int> grace_seconds);
  // True when every process of the pod has exited (also true for unknown uids).
  bool Stopped(const std::string& uid) const;
  // Forgets a stopped pod: frees its IP (its network namespace released), deletes its files (logs
  // included). Stops it first with grace 0 if it is still running.
  void Remove(const std::string& uid);

  // Status changes since the last call: (uid, the Pod's whole "status" object: phase,
  // conditions, hostIP, podIP, podIPs, startTime, qosClass, containerStatuses).
  std::vector<std::pair<std::string, nlohmann::json>> Poll();
  // The current status of one pod (null when unknown).
  nlohmann::json StatusOf(const std::string& uid) const;

  // The current log of a container (kubectl logs), and the previous run's (kubectl logs -p);
  // empty when the pod or container is unknown, or there is no previous run.
  std::string LogPath(const std::string& uid, const std::string& container) const;
  std::string PreviousLogPath(const std::string& uid, const std::string& container) const;
  std::string PodIP(const std::string& uid) const;  // empty when unknown

  // The names pods must resolve (e.g. from HeadlessServiceHosts): "h.s.ns.svc" or
  // "h.s.ns.svc.cluster.local" -> IP. Each pod's hosts file gets the .svc, .svc.<domain> and
  // "<h>.<s>.<ns>" forms, and "<h>.<s>" for names in its own namespace (its DNS search path).
  // Running processes see the change at their next lookup.
  void SetHosts(const std::map<std::string, std::string>& name_to_ip);

  Resolution resolution() const;  // the mechanism in use (kAuto resolved)

 private:
  explicit PodRuntime(RuntimeOptions options);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshwork::controlplane::agent
