// kubeconfig and in-cluster config loading (see config.h).
#include "operator/k8s/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "common/base64.h"

namespace meshwork::k8s {
namespace {

Error ConfigError(std::string m) { return Error(ErrorKind::kInvalidConfig, std::move(m)); }

bool FileExists(const std::string& path) {
  std::ifstream f(path);
  return f.good();
}

Result<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return ConfigError("cannot read " + what + " file " + path + ": " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// kubeconfig paths are relative to the file that names them.
std::string Resolve(const std::string& file, const std::string& rel) {
  if (rel.empty() || rel[0] == '/') return rel;
  return DirOf(file) + "/" + rel;
}

// One named entry (cluster, user or context) and the file it came from.
struct Entry {
  YAML::Node node;
  std::string file;
};

struct Merged {
  std::map<std::string, Entry> clusters, users, contexts;
  std::string current_context;
  std::string current_context_file;
  std::vector<std::string> files;
};

Error MergeList(const YAML::Node& root, const char* list_key, const char* item_key,
                const std::string& file, std::map<std::string, Entry>* out) {
  YAML::Node list = root[list_key];
  if (!list || list.IsNull()) return Error::Ok();
  if (!list.IsSequence()) return ConfigError("kubeconfig " + file + ": " + list_key + " must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    YAML::Node item = list[i];
    std::string where = "kubeconfig " + file + ": " + list_key + "[" + std::to_string(i) + "]";
    if (!item.IsMap() || !item["name"] || !item["name"].IsScalar()) {
      return ConfigError(where + " has no name");
    }
    std::string name = item["name"].as<std::string>();
    YAML::Node body = item[item_key];
    if (body && !body.IsNull() && !body.IsMap()) {
      return ConfigError(where + " (" + name + "): " + item_key + " must be a map");
    }
    out->emplace(name, Entry{body ? body : YAML::Node(YAML::NodeType::Map), file});  // first wins
  }
  return Error::Ok();
}

Error MergeFile(const std::string& file, Merged* m) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    return ConfigError("kubeconfig " + file + " is not valid YAML: " + e.what());
  }
  if (root.IsNull()) return Error::Ok();  // an empty file contributes nothing, as for kubectl
  if (!root.IsMap()) return ConfigError("kubeconfig " + file + " is not a YAML map");
  try {
    MW_RETURN_IF_ERROR(MergeList(root, "clusters", "cluster", file, &m->clusters));
    MW_RETURN_IF_ERROR(MergeList(root, "users", "user", file, &m->users));
    MW_RETURN_IF_ERROR(MergeList(root, "contexts", "context", file, &m->contexts));
    if (m->current_context.empty() && root["current-context"] && root["current-context"].IsScalar()) {
      m->current_context = root["current-context"].as<std::string>();
      m->current_context_file = file;
    }
  } catch (const YAML::Exception& e) {
    return ConfigError("kubeconfig " + file + ": " + e.what());
  }
  m->files.push_back(file);
  return Error::Ok();
}

// A string field of an entry; "" when absent. Errors name file, entry and key.
Result<std::string> Str(const Entry& e, const std::string& what, const char* key) {
  YAML::Node v = e.node[key];
  if (!v || v.IsNull()) return std::string();
  if (!v.IsScalar()) return ConfigError("kubeconfig " + e.file + ": " + what + "." + key + " must be a string");
  return v.as<std::string>();
}

Result<bool> Bool(const Entry& e, const std::string& what, const char* key) {
  YAML::Node v = e.node[key];
  if (!v || v.IsNull()) return false;
  try {
    return v.as<bool>();
  } catch (const YAML::Exception&) {
    return ConfigError("kubeconfig " + e.file + ": " + what + "." + key + " must be true or false, got \"" +
                       (v.IsScalar() ? v.as<std::string>() : std::string("?")) + "\"");
  }
}

// Inline "-data" (base64) wins over the file key, as in kubectl.
Result<std::string> Material(const Entry& e, const std::string& what, const char* file_key,
                             const char* data_key) {
  MW_ASSIGN_OR_RETURN(std::string data, Str(e, what, data_key));
  if (!data.empty()) {
    auto decoded = DecodeBase64(data);
    if (!decoded.ok()) {
      return ConfigError("kubeconfig " + e.file + ": " + what + "." + data_key + " is not valid base64: " +
                         decoded.error().message());
    }
    return std::move(decoded).value();
  }
  MW_ASSIGN_OR_RETURN(std::string path, Str(e, what, file_key));
  if (path.empty()) return std::string();
  return ReadFile(Resolve(e.file, path), std::string(file_key) + " (" + what + " in kubeconfig " + e.file + ")");
}

std::string Names(const std::map<std::string, Entry>& m) {
  std::string s;
  for (const auto& [name, _] : m) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "none" : s;
}

std::vector<std::string> SplitPaths(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ':') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

Error CheckServer(const std::string& server, const std::string& where) {
  if (server.rfind("https://", 0) != 0 && server.rfind("http://", 0) != 0) {
    return ConfigError(where + ": server \"" + server + "\" must start with https:// or http://");
  }
  return Error::Ok();
}

}  // namespace

