// A real API server for the integration tests of the operator's parts: meshwork-cluster
// (docs/cluster.md) with no node agents: etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, built by scripts/setup.sh into .meshwork/kube/bin (or $MESHWORK_KUBE_BIN).
// A cold start takes 15-40 s on 2 cores, so a test binary starts one and its tests share it (each
// in its own namespace or with its own object names); such binaries are registered as one ctest
// each (meshwork_test(... WHOLE)). The tests freeze or kill kube-apiserver by its pid file; the
// supervisor restarts a killed one on the same port and etcd keeps every object.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "operator/k8s/client.h"
#include "operator/k8s/config.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::testing {

inline std::string ClusterBinary() {
  return std::string(MESHWORK_BINARY_DIR) + "/controlplane/cluster/meshwork-cluster";
}

inline std::string KubeBinDir() {
  const char* env = std::getenv("MESHWORK_KUBE_BIN");
  if (env != nullptr && *env != '\0') return env;
  return std::string(MESHWORK_SOURCE_DIR) + "/.meshwork/kube/bin";
}

// Why a test must skip ("" when everything is there).
inline std::string LocalClusterMissing() {
  if (::access(ClusterBinary().c_str(), X_OK) != 0) {
    return "meshwork-cluster is not built at " + ClusterBinary() + " (build the meshwork-cluster target)";
  }
  if (::access((KubeBinDir() + "/kube-apiserver").c_str(), X_OK) != 0) {
    return "no kube-apiserver in " + KubeBinDir() +
           " (scripts/setup.sh builds the Kubernetes components there; or set MESHWORK_KUBE_BIN)";
  }
  return "";
}

// Polls `cond` until it holds or `limit` has passed; returns the last answer.
template <typename F>
bool Eventually(F cond, std::chrono::milliseconds limit = std::chrono::seconds(30),
                std::chrono::milliseconds step = std::chrono::milliseconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(step);
  }
  return cond();
}

class LocalCluster {
 public:
  explicit LocalCluster(std::string data_dir) : data_dir_(std::move(data_dir)) {}
  ~LocalCluster() { Stop(); }
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  std::string kubeconfig() const { return data_dir_ + "/kubeconfig"; }
  std::string log() const { return data_dir_ + "/cluster.log"; }

