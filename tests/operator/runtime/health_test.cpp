// /healthz and /readyz: HealthChecks' answers, over HTTP from the metrics server, and Heartbeat.
#include "operator/runtime/health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/operator/runtime/http_get.h"

namespace meshwork::runtime {
namespace {

using namespace std::chrono_literals;
using testing::HttpGet;

TEST(HealthChecksTest, NoChecksIsHealthyAndReady) {
  HealthChecks h;
  EXPECT_EQ(h.Live(), std::make_pair(200, std::string("ok\n")));
  EXPECT_EQ(h.Ready(), std::make_pair(200, std::string("ok\n")));
}

TEST(HealthChecksTest, FirstFailingCheckIsTheOneLineReason) {
  HealthChecks h;
  h.AddReadinessCheck("a", [] { return std::string(); });
  h.AddReadinessCheck("informers", [] { return std::string("trainingjobs informer has not synced\n(detail)"); });
  h.AddReadinessCheck("c", [] { return std::string("also bad"); });
  auto [code, body] = h.Ready();
  EXPECT_EQ(code, 503);
  EXPECT_EQ(body, "informers: trainingjobs informer has not synced (detail)\n");
  EXPECT_EQ(h.Live().first, 200);  // readiness checks do not affect liveness
}

TEST(HealthChecksTest, ThrowingCheckFails) {
  HealthChecks h;
  h.AddLivenessCheck("loop", []() -> std::string { throw std::runtime_error("boom"); });
  auto [code, body] = h.Live();
  EXPECT_EQ(code, 503);
  EXPECT_EQ(body, "loop: check threw: boom\n");
}

TEST(HealthChecksTest, ServedOnTheMetricsPortWithCodes) {
  auto server = metrics::MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  HealthChecks health;
  std::atomic<bool> synced{false};
  health.AddReadinessCheck("informers", [&] { return synced ? std::string() : "trainingjobs informer has not synced"; });
  ASSERT_TRUE(health.Install(**server).ok());
  const int port = (*server)->port();

  EXPECT_EQ(HttpGet(port, "/healthz").status, 200);
  auto ready = HttpGet(port, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "informers: trainingjobs informer has not synced\n");
  synced = true;
  ready = HttpGet(port, "/readyz?verbose");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ok\n");
  EXPECT_EQ(HttpGet(port, "/metrics").status, 200);
  EXPECT_EQ(HttpGet(port, "/livez").status, 404);
}

TEST(HeartbeatTest, FailsAfterSilenceAndRecoversOnBeat) {
  Heartbeat hb(100ms);
  EXPECT_EQ(hb.Check(), "");
  std::this_thread::sleep_for(250ms);
  const std::string reason = hb.Check();
  EXPECT_NE(reason.find("no heartbeat for"), std::string::npos) << reason;
  EXPECT_NE(reason.find("limit 100 ms"), std::string::npos) << reason;
  hb.Beat();
  EXPECT_EQ(hb.Check(), "");

  HealthChecks h;
  h.AddLivenessCheck("worker", [&] { return hb.Check(); });
  EXPECT_EQ(h.Live().first, 200);
}

}  // namespace
}  // namespace meshwork::runtime
