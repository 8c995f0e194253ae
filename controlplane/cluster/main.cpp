// meshwork-cluster: a local Kubernetes cluster of real parts (docs/cluster.md). It supervises
// etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from their Go modules
// by scripts/setup.sh, and the Meshwork node agent, as child processes: makes their certificates
// and the Pods' network (a bridge; pod_network.h), writes an admin kubeconfig, restarts what dies,
// stops them all on SIGTERM, and keeps its data directory (etcd's data included) across restarts.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/file.h"
#include "common/loopback_port.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "controlplane/agent/node_agent.h"
#include "controlplane/cluster/pki.h"
#include "controlplane/cluster/pod_network.h"
#include "operator/k8s/client.h"
#include "operator/k8s/config.h"

namespace agent = meshwork::controlplane::agent;
namespace cluster = meshwork::controlplane::cluster;
namespace exit_code = meshwork::exit_code;
namespace k8s = meshwork::k8s;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

const char* kUsage =
    "usage: meshwork-cluster --data-dir DIR [--port N] [--kubeconfig FILE] [--nodes FILE]\n"
    "                        [--kube-bin DIR] [--node-agent FILE] [--pod-network auto|none]\n"
    "                        [--controller-manager-arg ARG]...\n"
    "  --data-dir DIR      certificates, etcd's data, logs, pods' files and the kubeconfig (required)\n"
    "  --port N            kube-apiserver's port, on 127.0.0.1 (with a Pod network also on the\n"
    "                      bridge's address: it listens on every address); default: the one used\n"
    "                      last time in DIR, else a free one\n"
    "  --kubeconfig FILE   admin kubeconfig to write (default DIR/kubeconfig)\n"
    "  --nodes FILE        the node agent's nodes config (default: one node \"local\"); \"none\":\n"
    "                      no node agents (an API-only cluster, for clients' tests)\n"
    "  --kube-bin DIR      where etcd, kube-apiserver, kube-controller-manager and kube-scheduler\n"
    "                      are (default $MESHWORK_KUBE_BIN, else what scripts/setup.sh built)\n"
    "  --node-agent FILE   the meshwork-node-agent binary (default: the one built with this)\n"
    "  --pod-network MODE  auto (default): each Pod its own network namespace on a bridge, through\n"
    "                      the CNI plugins in the --kube-bin's cni/, where this process may (root);\n"
    "                      else, and with none, Pods get loopback addresses in the host's network\n"
    "  --controller-manager-arg ARG  one more flag for kube-controller-manager, e.g.\n"
    "                      --kube-api-qps=100 (its client's rate limit: 20 requests/s by default)\n";

const char* kServiceCidr = "10.0.0.0/24";
// The feature gates of every control-plane component: GenericWorkload turns on the PodGroup API
// and the scheduler's GangScheduling plugin (all-or-nothing placement of a PodGroup's Pods).
const char* kFeatureGates = "--feature-gates=GenericWorkload=true";
const char* kServiceIp = "10.0.0.1";  // the kubernetes Service's address in that range

void Log(const std::string& message) { std::cout << "meshwork-cluster: " << message << std::endl; }

int Usage(const std::string& message) {
  std::cerr << "meshwork-cluster: " << message << "\n" << kUsage;
  return exit_code::kConfig;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

meshwork::Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  auto writer = meshwork::AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  MW_RETURN_IF_ERROR(writer->Write(text.data(), text.size()));
  MW_RETURN_IF_ERROR(writer->Commit());
  if (::chmod(path.c_str(), mode) != 0) return meshwork::IOError(path + ": " + std::strerror(errno));
  return meshwork::Status::Ok();
}

// A kubeconfig with the certificates inline, so it stays valid wherever it is copied.
std::string Kubeconfig(const std::string& server, const std::string& pki, const std::string& identity) {
  using meshwork::Base64Encode;
  std::ostringstream out;
  out << "apiVersion: v1\nkind: Config\nclusters:\n- name: meshwork-local\n  cluster:\n"
      << "    server: " << server << "\n"
      << "    certificate-authority-data: " << Base64Encode(ReadAll(pki + "/ca.crt")) << "\n"
      << "users:\n- name: " << identity << "\n  user:\n"
      << "    client-certificate-data: " << Base64Encode(ReadAll(pki + "/" + identity + ".crt")) << "\n"
      << "    client-key-data: " << Base64Encode(ReadAll(pki + "/" + identity + ".key")) << "\n"
      << "contexts:\n- name: meshwork-local\n  context:\n    cluster: meshwork-local\n    user: " << identity
      << "\n    namespace: default\ncurrent-context: meshwork-local\n";
  return out.str();
}