Result<std::string> DecodeBase64(const std::string& in) {
  std::string why;
  auto out = Base64Decode(in, &why);
  if (!out) return Error(ErrorKind::kInvalidConfig, why);
  return *out;
}

Result<Config> LoadKubeconfig(const std::string& path, const std::string& context) {
  std::vector<std::string> files = SplitPaths(path);
  if (files.empty()) return ConfigError("no kubeconfig path given");
  Merged m;
  std::vector<std::string> missing;
  for (const auto& f : files) {
    // A single named file must exist; in a ':' list, missing files are skipped (kubectl does).
    if (!FileExists(f)) {
      missing.push_back(f);
      continue;
    }
    MW_RETURN_IF_ERROR(MergeFile(f, &m));
  }
  if (m.files.empty()) {
    std::string list;
    for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
    return ConfigError("kubeconfig file not found: " + list);
  }
  std::string all = m.files.size() == 1 ? m.files[0] : path;

  std::string ctx_name = context.empty() ? m.current_context : context;
  if (ctx_name.empty()) {
    return ConfigError("kubeconfig " + all + ": current-context is not set and no context was given (contexts: " +
                       Names(m.contexts) + ")");
  }
  auto ctx_it = m.contexts.find(ctx_name);
  if (ctx_it == m.contexts.end()) {
    return ConfigError("kubeconfig " + all + ": context \"" + ctx_name + "\" not found (contexts: " +
                       Names(m.contexts) + ")");
  }
  const Entry& ctx = ctx_it->second;
  std::string ctx_what = "contexts[" + ctx_name + "].context";
  MW_ASSIGN_OR_RETURN(std::string cluster_name, Str(ctx, ctx_what, "cluster"));
  MW_ASSIGN_OR_RETURN(std::string user_name, Str(ctx, ctx_what, "user"));
  MW_ASSIGN_OR_RETURN(std::string ns, Str(ctx, ctx_what, "namespace"));
  if (cluster_name.empty()) {
    return ConfigError("kubeconfig " + ctx.file + ": " + ctx_what + ".cluster is not set");
  }
  auto cl_it = m.clusters.find(cluster_name);
  if (cl_it == m.clusters.end()) {
    return ConfigError("kubeconfig " + all + ": cluster \"" + cluster_name + "\" (named by context \"" + ctx_name +
                       "\") not found (clusters: " + Names(m.clusters) + ")");
  }
  const Entry& cl = cl_it->second;
  std::string cl_what = "clusters[" + cluster_name + "].cluster";

  Config cfg;
  cfg.source = "kubeconfig " + all + " (context " + ctx_name + ")";
  if (!ns.empty()) cfg.default_namespace = ns;
  MW_ASSIGN_OR_RETURN(cfg.server, Str(cl, cl_what, "server"));
  if (cfg.server.empty()) return ConfigError("kubeconfig " + cl.file + ": " + cl_what + ".server is not set");
  MW_RETURN_IF_ERROR(CheckServer(cfg.server, "kubeconfig " + cl.file + ": " + cl_what));
  while (cfg.server.size() > 1 && cfg.server.back() == '/') cfg.server.pop_back();
  MW_ASSIGN_OR_RETURN(cfg.insecure_skip_tls_verify, Bool(cl, cl_what, "insecure-skip-tls-verify"));
  MW_ASSIGN_OR_RETURN(cfg.ca_pem, Material(cl, cl_what, "certificate-authority", "certificate-authority-data"));

  if (!user_name.empty()) {
    auto u_it = m.users.find(user_name);
    if (u_it == m.users.end()) {
      return ConfigError("kubeconfig " + all + ": user \"" + user_name + "\" (named by context \"" + ctx_name +
                         "\") not found (users: " + Names(m.users) + ")");
    }
    const Entry& u = u_it->second;
    std::string u_what = "users[" + user_name + "].user";
    if (u.node["exec"] || u.node["auth-provider"]) {
      return ConfigError("kubeconfig " + u.file + ": " + u_what +
                         " uses exec/auth-provider credentials, which this client does not support; "
                         "use a token, tokenFile or client certificate");
    }
    MW_ASSIGN_OR_RETURN(cfg.token, Str(u, u_what, "token"));
    MW_ASSIGN_OR_RETURN(std::string token_file, Str(u, u_what, "tokenFile"));
    if (cfg.token.empty() && !token_file.empty()) {
      cfg.token_file = Resolve(u.file, token_file);
      // Read it now so a wrong path fails at start-up, naming the key.
      MW_ASSIGN_OR_RETURN(std::string tok,
                           ReadFile(cfg.token_file, "tokenFile (" + u_what + " in kubeconfig " + u.file + ")"));
      cfg.token = Trim(tok);
    }
    MW_ASSIGN_OR_RETURN(cfg.client_cert_pem, Material(u, u_what, "client-certificate", "client-certificate-data"));
    MW_ASSIGN_OR_RETURN(cfg.client_key_pem, Material(u, u_what, "client-key", "client-key-data"));
    if (cfg.client_cert_pem.empty() != cfg.client_key_pem.empty()) {
      return ConfigError("kubeconfig " + u.file + ": " + u_what +
                         " sets only one of client-certificate(-data) and client-key(-data); both are needed");
    }
  }
  return cfg;
}

