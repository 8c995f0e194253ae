// EventRecorder against the real control plane: the Event's fields, aggregation of repeats into
// one object with a count, separate objects for different messages, API errors logged and never
// thrown, a bounded shutdown; and /readyz following an informer's sync.
#include "operator/runtime/events.h"

#include <gtest/gtest.h>

#include <mutex>
#include <regex>
#include <vector>

#include "operator/k8s/informer.h"
#include "operator/runtime/health.h"
#include "tests/operator/local_cluster.h"
#include "tests/operator/runtime/http_get.h"

namespace meshwork::runtime {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using meshwork::testing::LocalClusterTest;
using meshwork::testing::Eventually;

class EventRecorderTest : public LocalClusterTest {
 protected:
  void SetUp() override {
    LocalClusterTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    EnsureNamespace(ns_);
    auto cm = client_->Create(k8s::resources::ConfigMaps(), ns_,
                              {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "job-1"}}}});
    ASSERT_TRUE(cm.ok()) << cm.error().ToString();
    object_ = *cm;
  }

  EventRecorderOptions Options() {
    EventRecorderOptions o;
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      log_.push_back(line);
    };
    return o;
  }

  std::vector<json> EventsFor(const std::string& name) {
    k8s::ListOptions lo;
    lo.field_selector = "involvedObject.name=" + name;
    auto list = client_->List(k8s::resources::Events(), ns_, lo);
    EXPECT_TRUE(list.ok()) << list.error().ToString();
    std::vector<json> out;
    if (list.ok()) {
      for (const auto& e : (*list)["items"]) out.push_back(e);
    }
    return out;
  }

  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

  json object_;
  std::mutex mu_;
  std::vector<std::string> log_;
};

TEST_F(EventRecorderTest, EventHasTheInvolvedObjectAndRecorderFields) {
  EventRecorder rec(client_.get(), Options());
  const ObjectReference ref = ReferenceTo(object_);
  rec.Normal(ref, "CreatedPod", "Created pod job-1-worker-0");
  ASSERT_TRUE(rec.Flush(10s));
  EXPECT_EQ(rec.NumSent(), 1);
  EXPECT_EQ(rec.NumFailed(), 0);

  auto events = EventsFor("job-1");
  ASSERT_EQ(events.size(), 1u);
  const json& e = events[0];
  EXPECT_EQ(e["type"], "Normal");
  EXPECT_EQ(e["reason"], "CreatedPod");
  EXPECT_EQ(e["message"], "Created pod job-1-worker-0");
  EXPECT_EQ(e["count"], 1);
  EXPECT_EQ(e["metadata"]["namespace"], ns_);
  EXPECT_EQ(e["source"]["component"], "meshwork-operator");
  EXPECT_EQ(e["reportingComponent"], "meshwork-operator");
  const json& io = e["involvedObject"];
  EXPECT_EQ(io["kind"], "ConfigMap");
  EXPECT_EQ(io["apiVersion"], "v1");
  EXPECT_EQ(io["namespace"], ns_);
  EXPECT_EQ(io["name"], "job-1");
  EXPECT_EQ(io["uid"], object_["metadata"]["uid"]);
  EXPECT_EQ(io["resourceVersion"], object_["metadata"]["resourceVersion"]);
  const std::regex rfc3339(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)");
  EXPECT_TRUE(std::regex_match(e.value("firstTimestamp", ""), rfc3339)) << e.dump();
  EXPECT_EQ(e["firstTimestamp"], e["lastTimestamp"]);
  EXPECT_EQ(std::string(e["metadata"]["name"]).rfind("job-1.", 0), 0u) << e.dump();
}

TEST_F(EventRecorderTest, RepeatsAreAggregatedIntoOneEventWithACount) {
  EventRecorder rec(client_.get(), Options());
  const ObjectReference ref = ReferenceTo(object_);
  rec.Warning(ref, "BackoffLimit", "pod job-1-worker-0 failed");
  ASSERT_TRUE(rec.Flush(10s));
  std::this_thread::sleep_for(1100ms);  // timestamps have whole seconds
  rec.Warning(ref, "BackoffLimit", "pod job-1-worker-0 failed");
  ASSERT_TRUE(rec.Flush(10s));

  auto events = EventsFor("job-1");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["count"], 2);
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_GT(events[0].value("lastTimestamp", ""), events[0].value("firstTimestamp", ""));
  EXPECT_EQ(rec.NumSent(), 2);
}