// One supervised process.
struct Component {
  std::string name;
  std::vector<std::string> argv;
  pid_t pid = -1;
  int restarts = 0;
  int backoff_seconds = 0;
  long log_offset = 0;  // the size of its log when it last started: what it wrote since follows
  Clock::time_point started{};
  Clock::time_point next_start{};
};

class Supervisor {
 public:
  // Logs go to LOG_DIR/<name>.log; each running component's pid is in RUN_DIR/<name>.pid, for
  // scripts and tests that signal one (freeze or kill the API server).
  Supervisor(std::string log_dir, std::string run_dir) : log_dir_(std::move(log_dir)), run_dir_(std::move(run_dir)) {}
  ~Supervisor() { StopAll(); }

  meshwork::Status Start(Component* c) {
    const std::string log = log_dir_ + "/" + c->name + ".log";
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return meshwork::IOError(log + ": " + std::strerror(errno));
    c->log_offset = static_cast<long>(::lseek(fd, 0, SEEK_END));
    meshwork::SpawnOptions options;
    options.program = c->argv[0];
    options.argv = c->argv;
    for (char** e = environ; *e != nullptr; ++e) options.env.emplace_back(*e);
    options.new_session = true;
    options.stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    options.stdout_fd = options.stderr_fd = fd;
    options.close_other_fds = true;
    meshwork::Spawned child = meshwork::SpawnProcess(options);
    ::close(fd);
    if (options.stdin_fd >= 0) ::close(options.stdin_fd);
    if (!child.ok()) {
      if (child.pid > 0) ::waitpid(child.pid, nullptr, 0);
      return meshwork::Unavailable(c->name + ": cannot start " + c->argv[0] + ": " +
                                   (child.failure ? child.failure->ToString() : std::string("fork failed")));
    }
    c->pid = child.pid;
    c->started = Clock::now();
    if (std::ofstream pid_file(PidFile(*c)); pid_file) pid_file << c->pid << "\n";
    if (std::find(order_.begin(), order_.end(), c) == order_.end()) order_.push_back(c);
    return meshwork::Status::Ok();
  }

  // Reaps children that exited and restarts them after a backoff (1 s, doubling to 30 s; reset
  // once one ran a minute). Returns false while a component is down.
  bool Monitor() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (Component* c : order_) {
        if (c->pid != pid) continue;
        c->pid = -1;
        std::remove(PidFile(*c).c_str());
        const bool long_run = Clock::now() - c->started > std::chrono::minutes(1);
        c->backoff_seconds = long_run || c->backoff_seconds == 0 ? 1 : std::min(30, c->backoff_seconds * 2);
        c->next_start = Clock::now() + std::chrono::seconds(c->backoff_seconds);
        std::ostringstream why;
        if (WIFEXITED(status)) why << "exited with code " << WEXITSTATUS(status);
        else why << "was killed by signal " << WTERMSIG(status);
        Log(c->name + " " + why.str() + "; restarting in " + std::to_string(c->backoff_seconds) + " s (log: " +
            log_dir_ + "/" + c->name + ".log)");
      }
    }
    bool all_up = true;
    for (Component* c : order_) {
      if (c->pid > 0) continue;
      all_up = false;
      if (Clock::now() < c->next_start) continue;
      ++c->restarts;
      meshwork::Status s = Start(c);
      if (!s.ok()) Log(s.message());
    }
    return all_up;
  }

  // SIGTERM to each in reverse start order, SIGKILL after its grace.
  void StopAll() {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      Component* c = *it;
      if (c->pid <= 0) continue;
      ::kill(-c->pid, SIGTERM);
      // The node agent stops its pods first (their grace is up to 30 s).
      const auto grace = c->name.rfind("node-agent", 0) == 0 ? std::chrono::seconds(40) : std::chrono::seconds(10);
      const auto deadline = Clock::now() + grace;
      while (Clock::now() < deadline) {
        if (::waitpid(c->pid, nullptr, WNOHANG) == c->pid) {
          c->pid = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (c->pid > 0) {
        ::kill(-c->pid, SIGKILL);
        ::waitpid(c->pid, nullptr, 0);
        c->pid = -1;
      }
      std::remove(PidFile(*c).c_str());
    }
  }

  // Stops every component and forgets them, for another attempt with new ones.
  void Clear() {
    StopAll();
    order_.clear();
  }

  // Whether c runs; a child that exited is reaped here and forgotten (pid -1), so that StopAll
  // neither waits out its grace nor signals a reused pid.
  bool Running(Component* c) {
    if (c->pid <= 0) return false;
    if (::waitpid(c->pid, nullptr, WNOHANG) == 0) return true;
    c->pid = -1;
    std::remove(PidFile(*c).c_str());
    return false;
  }

 private:
  std::string PidFile(const Component& c) const { return run_dir_ + "/" + c.name + ".pid"; }

  std::string log_dir_;
  std::string run_dir_;
  std::vector<Component*> order_;
};

