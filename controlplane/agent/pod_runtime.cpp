// The pod runtime: each container a local process group, restarted as kubelet would, its
// status reported as a Pod's status; each pod its own network namespace (or loopback IP) and hosts
// file.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"
#include "common/file.h"
#include "common/subprocess.h"

extern char** environ;

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using SystemClock = std::chrono::system_clock;
namespace fs = std::filesystem;

constexpr int kExitNotFound = 127;  // as a shell reports a missing command
constexpr const char* kGpuResource = "nvidia.com/gpu";
constexpr int kExitStartError = 128;

std::string ErrnoText(int err) { return std::strerror(err); }

// ---- loopback addresses --------------------------------------------------------------------

// Pod IPs are 127.a.b.c with a in 1..254 and c in 1..254: never 127.0.x.x, where the machine's
// own loopback names live (127.0.0.1, 127.0.0.53, 127.0.1.1).
constexpr uint32_t kIpSlots = 254u * 256u * 254u;

std::string SlotToIp(uint32_t slot) {
  uint32_t a = 1 + slot / (256u * 254u);
  uint32_t b = (slot / 254u) % 256u;
  uint32_t c = 1 + slot % 254u;
  return "127." + std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
}

Result<uint32_t> IpToSlot(const std::string& ip) {
  in_addr addr{};
  if (inet_pton(AF_INET, ip.c_str(), &addr) != 1) {
    return InvalidConfig("first_pod_ip \"" + ip + "\" is not an IPv4 address");
  }
  uint32_t h = ntohl(addr.s_addr);
  uint32_t a = (h >> 16) & 0xff, b = (h >> 8) & 0xff, c = h & 0xff;
  if ((h >> 24) != 127 || a == 0 || a == 255 || c == 0 || c == 255) {
    return InvalidConfig("first_pod_ip \"" + ip + "\" must be in 127.1.0.1 - 127.254.255.254 with a last byte of 1-254");
  }
  return (a - 1) * 256u * 254u + b * 254u + (c - 1);
}

// ---- environment and command ---------------------------------------------------------------

// Kubernetes' $(VAR) expansion: known names are replaced, "$$" is a literal "$", anything else stays.
std::string Expand(const std::string& in, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '$' && i + 1 < in.size() && in[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (in[i] == '$' && i + 1 < in.size() && in[i + 1] == '(') {
      size_t close = in.find(')', i + 2);
      if (close != std::string::npos) {
        auto it = vars.find(in.substr(i + 2, close - i - 2));
        if (it != vars.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out += in[i];
  }
  return out;
}

// An ordered environment: later definitions replace earlier ones in place.
class EnvList {
 public:
  void Set(const std::string& k, const std::string& v) {
    auto it = index_.find(k);
    if (it == index_.end()) {
      index_[k] = entries_.size();
      entries_.push_back({k, v});
    } else {
      entries_[it->second].second = v;
    }
    values_[k] = v;
  }
  const std::map<std::string, std::string>& values() const { return values_; }
  std::vector<std::string> Strings() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : entries_) out.push_back(k + "=" + v);
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> values_;
};

// What metadata.labels['app'] names: the map key inside the brackets.
bool BracketKey(const std::string& path, const std::string& prefix, std::string* key) {
  if (path.rfind(prefix + "['", 0) != 0 || path.size() < prefix.size() + 4 || path.compare(path.size() - 2, 2, "']") != 0) {
    return false;
  }
  *key = path.substr(prefix.size() + 2, path.size() - prefix.size() - 4);
  return true;
}

std::string JsonToText(const json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); }

}  // namespace

const char* ResolutionName(Resolution r) {
  switch (r) {
    case Resolution::kAuto: return "auto";
    case Resolution::kMountNamespace: return "mount-namespace";
    case Resolution::kPreload: return "preload";
    case Resolution::kNone: return "none";
  }
  return "unknown";
}

struct PodRuntime::Impl {
  // What a container runs: everything the child needs, built before fork.
  struct Prepared {
    std::string path;  // the executable; empty when not found
    std::vector<std::string> argv;
    std::vector<std::string> env;
    std::string working_dir;
    std::string config_error;  // CreateContainerConfigError: env could not be built
    std::string start_error;   // StartError before fork (no command, not found)
    int start_exit_code = kExitNotFound;
  };

  struct Termination {
    int exit_code = 0;
    int signal = 0;
    std::string reason;
    std::string message;
    std::string started_at, finished_at;
    std::string container_id;
  };

  enum class State { kWaiting, kStarting, kRunning, kBackoff, kConfigError, kDone };

  struct Container {
    json spec;
    std::string name;
    State state = State::kWaiting;
    pid_t pid = -1;
    std::string container_id;
    std::string started_at;
    SteadyClock::time_point started_steady;
    std::optional<Termination> last;      // the most recent termination
    std::optional<Termination> previous;  // the one before it
    std::string waiting_reason, waiting_message;
    int restart_count = 0;
    int backoff_step = 0;
    SteadyClock::time_point next_attempt;
    bool ever_started = false;
  };

  struct Pod {
    json object;
    std::string uid, name, ns, hostname, subdomain, ip, restart_policy, dir, hosts_path;
    std::string netns;       // the file pinning its network namespace; empty: the machine's, ip a loopback slot
    std::string node;        // spec.nodeName
    std::vector<int> gpus;   // device indices on `node` its containers hold
    uint32_t ip_slot = 0;
    int spec_grace = -1;
    std::vector<Container> containers;
    std::string start_time;
    bool stopping = false;
    bool remove_when_stopped = false;
    // Its network namespace (and with it the address) went when it finished, as kubelet tears
    // down a finished Pod's sandbox: a node's addresses must not run out under finished Pods
    // that are kept (a job's cleanPodPolicy), only under running ones.
    bool network_released = false;
    SteadyClock::time_point kill_at;
    std::map<std::string, std::pair<bool, std::string>> conditions;  // type -> (true?, since)
    json reported;  // the status Poll last returned
    // Finished (every container kDone, which nothing leaves) with that status reported: it
    // changes no more, and Poll does not build it again. Kept finished Pods (a job's
    // cleanPodPolicy) made each 100 ms pass cost O(Pods): 2,000 of them, most of the agent's CPU.
    bool final_reported = false;
  };

  explicit Impl(RuntimeOptions o) : options(std::move(o)) {}

  RuntimeOptions options;
  Resolution resolution = Resolution::kNone;
  std::string preload_library;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::map<std::string, Pod> pods;
  std::map<std::string, std::string> hosts;  // SetHosts
  // The names part of a hosts file by namespace (RenderHostsNames), rendered once per SetHosts:
  // each file lists every name, and rendering them again for each pod started in a burst of jobs
  // made a pod's start cost grow with the cluster's pod count.
  mutable std::map<std::string, std::string> hosts_names_by_ns;
  std::set<uint32_t> ips_in_use;
  uint32_t next_ip_slot = 0;
  std::vector<std::string> networks_to_release;  // removed pods' uids whose namespace is still pinned
  std::set<std::string> starting;  // uids a Start is making the network of, outside the lock
  bool shutting_down = false;
  SteadyClock::time_point shutdown_deadline;
  std::thread monitor;

  // ---- helpers under mu ----

  std::string Now() const { return internal::Rfc3339(SystemClock::now()); }

