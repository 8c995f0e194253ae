#include "controlplane/cluster/pod_network.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "common/subprocess.h"

namespace meshwork::controlplane::cluster {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRunDir = "/run/meshwork/pod-network";
constexpr int kSlots = 64;  // 100.64.0.0/10, one /16 each

std::string IpCommand() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs `ip args...`; the error names the command and what ip said.
Status RunIp(const std::string& ip, const std::vector<std::string>& args) {
  SpawnOptions spawn;
  spawn.program = ip;
  spawn.argv = {ip};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"};
  std::string command = "ip";
  for (const std::string& a : args) command += " " + a;
  auto run = RunCaptured(std::move(spawn), "", std::chrono::seconds(30), /*merge_stderr=*/true);
  if (!run.ok()) return Unavailable(command + ": " + run.status().message());
  if (run->exit_code != 0) {
    std::string text = run->out;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return Unavailable(command + ": " + (text.empty() ? "exit code " + std::to_string(run->exit_code) : text));
  }
  return Status::Ok();
}

// Unmounts and removes what an agent of this slot left: each Pod's namespace file under
// <node>/netns/ and the directory's own mount (an agent bind-mounts it onto itself), then the tree.
// Dropping the namespaces removes their veths; the leases go with the tree.
void ClearSlotDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& node : fs::directory_iterator(dir, ec)) {
    const std::string netns = node.path().string() + "/netns";
    for (const auto& pin : fs::directory_iterator(netns, ec)) ::umount2(pin.path().c_str(), MNT_DETACH);
    for (int i = 0; i < 8 && ::umount2(netns.c_str(), MNT_DETACH) == 0; ++i) {
    }
  }
  fs::remove_all(dir, ec);
}

}  // namespace

Result<ClusterNetwork> ClusterNetwork::SetUp(const std::string& cni_bin_dir) {
  if (::geteuid() != 0) return Unavailable("not root: network namespaces and a bridge need it");
  for (const char* plugin : {"bridge", "host-local", "loopback"}) {
    if (::access((cni_bin_dir + "/" + plugin).c_str(), X_OK) != 0) {
      return Unavailable("no CNI plugin " + std::string(plugin) + " in " + cni_bin_dir +
                         " (scripts/kube-build.sh cni builds them)");
    }
  }
  const std::string ip = IpCommand();
  if (ip.empty()) return Unavailable("no ip command (the iproute2 package)");
  std::error_code ec;
  fs::create_directories(kRunDir, ec);
  if (ec) return Unavailable(std::string("cannot create ") + kRunDir + ": " + ec.message());
  ClusterNetwork net;
  for (int k = 0; k < kSlots && net.slot_ < 0; ++k) {
    const std::string lock = std::string(kRunDir) + "/slot-" + std::to_string(k) + ".lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return Unavailable(lock + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      net.slot_ = k;
      net.lock_fd_ = fd;
    } else {
      ::close(fd);
    }
  }
  if (net.slot_ < 0) return Unavailable("all " + std::to_string(kSlots) + " Pod network slots are taken by other clusters");
  const std::string prefix = "100." + std::to_string(64 + net.slot_) + ".";
  net.bridge_ = "mwpods" + std::to_string(net.slot_);
  net.subnet_ = prefix + "0.0/16";
  net.gateway_ = prefix + "0.1";
  net.dir_ = std::string(kRunDir) + "/" + std::to_string(net.slot_);
  net.cni_bin_dir_ = fs::absolute(cni_bin_dir, ec).string();
  // An earlier holder that died left its directory and maybe its bridge: start from nothing.
  ClearSlotDir(net.dir_);
  (void)RunIp(ip, {"link", "del", net.bridge_});
  // The bridge's address is set, not left to the kernel: a bridge without one takes the lowest
  // address of its ports and changes it as Pods come and go, and a Pod whose ARP cache still holds
  // the old one then cannot reach the host (kube-apiserver) until the entry expires, about 30 s.
  char mac[18];
  std::snprintf(mac, sizeof mac, "02:6d:77:00:00:%02x", net.slot_);  // locally administered, "mw"
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"link", "add", "name", net.bridge_, "type", "bridge"},
        std::vector<std::string>{"link", "set", net.bridge_, "address", mac},
        std::vector<std::string>{"addr", "add", net.gateway_ + "/16", "dev", net.bridge_},
        std::vector<std::string>{"link", "set", net.bridge_, "up"}}) {
    if (Status st = RunIp(ip, args); !st.ok()) return Unavailable("bridge " + net.bridge_ + ": " + st.message());
  }
  fs::create_directories(net.dir_, ec);
  if (ec) return Unavailable("cannot create " + net.dir_ + ": " + ec.message());
  return net;
}

ClusterNetwork::ClusterNetwork(ClusterNetwork&& other) noexcept { *this = std::move(other); }

ClusterNetwork& ClusterNetwork::operator=(ClusterNetwork&& other) noexcept {
  if (this != &other) {
    TearDown();
    slot_ = std::exchange(other.slot_, -1);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
    bridge_ = std::move(other.bridge_);
    subnet_ = std::move(other.subnet_);
    gateway_ = std::move(other.gateway_);
    dir_ = std::move(other.dir_);
    cni_bin_dir_ = std::move(other.cni_bin_dir_);
  }
  return *this;
}

ClusterNetwork::~ClusterNetwork() { TearDown(); }

void ClusterNetwork::TearDown() {
  if (slot_ < 0) return;
  ClearSlotDir(dir_);
  if (const std::string ip = IpCommand(); !ip.empty()) (void)RunIp(ip, {"link", "del", bridge_});
  ::close(lock_fd_);
  lock_fd_ = -1;
  slot_ = -1;
}

std::string ClusterNetwork::NodeCidr(size_t i) const {
  return "100." + std::to_string(64 + slot_) + "." + std::to_string(1 + i % 254) + ".0/24";
}

std::string ClusterNetwork::NodeDir(const std::string& node) const { return dir_ + "/" + node; }

}  // namespace meshwork::controlplane::cluster