// The last `lines` lines of text, each indented, for an error that points at a log: the cause
// (a port already in use, a flag refused) is usually there, and a CI run keeps only our output.
std::string LastLines(const std::string& text, size_t lines) {
  std::vector<std::string> all;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "\n  | " + all[i];
  return out;
}

// What c's log gained since it last started (earlier runs' lines are not its cause).
std::string LogSinceStart(const Component& c, const std::string& log) {
  const std::string text = ReadAll(log);
  return text.substr(std::min(text.size(), static_cast<size_t>(std::max(0L, c.log_offset))));
}

// Polls `ready` every 200 ms until it answers true while `component` runs, `component` dies,
// `timeout` passes or a signal arrives. The error says which, with the end of what the
// component logged since it started.
meshwork::Status WaitReady(Supervisor* sup, Component* component, const std::string& what,
                           std::chrono::seconds timeout, const std::function<bool()>& ready,
                           const sigset_t& signals, const std::string& log_dir) {
  const std::string log = log_dir + "/" + component->name + ".log";
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const bool answered = ready();
    if (!sup->Running(component)) {
      return meshwork::Unavailable(component->name + " exited before " + what + "; the end of " + log + ":" +
                                   LastLines(LogSinceStart(*component, log), 20));
    }
    if (answered) return meshwork::Status::Ok();
    timespec wait{0, 200 * 1000 * 1000};
    if (sigtimedwait(&signals, nullptr, &wait) > 0) return meshwork::Unavailable("interrupted by a signal");
  }
  return meshwork::Unavailable(component->name + ": no " + what + " after " + std::to_string(timeout.count()) +
                               " s; the end of " + log + ":" + LastLines(LogSinceStart(*component, log), 20));
}

// Whether etcd answers GET /health on 127.0.0.1:port with "health":"true": its own answer, not
// merely something listening there (another process may hold a port picked for etcd).
bool EtcdHealthy(int port) {
  const int fd = meshwork::ConnectLoopback(port);
  if (fd < 0) return false;
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string response;
  const std::string request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[1024];
    for (ssize_t n; response.size() < 8192 && (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
  }
  ::close(fd);
  return response.find("\"health\":\"true\"") != std::string::npos;
}

// Whether message names 127.0.0.1:port (and not a longer port that starts with its digits).
bool NamesPort(const std::string& message, int port) {
  const std::string needle = "127.0.0.1:" + std::to_string(port);
  for (size_t at = message.find(needle); at != std::string::npos; at = message.find(needle, at + 1)) {
    const size_t end = at + needle.size();
    if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) return true;
  }
  return false;
}