  Status WriteHostsFile(const Pod& pod) const {
    auto names = hosts_names_by_ns.find(pod.ns);
    if (names == hosts_names_by_ns.end()) {
      names = hosts_names_by_ns.emplace(pod.ns, internal::RenderHostsNames(pod.ns, options.cluster_domain, hosts)).first;
    }
    std::string text = internal::RenderHostsFile(pod.ip, pod.hostname, pod.subdomain, pod.ns, options.cluster_domain, {}) +
                       names->second;
    // Rewritten in place (same inode): a bind mount of the file keeps showing the new contents.
    return WriteFileInPlace(pod.hosts_path, text, 0644, "hosts file " + pod.hosts_path);
  }

  // Truncates and writes `path` (same inode), with `mode` even when the file existed or the
  // umask is wider.
  static Status WriteFileInPlace(const std::string& path, const std::string& text, int mode,
                                 const std::string& what) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return IOError("cannot write " + what + ": " + ErrnoText(errno));
    ::fchmod(fd, static_cast<mode_t>(mode));
    Status s = WriteAll(fd, text.data(), text.size(), what);
    ::close(fd);
    return s;
  }

  // The Pod's service-account directory, "" when it gets none.
  std::string ServiceAccountDir(const json& pod) const {
    if (!options.service_account) return "";
    const json spec = internal::ObjectAt(pod, "spec");
    if (spec.contains("automountServiceAccountToken") && spec["automountServiceAccountToken"] == false) return "";
    return options.state_dir + "/pods/" + internal::StringAt(internal::ObjectAt(pod, "metadata"), "uid") +
           "/serviceaccount";
  }

  Status WriteServiceAccountDir(const Pod& pod, const std::string& token_override) const {
    std::string dir = ServiceAccountDir(pod.object);
    if (dir.empty()) return Status::Ok();
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return IOError("cannot create service account directory " + dir + ": " + ec.message());
    const ServiceAccountCredentials& sa = *options.service_account;
    const std::string& token = token_override.empty() ? sa.token : token_override;
    for (const auto& [file, text, mode] : {std::make_tuple("token", token, 0600),
                                           std::make_tuple("ca.crt", sa.ca_pem, 0644),
                                           std::make_tuple("namespace", pod.ns, 0644)}) {
      std::string path = dir + "/" + file;
      MW_RETURN_IF_ERROR(WriteFileInPlace(path, text, mode, path));
    }
    return Status::Ok();
  }

  std::string LogFile(const Pod& pod, const std::string& container, bool previous) const {
    return pod.dir + "/" + container + (previous ? ".previous.log" : ".log");
  }

  // ---- preparing a container (no lock: may call the data source) ----

  // A volumeMount's mountPath and the directory (or file, with subPath) it stands for here.
  struct Mount {
    std::string path;
    std::string host;
  };

  // Replaces every path under a mount's path in `text` with the mount's host path: where the
  // mount path starts the text or follows a separator (= : , ; | & ( ) < > quotes, white space),
  // and ends it or is followed by / or a separator other than = ("--config=/etc/cfg/a.yaml",
  // "/etc/cfg:/x", "cat /etc/cfg/a; ls /etc/cfg").
  static std::string RewritePaths(const std::string& text, const std::vector<Mount>& mounts) {
    if (mounts.empty()) return text;
    static const char* kSeparators = "=:,;|&()<>'\" \t\n";
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
      bool replaced = false;
      if (text[i] == '/' && (i == 0 || std::strchr(kSeparators, text[i - 1]) != nullptr)) {
        for (const Mount& m : mounts) {  // longest path first
          if (text.compare(i, m.path.size(), m.path) != 0) continue;
          const size_t end = i + m.path.size();
          if (end < text.size() && text[end] != '/' && (text[end] == '=' || std::strchr(kSeparators, text[end]) == nullptr)) {
            continue;
          }
          out += m.host;
          i = end;
          replaced = true;
          break;
        }
      }
      if (!replaced) out += text[i++];
    }
    return out;
  }

  // Writes a configMap or secret volume's files (its items, or every key) into `dir`; returns
  // "" or the config error.
  std::string WriteDataVolume(const json& source, bool secret, const std::string& ns, const std::string& dir,
                              const std::string& field) const {
    const std::string kind = secret ? "Secret" : "ConfigMap";
    const std::string name = internal::StringAt(source, secret ? "secretName" : "name");
    const bool optional = source.contains("optional") && source["optional"].is_boolean() && source["optional"].get<bool>();
    int default_mode = 0644;
    if (source.contains("defaultMode") && source["defaultMode"].is_number_integer()) {
      default_mode = source["defaultMode"].get<int>() & 0777;
    }
    if (!options.data_source) return field + ": " + kind + " volumes are not available in this node agent";
    std::map<std::string, std::string> data;
    auto got = options.data_source(kind, ns, name);
    if (got.ok()) data = std::move(got).value();
    else if (!optional) return field + ": " + got.status().message();
    std::vector<std::tuple<std::string, std::string, int>> files;  // relative path, contents, mode
    const json items = internal::ArrayAt(source, "items");
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string key = internal::StringAt(items[i], "key"), path = internal::StringAt(items[i], "path");
      const std::string item = field + ".items[" + std::to_string(i) + "]";
      if (path.empty() || path[0] == '/' || path == ".." || path.rfind("../", 0) == 0 ||
          path.find("/../") != std::string::npos || (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0)) {
        return item + ".path \"" + path + "\" must be a relative path without ..";
      }
      auto it = data.find(key);
      if (it == data.end()) {
        if (optional) continue;
        return item + ": couldn't find key " + key + " in " + kind + " " + ns + "/" + name;
      }
      int mode = default_mode;
      if (items[i].contains("mode") && items[i]["mode"].is_number_integer()) mode = items[i]["mode"].get<int>() & 0777;
      files.emplace_back(path, it->second, mode);
    }
    if (items.empty()) {
      for (const auto& [key, value] : data) files.emplace_back(key, value, default_mode);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    if (ec) return field + ": cannot create " + dir + ": " + ec.message();
    for (const auto& [path, text, mode] : files) {
      const std::string file = dir + "/" + path;
      fs::create_directories(fs::path(file).parent_path(), ec);
      Status st = WriteFileInPlace(file, text, mode, file);
      if (!st.ok()) return field + ": " + st.message();
    }
    return "";
  }

  // The container's volumeMounts, resolved to this machine's paths (longest mountPath first);
  // returns "" or the config error, which names the field.
  std::string PrepareVolumes(const json& pod, const json& c, const std::string& ns, std::vector<Mount>* mounts) const {
    const json spec = internal::ObjectAt(pod, "spec");
    const std::string volume_root =
        options.state_dir + "/pods/" + internal::StringAt(internal::ObjectAt(pod, "metadata"), "uid") + "/volumes";
    std::map<std::string, std::pair<json, size_t>> volumes;  // name -> (volume, index)
    const json list = internal::ArrayAt(spec, "volumes");
    for (size_t i = 0; i < list.size(); ++i) volumes[internal::StringAt(list[i], "name")] = {list[i], i};
    const json volume_mounts = internal::ArrayAt(c, "volumeMounts");
    std::set<std::string> written;
    for (size_t i = 0; i < volume_mounts.size(); ++i) {
      const json& m = volume_mounts[i];
      const std::string field = "volumeMounts[" + std::to_string(i) + "]";
      const std::string name = internal::StringAt(m, "name");
      std::string path = internal::StringAt(m, "mountPath");
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      if (path.empty() || path[0] != '/' || path == "/") {
        return field + ".mountPath \"" + path + "\" must be an absolute path other than /";
      }
      auto v = volumes.find(name);
      if (v == volumes.end()) return field + ": no volume named \"" + name + "\" in spec.volumes";
      const json& volume = v->second.first;
      const std::string vfield = "spec.volumes[" + std::to_string(v->second.second) + "]";
      const std::string dir = volume_root + "/" + name;
      std::string host;
      if (volume.contains("configMap") || volume.contains("secret")) {
        const bool secret = volume.contains("secret");
        if (written.insert(name).second) {
          std::string err = WriteDataVolume(internal::ObjectAt(volume, secret ? "secret" : "configMap"), secret, ns,
                                            dir, vfield + (secret ? ".secret" : ".configMap"));
          if (!err.empty()) return err;
        }
        host = dir;
      } else if (volume.contains("emptyDir")) {
        std::error_code ec;
        fs::create_directories(dir, ec);  // kept across container restarts, as in a cluster
        if (ec) return vfield + ".emptyDir: cannot create " + dir + ": " + ec.message();
        host = dir;
      } else if (volume.contains("hostPath")) {
        const json hp = internal::ObjectAt(volume, "hostPath");
        host = internal::StringAt(hp, "path");
        if (host.empty() || host[0] != '/') return vfield + ".hostPath.path \"" + host + "\" must be absolute";
        if (internal::StringAt(hp, "type") == "DirectoryOrCreate") {
          std::error_code ec;
          fs::create_directories(host, ec);
          if (ec) return vfield + ".hostPath: cannot create " + host + ": " + ec.message();
        }
      } else {
        continue;  // not provided here (persistentVolumeClaim, nfs, ...): the machine's own path
      }
      const std::string sub = internal::StringAt(m, "subPath");
      if (!sub.empty()) {
        if (sub[0] == '/' || sub == ".." || sub.rfind("../", 0) == 0 || sub.find("/../") != std::string::npos) {
          return field + ".subPath \"" + sub + "\" must be a relative path without ..";
        }
        host += "/" + sub;
      }
      mounts->push_back({path, host});
    }
    std::sort(mounts->begin(), mounts->end(),
              [](const Mount& a, const Mount& b) { return a.path.size() > b.path.size(); });
    return "";
  }

  Prepared Prepare(const json& pod, const json& c, const std::string& ip, const std::string& hostname,
                   const std::string& hosts_path, bool own_network) const {
    Prepared p;
    const json meta = internal::ObjectAt(pod, "metadata");
    const json spec = internal::ObjectAt(pod, "spec");
    std::string ns = internal::StringAt(meta, "namespace");
    if (ns.empty()) ns = "default";
    EnvList env;
    if (options.inherit_environment) {
      for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        std::string kv = *e;
        size_t eq = kv.find('=');
        if (eq == std::string::npos) continue;
        std::string k = kv.substr(0, eq);
        if (k == "LD_PRELOAD" || k == "MESHWORK_HOSTS_FILE" || k == "MESHWORK_SERVICE_ACCOUNT_DIR") continue;
        env.Set(k, kv.substr(eq + 1));
      }
    }
    if (env.values().count("PATH") == 0) env.Set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    env.Set("HOSTNAME", hostname);
    for (const auto& [k, v] : options.extra_env) env.Set(k, v);
    if (own_network && !options.network_service_host.empty()) {
      env.Set("KUBERNETES_SERVICE_HOST", options.network_service_host);
    }
    if (std::string sa_dir = ServiceAccountDir(pod); !sa_dir.empty()) env.Set("MESHWORK_SERVICE_ACCOUNT_DIR", sa_dir);

    const json env_list = internal::ArrayAt(c, "env");
    for (size_t i = 0; i < env_list.size(); ++i) {
      const json& e = env_list[i];
      std::string field = "env[" + std::to_string(i) + "]";
      std::string name = internal::StringAt(e, "name");
      if (name.empty()) {
        p.config_error = field + ".name is required";
        return p;
      }
      if (e.contains("value") && !e["value"].is_null()) {
        env.Set(name, Expand(JsonToText(e["value"]), env.values()));
        continue;
      }
      if (!e.contains("valueFrom") || e["valueFrom"].is_null()) {
        env.Set(name, "");
        continue;
      }
      const json from = internal::ObjectAt(e, "valueFrom");
      if (from.contains("fieldRef")) {
        std::string path = internal::StringAt(internal::ObjectAt(from, "fieldRef"), "fieldPath");
        std::string key, value;
        if (path == "metadata.name") value = internal::StringAt(meta, "name");
        else if (path == "metadata.namespace") value = ns;
        else if (path == "metadata.uid") value = internal::StringAt(meta, "uid");
        else if (path == "spec.nodeName") value = internal::StringAt(spec, "nodeName");
        else if (path == "spec.serviceAccountName") value = internal::StringAt(spec, "serviceAccountName");
        else if (path == "status.podIP" || path == "status.podIPs") value = ip;
        else if (path == "status.hostIP" || path == "status.hostIPs") value = options.host_ip;
        else if (BracketKey(path, "metadata.labels", &key)) value = internal::StringAt(internal::ObjectAt(meta, "labels"), key.c_str());
        else if (BracketKey(path, "metadata.annotations", &key)) value = internal::StringAt(internal::ObjectAt(meta, "annotations"), key.c_str());
        else {
          p.config_error = field + " (" + name + "): unsupported valueFrom.fieldRef.fieldPath \"" + path + "\"";
          return p;
        }
        env.Set(name, value);
      } else if (from.contains("resourceFieldRef")) {
        const json ref = internal::ObjectAt(from, "resourceFieldRef");
        std::string resource = internal::StringAt(ref, "resource");
        size_t dot = resource.find('.');
        std::string section = dot == std::string::npos ? "" : resource.substr(0, dot);
        std::string what = dot == std::string::npos ? "" : resource.substr(dot + 1);
        if ((section != "limits" && section != "requests") || (what != "cpu" && what != "memory")) {
          p.config_error = field + " (" + name + "): unsupported valueFrom.resourceFieldRef.resource \"" + resource + "\"";
          return p;
        }
        const json q = internal::ObjectAt(internal::ObjectAt(c, "resources"), section.c_str());
        json divisor = ref.contains("divisor") ? ref["divisor"] : json("1");
        if (what == "cpu") {
          double cores = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
          if (q.contains("cpu")) {
            auto v = ParseCpu(q["cpu"]);
            if (v.ok()) cores = *v;
          }
          auto d = ParseCpu(divisor);
          if (!d.ok() || *d <= 0) {
            p.config_error = field + " (" + name + "): bad resourceFieldRef.divisor \"" + JsonToText(divisor) + "\"";
            return p;
          }
          env.Set(name, std::to_string(static_cast<int64_t>(std::ceil(cores / *d - 1e-9))));
        } else {
          int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
          if (q.contains("memory")) {
            auto v = ParseBytes(q["memory"]);
            if (v.ok()) bytes = *v;
          }
          auto d = ParseBytes(divisor);
          if (!d.ok() || *d <= 0) {
            p.config_error = field + " (" + name + "): bad resourceFieldRef.divisor \"" + JsonToText(divisor) + "\"";
            return p;
          }
          env.Set(name, std::to_string((bytes + *d - 1) / *d));
        }
      } else if (from.contains("configMapKeyRef") || from.contains("secretKeyRef")) {
        bool is_cm = from.contains("configMapKeyRef");
        const json ref = internal::ObjectAt(from, is_cm ? "configMapKeyRef" : "secretKeyRef");
        std::string kind = is_cm ? "ConfigMap" : "Secret";
        bool optional = ref.contains("optional") && ref["optional"].is_boolean() && ref["optional"].get<bool>();
        if (!options.data_source) {
          if (optional) continue;
          p.config_error = field + " (" + name + "): " + kind + " references are not available in this node agent";
          return p;
        }
        const std::string object = internal::StringAt(ref, "name"), key = internal::StringAt(ref, "key");
        auto data = options.data_source(kind, ns, object);
        auto value = data.ok() ? data->find(key) : std::map<std::string, std::string>::const_iterator();
        if (!data.ok() || value == data->end()) {
          if (optional) continue;
          p.config_error = data.ok() ? "couldn't find key " + key + " in " + kind + " " + ns + "/" + object
                                     : data.status().message();
          return p;
        }
        env.Set(name, value->second);
      } else {
        p.config_error = field + " (" + name + "): valueFrom needs fieldRef, resourceFieldRef, configMapKeyRef or secretKeyRef";
        return p;
      }
    }
    if (c.contains("envFrom") && c["envFrom"].is_array() && !c["envFrom"].empty()) {
      p.config_error = "envFrom is not supported by the local node agent; list the variables under env";
      return p;
    }
    if (resolution == Resolution::kPreload) {
      auto it = env.values().find("LD_PRELOAD");
      std::string existing = it == env.values().end() ? "" : it->second;
      env.Set("LD_PRELOAD", preload_library + (existing.empty() ? "" : ":" + existing));
    }
    env.Set("MESHWORK_HOSTS_FILE", hosts_path);
    std::vector<Mount> mounts;
    p.config_error = PrepareVolumes(pod, c, ns, &mounts);
    if (!p.config_error.empty()) return p;
    for (std::string kv : env.Strings()) p.env.push_back(RewritePaths(kv, mounts));
    p.working_dir = RewritePaths(internal::StringAt(c, "workingDir"), mounts);

    for (const char* key : {"command", "args"}) {
      const json list = internal::ArrayAt(c, key);
      for (const json& a : list) p.argv.push_back(RewritePaths(Expand(JsonToText(a), env.values()), mounts));
    }
    // No image is pulled, so there is no entrypoint: without `command`, `args` is the command
    // line (what `kubectl run NAME --image=x -- sh -c ...` sends).
    if (p.argv.empty()) {
      p.start_error =
          "container has no command or args: the local node agent runs spec.containers[].command and does not pull "
          "images";
      return p;
    }
    // Find the executable in the container's PATH, before fork, as the runtime would.
    const std::string& exe = p.argv[0];
    if (exe.find('/') != std::string::npos) {
      std::string full = exe[0] == '/' || p.working_dir.empty() ? exe : p.working_dir + "/" + exe;
      if (::access(full.c_str(), F_OK) != 0) {
        p.start_error = "exec: \"" + exe + "\": stat " + full + ": no such file or directory";
        return p;
      }
      p.path = full;
      return p;
    }
    std::string path_var = env.values().count("PATH") ? env.values().at("PATH") : "";
    std::stringstream dirs(path_var);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (dir.empty()) dir = ".";
      std::string candidate = dir + "/" + exe;
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
        p.path = candidate;
        return p;
      }
    }
    p.start_error = "exec: \"" + exe + "\": executable file not found in $PATH";
    return p;
  }

  // ---- starting a process (monitor thread, no lock) ----

  struct SpawnResult {
    pid_t pid = -1;
    std::optional<Termination> failed;  // StartError
  };

  SpawnResult Spawn(const Prepared& p, const std::string& log_path, const std::string& hosts_path,
                    const std::string& hostname, const std::string& netns) const {
    SpawnResult r;
    auto fail = [&](int code, const std::string& message) {
      Termination t;
      t.exit_code = code;
      t.reason = "StartError";
      t.message = message;
      t.started_at = t.finished_at = Now();
      r.failed = t;
      return r;
    };
    if (!p.start_error.empty()) {
      // Still create the log, so `kubectl logs` finds an (empty) file.
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd);
      return fail(p.start_exit_code, p.start_error);
    }
    int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return fail(kExitStartError, "cannot open log " + log_path + ": " + ErrnoText(errno));
    int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0) {
      int err = errno;
      ::close(log_fd);
      return fail(kExitStartError, "cannot set up the process: " + ErrnoText(err));
    }
    SpawnOptions spawn;
    spawn.program = p.path;
    spawn.argv = p.argv;
    spawn.env = p.env;
    // Pods die with the control plane (docs/controlplane-agent.md). The forking thread is the
    // runtime's monitor, which lives as long as the runtime, so PR_SET_PDEATHSIG does not fire early.
    spawn.new_session = true;
    if (resolution == Resolution::kMountNamespace) {
      spawn.hosts_file = hosts_path;
      spawn.hostname = hostname;
      if (options.network) spawn.detach_mount = options.network->NamespaceDir();
    }
    spawn.netns = netns;
    spawn.stdin_fd = null_fd;
    spawn.stdout_fd = spawn.stderr_fd = log_fd;
    spawn.close_other_fds = true;
    spawn.working_dir = p.working_dir;
    spawn.failure_exit_code = kExitNotFound;
    Spawned child = SpawnProcess(spawn);
    ::close(log_fd);
    ::close(null_fd);
    if (child.failure) {
      if (child.pid > 0) {
        int status = 0;
        while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      const SpawnFailure& f = *child.failure;
      std::string message = f.step + ": " + ErrnoText(f.error);
      if (f.step == "pipe") message = "cannot set up the process: " + ErrnoText(f.error);
      if (f.step == "chdir") message = "chdir to workingDir \"" + p.working_dir + "\": " + ErrnoText(f.error);
      if (f.step == "exec") message = "exec: \"" + p.path + "\": " + ErrnoText(f.error);
      const bool exec = f.step == "exec";
      int code = exec && f.error == ENOENT ? kExitNotFound : exec && f.error == EACCES ? 126 : kExitStartError;
      return fail(code, message);
    }
    r.pid = child.pid;
    return r;
  }

  // ---- the monitor thread ----

  std::chrono::milliseconds BackoffDelay(int step) const {
    if (step <= 0) return std::chrono::milliseconds(0);
    auto d = options.restart_backoff_initial;
    for (int i = 1; i < step && d < options.restart_backoff_max; ++i) d *= 2;
    return std::min(d, options.restart_backoff_max);
  }

  static std::string TailOfLog(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) return "";
    std::streamoff size = in.tellg();
    std::streamoff start = std::max<std::streamoff>(0, size - 2048);
    in.seekg(start);
    std::string s(static_cast<size_t>(size - start), '\0');
    in.read(&s[0], static_cast<std::streamsize>(s.size()));
    return s;
  }

  // A container's main process has exited: record it, sweep its process group, and decide what next.
  void OnExit(Pod& pod, Container& c, int wait_status, bool status_known) {
    Termination t;
    t.started_at = c.started_at;
    t.finished_at = Now();
    t.container_id = c.container_id;
    if (!status_known) {
      t.exit_code = 255;
      t.reason = "Unknown";
      t.message = "the process was reaped by someone else; its exit status is unknown";
    } else if (WIFSIGNALED(wait_status)) {
      t.signal = WTERMSIG(wait_status);
      t.exit_code = 128 + t.signal;
    } else {
      t.exit_code = WEXITSTATUS(wait_status);
    }
    if (t.reason.empty()) t.reason = t.exit_code == 0 ? "Completed" : "Error";
    if (t.exit_code != 0 && internal::StringAt(c.spec, "terminationMessagePolicy") == "FallbackToLogsOnError") {
      t.message = TailOfLog(LogFile(pod, c.name, false));
    }
    // As in a container, the main process' exit ends everything it started.
    ::kill(-c.pid, SIGKILL);
    c.pid = -1;
    Finish(pod, c, std::move(t));
  }

  void Finish(Pod& pod, Container& c, Termination t) {
    if (c.last) c.previous = c.last;
    c.last = std::move(t);
    bool failed = c.last->exit_code != 0;
    bool restart = !pod.stopping && (pod.restart_policy == "Always" || (pod.restart_policy == "OnFailure" && failed));
    if (!restart) {
      c.state = State::kDone;
      return;
    }
    // kubelet's backoff: a container that ran long enough starts over at the shortest delay.
    if (c.ever_started && SteadyClock::now() - c.started_steady >= 2 * options.restart_backoff_max) c.backoff_step = 0;
    auto delay = BackoffDelay(c.backoff_step);
    ++c.backoff_step;
    c.state = State::kBackoff;
    c.next_attempt = SteadyClock::now() + delay;
    c.waiting_reason = "CrashLoopBackOff";
    c.waiting_message = "back-off " + std::to_string(delay.count() / 1000) + "s restarting failed container=" +
                        c.name + " pod=" + pod.name + "_" + pod.ns + "(" + pod.uid + ")";
  }

  struct SpawnJob {
    std::string uid;
    size_t index;
    json pod, container;
    std::string ip, hostname, hosts_path, log_path, previous_log_path;
    bool rotate;
    std::string netns;
  };

  void MonitorLoop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      std::vector<SpawnJob> jobs;
      auto now = SteadyClock::now();
      for (auto it = pods.begin(); it != pods.end();) {
        Pod& pod = it->second;
        for (size_t i = 0; i < pod.containers.size(); ++i) {
          Container& c = pod.containers[i];
          if (c.state == State::kRunning) {
            int status = 0;
            pid_t r = ::waitpid(c.pid, &status, WNOHANG);
            if (r == c.pid) {
              OnExit(pod, c, status, true);
            } else if (r < 0 && errno == ECHILD) {
              OnExit(pod, c, 0, false);
            } else if (pod.stopping && now >= pod.kill_at) {
              ::kill(-c.pid, SIGKILL);
            }
          }
          if (pod.stopping && (c.state == State::kWaiting || c.state == State::kBackoff || c.state == State::kConfigError)) {
            if (c.state == State::kWaiting || c.state == State::kConfigError) {
              Termination t;
              t.exit_code = 137;
              t.reason = "ContainerStatusUnknown";
              t.message = "The container could not be located when the pod was terminated";
              t.started_at = t.finished_at = Now();
              c.last = t;
            }
            c.state = State::kDone;
          }
          bool due = !pod.stopping && !shutting_down &&
                     ((c.state == State::kWaiting) ||
                      ((c.state == State::kBackoff || c.state == State::kConfigError) && now >= c.next_attempt));
          if (due) {
            c.state = State::kStarting;
            jobs.push_back({pod.uid, i, pod.object, c.spec, pod.ip, pod.hostname, pod.hosts_path,
                            LogFile(pod, c.name, false), LogFile(pod, c.name, true), c.ever_started, pod.netns});
          }
        }
        if (pod.remove_when_stopped && StoppedLocked(pod)) {
          std::error_code ec;
          fs::remove_all(pod.dir, ec);
          if (pod.netns.empty()) ips_in_use.erase(pod.ip_slot);
          if (!pod.netns.empty() && !pod.network_released) networks_to_release.push_back(pod.uid);
          it = pods.erase(it);
        } else {
          if (!pod.netns.empty() && !pod.network_released && FinishedLocked(pod)) {
            networks_to_release.push_back(pod.uid);
            pod.network_released = true;
          }
          ++it;
        }
      }
      if (!networks_to_release.empty()) {
        // The plugins' DEL takes a few tens of milliseconds: not under the lock.
        std::vector<std::string> uids = std::move(networks_to_release);
        networks_to_release.clear();
        lock.unlock();
        ReleaseNetworks(uids);
        lock.lock();
      }
      if (!jobs.empty()) {
        lock.unlock();
        std::vector<std::pair<Prepared, SpawnResult>> results;
        for (const SpawnJob& job : jobs) {
          Prepared p;
          try {
            p = Prepare(job.pod, job.container, job.ip, job.hostname, job.hosts_path, !job.netns.empty());
          } catch (const std::exception& e) {  // a throwing data source must not end the monitor
            p = Prepared();
            p.config_error = std::string("cannot build the container's environment: ") + e.what();
          }
          SpawnResult s;
          if (p.config_error.empty()) {
            if (job.rotate) {
              std::error_code ec;
              fs::rename(job.log_path, job.previous_log_path, ec);
            }
            s = Spawn(p, job.log_path, job.hosts_path, job.hostname, job.netns);
          }
          results.push_back({std::move(p), std::move(s)});
        }
        lock.lock();
        for (size_t k = 0; k < jobs.size(); ++k) Record(jobs[k], results[k].first, results[k].second);
        continue;  // look at the new processes at once (a fast exit, a Stop that came meanwhile)
      }
      // Bounded: a process stuck in the kernel past SIGKILL must not hang the destructor.
      if (shutting_down && (AllStoppedLocked() || SteadyClock::now() > shutdown_deadline)) return;
      wake.wait_for(lock, options.monitor_interval);
    }
  }

  // Releases the network namespaces of pods that are gone (no lock held). A failure is said on
  // stderr (the agent's log): the namespace file stays, and the next agent's start releases it.
  void ReleaseNetworks(const std::vector<std::string>& uids) const {
    for (const std::string& uid : uids) {
      Status st = options.network->Remove(uid);
      if (!st.ok()) std::cerr << "pod runtime: pod " << uid << ": " << st.message() << std::endl;
    }
  }

  void Record(const SpawnJob& job, const Prepared& p, const SpawnResult& s) {
    auto it = pods.find(job.uid);
    if (it == pods.end()) {
      if (s.pid > 0) ::kill(-s.pid, SIGKILL);  // cannot happen: pods are only erased once stopped
      return;
    }
    Pod& pod = it->second;
    Container& c = pod.containers[job.index];
    if (!p.config_error.empty()) {
      c.state = State::kConfigError;
      c.waiting_reason = "CreateContainerConfigError";
      c.waiting_message = p.config_error;
      c.next_attempt = SteadyClock::now() + std::chrono::seconds(2);
      return;
    }
    if (c.ever_started) ++c.restart_count;
    c.ever_started = true;
    c.started_steady = SteadyClock::now();
    if (s.failed) {
      c.started_at = s.failed->started_at;
      c.container_id.clear();
      Finish(pod, c, *s.failed);
      return;
    }
    c.pid = s.pid;
    c.state = State::kRunning;
    c.started_at = Now();
    c.container_id = "meshwork://" + std::to_string(s.pid);
    if (pod.stopping) ::kill(-s.pid, SIGTERM);  // Stop came while it was starting
  }

  // The device plugin's part: each container gets the GPUs it asks for, from those of its node
  // that no pod still running holds, in CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (put first
  // in its env list, so the container's own entries win).
  Status AssignGpusLocked(Pod& pod) {
    auto capacity = options.node_gpus.find(pod.node);
    const int64_t total = capacity == options.node_gpus.end() ? 0 : capacity->second;
    std::set<int> held;
    for (const auto& [uid, other] : pods) {
      if (other.node == pod.node && !StoppedLocked(other)) held.insert(other.gpus.begin(), other.gpus.end());
    }
    for (size_t i = 0; i < pod.containers.size(); ++i) {
      Container& c = pod.containers[i];
      const std::string where = "spec.containers[" + std::to_string(i) + "]";
      MW_ASSIGN_OR_RETURN(PodRequests wants, internal::ContainerRequests(c.spec, where));
      const int64_t n = wants.extended.count(kGpuResource) ? wants.extended.at(kGpuResource) : 0;
      std::string visible;
      int64_t got = 0;
      for (int d = 0; d < total && got < n; ++d) {
        if (!held.insert(d).second) continue;
        pod.gpus.push_back(d);
        visible += (got++ ? "," : "") + std::to_string(d);
      }
      if (got < n) {
        return Unavailable(where + " asks for " + std::to_string(n) + " " + kGpuResource + " but node \"" + pod.node +
                           "\" has " + std::to_string(total) + " and " + std::to_string(total - static_cast<int64_t>(held.size()) + got) +
                           " of them free");
      }
      json env = json::array({{{"name", "CUDA_VISIBLE_DEVICES"}, {"value", visible}},
                              {{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", n > 0 ? visible : "void"}}});
      for (const json& e : internal::ArrayAt(c.spec, "env")) env.push_back(e);
      c.spec["env"] = env;
    }
    return Status::Ok();
  }

  // Every container ended for good (Succeeded or Failed): nothing will run in the Pod again.
  bool FinishedLocked(const Pod& pod) const {
    for (const Container& c : pod.containers) {
      if (c.state != State::kDone) return false;
    }
    return !pod.containers.empty();
  }

  bool StoppedLocked(const Pod& pod) const {
    for (const Container& c : pod.containers) {
      if (c.state == State::kRunning || c.state == State::kStarting) return false;
      if (!pod.stopping && c.state != State::kDone) return false;
    }
    return true;
  }

  bool AllStoppedLocked() const {
    for (const auto& [uid, pod] : pods) {
      if (!StoppedLocked(pod)) return false;
    }
    return true;
  }

  void StopLocked(Pod& pod, std::optional<int> grace_seconds) {
    int grace = grace_seconds ? *grace_seconds : pod.spec_grace >= 0 ? pod.spec_grace : options.grace_seconds_default;
    grace = std::max(0, grace);
    auto kill_at = SteadyClock::now() + std::chrono::seconds(grace);
    if (pod.stopping) {
      pod.kill_at = std::min(pod.kill_at, kill_at);  // a shorter grace may come later, as in kubelet
    } else {
      pod.stopping = true;
      pod.kill_at = kill_at;
    }
    for (Container& c : pod.containers) {
      if (c.state == State::kRunning) ::kill(-c.pid, grace == 0 ? SIGKILL : SIGTERM);
    }
    wake.notify_all();
  }

  // ---- status ----

  json TerminationJson(const Termination& t) const {
    json j = {{"exitCode", t.exit_code}, {"reason", t.reason}, {"startedAt", t.started_at}, {"finishedAt", t.finished_at}};
    if (t.signal != 0) j["signal"] = t.signal;
    if (!t.message.empty()) j["message"] = t.message;
    if (!t.container_id.empty()) j["containerID"] = t.container_id;
    return j;
  }

  static std::string QosClass(const json& pod) {
    bool any = false, guaranteed = true;
    for (const json& c : internal::ArrayAt(internal::ObjectAt(pod, "spec"), "containers")) {
      const json res = internal::ObjectAt(c, "resources");
      const json limits = internal::ObjectAt(res, "limits");
      const json requests = internal::ObjectAt(res, "requests");
      if (!limits.empty() || !requests.empty()) any = true;
      for (const char* r : {"cpu", "memory"}) {
        if (!limits.contains(r)) {
          guaranteed = false;
        } else if (requests.contains(r) && JsonToText(requests[r]) != JsonToText(limits[r])) {
          guaranteed = false;
        }
      }
    }
    if (!any) return "BestEffort";
    return guaranteed ? "Guaranteed" : "Burstable";
  }

  json StatusJson(Pod& pod) {
    std::string now = Now();
    bool all_done = true, any_started = false, all_running = true, all_succeeded = true;
    json statuses = json::array();
    std::vector<std::string> unready;
    for (const Container& c : pod.containers) {
      json st;
      json state, last_state = json::object();
      bool running = c.state == State::kRunning;
      switch (c.state) {
        case State::kWaiting:
        case State::kStarting:
          state = {{"waiting", {{"reason", "ContainerCreating"}}}};
          break;
        case State::kRunning:
          state = {{"running", {{"startedAt", c.started_at}}}};
          if (c.last) last_state = {{"terminated", TerminationJson(*c.last)}};
          break;
        case State::kBackoff:
        case State::kConfigError:
          state = {{"waiting", {{"reason", c.waiting_reason}, {"message", c.waiting_message}}}};
          if (c.last) last_state = {{"terminated", TerminationJson(*c.last)}};
          break;
        case State::kDone:
          if (c.last) state = {{"terminated", TerminationJson(*c.last)}};
          else state = {{"waiting", {{"reason", "ContainerCreating"}}}};
          if (c.previous) last_state = {{"terminated", TerminationJson(*c.previous)}};
          break;
      }
      bool ready = running && !pod.stopping;
      if (!ready) unready.push_back(c.name);
      if (c.state != State::kDone) all_done = false;
      if (c.ever_started) any_started = true;
      if (!running) all_running = false;
      if (!c.last || c.last->exit_code != 0) all_succeeded = false;
      st = {{"name", c.name},
            {"state", state},
            {"lastState", last_state},
            {"ready", ready},
            {"restartCount", c.restart_count},
            {"started", running},
            {"image", internal::StringAt(c.spec, "image")},
            {"imageID", ""}};
      if (!c.container_id.empty()) st["containerID"] = c.container_id;
      statuses.push_back(st);
    }
    std::string phase = all_done ? (all_succeeded ? "Succeeded" : "Failed") : any_started ? "Running" : "Pending";
    bool terminal = phase == "Succeeded" || phase == "Failed";
    bool ready = all_running && !pod.stopping && !terminal;
    std::string unready_list;
    for (const auto& n : unready) unready_list += (unready_list.empty() ? "" : " ") + n;

    auto condition = [&](const std::string& type, bool value, const std::string& reason, const std::string& message) {
      auto it = pod.conditions.find(type);
      if (it == pod.conditions.end() || it->second.first != value) {
        pod.conditions[type] = {value, now};
        it = pod.conditions.find(type);
      }
      json j = {{"type", type}, {"status", value ? "True" : "False"}, {"lastProbeTime", nullptr},
                {"lastTransitionTime", it->second.second}};
      if (!value && !reason.empty()) {
        j["reason"] = reason;
        if (!message.empty()) j["message"] = message;
      }
      return j;
    };
    std::string not_ready_reason = terminal ? "PodCompleted" : "ContainersNotReady";
    std::string not_ready_message = terminal ? "" : "containers with unready status: [" + unready_list + "]";
    json conditions = json::array({
        condition("Initialized", true, "", ""),
        condition("Ready", ready, not_ready_reason, not_ready_message),
        condition("ContainersReady", ready, not_ready_reason, not_ready_message),
        condition("PodScheduled", true, "", ""),
    });
    return {{"phase", phase},
            {"conditions", conditions},
            {"hostIP", options.host_ip},
            {"hostIPs", json::array({{{"ip", options.host_ip}}})},
            {"podIP", pod.ip},
            {"podIPs", json::array({{{"ip", pod.ip}}})},
            {"startTime", pod.start_time},
            {"qosClass", QosClass(pod.object)},
            {"containerStatuses", statuses}};
  }

  const Container* FindContainer(const std::string& uid, const std::string& name, const Pod** pod_out) const {
    auto it = pods.find(uid);
    if (it == pods.end()) return nullptr;
    for (const Container& c : it->second.containers) {
      if (c.name == name) {
        *pod_out = &it->second;
        return &c;
      }
    }
    return nullptr;
  }
};

// ---- probing the resolution mechanism ----------------------------------------------------------

namespace {

// Whether a child may get its own mount + UTS namespace with a file bind-mounted over /etc/hosts.
Status ProbeMountNamespace(const std::string& state_dir) {
  std::string probe = state_dir + "/.hosts-probe";
  {
    std::ofstream out(probe);
    out << "127.0.0.1\tlocalhost\n";
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) ::_exit(10);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(11);
    if (::mount(probe.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) ::_exit(12);
    if (::sethostname("meshwork-probe", 14) != 0) ::_exit(13);
    ::_exit(0);
  }
  if (pid < 0) return Unavailable("fork: " + ErrnoText(errno));
  int status = 0;
  auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return Unavailable("waitpid: " + ErrnoText(errno));
    if (SteadyClock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Unavailable("the namespace probe did not finish");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::unlink(probe.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  static const char* kWhat[] = {"unshare(CLONE_NEWNS|CLONE_NEWUTS)", "making / private", "bind-mounting /etc/hosts",
                                "sethostname"};
  int code = WIFEXITED(status) ? WEXITSTATUS(status) - 10 : -1;
  return Unavailable(std::string("a private mount namespace is not permitted here: ") +
                     (code >= 0 && code < 4 ? kWhat[code] : "the probe was killed") + " failed");
}

std::string DefaultPreloadLibrary() {
  if (const char* env = std::getenv("MESHWORK_HOSTS_PRELOAD"); env != nullptr && *env != '\0') return env;
#ifdef MESHWORK_HOSTS_PRELOAD_DEFAULT
  return MESHWORK_HOSTS_PRELOAD_DEFAULT;
#else
  return "";
#endif
}

}  // namespace

// ---- PodRuntime --------------------------------------------------------------------------------

PodRuntime::PodRuntime(RuntimeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Result<std::unique_ptr<PodRuntime>> PodRuntime::Create(RuntimeOptions options) {
  if (options.state_dir.empty()) return InvalidConfig("state_dir is required");
  std::error_code ec;
  fs::create_directories(options.state_dir + "/pods", ec);
  if (ec) return IOError("cannot create state_dir \"" + options.state_dir + "\": " + ec.message());
  if (options.grace_seconds_default < 0) {
    return InvalidConfig("grace_seconds_default " + std::to_string(options.grace_seconds_default) + " must be >= 0");
  }
  if (options.restart_backoff_initial.count() < 0 || options.restart_backoff_max < options.restart_backoff_initial) {
    return InvalidConfig("restart_backoff_initial must be >= 0 and <= restart_backoff_max");
  }
  if (options.monitor_interval.count() <= 0) return InvalidConfig("monitor_interval must be > 0");
  uint32_t first_slot;
  if (!options.first_pod_ip.empty()) {
    MW_ASSIGN_OR_RETURN(first_slot, IpToSlot(options.first_pod_ip));
  } else {
    // A random start, so that two control planes on one machine rarely hand out the same IPs.
    std::random_device rd;
    first_slot = std::uniform_int_distribution<uint32_t>(0, kIpSlots - 1)(rd);
  }
  std::string preload = options.preload_library.empty() ? DefaultPreloadLibrary() : options.preload_library;
  bool preload_ok = !preload.empty() && ::access(preload.c_str(), R_OK) == 0;

  Resolution mode = options.resolution;
  switch (options.resolution) {
    case Resolution::kAuto:
      if (ProbeMountNamespace(options.state_dir).ok()) {
        mode = Resolution::kMountNamespace;
      } else {
        mode = preload_ok ? Resolution::kPreload : Resolution::kNone;
      }
      break;
    case Resolution::kMountNamespace:
      MW_RETURN_IF_ERROR(ProbeMountNamespace(options.state_dir));
      break;
    case Resolution::kPreload:
      if (!preload_ok) {
        return InvalidConfig("preload_library \"" + preload +
                             "\" is not a readable file (build meshwork_cp_hosts_preload or set MESHWORK_HOSTS_PRELOAD)");
      }
      break;
    case Resolution::kNone:
      break;
  }
  std::unique_ptr<PodRuntime> rt(new PodRuntime(std::move(options)));
  rt->impl_->resolution = mode;
  if (!preload.empty()) rt->impl_->preload_library = fs::absolute(preload, ec).string();
  rt->impl_->next_ip_slot = first_slot;
  Impl* impl = rt->impl_.get();
  rt->impl_->monitor = std::thread([impl] { impl->MonitorLoop(); });
  return rt;
}

PodRuntime::~PodRuntime() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto last_kill = SteadyClock::now();
    for (auto& [uid, pod] : impl_->pods) {
      impl_->StopLocked(pod, std::nullopt);
      last_kill = std::max(last_kill, pod.kill_at);
    }
    impl_->shutting_down = true;
    impl_->shutdown_deadline = last_kill + std::chrono::seconds(10);
  }
  impl_->wake.notify_all();
  // The monitor returns once every pod has stopped; SIGKILL after the grace makes that bounded.
  impl_->monitor.join();
  if (impl_->options.network) {
    std::vector<std::string> uids = std::move(impl_->networks_to_release);
    for (const auto& [uid, pod] : impl_->pods) {
      if (!pod.netns.empty() && !pod.network_released) uids.push_back(uid);
    }
    impl_->ReleaseNetworks(uids);
  }
}

Status PodRuntime::Start(const json& pod, const std::string& service_account_token) {
  if (!pod.is_object()) return InvalidInput("pod must be a JSON object");
  const json meta = internal::ObjectAt(pod, "metadata");
  const json spec = internal::ObjectAt(pod, "spec");
  Impl::Pod p;
  p.object = pod;
  p.uid = internal::StringAt(meta, "uid");
  p.name = internal::StringAt(meta, "name");
  p.ns = internal::StringAt(meta, "namespace");
  if (p.ns.empty()) p.ns = "default";
  if (p.uid.empty()) return InvalidInput("metadata.uid is required");
  if (p.uid.find('/') != std::string::npos || p.uid == "." || p.uid == ".." || p.uid.size() > 128) {
    return InvalidInput("metadata.uid \"" + p.uid + "\" is not a valid uid");
  }
  if (p.name.empty()) return InvalidInput("metadata.name is required");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->pods.count(p.uid) || impl_->starting.count(p.uid)) return Status::Ok();
    impl_->starting.insert(p.uid);
  }
  // Until this Start returns, a second Start of the uid returns at once: it must not make (or
  // remove) the network namespace this one is making, which sits at the same path.
  struct Unmark {
    Impl* impl;
    std::string uid;
    ~Unmark() {
      std::lock_guard<std::mutex> lock(impl->mu);
      impl->starting.erase(uid);
    }
  } unmark{impl_.get(), p.uid};
  const json containers = internal::ArrayAt(spec, "containers");
  if (containers.empty()) return InvalidInput("spec.containers: a pod needs at least one container");
  if (!internal::ArrayAt(spec, "initContainers").empty()) {
    return InvalidInput("spec.initContainers: init containers are not supported by the local node agent");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < containers.size(); ++i) {
    std::string field = "spec.containers[" + std::to_string(i) + "]";
    if (!containers[i].is_object()) return InvalidInput(field + " must be an object");
    std::string name = internal::StringAt(containers[i], "name");
    if (!internal::IsDns1123Label(name)) {
      return InvalidInput(field + ".name \"" + name + "\" must be a DNS-1123 label (lower-case letters, digits, '-')");
    }
    if (!names.insert(name).second) return InvalidInput(field + ".name \"" + name + "\" is used by another container");
    Impl::Container c;
    c.spec = containers[i];
    c.name = name;
    p.containers.push_back(std::move(c));
  }
  p.restart_policy = internal::StringAt(spec, "restartPolicy");
  if (p.restart_policy.empty()) p.restart_policy = "Always";
  if (p.restart_policy != "Always" && p.restart_policy != "OnFailure" && p.restart_policy != "Never") {
    return InvalidInput("spec.restartPolicy \"" + p.restart_policy + "\" must be Always, OnFailure or Never");
  }
  if (spec.contains("terminationGracePeriodSeconds") && spec["terminationGracePeriodSeconds"].is_number_integer()) {
    p.spec_grace = static_cast<int>(std::max<int64_t>(0, spec["terminationGracePeriodSeconds"].get<int64_t>()));
  }
  p.hostname = internal::StringAt(spec, "hostname");
  if (p.hostname.empty()) p.hostname = p.name.substr(0, 63);
  p.node = internal::StringAt(spec, "nodeName");
  p.subdomain = internal::StringAt(spec, "subdomain");
  p.start_time = internal::Rfc3339(SystemClock::now());

  // The Pod's network namespace, outside the lock (the plugins take tens of milliseconds).
  PodNetwork* network = impl_->options.network.get();
  const bool host_network = spec.contains("hostNetwork") && spec["hostNetwork"].is_boolean() && spec["hostNetwork"].get<bool>();
  if (network != nullptr && !host_network) {
    auto ip = network->Add(p.uid);
    if (!ip.ok()) return ip.status();
    p.ip = ip.value();
    p.netns = network->NamespacePath(p.uid);
  }
  std::unique_lock<std::mutex> lock(impl_->mu);
  // What this Start made of the network, released (outside the lock) when it does not keep the Pod.
  auto release = [&](Status st) {
    lock.unlock();
    if (!p.netns.empty()) (void)network->Remove(p.uid);
    return st;
  };
  if (p.netns.empty() && impl_->ips_in_use.size() >= kIpSlots) return Unavailable("no free pod IP addresses left");
  if (Status st = impl_->AssignGpusLocked(p); !st.ok()) return release(st);
  if (p.netns.empty()) {
    while (impl_->ips_in_use.count(impl_->next_ip_slot)) impl_->next_ip_slot = (impl_->next_ip_slot + 1) % kIpSlots;
    p.ip_slot = impl_->next_ip_slot;
    impl_->next_ip_slot = (impl_->next_ip_slot + 1) % kIpSlots;
    p.ip = SlotToIp(p.ip_slot);
  }
  p.dir = impl_->options.state_dir + "/pods/" + p.uid;
  p.hosts_path = p.dir + "/hosts";
  std::error_code ec;
  fs::remove_all(p.dir, ec);  // leftovers of an earlier run with the same uid
  fs::create_directories(p.dir, ec);
  if (ec) return release(IOError("cannot create pod directory " + p.dir + ": " + ec.message()));
  if (Status st = impl_->WriteHostsFile(p); !st.ok()) return release(st);
  if (Status st = impl_->WriteServiceAccountDir(p, service_account_token); !st.ok()) return release(st);
  if (p.netns.empty()) impl_->ips_in_use.insert(p.ip_slot);
  std::string uid = p.uid;
  impl_->pods.emplace(uid, std::move(p));
  impl_->wake.notify_all();
  return Status::Ok();
}

void PodRuntime::Stop(const std::string& uid, std::optional<int> grace_seconds) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->pods.find(uid);
  if (it != impl_->pods.end()) impl_->StopLocked(it->second, grace_seconds);
}

bool PodRuntime::Stopped(const std::string& uid) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->pods.find(uid);
  return it == impl_->pods.end() || impl_->StoppedLocked(it->second);
}

