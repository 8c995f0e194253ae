// meshwork-controlplane: the local Kubernetes-API-compatible control plane (docs/controlplane.md).
// Serves the API on 127.0.0.1 with bearer-token auth, keeps objects in a durable store under
// --data-dir, runs pods with the node agent, and writes a kubeconfig for kubectl and the operator.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "controlplane/agent/node_agent.h"
#include "controlplane/apiserver/api_server.h"
#include "controlplane/apiserver/controllers.h"
#include "controlplane/net/tls_front.h"
#include "controlplane/net/http_server.h"
#include "controlplane/store/store.h"
#include "common/base64.h"
#include "common/status.h"

namespace mc = meshwork::controlplane;

namespace {

const char* kUsage =
    "usage: meshwork-controlplane --data-dir DIR [--port N] [--kubeconfig FILE] [--nodes FILE]\n"
    "                             [--token TOKEN] [--history-events N] [--insecure-http]\n"
    "                             [--audit-log FILE]\n"
    "  --data-dir DIR        where objects, pod logs, the token and the kubeconfig live (required)\n"
    "  --port N              port on 127.0.0.1 (default 0: the kernel picks one)\n"
    "  --kubeconfig FILE     kubeconfig to write (default DIR/kubeconfig)\n"
    "  --nodes FILE          nodes config, YAML or JSON (default: one node \"local\" with this\n"
    "                        machine's cores and memory)\n"
    "  --token TOKEN         bearer token clients must send (default: random, kept in DIR/token)\n"
    "  --history-events N    watch events kept for resuming watches (default 10000)\n"
    "  --insecure-http       serve plain HTTP without authentication instead of HTTPS with the\n"
    "                        token (kubectl never sends a token over plain HTTP)\n"
    "  --audit-log FILE      append one JSON line per API request answered (verb, resource,\n"
    "                        namespace, name, user agent, code) to FILE\n";

struct Flags {
  std::string data_dir;
  int port = 0;
  std::string kubeconfig;
  std::string nodes;
  std::string token;
  size_t history_events = 10000;
  bool insecure_http = false;
  std::string audit_log;
};

int Usage(const std::string& message) {
  std::cerr << "meshwork-controlplane: " << message << "\n" << kUsage;
  return meshwork::exit_code::kConfig;
}

bool ParseNumber(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Returns -1 when parsing succeeded, else the exit code.
int ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--insecure-http") {
      f->insecure_http = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    }
    std::string name = arg, value;
    bool has_value = false;
    auto eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    static const char* kKnown[] = {"--data-dir", "--port", "--kubeconfig", "--nodes", "--token", "--history-events", "--audit-log"};
    bool known = false;
    for (const char* k : kKnown) known = known || name == k;
    if (!known) return Usage("unknown flag " + name);
    if (!has_value) {
      if (i + 1 >= argc) return Usage("flag " + name + " needs a value");
      value = argv[++i];
    }
    long long n;
    if (name == "--data-dir") {
      if (value.empty()) return Usage("--data-dir: must not be empty");
      f->data_dir = value;
    } else if (name == "--port") {
      if (!ParseNumber(value, 0, 65535, &n)) return Usage("--port: invalid value \"" + value + "\" (want 0..65535)");
      f->port = static_cast<int>(n);
    } else if (name == "--kubeconfig") {
      if (value.empty()) return Usage("--kubeconfig: must not be empty");
      f->kubeconfig = value;
    } else if (name == "--nodes") {
      f->nodes = value;
    } else if (name == "--token") {
      if (value.empty() || value.find_first_of(" \t\r\n") != std::string::npos) {
        return Usage("--token: invalid value (must be non-empty, without whitespace)");
      }
      f->token = value;
    } else if (name == "--history-events") {
      if (!ParseNumber(value, 1, 100000000, &n)) return Usage("--history-events: invalid value \"" + value + "\" (want a positive integer)");
      f->history_events = static_cast<size_t>(n);
    } else if (name == "--audit-log") {
      if (value.empty()) return Usage("--audit-log: must not be empty");
      f->audit_log = value;
    }
  }
  if (f->data_dir.empty()) return Usage("--data-dir is required");
  return -1;
}

