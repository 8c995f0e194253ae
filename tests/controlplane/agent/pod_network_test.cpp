// Pods' network namespaces through the real CNI plugins (bridge, host-local, loopback; built by
// scripts/kube-build.sh cni): a Pod's address, its interfaces, two Pods on one port, teardown that
// leaves nothing (namespace, veth, lease), an agent that died mid-Pod, a plugin that fails, and the
// runtime's Pods in their namespaces. Needs root and the plugins; without them each test says
// SKIPPED and why. The option checks need neither.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/subprocess.h"
#include "controlplane/agent/node_agent.h"
#include "controlplane/agent/pod_network.h"
#include "controlplane/cluster/pod_network.h"

namespace meshwork::controlplane::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

std::string CniBinDir() {
  const char* env = std::getenv("MESHWORK_KUBE_BIN");
  return std::string(env != nullptr && *env != '\0' ? env : MESHWORK_SOURCE_DIR "/.meshwork/kube/bin") + "/cni";
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return done();
}

// Runs argv (in `netns` when set) and returns its exit code and output.
std::pair<int, std::string> RunIn(const std::vector<std::string>& argv, const std::string& netns = "") {
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.search_path = true;
  spawn.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  spawn.netns = netns;
  auto run = RunCaptured(std::move(spawn), "", 30s, /*merge_stderr=*/true);
  if (!run.ok()) return {-1, run.status().message()};
  return {run->exit_code, run->out};
}

// The host-side ends attached to the bridge (`ip -o link show master BRIDGE`).
int BridgePorts(const std::string& bridge) {
  auto [code, text] = RunIn({"ip", "-o", "link", "show", "master", bridge});
  if (code != 0) return -1;
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

// host-local's leases: one file per address under ipam/meshwork-pods/ (besides its lock and
// last-reserved marker).
int Leases(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir + "/ipam/meshwork-pods", ec)) {
    const std::string name = e.path().filename().string();
    if (name != "lock" && name.rfind("last_reserved_ip", 0) != 0) ++n;
  }
  return n;
}

// What a TCP server at ip:port answers to a connect.
std::string Ask(const std::string& ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  std::string text;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    char buf[256];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

TEST(PodNetworkOptions, RefusedNamingTheOptionAndValue) {
  PodNetworkOptions base{"/nonexistent-cni", "/tmp/x", "mwtest0", "100.127.0.0/16", "100.127.0.1", "100.127.1.0/24"};
  auto refused = [&](const std::function<void(PodNetworkOptions&)>& change) {
    PodNetworkOptions o = base;
    change(o);
    auto made = PodNetwork::Create(o);
    EXPECT_FALSE(made.ok());
    return made.ok() ? std::string() : made.status().message();
  };
  EXPECT_NE(refused([](auto& o) { o.subnet = "100.127.0.0"; }).find("subnet \"100.127.0.0\" is not a CIDR"), std::string::npos);
  EXPECT_NE(refused([](auto& o) { o.pod_cidr = "100.128.1.0/24"; }).find("pod CIDR 100.128.1.0/24 is not inside subnet"),
            std::string::npos);
  EXPECT_NE(refused([](auto& o) { o.gateway = "100.127.1.9"; }).find("gateway 100.127.1.9 is inside the pod CIDR"),
            std::string::npos);
  EXPECT_NE(refused([](auto& o) { o.pod_cidr = "100.127.1.1/24"; }).find("has host bits set"), std::string::npos);
  EXPECT_NE(refused([](auto& o) { o.bridge = "a-bridge-name-too-long"; }).find("bridge \"a-bridge-name-too-long\""),
            std::string::npos);
  EXPECT_NE(refused([](auto&) {}).find("cni bin dir \"/nonexistent-cni\" has no executable bridge"), std::string::npos);
  auto made = PodNetwork::Create(base);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidConfig);
}

