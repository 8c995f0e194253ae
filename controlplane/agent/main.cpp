// meshwork-node-agent: the process kubelet of the local cluster (docs/controlplane-agent.md).
// Registers its Nodes with a real kube-apiserver and runs the Pods kube-scheduler binds to them
// as local processes. meshwork-cluster starts it; it also runs on its own against any API server.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <tuple>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"
#include "controlplane/agent/kubelet.h"
#include "controlplane/agent/kubelet_server.h"
#include "controlplane/agent/node_agent.h"
#include "controlplane/net/http_server.h"
#include "controlplane/net/tls_front.h"
#include "operator/k8s/client.h"
#include "operator/k8s/config.h"

namespace agent = meshwork::controlplane::agent;
namespace k8s = meshwork::k8s;

namespace {

const char* kUsage =
    "usage: meshwork-node-agent --kubeconfig FILE --state-dir DIR [--nodes FILE] [--node-name NAME]\n"
    "                           [--first-pod-ip IP] [--names-kubeconfig FILE]\n"
    "                           [--resolution auto|mount|preload|none] [--kubelet-port N\n"
    "                           --tls-cert-file FILE --tls-private-key-file FILE --client-ca-file FILE]\n"
    "                           [--pod-cidr CIDR --pod-subnet CIDR --pod-gateway IP --pod-bridge NAME\n"
    "                           --pod-network-dir DIR --cni-bin-dir DIR]\n"
    "  --kubeconfig FILE   the API server and the agent's credentials (required)\n"
    "  --state-dir DIR     pod logs and hosts files live under DIR/pods/<uid>/ (required)\n"
    "  --nodes FILE        nodes config, YAML or JSON (default: one node with this machine's\n"
    "                      cores and memory)\n"
    "  --node-name NAME    with --nodes: serve only that node of the file (as kubelet serves one\n"
    "                      node, with the credentials of system:node:NAME); without: the default\n"
    "                      node's name (default \"local\")\n"
    "  --names-kubeconfig FILE  the identity that reads every Pod and Service for headless-Service\n"
    "                      names, as a cluster DNS would (default: --kubeconfig's)\n"
    "  --first-pod-ip IP   the first Pod address handed out (default: a random one in 127.1-254.x.x);\n"
    "                      agents on one machine get distinct ranges this way\n"
    "  --resolution MODE   how pods resolve headless Service names (default auto)\n"
    "  --kubelet-port N    serve the kubelet API (logs) over TLS on 127.0.0.1:N, with this serving\n"
    "                      certificate and key, to clients whose certificate --client-ca-file signed\n"
    "  --pod-cidr CIDR     with the other --pod-* flags and --cni-bin-dir: each Pod gets its own network\n"
    "                      namespace and an address from CIDR (inside --pod-subnet, the bridge's\n"
    "                      network, where the host is --pod-gateway) on bridge --pod-bridge, through\n"
    "                      the CNI plugins in --cni-bin-dir; namespaces and leases under\n"
    "                      --pod-network-dir. Not root: said in the log, loopback addresses instead\n";

int Usage(const std::string& message) {
  std::cerr << "meshwork-node-agent: " << message << "\n" << kUsage;
  return meshwork::exit_code::kConfig;
}

// "https://127.0.0.1:6443" -> ("127.0.0.1", "6443"); empty parts when it has no port.
std::pair<std::string, std::string> HostPort(const std::string& server) {
  std::string rest = server.substr(server.find("://") == std::string::npos ? 0 : server.find("://") + 3);
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, ""};
  return {rest.substr(0, colon), rest.substr(colon + 1)};
}

}  // namespace