bool WriteFileAtomically(const std::string& path, const std::string& content, mode_t mode, std::string* error) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      *error = "cannot write " + tmp;
      return false;
    }
    out << content;
    out.flush();
    if (!out) {
      *error = "cannot write " + tmp;
      return false;
    }
  }
  chmod(tmp.c_str(), mode);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + " to " + path;
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string RandomToken() {
  std::random_device rd;
  std::string out;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 40; ++i) out += hex[rd() % 16];
  return out;
}

std::string Kubeconfig(const std::string& server, const std::string& token, const std::string& ca_pem) {
  std::ostringstream k;
  k << "apiVersion: v1\n"
    << "kind: Config\n"
    << "clusters:\n"
    << "- name: meshwork-local\n"
    << "  cluster:\n"
    << "    server: " << server << "\n";
  if (!ca_pem.empty()) k << "    certificate-authority-data: " << meshwork::Base64Encode(ca_pem) << "\n";
  k
    << "users:\n"
    << "- name: meshwork-local\n"
    << "  user:\n"
    << "    token: " << token << "\n"
    << "contexts:\n"
    << "- name: meshwork-local\n"
    << "  context:\n"
    << "    cluster: meshwork-local\n"
    << "    user: meshwork-local\n"
    << "    namespace: default\n"
    << "current-context: meshwork-local\n";
  return k.str();
}

