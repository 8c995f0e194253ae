// A real meshwork-controlplane process for the runtime's integration tests, and a fixture that
// skips (saying where it looked) when the binary is not built. Same approach as
// tests/operator/k8s/controlplane_test.cpp.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "operator/k8s/client.h"
#include "tests/common/free_port.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::runtime::testing {

using namespace std::chrono_literals;

inline std::string ControlPlaneBinary() {
  const char* env = std::getenv("MESHWORK_CONTROLPLANE_BIN");
  if (env != nullptr && *env != '\0') return env;
  return std::string(MESHWORK_BINARY_DIR) + "/controlplane/apiserver/meshwork-controlplane";
}

template <typename F>
bool Eventually(F cond, std::chrono::milliseconds limit = 30s, std::chrono::milliseconds step = 10ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(step);
  }
  return cond();
}

class ControlPlane {
 public:
  explicit ControlPlane(std::string data_dir) : data_dir_(std::move(data_dir)), port_(meshwork::testing::FreePort()) {}
  ~ControlPlane() { Kill(); }

  std::string kubeconfig() const { return data_dir_ + "/kubeconfig"; }

  // Starts the process and waits until it answers; returns "" or what went wrong.
  std::string Start() {
    std::filesystem::create_directories(data_dir_);
    std::vector<std::string> args = {ControlPlaneBinary(), "--data-dir", data_dir_, "--port", std::to_string(port_)};
    const std::string log = data_dir_ + "/controlplane.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    bool up = Eventually([&] {
      if (!std::filesystem::exists(kubeconfig())) return false;
      auto cfg = k8s::LoadKubeconfig(kubeconfig());
      if (!cfg.ok()) return false;
      auto c = k8s::Client::FromConfig(*cfg);
      return c.ok() && (*c)->List(k8s::resources::Namespaces(), "").ok();
    }, 30s, 50ms);
    return up ? "" : "the control plane did not come up within 30s; its log is " + log;
  }

  // SIGSTOP / SIGCONT: a server that accepts connections and does not answer.
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  void Kill() {
    Signal(SIGCONT);
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 500; ++i) {  // 10 s
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) break;
      if (i == 250) ::kill(pid_, SIGKILL);
      std::this_thread::sleep_for(20ms);
    }
    pid_ = -1;
  }

 private:
  std::string data_dir_;
  int port_;
  pid_t pid_ = -1;
};

class ControlPlaneFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::error_code ec;
    if (::access(ControlPlaneBinary().c_str(), X_OK) != 0 || std::filesystem::file_size(ControlPlaneBinary(), ec) == 0) {
      GTEST_SKIP() << "meshwork-controlplane is not built at " << ControlPlaneBinary()
                   << " (build the meshwork-controlplane target, or set MESHWORK_CONTROLPLANE_BIN)";
    }
    cp_ = std::make_unique<ControlPlane>(dir_.path() + "/cp");
    const std::string err = cp_->Start();
    ASSERT_EQ(err, "");
    client_ = NewClient();
    ASSERT_NE(client_, nullptr);
  }

  std::unique_ptr<k8s::Client> NewClient(std::chrono::milliseconds timeout = 5s) {
    auto cfg = k8s::LoadKubeconfig(cp_->kubeconfig());
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

  k8s::testing::TempDir dir_;
  std::unique_ptr<ControlPlane> cp_;
  std::unique_ptr<k8s::Client> client_;
};

}  // namespace meshwork::runtime::testing
