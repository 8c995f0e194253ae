#include "controlplane/agent/pod_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/subprocess.h"

namespace meshwork::controlplane::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The CNI spec version of the configs (the reference plugins v1.10 speak 0.1.0 to 1.1.0).
constexpr const char* kCniVersion = "1.0.0";
constexpr const char* kNetworkName = "meshwork-pods";  // host-local keeps leases under ipam/<name>/
constexpr const char* kPlugins[] = {"bridge", "host-local", "loopback"};

std::string ErrnoText(int err) { return std::strerror(err); }

struct Cidr {
  uint32_t base = 0;  // host order, host bits cleared
  int prefix = 0;
};

Result<uint32_t> ParseIp(const std::string& text, const std::string& what) {
  in_addr addr{};
  if (inet_pton(AF_INET, text.c_str(), &addr) != 1) return InvalidConfig(what + " \"" + text + "\" is not an IPv4 address");
  return ntohl(addr.s_addr);
}

Result<Cidr> ParseCidr(const std::string& text, const std::string& what) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return InvalidConfig(what + " \"" + text + "\" is not a CIDR (address/prefix)");
  auto ip = ParseIp(text.substr(0, slash), what);
  if (!ip.ok()) return InvalidConfig(what + " \"" + text + "\" is not a CIDR (address/prefix)");
  const std::string prefix = text.substr(slash + 1);
  char* end = nullptr;
  const long p = std::strtol(prefix.c_str(), &end, 10);
  if (prefix.empty() || *end != '\0' || p < 8 || p > 30) {
    return InvalidConfig(what + " \"" + text + "\": the prefix must be 8 to 30");
  }
  Cidr c;
  c.prefix = static_cast<int>(p);
  const uint32_t mask = ~uint32_t{0} << (32 - c.prefix);
  if ((ip.value() & ~mask) != 0) return InvalidConfig(what + " \"" + text + "\" has host bits set");
  c.base = ip.value();
  return c;
}

std::string IpText(uint32_t host_order) {
  in_addr addr{};
  addr.s_addr = htonl(host_order);
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &addr, buf, sizeof(buf));
}

uint32_t Last(const Cidr& c) { return c.base | ~(~uint32_t{0} << (32 - c.prefix)); }

// Whether `path` is a mount point in this process' mount namespace (/proc/self/mountinfo's fifth
// field, with the kernel's octal escapes of space, tab, newline and backslash undone).
bool IsMountPoint(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field) pos = line.find(' ', pos + 1);
    if (pos == std::string::npos) continue;
    const size_t end = line.find(' ', pos + 1);
    const std::string raw = line.substr(pos + 1, end - pos - 1);
    std::string point;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 3 < raw.size()) {
        point += static_cast<char>(std::stoi(raw.substr(i + 1, 3), nullptr, 8));
        i += 3;
      } else {
        point += raw[i];
      }
    }
    if (point == path) return true;
  }
  return false;
}