TEST(PodNetworkOptions, HostRangeAndMembership) {
  auto r = HostRange("100.64.3.0/24", "cidr");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, "100.64.3.1");
  EXPECT_EQ(r->second, "100.64.3.254");
  EXPECT_TRUE(InCidr("100.64.3.7", "100.64.3.0/24"));
  EXPECT_FALSE(InCidr("100.64.4.7", "100.64.3.0/24"));
}

class PodNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces and a bridge";
    if (::access((CniBinDir() + "/bridge").c_str(), X_OK) != 0) {
      GTEST_SKIP() << "no CNI plugins in " << CniBinDir() << " (scripts/kube-build.sh cni builds them)";
    }
    auto cluster = cluster::ClusterNetwork::SetUp(CniBinDir());
    if (!cluster.ok()) GTEST_SKIP() << "no Pod network here: " << cluster.status().message();
    cluster_.emplace(std::move(cluster).value());
    char tmpl[] = "/tmp/meshwork-pod-network-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    runtime_.reset();
    network_.reset();
    cluster_.reset();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  PodNetworkOptions Options(const std::string& cni_bin_dir = "") const {
    return {cni_bin_dir.empty() ? CniBinDir() : cni_bin_dir,
            cluster_->NodeDir("node-0"),
            cluster_->bridge(),
            cluster_->subnet(),
            cluster_->gateway(),
            cluster_->NodeCidr(0)};
  }

  // A network on a plugin directory where `plugin` is the shell script `body` (after it reads its
  // config from stdin) and the other two plugins are the real ones.
  std::unique_ptr<PodNetwork> NetworkWithPlugin(const std::string& plugin, const std::string& body) {
    const std::string bin = dir_ + "/cni";
    fs::create_directories(bin);
    for (const char* real : {"bridge", "host-local", "loopback"}) {
      if (plugin != real) fs::create_symlink(CniBinDir() + "/" + real, bin + "/" + real);
    }
    std::ofstream(bin + "/" + plugin) << "#!/bin/sh\ncat >/dev/null\n" << body;
    fs::permissions(bin + "/" + plugin, fs::perms::owner_all);
    auto made = PodNetwork::Create(Options(bin));
    EXPECT_TRUE(made.ok()) << made.status().message();
    return made.ok() ? std::move(made).value() : nullptr;
  }

  PodNetwork& Network() {
    auto made = PodNetwork::Create(Options());
    EXPECT_TRUE(made.ok()) << made.status().message();
    network_ = std::move(made).value();
    return *network_;
  }

  // A runtime on this test's network (Network()), its Pods finding the API server on the
  // bridge, the machine's KUBERNETES_SERVICE_HOST 127.0.0.1 for host-network Pods.
  bool StartRuntime() {
    Network();
    RuntimeOptions o;
    o.state_dir = dir_ + "/state";
    o.monitor_interval = 10ms;
    o.network = network_;
    o.network_service_host = cluster_->gateway();
    o.extra_env = {{"KUBERNETES_SERVICE_HOST", "127.0.0.1"}};
    auto made = PodRuntime::Create(o);
    EXPECT_TRUE(made.ok()) << made.status().message();
    if (!made.ok()) return false;
    runtime_ = std::move(made).value();
    return true;
  }

  std::optional<cluster::ClusterNetwork> cluster_;
  std::shared_ptr<PodNetwork> network_;
  std::unique_ptr<PodRuntime> runtime_;
  std::string dir_;
};

