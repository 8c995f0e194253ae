// The runtime's integration tests run against a real meshwork-controlplane
// (tests/operator/controlplane_process.h); this fixture skips, saying where it looked, when the
// binary is not built.
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
#include "tests/operator/controlplane_process.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::runtime::testing {

using namespace std::chrono_literals;

using meshwork::testing::ControlPlaneBinary;
using meshwork::testing::Eventually;
using ControlPlane = meshwork::testing::ControlPlaneProcess;

class ControlPlaneFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string missing = meshwork::testing::ControlPlaneMissing(); !missing.empty()) {
      GTEST_SKIP() << missing;
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