TEST_F(EventRecorderTest, DifferentMessagesOrTypesAreSeparateEvents) {
  EventRecorder rec(client_.get(), Options());
  const ObjectReference ref = ReferenceTo(object_);
  rec.Normal(ref, "CreatedPod", "Created pod job-1-worker-0");
  rec.Normal(ref, "CreatedPod", "Created pod job-1-worker-1");
  rec.Warning(ref, "CreatedPod", "Created pod job-1-worker-1");
  rec.Normal(ref, "CreatedPod", "Created pod job-1-worker-1");  // repeats the second
  ASSERT_TRUE(rec.Flush(10s));
  auto events = EventsFor("job-1");
  ASSERT_EQ(events.size(), 3u);
  int total = 0;
  for (const auto& e : events) total += e["count"].get<int>();
  EXPECT_EQ(total, 4);
}

TEST_F(EventRecorderTest, ZeroWindowCreatesANewEventForEachRepeat) {
  EventRecorderOptions o = Options();
  o.aggregation_window = 0ms;
  EventRecorder rec(client_.get(), o);
  const ObjectReference ref = ReferenceTo(object_);
  rec.Normal(ref, "Synced", "same");
  ASSERT_TRUE(rec.Flush(10s));
  std::this_thread::sleep_for(5ms);
  rec.Normal(ref, "Synced", "same");
  ASSERT_TRUE(rec.Flush(10s));
  EXPECT_EQ(EventsFor("job-1").size(), 2u);
}

TEST_F(EventRecorderTest, ApiErrorIsLoggedNotThrown) {
  EventRecorder rec(client_.get(), Options());
  ObjectReference ref = ReferenceTo(object_);
  ref.ns = "no-such-namespace";  // the Event's namespace does not exist: 404
  EXPECT_NO_THROW(rec.Warning(ref, "Failed", "x"));
  ASSERT_TRUE(rec.Flush(10s));
  EXPECT_EQ(rec.NumFailed(), 1);
  EXPECT_EQ(rec.NumSent(), 0);
  const auto log = Log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("cannot create event Failed"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("no-such-namespace"), std::string::npos) << log[0];
}

// An API server that accepts connections and never answers: recording still returns at once,
// and the destructor gives up after flush_timeout plus the request in flight.
TEST_F(EventRecorderTest, UnresponsiveApiNeitherBlocksRecordingNorShutdown) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 64), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  k8s::Config cfg;
  cfg.server = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  k8s::ClientOptions co;
  co.request_timeout = 1000ms;
  co.max_retries = 0;
  auto client = k8s::Client::FromConfig(cfg, co);
  ASSERT_TRUE(client.ok()) << client.error().ToString();

  const auto start = std::chrono::steady_clock::now();
  {
    EventRecorderOptions o = Options();
    o.flush_timeout = 500ms;
    EventRecorder rec(client->get(), o);
    for (int i = 0; i < 20; ++i) rec.Normal(ReferenceTo(object_), "R", "m" + std::to_string(i));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);  // queued, not sent
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 4s) << std::chrono::duration<double>(took).count() << " s";
  ::close(fd);
  const auto log = Log();
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("dropping"), std::string::npos) << log.back();
}

// /readyz follows the informer: 503 naming it until its first list is in, then 200.
TEST_F(EventRecorderTest, ReadyzIsServiceUnavailableUntilTheInformerHasSynced) {
  auto server = metrics::MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  k8s::Informer informer(client_.get(), k8s::resources::ConfigMaps(), ns_);
  HealthChecks health;
  health.AddReadinessCheck("informers", InformerSyncedCheck(&informer, "configmaps informer"));
  ASSERT_TRUE(health.Install(**server).ok());

  auto before = testing::HttpGet((*server)->port(), "/readyz");
  EXPECT_EQ(before.status, 503);
  EXPECT_EQ(before.body, "informers: configmaps informer has not synced (last error: OK)\n");
  EXPECT_EQ(testing::HttpGet((*server)->port(), "/healthz").status, 200);

  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(10s));
  auto after = testing::HttpGet((*server)->port(), "/readyz");
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(after.body, "ok\n");
  informer.Stop();
}

}  // namespace
}  // namespace meshwork::runtime