TEST_F(PodNetworkTest, APodGetsItsOwnNamespaceAndTeardownLeavesNothing) {
  PodNetwork& net = Network();
  auto ip = net.Add("pod-a");
  ASSERT_TRUE(ip.ok()) << ip.status().message();
  EXPECT_TRUE(InCidr(ip.value(), cluster_->NodeCidr(0))) << ip.value();
  EXPECT_EQ(net.Attached(), std::vector<std::string>{"pod-a"});
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 1);
  EXPECT_EQ(Leases(Options().dir), 1);
  auto [code, addrs] = RunIn({"ip", "-o", "-4", "addr", "show"}, net.NamespacePath("pod-a"));
  ASSERT_EQ(code, 0) << addrs;
  EXPECT_NE(addrs.find("lo    inet 127.0.0.1/8"), std::string::npos) << addrs;
  EXPECT_NE(addrs.find("eth0    inet " + ip.value() + "/16"), std::string::npos) << addrs;
  // It reaches the host at the host's address on the bridge (where Pods find the API server).
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, cluster_->gateway().c_str(), &addr.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread host([listener] {
    const int c = ::accept(listener, nullptr, nullptr);
    if (c >= 0) {
      ssize_t sent = ::write(c, "host", 4);
      (void)sent;
      ::close(c);
    }
  });
  auto [py_code, answer] = RunIn({"python3", "-c",
                                "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), 10); "
                                "print(s.recv(16).decode())",
                                cluster_->gateway(), std::to_string(ntohs(addr.sin_port))},
                               net.NamespacePath("pod-a"));
  ::shutdown(listener, SHUT_RDWR);
  host.join();
  ::close(listener);
  EXPECT_EQ(py_code, 0) << answer;
  EXPECT_EQ(answer, "host\n");

  ASSERT_TRUE(net.Remove("pod-a").ok());
  EXPECT_TRUE(net.Attached().empty());
  EXPECT_FALSE(fs::exists(net.NamespacePath("pod-a")));
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
  EXPECT_TRUE(net.Remove("pod-a").ok());  // again: nothing to do
}

// The bridge keeps the address it was given while Pods come and go: a bridge whose address is
// left to the kernel takes its lowest port's, so a Pod that had resolved the host's address before
// another Pod came or went sent to an address nobody had, for the 30 s its ARP entry lived.
TEST_F(PodNetworkTest, TheBridgeKeepsItsAddressAsPodsComeAndGo) {
  auto address = [&] {
    std::ifstream in("/sys/class/net/" + cluster_->bridge() + "/address");
    std::string mac;
    in >> mac;
    return mac;
  };
  const std::string before = address();
  ASSERT_EQ(before.size(), 17u) << before;
  EXPECT_EQ(before.rfind("02:6d:77:00:00:", 0), 0u) << before;
  PodNetwork& net = Network();
  for (const char* uid : {"pod-a", "pod-b", "pod-c"}) {
    ASSERT_TRUE(net.Add(uid).ok()) << uid;
    EXPECT_EQ(address(), before) << "after adding " << uid;
  }
  for (const char* uid : {"pod-b", "pod-a", "pod-c"}) {
    ASSERT_TRUE(net.Remove(uid).ok()) << uid;
    EXPECT_EQ(address(), before) << "after removing " << uid;
  }
}

TEST_F(PodNetworkTest, TwoPodsBindTheSamePortAndTheHostReachesEach) {
  PodNetwork& net = Network();
  std::vector<std::string> ips;
  std::vector<pid_t> servers;
  for (const std::string uid : {"pod-a", "pod-b"}) {
    auto ip = net.Add(uid);
    ASSERT_TRUE(ip.ok()) << ip.status().message();
    ips.push_back(ip.value());
    SpawnOptions spawn;
    spawn.argv = {"python3", "-c",
                  "import socket,sys\n"
                  "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                  "s.bind(('0.0.0.0', 18080)); s.listen(1)\n"
                  "c,_=s.accept(); c.sendall(sys.argv[1].encode()); c.close()\n",
                  uid};
    spawn.search_path = true;
    spawn.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    spawn.netns = net.NamespacePath(uid);
    Spawned child = SpawnProcess(spawn);
    ASSERT_TRUE(child.ok());
    servers.push_back(child.pid);
  }
  EXPECT_NE(ips[0], ips[1]);
  std::string a, b;
  EXPECT_TRUE(WaitUntil([&] { return !(a = Ask(ips[0], 18080)).empty(); }));
  EXPECT_TRUE(WaitUntil([&] { return !(b = Ask(ips[1], 18080)).empty(); }));
  EXPECT_EQ(a, "pod-a");
  EXPECT_EQ(b, "pod-b");
  for (pid_t pid : servers) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(net.RemoveAll().ok());
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
}