// The ClusterRole and binding of the node agents' names identity: get, list and watch Pods and
// Services everywhere, nothing else. Made once; kept across restarts (AlreadyExists is fine).
meshwork::Status BootstrapNamesRole(k8s::Client* api) {
  const json role = {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                     {"kind", "ClusterRole"},
                     {"metadata", {{"name", "meshwork:names"}}},
                     {"rules", {{{"apiGroups", {""}}, {"resources", {"pods", "services"}}, {"verbs", {"get", "list", "watch"}}}}}};
  const json binding = {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                        {"kind", "ClusterRoleBinding"},
                        {"metadata", {{"name", "meshwork:names"}}},
                        {"roleRef", {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", "meshwork:names"}}},
                        {"subjects", {{{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "User"}, {"name", "meshwork:names"}}}}};
  const k8s::ResourceRef roles{"rbac.authorization.k8s.io", "v1", "clusterroles", false};
  const k8s::ResourceRef bindings{"rbac.authorization.k8s.io", "v1", "clusterrolebindings", false};
  for (const auto& [ref, obj] : {std::pair{roles, role}, std::pair{bindings, binding}}) {
    auto made = api->Create(ref, "", obj);
    if (!made.ok() && !k8s::IsAlreadyExists(made.error())) {
      return meshwork::Unavailable("creating " + ref.resource + " meshwork:names: " + made.error().ToString());
    }
  }
  return meshwork::Status::Ok();
}

std::string DefaultKubeBin() {
  if (const char* env = std::getenv("MESHWORK_KUBE_BIN"); env != nullptr && *env != '\0') return env;
  return MESHWORK_KUBE_BIN_DEFAULT;
}


// Where a start of the control plane finds and puts things; the same on every attempt.
struct Layout {
  std::string data_dir, pki, logs, kube_bin, agent, nodes, kubeconfig_path, audit_policy;
  std::vector<agent::NodeConfig> node_configs;
  const cluster::ClusterNetwork* network = nullptr;  // null: Pods on loopback addresses
  std::vector<std::string> controller_manager_args;  // --controller-manager-arg, in order
};

// The components one attempt started (the supervisor points at them) and its admin client.
struct ControlPlane {
  std::vector<std::unique_ptr<Component>> components;
  std::unique_ptr<k8s::Client> api;
};

bool DirectoryEmpty(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return errno == ENOENT;
  bool empty = true;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(dir);
  return empty;
}

// Whether a start failed because a port was taken: EADDRINUSE in the component's log (Go's and
// etcd's "bind: address already in use"), or our own check before kube-apiserver starts.
bool PortTaken(const meshwork::Status& status) {
  std::string message = status.message();
  std::transform(message.begin(), message.end(), message.begin(), [](unsigned char c) { return std::tolower(c); });
  return message.find("address already in use") != std::string::npos;
}

// One attempt: writes the kubeconfigs for the API server on ports["apiserver"], starts etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and the node agents in turn, each once
// the one before serves, then writes the admin kubeconfig. Stops at the first error; the caller
// stops what started.
meshwork::Status BringUp(const Layout& layout, const json& ports, const sigset_t& signals, Supervisor* sup,
                         ControlPlane* plane) {
  const std::string& pki = layout.pki;
  const std::string api_port = std::to_string(ports["apiserver"].get<int>());
  const std::string etcd_client = "http://127.0.0.1:" + std::to_string(ports["etcd-client"].get<int>());
  const std::string etcd_peer = "http://127.0.0.1:" + std::to_string(ports["etcd-peer"].get<int>());
  const std::string server = "https://127.0.0.1:" + api_port;
  if (meshwork::LoopbackPortListening(ports["apiserver"].get<int>())) {
    return meshwork::Unavailable("127.0.0.1:" + api_port + ", kube-apiserver's port, is taken (address already in " +
                                 "use); pass another --port");
  }
  std::vector<std::string> kubeconfig_users = {"admin", "controller-manager", "scheduler", "names"};
  for (const agent::NodeConfig& node : layout.node_configs) kubeconfig_users.push_back("node-" + node.name);
  for (const std::string& identity : kubeconfig_users) {
    MW_RETURN_IF_ERROR(WriteFile(pki + "/" + identity + ".kubeconfig", Kubeconfig(server, pki, identity), 0600));
  }

  auto own = [plane](Component c) {
    plane->components.push_back(std::make_unique<Component>(std::move(c)));
    return plane->components.back().get();
  };
  const std::string& bin = layout.kube_bin;
  Component* etcd = own({"etcd",
                         {bin + "/etcd", "--name", "meshwork", "--data-dir", layout.data_dir + "/etcd",
                          "--listen-client-urls", etcd_client, "--advertise-client-urls", etcd_client,
                          "--listen-peer-urls", etcd_peer, "--initial-advertise-peer-urls", etcd_peer,
                          "--initial-cluster", "meshwork=" + etcd_peer, "--log-level", "warn",
                          "--quota-backend-bytes", "8589934592"}});
  // With a Pod network, Pods reach the API server at the host's address on their bridge, which is
  // also what it advertises: the kubernetes Service then has real endpoints (its EndpointSlice).
  // It listens on every address then, as kubeadm's does, for the bridge's and loopback's clients.
  const cluster::ClusterNetwork* network = layout.network;
  Component* apiserver = own({
      "kube-apiserver",
      {bin + "/kube-apiserver", "--etcd-servers", etcd_client, "--bind-address", network ? "0.0.0.0" : "127.0.0.1",
       "--advertise-address", network ? network->gateway() : "127.0.0.1", "--secure-port", api_port, "--tls-cert-file", pki + "/apiserver.crt",
       "--tls-private-key-file", pki + "/apiserver.key", "--client-ca-file", pki + "/ca.crt",
       "--service-account-issuer", "https://kubernetes.default.svc.cluster.local", "--service-account-key-file",
       pki + "/sa.pub", "--service-account-signing-key-file", pki + "/sa.key", "--service-cluster-ip-range",
       kServiceCidr, "--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
       "--audit-policy-file", layout.audit_policy, "--audit-log-path", layout.logs + "/audit.log",
       "--audit-log-maxsize", "100", "--audit-log-maxbackup", "3", "--kubelet-client-certificate",
       pki + "/apiserver-kubelet-client.crt", "--kubelet-client-key", pki + "/apiserver-kubelet-client.key",
       "--kubelet-certificate-authority", pki + "/ca.crt", "--kubelet-preferred-address-types", "InternalIP",
       // Without a Pod network the kubernetes Service's endpoints would be 127.0.0.1, which
       // EndpointSlices refuse.
       "--endpoint-reconciler-type", network ? "lease" : "none", "--allow-privileged=true", "--profiling=false",
       // Kubernetes' own gang scheduling (PodGroup, scheduling.k8s.io/v1beta1; beta, off by
       // default in 1.37): a TrainingJob's gangAdmission PodGroup uses it.
       kFeatureGates, "--runtime-config", "scheduling.k8s.io/v1beta1=true"}});
  Component* controller_manager = own({
      "kube-controller-manager",
      {bin + "/kube-controller-manager", "--kubeconfig", pki + "/controller-manager.kubeconfig",
       "--authentication-kubeconfig", pki + "/controller-manager.kubeconfig", "--authorization-kubeconfig",
       pki + "/controller-manager.kubeconfig", "--bind-address", "127.0.0.1", "--secure-port", "0",
       "--leader-elect=false", "--service-account-private-key-file", pki + "/sa.key", "--root-ca-file",
       pki + "/ca.crt", "--use-service-account-credentials=true", "--service-cluster-ip-range", kServiceCidr,
       "--controllers",
       "*,-node-ipam-controller,-persistentvolume-binder-controller,-persistentvolume-attach-detach-controller",
       kFeatureGates}});
  controller_manager->argv.insert(controller_manager->argv.end(), layout.controller_manager_args.begin(),
                                  layout.controller_manager_args.end());
  Component* scheduler = own({"kube-scheduler",
                              {bin + "/kube-scheduler", "--kubeconfig", pki + "/scheduler.kubeconfig",
                               "--authentication-kubeconfig", pki + "/scheduler.kubeconfig",
                               "--authorization-kubeconfig", pki + "/scheduler.kubeconfig", "--bind-address",
                               "127.0.0.1", "--secure-port", "0", "--leader-elect=false", kFeatureGates}});
  std::vector<Component*> node_agents;
  for (size_t i = 0; i < layout.node_configs.size(); ++i) {
    const std::string& name = layout.node_configs[i].name;
    Component* c = own({"node-agent-" + name,
                        {layout.agent, "--kubeconfig", pki + "/node-" + name + ".kubeconfig", "--state-dir",
                         layout.data_dir + "/agent/" + name, "--kubelet-port",
                         std::to_string(ports["kubelet-" + name].get<int>()), "--tls-cert-file", pki + "/kubelet.crt",
                         "--tls-private-key-file", pki + "/kubelet.key", "--client-ca-file", pki + "/ca.crt",
                         "--node-name", name, "--names-kubeconfig", pki + "/names.kubeconfig",
                         // Distinct Pod address ranges: 127.<10+i>.0.1 upwards for node i.
                         "--first-pod-ip", "127." + std::to_string(10 + i % 240) + ".0.1"}});
    if (!layout.nodes.empty()) c->argv.insert(c->argv.end(), {"--nodes", layout.nodes});
    if (network != nullptr) {
      c->argv.insert(c->argv.end(), {"--pod-cidr", network->NodeCidr(i), "--pod-subnet", network->subnet(),
                                     "--pod-gateway", network->gateway(), "--pod-bridge", network->bridge(),
                                     "--pod-network-dir", network->NodeDir(name), "--cni-bin-dir",
                                     network->cni_bin_dir()});
    }
    node_agents.push_back(c);
  }

  auto admin_config = k8s::LoadKubeconfig(pki + "/admin.kubeconfig");
  if (!admin_config.ok()) return meshwork::Unavailable(admin_config.error().ToString());
  k8s::ClientOptions client_options;
  client_options.max_retries = 0;
  client_options.request_timeout = std::chrono::milliseconds(5000);
  client_options.user_agent = "meshwork-cluster/0.1";
  auto client = k8s::Client::FromConfig(admin_config.value(), client_options);
  if (!client.ok()) return meshwork::Unavailable(client.error().ToString());
  plane->api = std::move(client).value();
  k8s::Client* api = plane->api.get();

  auto start = [&](Component* c, const std::string& what, std::chrono::seconds timeout,
                   const std::function<bool()>& ready) -> meshwork::Status {
    MW_RETURN_IF_ERROR(sup->Start(c));
    MW_RETURN_IF_ERROR(WaitReady(sup, c, what, timeout, ready, signals, layout.logs));
    Log(c->name + " " + what);
    return meshwork::Status::Ok();
  };
  const int etcd_port = ports["etcd-client"].get<int>();
  MW_RETURN_IF_ERROR(start(etcd, "listening on " + etcd_client, std::chrono::seconds(60),
                           [&] { return EtcdHealthy(etcd_port); }));
  MW_RETURN_IF_ERROR(start(apiserver, "answering on " + server, std::chrono::seconds(180),
                           [&] { return api->Get(k8s::resources::Namespaces(), "", "default").ok(); }));
  // Pods need their namespace's default ServiceAccount, which the controller manager makes.
  const k8s::ResourceRef service_accounts{"", "v1", "serviceaccounts", true};
  MW_RETURN_IF_ERROR(start(controller_manager, "running (default ServiceAccount present)", std::chrono::seconds(180),
                           [&] { return api->Get(service_accounts, "default", "default").ok(); }));
  MW_RETURN_IF_ERROR(start(scheduler, "running", std::chrono::seconds(5), [] { return true; }));
  MW_RETURN_IF_ERROR(BootstrapNamesRole(api));
  for (size_t i = 0; i < node_agents.size(); ++i) {
    const std::string node = layout.node_configs[i].name;
    MW_RETURN_IF_ERROR(start(node_agents[i], "registered node " + node, std::chrono::seconds(60),
                             [&] { return api->Get(k8s::resources::Nodes(), "", node).ok(); }));
  }
  return WriteFile(layout.kubeconfig_path, Kubeconfig(server, pki, "admin"), 0600);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir, kubeconfig_path, nodes, kube_bin = DefaultKubeBin(), agent = MESHWORK_NODE_AGENT_DEFAULT;
  std::string pod_network = "auto";
  std::vector<std::string> controller_manager_args;
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (i + 1 >= argc) return Usage(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--data-dir") data_dir = value;
    else if (arg == "--kubeconfig") kubeconfig_path = value;
    else if (arg == "--nodes") nodes = value;
    else if (arg == "--kube-bin") kube_bin = value;
    else if (arg == "--node-agent") agent = value;
    else if (arg == "--pod-network") pod_network = value;
    else if (arg == "--controller-manager-arg") controller_manager_args.push_back(value);
    else if (arg == "--port") {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 1 || v > 65535) return Usage("--port " + value + ": expected 1-65535");
      port = static_cast<int>(v);
    } else {
      return Usage("unknown flag " + arg);
    }
  }
  if (data_dir.empty()) return Usage("--data-dir is required");
  if (pod_network != "auto" && pod_network != "none") return Usage("--pod-network " + pod_network + ": expected auto or none");
  for (const char* binary : {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}) {
    const std::string path = kube_bin + "/" + binary;
    if (::access(path.c_str(), X_OK) != 0) {
      std::cerr << "meshwork-cluster: --kube-bin " << kube_bin << ": no " << binary
                << " there; scripts/setup.sh builds the Kubernetes components into .meshwork/kube/bin\n";
      return exit_code::kConfig;
    }
  }
  if (::access(agent.c_str(), X_OK) != 0) {
    std::cerr << "meshwork-cluster: --node-agent " << agent << ": not an executable\n";
    return exit_code::kConfig;
  }
  for (const std::string& dir : {data_dir, data_dir + "/logs", data_dir + "/etcd", data_dir + "/agent", data_dir + "/run"}) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      std::cerr << "meshwork-cluster: --data-dir: " << dir << ": " << std::strerror(errno) << "\n";
      return exit_code::kIO;
    }
  }
  // One meshwork-cluster per data directory: a second would share etcd's data and the ports.
  const std::string lock = data_dir + "/lock";
  const int lock_fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    std::cerr << "meshwork-cluster: --data-dir: " << lock << ": " << std::strerror(errno) << "\n";
    return exit_code::kIO;
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    std::cerr << "meshwork-cluster: --data-dir " << data_dir << ": another meshwork-cluster runs on it (it holds "
              << lock << ")\n";
    return exit_code::kUnavailable;
  }
  // The nodes, to give each its own agent and identity (the agent validates the file the same way).
  std::vector<agent::NodeConfig> node_configs;
  if (nodes == "none") {
    nodes.clear();  // no agents, so none of their identities or ports
  } else if (!nodes.empty()) {
    std::string text = ReadAll(nodes);
    if (text.empty()) {
      std::cerr << "meshwork-cluster: --nodes " << nodes << ": cannot read it, or it is empty\n";
      return exit_code::kConfig;
    }
    auto parsed = agent::ParseNodes(text);
    if (!parsed.ok()) {
      std::cerr << "meshwork-cluster: --nodes " << nodes << ": " << parsed.status().message() << "\n";
      return exit_code::kConfig;
    }
    node_configs = std::move(parsed).value();
  } else {
    node_configs.push_back(agent::DefaultNode());
  }
  const std::string pki = data_dir + "/pki";
  const std::string logs = data_dir + "/logs";
  if (kubeconfig_path.empty()) kubeconfig_path = data_dir + "/kubeconfig";

  // The same ports as last time, so a restart keeps etcd's member URLs and clients' kubeconfigs.
  json ports = json::object();
  if (std::string text = ReadAll(data_dir + "/ports.json"); !text.empty()) ports = json::parse(text, nullptr, false);
  if (!ports.is_object()) ports = json::object();
  // A first start (no ports kept, etcd empty) may pick its ports again: between the pick and a
  // component's bind, another process can take a port (seen in CI: kube-apiserver's, with the
  // other tests' servers picking from the same range). A restart keeps its ports, or fails.
  const bool first_start = ports.empty() && DirectoryEmpty(data_dir + "/etcd");
  if (port != 0) ports["apiserver"] = port;
  std::vector<std::string> port_names = {"apiserver", "etcd-client", "etcd-peer"};
  for (const agent::NodeConfig& node : node_configs) port_names.push_back("kubelet-" + node.name);

  Log("certificates in " + pki);
  std::vector<cluster::ClientIdentity> identities = {
      {"admin", "meshwork-admin", {"system:masters"}},
      {"controller-manager", "system:kube-controller-manager", {}},
      {"scheduler", "system:kube-scheduler", {}},
      {"apiserver-kubelet-client", "kube-apiserver-kubelet-client", {"system:masters"}},
      // The node agents' cluster-DNS role: read every Pod and Service for headless-Service names
      // (bound to the meshwork:names ClusterRole below), as CoreDNS reads them in a cluster.
      {"names", "meshwork:names", {}},
  };
  // One node agent per node, each with the node's own identity, as kubelets have: the Node
  // authorizer and NodeRestriction then confine it to its Node, its Lease and its Pods.
  for (const agent::NodeConfig& node : node_configs) {
    identities.push_back({"node-" + node.name, "system:node:" + node.name, {"system:nodes"}});
  }
  // The Pods' network, before the certificates: the API server's names its address on the bridge.
  // Given back (the bridge deleted) when main returns, after the supervisor has stopped the agents.
  std::optional<cluster::ClusterNetwork> network;
  if (pod_network == "auto" && !node_configs.empty()) {
    auto made = node_configs.size() > 254 ? meshwork::Result<cluster::ClusterNetwork>(meshwork::Unavailable(
                                                "more than 254 nodes (one /24 of Pod addresses each)"))
                                          : cluster::ClusterNetwork::SetUp(kube_bin + "/cni");
    if (made.ok()) {
      network.emplace(std::move(made).value());
      Log("Pod network: bridge " + network->bridge() + " (" + network->subnet() + ", the host at " +
          network->gateway() + "), node i's Pods in " + network->NodeCidr(0).substr(0, network->NodeCidr(0).size() - 6) +
          "<i+1>.0/24");
    } else {
      Log("Pods share the host's network with loopback addresses: " + made.status().message());
    }
  }
  std::vector<std::string> api_ips = {kServiceIp};
  if (network) api_ips.push_back(network->gateway());
  if (meshwork::Status s = cluster::EnsurePki(pki, api_ips, identities); !s.ok()) {
    std::cerr << "meshwork-cluster: " << s.message() << "\n";
    return exit_code::kIO;
  }
  const Layout layout{data_dir,
                      pki,
                      logs,
                      kube_bin,
                      agent,
                      nodes,
                      kubeconfig_path,
                      data_dir + "/audit-policy.yaml",
                      node_configs,
                      network ? &*network : nullptr,
                      controller_manager_args};
  if (meshwork::Status s = WriteFile(layout.audit_policy,
                                     "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
                                     "rules:\n- level: Metadata\n",
                                     0600);
      !s.ok()) {
    std::cerr << "meshwork-cluster: " << s.message() << "\n";
    return exit_code::kIO;
  }

  // Signals are taken by sigwait on this thread; every child gets a clean mask from SpawnProcess.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ControlPlane plane;  // before the supervisor, which points into it and stops it on the way out
  Supervisor sup(logs, data_dir + "/run");
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    for (const std::string& name : port_names) {
      if (!ports.contains(name) || !ports[name].is_number_integer()) ports[name] = meshwork::FreeLoopbackPort();
    }
    if (meshwork::Status s = WriteFile(data_dir + "/ports.json", ports.dump() + "\n", 0600); !s.ok()) {
      std::cerr << "meshwork-cluster: " << s.message() << "\n";
      return exit_code::kIO;
    }
    const meshwork::Status st = BringUp(layout, ports, signals, &sup, &plane);
    if (st.ok()) break;
    sup.Clear();
    plane = ControlPlane{};
    // Picking again helps only with ports this run picked: not --port's, not a restart's.
    const bool again =
        first_start && attempt < kAttempts && PortTaken(st) && (port == 0 || !NamesPort(st.message(), port));
    if (!again) {
      std::cerr << "meshwork-cluster: " << st.message() << "\n";
      return st.code() == meshwork::StatusCode::kIOError ? exit_code::kIO : exit_code::kUnavailable;
    }
    Log(st.message() + "\nmeshwork-cluster: a port picked for this first start was taken before its component "
        "bound it; picking new ports (attempt " + std::to_string(attempt + 1) + " of " + std::to_string(kAttempts) +
        ")");
    for (const std::string& name : port_names) {
      if (name != "apiserver" || port == 0) ports.erase(name);
    }
    // etcd's member URLs are the old ports; it held nothing yet.
    if (meshwork::Status s = meshwork::RemoveTree(data_dir + "/etcd"); !s.ok()) {
      std::cerr << "meshwork-cluster: " << s.message() << "\n";
      return exit_code::kIO;
    }
    if (::mkdir((data_dir + "/etcd").c_str(), 0700) != 0) {
      std::cerr << "meshwork-cluster: " << data_dir << "/etcd: " << std::strerror(errno) << "\n";
      return exit_code::kIO;
    }
  }
  const std::string server = "https://127.0.0.1:" + std::to_string(ports["apiserver"].get<int>());
  Log("ready, serving on " + server + ": kubectl --kubeconfig " + kubeconfig_path + " (logs in " + logs + ")");

  while (true) {
    timespec wait{0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig > 0) {
      Log("signal " + std::to_string(sig) + ": stopping the node agent's pods, then the control plane");
      break;
    }
    sup.Monitor();
  }
  sup.StopAll();
  Log("stopped");
  return 0;
}