// A new network namespace pinned at `path` (an empty file it creates): a child unshares its
// network namespace and bind-mounts it there, as `ip netns add` does.
Status MakeNamespace(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0) return IOError("cannot create " + path + ": " + ErrnoText(errno));
  ::close(fd);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::unshare(CLONE_NEWNET) != 0) ::_exit(10);
    if (::mount("/proc/self/ns/net", path.c_str(), nullptr, MS_BIND, nullptr) != 0) ::_exit(11);
    ::_exit(0);
  }
  if (pid < 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return Unavailable("fork: " + ErrnoText(err));
  }
  int status = 0;
  pid_t waited = 0;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited < 0) {
    // ECHILD: something reaped it (SIGCHLD ignored); whether the mount happened is unknown.
    const int err = errno;
    (void)::umount2(path.c_str(), MNT_DETACH);
    ::unlink(path.c_str());
    return Unavailable("waiting for the child making a network namespace: " + ErrnoText(err));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  ::unlink(path.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return Unavailable(std::string("a network namespace cannot be made here: ") +
                     (code == 10 ? "unshare(CLONE_NEWNET) was refused (needs root or CAP_SYS_ADMIN)"
                      : code == 11 ? "bind-mounting it at " + path + " was refused"
                                   : "the child making it died"));
}

// Unpins a namespace: the kernel drops it (and the veth end inside it) once nothing else holds it.
Status DropNamespace(const std::string& path) {
  Status st = Status::Ok();
  if (::umount2(path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
    st = IOError("cannot unmount " + path + ": " + ErrnoText(errno));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT && st.ok()) st = IOError("cannot remove " + path + ": " + ErrnoText(errno));
  return st;
}

// Runs a plugin with `env` as its whole environment and `input` (its config) on stdin.
Result<Captured> RunPlugin(const std::string& program, const std::vector<std::string>& env, const std::string& input,
                           std::chrono::milliseconds timeout) {
  SpawnOptions spawn;
  spawn.program = program;
  spawn.argv = {program};
  spawn.env = env;
  return RunCaptured(std::move(spawn), input, timeout);
}

// A plugin's failure as the CNI spec reports it: {"code": N, "msg": "...", "details": "..."} on
// stdout, else whatever it wrote to stderr.
std::string PluginError(const Captured& run) {
  const json j = json::parse(run.out, nullptr, false);
  if (j.is_object() && j.contains("msg") && j["msg"].is_string()) {
    std::string text = j["msg"].get<std::string>();
    if (j.contains("details") && j["details"].is_string() && !j["details"].get<std::string>().empty()) {
      text += ": " + j["details"].get<std::string>();
    }
    if (j.contains("code") && j["code"].is_number_integer()) text += " (CNI error code " + std::to_string(j["code"].get<int>()) + ")";
    return text;
  }
  std::string text = run.err.empty() ? run.out : run.err;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return (text.empty() ? std::string("no message") : text) + " (exit code " + std::to_string(run.exit_code) + ")";
}

// CNI_CONTAINERID's characters (the spec: alphanumerics, then also '_', '.', '-'); a Pod uid is a UUID.
bool ValidContainerId(const std::string& id) {
  if (id.empty() || !std::isalnum(static_cast<unsigned char>(id[0]))) return false;
  return std::all_of(id.begin(), id.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '.' || c == '-'; });
}

}  // namespace

Result<std::pair<std::string, std::string>> HostRange(const std::string& cidr, const std::string& what) {
  MW_ASSIGN_OR_RETURN(Cidr c, ParseCidr(cidr, what));
  return std::make_pair(IpText(c.base + 1), IpText(Last(c) - 1));
}

bool InCidr(const std::string& ip, const std::string& cidr) {
  auto a = ParseIp(ip, "ip");
  auto c = ParseCidr(cidr, "cidr");
  return a.ok() && c.ok() && a.value() >= c->base && a.value() <= Last(c.value());
}

PodNetwork::PodNetwork(Key, PodNetworkOptions options) : options_(std::move(options)) {}

PodNetwork::~PodNetwork() {
  if (pinned_dir_) ::umount2(NamespaceDir().c_str(), MNT_DETACH);
}