TEST_F(PodNetworkTest, AnAgentThatDiedMidPodLeavesNothingAfterTheNextStart) {
  // A child agent makes a Pod's network and dies without releasing it (as a crash does).
  const pid_t agent = ::fork();
  if (agent == 0) {
    auto made = PodNetwork::Create(Options());
    if (!made.ok() || !made.value()->Add("pod-left").ok()) ::_exit(1);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(agent, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(BridgePorts(cluster_->bridge()), 1);
  ASSERT_EQ(Leases(Options().dir), 1);
  PodNetwork& net = Network();  // the next agent on the same directory
  EXPECT_TRUE(net.Attached().empty());
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
  auto ip = net.Add("pod-next");
  ASSERT_TRUE(ip.ok()) << ip.status().message();
  EXPECT_TRUE(net.Remove("pod-next").ok());
}

TEST_F(PodNetworkTest, APinThatHoldsNoNamespaceIsReleasedWithItsLease) {
  // The pin file without its mount (an agent killed between the two, or a mount lost): the
  // namespace and its veth are gone with the last reference, the lease is not; DEL without a
  // namespace releases it, and Remove is not an error.
  PodNetwork& net = Network();
  ASSERT_TRUE(net.Add("pod-a").ok());
  ASSERT_EQ(Leases(Options().dir), 1);
  ASSERT_EQ(::umount2(net.NamespacePath("pod-a").c_str(), MNT_DETACH), 0);
  EXPECT_TRUE(WaitUntil([&] { return BridgePorts(cluster_->bridge()) == 0; }));
  Status st = net.Remove("pod-a");
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(net.Attached().empty());
  EXPECT_EQ(Leases(Options().dir), 0);
}

TEST_F(PodNetworkTest, ADeleteThatFailsIsNamedAndTheRestIsStillReleased) {
  // A loopback plugin whose DEL fails: Remove says so, naming it, and the bridge's DEL (lease and
  // veth) and the namespace's drop still happen.
  auto made = NetworkWithPlugin(
      "loopback",
      "if [ \"$CNI_COMMAND\" = DEL ]; then echo '{\"code\":11,\"msg\":\"no DEL today\"}'; exit 1; fi\n"
      "echo '{\"cniVersion\":\"1.0.0\",\"interfaces\":[{\"name\":\"lo\"}]}'\n");
  ASSERT_NE(made, nullptr);
  auto ip = made->Add("pod-a");
  ASSERT_TRUE(ip.ok()) << ip.status().message();
  Status st = made->Remove("pod-a");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("pod network: loopback plugin DEL: no DEL today"), std::string::npos) << st.message();
  EXPECT_TRUE(made->Attached().empty());
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
}

TEST_F(PodNetworkTest, APluginThatFailsIsNamedWithItsMessageAndNothingIsLeft) {
  auto made = NetworkWithPlugin(
      "bridge",
      "echo '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"no bridge today\",\"details\":\"a test plugin\"}'\n"
      "exit 1\n");
  ASSERT_NE(made, nullptr);
  auto ip = made->Add("pod-a");
  ASSERT_FALSE(ip.ok());
  EXPECT_EQ(ip.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ip.status().message(),
            "pod network: bridge plugin ADD: no bridge today: a test plugin (CNI error code 11)");
  EXPECT_TRUE(made->Attached().empty());
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
}

json MakePod(const std::string& name, const std::string& script, bool host_network = false) {
  json pod = {{"metadata", {{"name", name}, {"namespace", "team"}, {"uid", name + "-uid"}}},
              {"spec",
               {{"nodeName", "local"},
                {"restartPolicy", "Never"},
                {"containers", {{{"name", "main"}, {"command", {"sh", "-c", script}}}}}}}};
  if (host_network) pod["spec"]["hostNetwork"] = true;
  return pod;
}

TEST_F(PodNetworkTest, TheRuntimeRunsPodsInTheirNamespacesAndReleasesThemWhenRemoved) {
  ASSERT_TRUE(StartRuntime());
  const std::string report = "ip -o -4 addr show; echo service-host=$KUBERNETES_SERVICE_HOST";
  ASSERT_TRUE(runtime_->Start(MakePod("own", report + "; sleep 60")).ok());
  ASSERT_TRUE(runtime_->Start(MakePod("host", report, true)).ok());
  const std::string own_ip = runtime_->PodIP("own-uid");
  EXPECT_TRUE(InCidr(own_ip, cluster_->NodeCidr(0))) << own_ip;
  EXPECT_EQ(runtime_->StatusOf("own-uid")["podIP"], own_ip);
  EXPECT_EQ(runtime_->PodIP("host-uid").rfind("127.", 0), 0u) << runtime_->PodIP("host-uid");
  EXPECT_EQ(network_->Attached(), std::vector<std::string>{"own-uid"});
  auto log = [&](const std::string& uid) {
    std::ifstream in(runtime_->LogPath(uid, "main"));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  // Each sees its own interfaces, and a Pod with its own namespace finds the API server on the bridge.
  ASSERT_TRUE(WaitUntil([&] { return log("own-uid").find("service-host=") != std::string::npos; })) << log("own-uid");
  EXPECT_NE(log("own-uid").find("eth0    inet " + own_ip + "/16"), std::string::npos) << log("own-uid");
  EXPECT_NE(log("own-uid").find("service-host=" + cluster_->gateway() + "\n"), std::string::npos) << log("own-uid");
  ASSERT_TRUE(WaitUntil([&] { return log("host-uid").find("service-host=") != std::string::npos; })) << log("host-uid");
  EXPECT_EQ(log("host-uid").find(own_ip), std::string::npos) << log("host-uid");
  EXPECT_NE(log("host-uid").find("service-host=127.0.0.1\n"), std::string::npos) << log("host-uid");
  runtime_->Remove("own-uid");
  EXPECT_TRUE(WaitUntil([&] { return network_->Attached().empty(); }));
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
}

// A finished Pod gives its address back at once, as kubelet tears down a finished Pod's sandbox,
// though the Pod itself stays (a job's cleanPodPolicy keeps it): else a node's /24 runs out of
// addresses under a few hundred finished Pods (FailedCreatePodSandBox). Its status keeps the podIP.
TEST_F(PodNetworkTest, AFinishedPodReleasesItsAddressButKeepsItsStatus) {
  ASSERT_TRUE(StartRuntime());
  ASSERT_TRUE(runtime_->Start(MakePod("done", "exit 0")).ok());
  ASSERT_TRUE(runtime_->Start(MakePod("failed", "exit 3")).ok());
  ASSERT_TRUE(runtime_->Start(MakePod("running", "sleep 60")).ok());
  const std::string done_ip = runtime_->PodIP("done-uid");
  ASSERT_TRUE(WaitUntil([&] { return network_->Attached() == std::vector<std::string>{"running-uid"}; }))
      << network_->Attached().size() << " Pods still attached";
  EXPECT_EQ(Leases(Options().dir), 1) << "only the running Pod holds an address";
  EXPECT_EQ(runtime_->StatusOf("done-uid")["phase"], "Succeeded");
  EXPECT_EQ(runtime_->StatusOf("failed-uid")["phase"], "Failed");
  EXPECT_EQ(runtime_->StatusOf("done-uid")["podIP"], done_ip);
  // Removing the finished Pods later releases nothing twice; the running one still goes as before.
  runtime_->Remove("done-uid");
  runtime_->Remove("failed-uid");
  runtime_->Remove("running-uid");
  EXPECT_TRUE(WaitUntil([&] { return network_->Attached().empty(); }));
  EXPECT_EQ(BridgePorts(cluster_->bridge()), 0);
  EXPECT_EQ(Leases(Options().dir), 0);
}

}  // namespace
}  // namespace meshwork::controlplane::agent