Result<Config> LoadKubeconfigFromEnv(const std::string& context) {
  const char* env = std::getenv("KUBECONFIG");
  if (env != nullptr && *env != '\0') return LoadKubeconfig(env, context);
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    return ConfigError("neither KUBECONFIG nor HOME is set: no kubeconfig to read");
  }
  return LoadKubeconfig(std::string(home) + "/.kube/config", context);
}

Result<Config> InClusterConfig(const std::string& root) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    return ConfigError("in-cluster config needs KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT; "
                       "they are not set (not running in a pod?)");
  }
  std::string h = host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";  // IPv6
  Config cfg;
  cfg.source = "in-cluster service account (" + root + ")";
  cfg.server = "https://" + h + ":" + port;
  cfg.token_file = root + "/token";
  MW_ASSIGN_OR_RETURN(std::string tok, ReadFile(cfg.token_file, "service-account token"));
  cfg.token = Trim(tok);
  if (cfg.token.empty()) return ConfigError("service-account token file " + cfg.token_file + " is empty");
  MW_ASSIGN_OR_RETURN(cfg.ca_pem, ReadFile(root + "/ca.crt", "service-account CA"));
  std::string ns_file = root + "/namespace";
  if (FileExists(ns_file)) {
    MW_ASSIGN_OR_RETURN(std::string ns, ReadFile(ns_file, "service-account namespace"));
    ns = Trim(ns);
    if (!ns.empty()) cfg.default_namespace = ns;
  }
  return cfg;
}

Result<Config> AutoConfig() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host != nullptr && *host != '\0' && port != nullptr && *port != '\0') {
    const char* dir = std::getenv(kServiceAccountDirEnv);
    return InClusterConfig(dir != nullptr && *dir != '\0' ? dir : kServiceAccountDir);
  }
  return LoadKubeconfigFromEnv();
}

}  // namespace meshwork::k8s