  // Starts the supervisor and waits for its ready line; returns "" or what went wrong.
  std::string Start() {
    std::filesystem::create_directories(data_dir_);
    std::vector<std::string> args = {ClusterBinary(), "--data-dir", data_dir_, "--nodes", "none",
                                     "--kube-bin", KubeBinDir()};
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a crashed test does not leave a cluster behind
      int fd = ::open(log().c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    const bool up = Eventually([&] {
      std::ifstream in(log());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return text.find("ready, serving on") != std::string::npos || ::waitpid(pid_, nullptr, WNOHANG) == pid_;
    }, std::chrono::seconds(240), std::chrono::milliseconds(200));
    if (!up || !Answers()) {
      std::ifstream in(log());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return "meshwork-cluster did not become ready within 240 s; its log (" + log() + "):\n" + text;
    }
    return "";
  }

  // kube-apiserver's pid (from the supervisor's pid file), or -1.
  pid_t ApiServerPid() const {
    std::ifstream in(data_dir_ + "/run/kube-apiserver.pid");
    pid_t pid = -1;
    in >> pid;
    return in ? pid : -1;
  }

  // SIGSTOP / SIGCONT: an API server that accepts connections and does not answer.
  void SignalApiServer(int sig) {
    if (pid_t pid = ApiServerPid(); pid > 0) ::kill(pid, sig);
  }

  // SIGKILLs kube-apiserver and waits until the supervisor has restarted it and it answers on
  // the same port; returns "" or what went wrong.
  std::string KillApiServer() {
    const pid_t old = ApiServerPid();
    if (old <= 0) return "no kube-apiserver pid file in " + data_dir_ + "/run";
    ::kill(old, SIGKILL);
    const bool back = Eventually([&] {
      const pid_t now = ApiServerPid();
      return now > 0 && now != old && Answers();
    }, std::chrono::seconds(180), std::chrono::milliseconds(200));
    return back ? "" : "kube-apiserver was not restarted and answering within 180 s; see " + log();
  }

  // Whether the admin kubeconfig's client gets an answer.
  bool Answers() const {
    auto cfg = k8s::LoadKubeconfig(kubeconfig());
    if (!cfg.ok()) return false;
    k8s::ClientOptions o;
    o.max_retries = 0;
    o.request_timeout = std::chrono::seconds(5);
    auto c = k8s::Client::FromConfig(*cfg, o);
    return c.ok() && (*c)->Get(k8s::resources::Namespaces(), "", "default").ok();
  }

  // SIGTERM (the supervisor stops every component), SIGKILL after a minute.
  void Stop() {
    if (pid_ <= 0) return;
    SignalApiServer(SIGCONT);
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 600; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  std::string data_dir_;
  pid_t pid_ = -1;
};

// The binary's one cluster, started by the first test that asks and stopped after the last one
// (a gtest Environment's TearDown, which runs inside RUN_ALL_TESTS, so a main() that leaves with
// _Exit still stops it).
class SharedCluster : public ::testing::Environment {
 public:
  // The cluster, or nullptr with *error saying why it did not start (every later test is told).
  static LocalCluster* Get(std::string* error) {
    static std::string start_error;
    Instance().Ensure(&start_error);
    *error = start_error;
    return start_error.empty() ? Instance().cluster_.get() : nullptr;
  }
  void TearDown() override {
    if (cluster_) cluster_->Stop();
    cluster_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_.path(), ec);  // (_Exit skips TempDir's destructor)
  }

 private:
  static SharedCluster& Instance() {
    static SharedCluster* env =
        static_cast<SharedCluster*>(::testing::AddGlobalTestEnvironment(new SharedCluster));
    return *env;
  }
  void Ensure(std::string* error) {
    if (tried_) return;
    tried_ = true;
    cluster_ = std::make_unique<LocalCluster>(dir_.path() + "/cluster");
    *error = cluster_->Start();
  }

  bool tried_ = false;
  k8s::testing::TempDir dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

// A test on the binary's shared cluster: skipped, saying why, without the binaries; `client_`
// is the admin's, and `ns_` a namespace of the test's own (made on first use by EnsureNamespace).
class LocalClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string missing = LocalClusterMissing(); !missing.empty()) GTEST_SKIP() << missing;
    std::string error;
    cluster_ = SharedCluster::Get(&error);
    ASSERT_NE(cluster_, nullptr) << error;
    client_ = NewClient();
    ASSERT_NE(client_, nullptr);
    ns_ = TestNamespace();
  }

  std::unique_ptr<k8s::Client> NewClient(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto cfg = k8s::LoadKubeconfig(cluster_->kubeconfig());
    EXPECT_TRUE(cfg.ok()) << cfg.error().ToString();
    if (!cfg.ok()) return nullptr;
    k8s::ClientOptions o;
    o.request_timeout = timeout;
    auto c = k8s::Client::FromConfig(*cfg, o);
    EXPECT_TRUE(c.ok()) << c.error().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  void EnsureNamespace(const std::string& ns) {
    auto r = client_->Create(k8s::resources::Namespaces(), "",
                             {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
    ASSERT_TRUE(r.ok() || k8s::IsAlreadyExists(r.error())) << r.error().ToString();
  }

  // "t<n>-" and the test's name in lower case, cut to a valid namespace name.
  static std::string TestNamespace() {
    static int n = 0;
    std::string name = "t" + std::to_string(++n) + "-";
    for (char c : std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())) {
      if (std::isalnum(static_cast<unsigned char>(c))) name += static_cast<char>(std::tolower(c));
    }
    return name.substr(0, 50);
  }

  LocalCluster* cluster_ = nullptr;
  std::unique_ptr<k8s::Client> client_;
  std::string ns_;
};

}  // namespace meshwork::testing