int main(int argc, char** argv) {
  namespace exit_code = meshwork::exit_code;
  std::string kubeconfig, names_kubeconfig, state_dir, nodes_file, node_name, first_pod_ip, resolution = "auto";
  std::string tls_cert, tls_key, client_ca;
  agent::PodNetworkOptions network;
  int kubelet_port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (i + 1 >= argc) return Usage(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--kubeconfig") kubeconfig = value;
    else if (arg == "--state-dir") state_dir = value;
    else if (arg == "--nodes") nodes_file = value;
    else if (arg == "--node-name") node_name = value;
    else if (arg == "--first-pod-ip") first_pod_ip = value;
    else if (arg == "--names-kubeconfig") names_kubeconfig = value;
    else if (arg == "--resolution") resolution = value;
    else if (arg == "--tls-cert-file") tls_cert = value;
    else if (arg == "--tls-private-key-file") tls_key = value;
    else if (arg == "--client-ca-file") client_ca = value;
    else if (arg == "--pod-cidr") network.pod_cidr = value;
    else if (arg == "--pod-subnet") network.subnet = value;
    else if (arg == "--pod-gateway") network.gateway = value;
    else if (arg == "--pod-bridge") network.bridge = value;
    else if (arg == "--pod-network-dir") network.dir = value;
    else if (arg == "--cni-bin-dir") network.cni_bin_dir = value;
    else if (arg == "--kubelet-port") {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 1 || v > 65535) return Usage("--kubelet-port " + value + ": expected 1-65535");
      kubelet_port = static_cast<int>(v);
    }
    else return Usage("unknown flag " + arg);
  }
  if (kubeconfig.empty()) return Usage("--kubeconfig is required");
  if (state_dir.empty()) return Usage("--state-dir is required");
  if (kubelet_port != 0 && (tls_cert.empty() || tls_key.empty() || client_ca.empty())) {
    return Usage("--kubelet-port needs --tls-cert-file, --tls-private-key-file and --client-ca-file");
  }
  meshwork::controlplane::TlsMaterial tls;
  if (kubelet_port != 0) {
    for (auto [flag, path, out] : {std::tuple{"--tls-cert-file", &tls_cert, &tls.cert_pem},
                                   std::tuple{"--tls-private-key-file", &tls_key, &tls.key_pem},
                                   std::tuple{"--client-ca-file", &client_ca, &tls.client_ca_pem}}) {
      std::ifstream in(*path);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) {
        std::cerr << "meshwork-node-agent: " << flag << " " << *path << ": cannot read it\n";
        return exit_code::kIO;
      }
      *out = text.str();
    }
  }

  const std::vector<std::pair<const char*, const std::string*>> network_flags = {
      {"--pod-cidr", &network.pod_cidr},    {"--pod-subnet", &network.subnet},
      {"--pod-gateway", &network.gateway},  {"--pod-bridge", &network.bridge},
      {"--pod-network-dir", &network.dir},  {"--cni-bin-dir", &network.cni_bin_dir}};
  const bool any_network_flag =
      std::any_of(network_flags.begin(), network_flags.end(), [](const auto& f) { return !f.second->empty(); });
  for (const auto& [flag, value] : network_flags) {
    if (any_network_flag && value->empty()) return Usage(std::string(flag) + " is required with the other pod network flags");
  }

  agent::RuntimeOptions runtime_options;
  runtime_options.state_dir = state_dir;
  if (any_network_flag) {
    auto made = agent::PodNetwork::Create(network);
    if (made.ok()) {
      runtime_options.network = std::move(made).value();
      runtime_options.network_service_host = network.gateway;
    } else if (made.status().code() == meshwork::StatusCode::kUnavailable) {
      std::cout << "meshwork-node-agent: Pods keep the machine's network with loopback addresses: "
                << made.status().message() << std::endl;
    } else {
      std::cerr << "meshwork-node-agent: " << made.status().message() << "\n";
      return meshwork::ExitCodeFor(made.status().code());
    }
  }
  runtime_options.first_pod_ip = first_pod_ip;
  if (resolution == "auto") runtime_options.resolution = agent::Resolution::kAuto;
  else if (resolution == "mount") runtime_options.resolution = agent::Resolution::kMountNamespace;
  else if (resolution == "preload") runtime_options.resolution = agent::Resolution::kPreload;
  else if (resolution == "none") runtime_options.resolution = agent::Resolution::kNone;
  else return Usage("--resolution " + resolution + ": expected auto, mount, preload or none");

  std::vector<agent::NodeConfig> nodes;
  if (!nodes_file.empty()) {
    std::ifstream in(nodes_file);
    if (!in) {
      std::cerr << "meshwork-node-agent: --nodes " << nodes_file << ": cannot read it\n";
      return exit_code::kIO;
    }
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = agent::ParseNodes(text.str());
    if (!parsed.ok()) {
      std::cerr << "meshwork-node-agent: --nodes " << nodes_file << ": " << parsed.status().message() << "\n";
      return exit_code::kConfig;
    }
    nodes = std::move(parsed).value();
    if (!node_name.empty()) {
      std::vector<agent::NodeConfig> one;
      for (const auto& n : nodes) {
        if (n.name == node_name) one.push_back(n);
      }
      if (one.empty()) {
        std::cerr << "meshwork-node-agent: --node-name " << node_name << ": no such node in --nodes " << nodes_file << "\n";
        return exit_code::kConfig;
      }
      nodes = std::move(one);
    }
  } else {
    nodes.push_back(agent::DefaultNode());
    if (!node_name.empty()) nodes.back().name = node_name;
  }
  for (const auto& node : nodes) runtime_options.node_gpus[node.name] = node.gpus;

  auto config = k8s::LoadKubeconfig(kubeconfig);
  if (!config.ok()) {
    std::cerr << "meshwork-node-agent: --kubeconfig " << kubeconfig << ": " << config.error().ToString() << "\n";
    return exit_code::kConfig;
  }
  k8s::ClientOptions client_options;
  client_options.user_agent = "meshwork-node-agent/0.1";
  auto client = k8s::Client::FromConfig(config.value(), client_options);
  if (!client.ok()) {
    std::cerr << "meshwork-node-agent: --kubeconfig " << kubeconfig << ": " << client.error().ToString() << "\n";
    return exit_code::kConfig;
  }
  k8s::Client* api = client.value().get();
  k8s::Client* names_api = api;
  std::unique_ptr<k8s::Client> names_client;
  if (!names_kubeconfig.empty()) {
    auto names_config = k8s::LoadKubeconfig(names_kubeconfig);
    if (!names_config.ok()) {
      std::cerr << "meshwork-node-agent: --names-kubeconfig " << names_kubeconfig << ": "
                << names_config.error().ToString() << "\n";
      return exit_code::kConfig;
    }
    auto made = k8s::Client::FromConfig(names_config.value(), client_options);
    if (!made.ok()) {
      std::cerr << "meshwork-node-agent: --names-kubeconfig " << names_kubeconfig << ": " << made.error().ToString() << "\n";
      return exit_code::kConfig;
    }
    names_client = std::move(made).value();
    names_api = names_client.get();
  }

  // In-cluster clients find the API server as in a cluster (the Service's address is the
  // server's own here: there is no kube-proxy).
  auto [host, port] = HostPort(config->server);
  runtime_options.extra_env = {{"KUBERNETES_SERVICE_HOST", host}, {"KUBERNETES_SERVICE_PORT", port}};
  // Each Pod's service-account directory: its own bound token (Kubelet asks for it) and the CA.
  runtime_options.service_account = agent::ServiceAccountCredentials{"", config->ca_pem};
  // ConfigMaps and Secrets for env references and volumes (the Node authorizer lets a node read
  // those its Pods name).
  runtime_options.data_source = [api](const std::string& kind, const std::string& ns, const std::string& name)
      -> meshwork::Result<std::map<std::string, std::string>> {
    const bool secret = kind == "Secret";
    auto obj = api->Get(secret ? k8s::ResourceRef{"", "v1", "secrets", true} : k8s::resources::ConfigMaps(), ns,
                        name);
    if (!obj.ok()) return meshwork::NotFound(kind + " " + ns + "/" + name + ": " + obj.error().message());
    std::map<std::string, std::string> out;
    // A ConfigMap's data is text, its binaryData base64; a Secret's data is base64.
    for (const char* section : {"data", "binaryData"}) {
      const bool base64 = secret || std::string(section) == "binaryData";
      const nlohmann::json values = obj->value(section, nlohmann::json::object());  // (items() of a temporary dangles)
      for (const auto& [key, value] : values.items()) {
        if (!value.is_string()) continue;
        if (!base64) {
          out[key] = value.get<std::string>();
          continue;
        }
        auto decoded = k8s::DecodeBase64(value.get<std::string>());
        if (!decoded.ok()) return meshwork::InvalidInput(kind + " " + ns + "/" + name + " key " + key + ": not base64");
        out[key] = std::move(decoded).value();
      }
    }
    return out;
  };

  // Signals are taken by sigwait on this thread; every thread started after this inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto runtime = agent::PodRuntime::Create(runtime_options);
  if (!runtime.ok()) {
    std::cerr << "meshwork-node-agent: " << runtime.status().message() << "\n";
    return runtime.status().code() == meshwork::StatusCode::kInvalidConfig ? exit_code::kConfig : exit_code::kIO;
  }
  agent::KubeletOptions options;
  options.nodes = nodes;
  options.kubelet_port = kubelet_port;
  options.service_account_tokens = true;
  agent::Kubelet kubelet(api, names_api, runtime.value().get(), options);
  // The kubelet API: a loopback HTTP server behind a TLS front that admits only client
  // certificates the cluster CA signed (the API server's kubelet client). Its port is bound
  // before the Node registers: a registered Node means the port is ours (meshwork-cluster reads
  // a taken port as a reason to pick new ones, which it can do only while the Node is not up).
  std::atomic<bool> stopping{false};
  std::unique_ptr<meshwork::controlplane::HttpServer> http;
  std::unique_ptr<meshwork::controlplane::TlsFront> front;
  if (kubelet_port != 0) {
    auto server = meshwork::controlplane::HttpServer::Start(
        {}, agent::KubeletApiHandler(
                runtime.value().get(), [&kubelet](const std::string& ns, const std::string& name) {
                  return kubelet.FindPod(ns, name);
                },
                &stopping));
    if (!server.ok()) {
      std::cerr << "meshwork-node-agent: kubelet API: " << server.status().message() << "\n";
      return exit_code::kUnavailable;
    }
    http = std::move(server).value();
    auto started = meshwork::controlplane::TlsFront::Start(kubelet_port, tls, http->port());
    if (!started.ok()) {
      std::cerr << "meshwork-node-agent: --kubelet-port " << kubelet_port << ": " << started.status().message() << "\n";
      return started.status().code() == meshwork::StatusCode::kInvalidConfig ? exit_code::kConfig
                                                                               : exit_code::kUnavailable;
    }
    front = std::move(started).value();
  }
  if (meshwork::Status st = kubelet.Register(); !st.ok()) {
    std::cerr << "meshwork-node-agent: " << st.message() << "\n";
    return exit_code::kUnavailable;
  }
  kubelet.Start();
  std::cout << "meshwork-node-agent: node";
  for (const auto& node : nodes) std::cout << " " << node.name;
  std::cout << " registered with " << config->server << "; pods resolve names by "
            << agent::ResolutionName(runtime.value()->resolution());
  if (runtime_options.network) {
    std::cout << "; each Pod has its own network namespace on bridge " << network.bridge << " with an address from "
              << network.pod_cidr;
  }
  std::cout << std::endl;

  int sig = 0;
  sigwait(&signals, &sig);
  std::cout << "meshwork-node-agent: signal " << sig << ", stopping pods" << std::endl;
  stopping = true;
  if (front) front->Stop();
  if (http) http->Stop();
  kubelet.Stop();
  runtime.value().reset();  // stops the pods' processes
  return 0;
}