void PodRuntime::Remove(const std::string& uid) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->pods.find(uid);
  if (it == impl_->pods.end()) return;
  if (!impl_->StoppedLocked(it->second) || !it->second.stopping) impl_->StopLocked(it->second, 0);
  it->second.remove_when_stopped = true;
  impl_->wake.notify_all();
}

std::vector<std::pair<std::string, json>> PodRuntime::Poll() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::pair<std::string, json>> changes;
  for (auto& [uid, pod] : impl_->pods) {
    if (pod.final_reported) continue;
    json status = impl_->StatusJson(pod);
    if (status != pod.reported) {
      pod.reported = status;
      changes.emplace_back(uid, std::move(status));
    }
    pod.final_reported = impl_->FinishedLocked(pod);
  }
  return changes;
}

json PodRuntime::StatusOf(const std::string& uid) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->pods.find(uid);
  if (it == impl_->pods.end()) return nullptr;
  return impl_->StatusJson(it->second);
}

std::string PodRuntime::LogPath(const std::string& uid, const std::string& container) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Impl::Pod* pod = nullptr;
  if (impl_->FindContainer(uid, container, &pod) == nullptr) return "";
  return impl_->LogFile(*pod, container, false);
}

std::string PodRuntime::PreviousLogPath(const std::string& uid, const std::string& container) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Impl::Pod* pod = nullptr;
  if (impl_->FindContainer(uid, container, &pod) == nullptr) return "";
  std::string path = impl_->LogFile(*pod, container, true);
  return ::access(path.c_str(), F_OK) == 0 ? path : "";
}

std::string PodRuntime::PodIP(const std::string& uid) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->pods.find(uid);
  return it == impl_->pods.end() ? "" : it->second.ip;
}

void PodRuntime::SetHosts(const std::map<std::string, std::string>& name_to_ip) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->hosts == name_to_ip) return;
  impl_->hosts = name_to_ip;
  impl_->hosts_names_by_ns.clear();
  for (const auto& [uid, pod] : impl_->pods) {
    // A finished Pod runs nothing that could read its file again. Rewriting every kept one on
    // each change (each file lists every name) was most of a 500-job burst's agent CPU.
    if (impl_->FinishedLocked(pod)) continue;
    Status s = impl_->WriteHostsFile(pod);
    (void)s;  // a pod whose directory vanished keeps its old names; nothing better to do here
  }
}

Resolution PodRuntime::resolution() const { return impl_->resolution; }

}  // namespace meshwork::controlplane::agent