Result<std::unique_ptr<PodNetwork>> PodNetwork::Create(PodNetworkOptions options) {
  if (options.dir.empty()) return InvalidConfig("pod network: dir is required");
  if (options.bridge.empty() || options.bridge.size() > 15 ||
      !std::all_of(options.bridge.begin(), options.bridge.end(),
                   [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_'; })) {
    return InvalidConfig("pod network: bridge \"" + options.bridge + "\" must be 1-15 letters, digits, '-' or '_'");
  }
  MW_ASSIGN_OR_RETURN(Cidr subnet, ParseCidr(options.subnet, "pod network: subnet"));
  MW_ASSIGN_OR_RETURN(Cidr pods, ParseCidr(options.pod_cidr, "pod network: pod CIDR"));
  MW_ASSIGN_OR_RETURN(uint32_t gateway, ParseIp(options.gateway, "pod network: gateway"));
  if (pods.prefix < subnet.prefix || pods.base < subnet.base || Last(pods) > Last(subnet)) {
    return InvalidConfig("pod network: pod CIDR " + options.pod_cidr + " is not inside subnet " + options.subnet);
  }
  if (gateway <= subnet.base || gateway >= Last(subnet)) {
    return InvalidConfig("pod network: gateway " + options.gateway + " is not a host address of subnet " + options.subnet);
  }
  if (gateway >= pods.base && gateway <= Last(pods)) {
    return InvalidConfig("pod network: gateway " + options.gateway + " is inside the pod CIDR " + options.pod_cidr);
  }
  if (options.plugin_timeout.count() <= 0) return InvalidConfig("pod network: plugin_timeout " + std::to_string(options.plugin_timeout.count()) + " ms must be > 0");
  for (const char* plugin : kPlugins) {
    const std::string path = options.cni_bin_dir + "/" + plugin;
    if (::access(path.c_str(), X_OK) != 0) {
      return InvalidConfig("pod network: cni bin dir \"" + options.cni_bin_dir + "\" has no executable " + plugin +
                           " (scripts/kube-build.sh cni builds the CNI plugins)");
    }
  }
  const std::string dir = options.dir;
  std::error_code ec;
  fs::create_directories(dir + "/netns", ec);
  if (!ec) fs::create_directories(dir + "/ipam", ec);
  if (ec) return IOError("pod network: cannot create " + dir + ": " + ec.message());
  options.dir = fs::canonical(dir, ec).string();
  if (ec) return IOError("pod network: dir \"" + dir + "\": " + ec.message());
  auto net = std::make_unique<PodNetwork>(Key{}, std::move(options));
  // A namespace made and dropped again says whether this process may make them at all.
  const std::string probe = net->NamespaceDir() + "/.probe";
  MW_RETURN_IF_ERROR(DropNamespace(probe));  // a probe left by an agent killed mid-way
  MW_RETURN_IF_ERROR(MakeNamespace(probe));
  MW_RETURN_IF_ERROR(DropNamespace(probe));
  // The pins live on a private mount of the directory: they do not propagate to the host's other
  // mount namespaces, and a container unmounting the directory in its own mount namespace (to not
  // hold every Pod's namespace) touches nothing outside it. A directory still mounted by an
  // agent that died is made private again, not mounted twice.
  const std::string netns_dir = net->NamespaceDir();
  if (!IsMountPoint(netns_dir)) {
    if (::mount(netns_dir.c_str(), netns_dir.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return Unavailable("pod network: cannot bind-mount " + netns_dir + " onto itself: " + ErrnoText(errno));
    }
    net->pinned_dir_ = true;
  }
  if (::mount(nullptr, netns_dir.c_str(), nullptr, MS_PRIVATE, nullptr) != 0) {
    return Unavailable("pod network: cannot make the mount " + netns_dir + " private: " + ErrnoText(errno));
  }
  // An earlier agent's Pods are gone (they die with it): their namespaces are released with the
  // plugins' DEL where it works, and every lease goes, DEL or not, since no Pod of ours holds one.
  // What a DEL refuses is logged and left: a stale veth on the bridge holds no address.
  auto released = net->RemoveAll();
  fs::remove_all(net->options_.dir + "/ipam/" + kNetworkName, ec);
  if (!released.ok()) {
    std::cerr << "pod network: releasing an earlier agent's Pod networks: " << released.status().message() << std::endl;
  }
  return net;
}

std::string PodNetwork::NamespaceDir() const { return options_.dir + "/netns"; }
std::string PodNetwork::NamespacePath(const std::string& uid) const { return NamespaceDir() + "/" + uid; }

std::vector<std::string> PodNetwork::Attached() const {
  std::vector<std::string> uids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(NamespaceDir(), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name[0] != '.') uids.push_back(name);
  }
  std::sort(uids.begin(), uids.end());
  return uids;
}

std::string PodNetwork::BridgeConfig() const {
  auto range = HostRange(options_.pod_cidr, "pod CIDR");
  // The plugin attaches eth0 to the bridge and puts the address on it; the bridge's own address
  // (the gateway) is the host's, set by whoever made the bridge. No default route, no masquerade:
  // Pods reach each other and the host on the bridge's subnet, which is all a local cluster needs,
  // and nothing here touches iptables or the host's forwarding.
  const json config = {
      {"cniVersion", kCniVersion},
      {"name", kNetworkName},
      {"type", "bridge"},
      {"bridge", options_.bridge},
      {"isGateway", false},
      {"ipMasq", false},
      {"ipam",
       {{"type", "host-local"},
        {"dataDir", options_.dir + "/ipam"},
        {"ranges",
         {{{{"subnet", options_.subnet},
            {"rangeStart", range->first},
            {"rangeEnd", range->second},
            {"gateway", options_.gateway}}}}}}}};
  return config.dump();
}

namespace {

std::vector<std::string> CniEnv(const std::string& command, const std::string& uid, const std::string& netns,
                                const std::string& ifname, const std::string& bin_dir) {
  return {"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + uid, "CNI_NETNS=" + netns, "CNI_IFNAME=" + ifname,
          "CNI_PATH=" + bin_dir, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
}

std::string LoopbackConfig() {
  return json{{"cniVersion", kCniVersion}, {"name", "meshwork-lo"}, {"type", "loopback"}}.dump();
}

}  // namespace

Result<std::string> PodNetwork::Add(const std::string& uid) {
  if (!ValidContainerId(uid)) {
    return Unavailable(std::string(kPodNetworkError) + "uid \"" + uid + "\" is not a CNI container id (letters, digits, '_', '.', '-')");
  }
  const std::string netns = NamespacePath(uid);
  if (::access(netns.c_str(), F_OK) == 0) {
    if (Status st = Remove(uid); !st.ok()) {
      const std::string& m = st.message();
      return Unavailable(m.rfind(kPodNetworkError, 0) == 0 ? m : kPodNetworkError + m);
    }
  }
  if (Status st = MakeNamespace(netns); !st.ok()) return Unavailable(kPodNetworkError + st.message());
  auto fail = [&](const std::string& message) -> Result<std::string> {
    (void)Remove(uid);
    return Unavailable(kPodNetworkError + message);
  };
  const std::string& bin = options_.cni_bin_dir;
  auto lo = RunPlugin(bin + "/loopback", CniEnv("ADD", uid, netns, "lo", bin), LoopbackConfig(), options_.plugin_timeout);
  if (!lo.ok()) return fail("loopback plugin: " + lo.status().message());
  if (lo->exit_code != 0) return fail("loopback plugin ADD: " + PluginError(lo.value()));
  auto eth = RunPlugin(bin + "/bridge", CniEnv("ADD", uid, netns, "eth0", bin), BridgeConfig(), options_.plugin_timeout);
  if (!eth.ok()) return fail("bridge plugin: " + eth.status().message());
  if (eth->exit_code != 0) return fail("bridge plugin ADD: " + PluginError(eth.value()));
  const json result = json::parse(eth->out, nullptr, false);
  if (!result.is_object() || !result.contains("ips") || !result["ips"].is_array() || result["ips"].empty() ||
      !result["ips"][0].contains("address") || !result["ips"][0]["address"].is_string()) {
    return fail("bridge plugin ADD: its result has no ips[0].address: " + eth->out);
  }
  std::string address = result["ips"][0]["address"].get<std::string>();
  address = address.substr(0, address.find('/'));
  if (!InCidr(address, options_.pod_cidr)) {
    return fail("bridge plugin ADD gave " + address + ", outside this node's pod CIDR " + options_.pod_cidr);
  }
  return address;
}

Status PodNetwork::Delete(const std::string& uid, const std::string& netns) {
  const std::string& bin = options_.cni_bin_dir;
  Status first = Status::Ok();
  // In reverse order of ADD, as a runtime tears a sandbox down; DEL of what was never added is
  // not an error to the plugins (the spec asks them to tolerate it).
  for (const auto& [plugin, ifname, config] :
       {std::tuple{"bridge", "eth0", BridgeConfig()}, std::tuple{"loopback", "lo", LoopbackConfig()}}) {
    auto run = RunPlugin(bin + "/" + plugin, CniEnv("DEL", uid, netns, ifname, bin), config, options_.plugin_timeout);
    if (!run.ok() && first.ok()) first = Unavailable(std::string(plugin) + " plugin DEL: " + run.status().message());
    if (run.ok() && run->exit_code != 0 && first.ok()) {
      first = Unavailable(std::string(plugin) + " plugin DEL: " + PluginError(run.value()));
    }
  }
  if (!first.ok() && !netns.empty()) {
    // The namespace may be what failed: a DEL without one still releases the address lease (the
    // bridge plugin frees the IPAM lease before it looks at the namespace).
    auto run = RunPlugin(bin + "/bridge", CniEnv("DEL", uid, "", "eth0", bin), BridgeConfig(), options_.plugin_timeout);
    if (run.ok() && run->exit_code == 0) {
      std::cerr << "pod network: pod " << uid << ": " << first.message()
                << "; its address lease was released without the namespace" << std::endl;
    }
  }
  return first;
}

Status PodNetwork::Remove(const std::string& uid) {
  const std::string netns = NamespacePath(uid);
  if (::access(netns.c_str(), F_OK) != 0) return Status::Ok();
  // A file that pins no namespace (an agent killed between creating it and mounting it, or a
  // mount lost with its mount namespace): the plugins get no namespace, which they accept on DEL.
  Status deleted = Delete(uid, IsMountPoint(netns) ? netns : "");
  Status dropped = DropNamespace(netns);
  if (!deleted.ok()) return Unavailable(kPodNetworkError + deleted.message());
  return dropped;
}

Result<int> PodNetwork::RemoveAll() {
  int n = 0;
  Status first = Status::Ok();
  for (const std::string& uid : Attached()) {
    Status st = Remove(uid);
    if (!st.ok() && first.ok()) first = st;
    ++n;
  }
  if (!first.ok()) return first;
  return n;
}

}  // namespace meshwork::controlplane::agent
