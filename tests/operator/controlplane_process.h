// A real meshwork-controlplane process for integration tests of the operator's parts: started
// on a fixed port and data dir (so it can be killed and started again on the same ones), with
// the binary found at MESHWORK_CONTROLPLANE_BIN or in the build tree.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "operator/k8s/client.h"
#include "operator/k8s/config.h"
#include "tests/common/free_port.h"

namespace meshwork::testing {

inline std::string ControlPlaneBinary() {
  const char* env = std::getenv("MESHWORK_CONTROLPLANE_BIN");
  if (env != nullptr && *env != '\0') return env;
  return std::string(MESHWORK_BINARY_DIR) + "/controlplane/apiserver/meshwork-controlplane";
}

// Why a test must skip ("" when the binary is there).
inline std::string ControlPlaneMissing() {
  std::error_code ec;
  if (::access(ControlPlaneBinary().c_str(), X_OK) == 0 && std::filesystem::file_size(ControlPlaneBinary(), ec) > 0) {
    return "";
  }
  return "meshwork-controlplane is not built at " + ControlPlaneBinary() +
         " (build the meshwork-controlplane target, or set MESHWORK_CONTROLPLANE_BIN)";
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

class ControlPlaneProcess {
 public:
  ControlPlaneProcess(std::string data_dir, std::vector<std::string> extra_args = {})
      : data_dir_(std::move(data_dir)), port_(FreePort()), extra_(std::move(extra_args)) {}
  ~ControlPlaneProcess() { Kill(SIGTERM); }
  ControlPlaneProcess(const ControlPlaneProcess&) = delete;
  ControlPlaneProcess& operator=(const ControlPlaneProcess&) = delete;

  std::string kubeconfig() const { return data_dir_ + "/kubeconfig"; }

  // Starts the process and waits until it answers; returns "" or what went wrong.
  std::string Start() {
    std::filesystem::create_directories(data_dir_);
    std::filesystem::remove(kubeconfig());
    std::vector<std::string> args = {ControlPlaneBinary(), "--data-dir", data_dir_, "--port", std::to_string(port_)};
    args.insert(args.end(), extra_.begin(), extra_.end());
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
    }, std::chrono::seconds(30), std::chrono::milliseconds(50));
    return up ? "" : "the control plane did not come up within 30s; its log is " + log;
  }

  // SIGSTOP / SIGCONT: a server that accepts connections and does not answer.
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  // Sends `sig` (after SIGCONT, in case it was stopped), SIGKILL after 5 s, and reaps it.
  void Kill(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, sig);
    for (int i = 0; i < 500; ++i) {  // 10 s
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) break;
      if (i == 250) ::kill(pid_, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
  }

 private:
  std::string data_dir_;
  int port_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

}  // namespace meshwork::testing