int Run(const Flags& flags) {
  using meshwork::exit_code::kConfig;
  using meshwork::exit_code::kIO;
  using meshwork::exit_code::kUnavailable;
  if (mkdir(flags.data_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::cerr << "meshwork-controlplane: --data-dir " << flags.data_dir << ": cannot create: " << std::strerror(errno) << "\n";
    return kIO;
  }
  // Nodes first: a bad config is the user's to fix before anything starts.
  std::vector<mc::agent::NodeConfig> nodes;
  if (!flags.nodes.empty()) {
    std::ifstream in(flags.nodes);
    if (!in) {
      std::cerr << "meshwork-controlplane: --nodes " << flags.nodes << ": cannot read the file\n";
      return kConfig;
    }
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = mc::agent::ParseNodes(text.str());
    if (!parsed.ok()) {
      std::cerr << "meshwork-controlplane: --nodes " << flags.nodes << ": " << parsed.status().message() << "\n";
      return kConfig;
    }
    nodes = std::move(parsed).value();
  } else {
    nodes.push_back(mc::agent::DefaultNode());
  }
  std::string token = flags.token;
  std::string token_path = flags.data_dir + "/token";
  if (token.empty()) {
    std::ifstream in(token_path);
    std::getline(in, token);
    if (token.empty()) {
      token = RandomToken();
      std::string err;
      if (!WriteFileAtomically(token_path, token + "\n", 0600, &err)) {
        std::cerr << "meshwork-controlplane: " << err << "\n";
        return kIO;
      }
    }
  }
  std::unique_ptr<mc::AuditLog> audit_log;
  if (!flags.audit_log.empty()) {
    auto opened = mc::AuditLog::Open(flags.audit_log);
    if (!opened.ok()) {
      std::cerr << "meshwork-controlplane: --audit-log " << flags.audit_log << ": " << opened.status().message() << "\n";
      return kIO;
    }
    audit_log = std::move(opened).value();
  }
  std::string kubeconfig = flags.kubeconfig.empty() ? flags.data_dir + "/kubeconfig" : flags.kubeconfig;

  // Signals are taken by sigwait on this thread; every thread started after this inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  mc::StoreOptions store_options;
  store_options.history_events = flags.history_events;
  auto store = mc::Store::Open(flags.data_dir + "/store", store_options);
  if (!store.ok()) {
    std::cerr << "meshwork-controlplane: store " << flags.data_dir << "/store: " << store.error().ToString() << "\n";
    return kIO;
  }
  mc::ApiServerOptions api_options;
  // kubectl sends a bearer token only over TLS: plain HTTP has no authentication.
  if (!flags.insecure_http) api_options.token = token;
  api_options.audit_log = audit_log.get();
  mc::ApiServer api(store.value().get(), api_options);
  if (meshwork::Status st = api.Bootstrap(); !st.ok()) {
    std::cerr << "meshwork-controlplane: " << st.message() << "\n";
    return kIO;
  }
  mc::HttpServerOptions http_options;
  // With TLS the API server listens on a kernel-picked loopback port behind the TLS front.
  http_options.port = flags.insecure_http ? flags.port : 0;
  auto server = mc::HttpServer::Start(http_options, [&api](const mc::HttpRequest& r) { return api.Handle(r); });
  if (!server.ok()) {
    std::cerr << "meshwork-controlplane: --port " << flags.port << ": " << server.status().message() << "\n";
    return server.status().code() == meshwork::StatusCode::kInvalidConfig ? kConfig : kUnavailable;
  }
  int port = server.value()->port();
  std::unique_ptr<mc::TlsFront> tls;
  std::string ca_pem;
  if (!flags.insecure_http) {
    auto material = mc::LoadOrCreateServingCert(flags.data_dir + "/pki");
    if (!material.ok()) {
      std::cerr << "meshwork-controlplane: serving certificate: " << material.status().message() << "\n";
      return kIO;
    }
    auto front = mc::TlsFront::Start(flags.port, material.value(), port);
    if (!front.ok()) {
      std::cerr << "meshwork-controlplane: --port " << flags.port << ": " << front.status().message() << "\n";
      return kUnavailable;
    }
    tls = std::move(front).value();
    port = tls->port();
    ca_pem = material->cert_pem;
  }

  mc::agent::RuntimeOptions runtime_options;
  runtime_options.state_dir = flags.data_dir + "/agent";
  runtime_options.extra_env = {{"KUBERNETES_SERVICE_HOST", "127.0.0.1"},
                               {"KUBERNETES_SERVICE_PORT", std::to_string(port)}};
  // Pods' stand-in for the mounted service-account token (docs/controlplane-agent.md).
  runtime_options.service_account = mc::agent::ServiceAccountCredentials{token, ca_pem};
  for (const auto& node : nodes) runtime_options.node_gpus[node.name] = node.gpus;
  mc::Store* store_ptr = store.value().get();
  runtime_options.env_source = [store_ptr](const std::string& kind, const std::string& ns,
                                           const std::string& name,
                                           const std::string& key) -> meshwork::Result<std::string> {
    if (kind != "ConfigMap") return meshwork::NotFound(kind + "s are not served by the local control plane");
    auto cm = store_ptr->Get(mc::StoreKey("configmaps", ns, name));
    if (!cm) return meshwork::NotFound("configmap \"" + name + "\" not found");
    if (!cm->contains("data") || !(*cm)["data"].contains(key)) {
      return meshwork::NotFound("couldn't find key " + key + " in ConfigMap " + ns + "/" + name);
    }
    return (*cm)["data"][key].get<std::string>();
  };
  auto runtime = mc::agent::PodRuntime::Create(runtime_options);
  if (!runtime.ok()) {
    std::cerr << "meshwork-controlplane: node agent: " << runtime.status().message() << "\n";
    return kIO;
  }
  mc::agent::PodRuntime* rt = runtime.value().get();
  api.SetPodLogSource({[rt](const std::string& uid, const std::string& container, bool previous) {
    return previous ? rt->PreviousLogPath(uid, container) : rt->LogPath(uid, container);
  }});
  api.SetPodsHaveAgent(true);
  mc::PodController pods(&api, nodes, rt);
  pods.RegisterNodes();
  pods.Start();
  mc::GarbageCollector gc(&api);
  gc.Start();
  mc::DeploymentController deployments(&api);
  deployments.Start();

  std::string server_url = std::string(flags.insecure_http ? "http" : "https") + "://127.0.0.1:" + std::to_string(port);
  std::string err;
  if (!WriteFileAtomically(kubeconfig, Kubeconfig(server_url, token, ca_pem), 0600, &err)) {
    std::cerr << "meshwork-controlplane: --kubeconfig: " << err << "\n";
    return kIO;
  }
  std::cout << "meshwork-controlplane: serving on " << server_url << " (kubeconfig " << kubeconfig << ")" << std::endl;

  int sig = 0;
  sigwait(&signals, &sig);
  std::cerr << "meshwork-controlplane: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", shutting down" << std::endl;
  api.Shutdown();
  deployments.Stop();
  gc.Stop();
  pods.Stop();
  if (tls) tls->Stop();
  server.value()->Stop();
  runtime.value().reset();  // stops the pods' processes
  return meshwork::exit_code::kOk;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  int rc = ParseFlags(argc, argv, &flags);
  if (rc >= 0) return rc;
  try {
    return Run(flags);
  } catch (const std::exception& e) {
    std::cerr << "meshwork-controlplane: internal error: " << e.what() << "\n";
    return meshwork::exit_code::kRuntime;
  }
}
