// The client's transport against a scripted server on 127.0.0.1: verbs, paths, headers,
// pagination, error mapping, retries (connection errors, 429 + Retry-After), timeouts,
// incremental watch decoding, prompt cancellation, and the informer's re-watch / relist.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <vector>

#include "operator/k8s/client.h"
#include "operator/k8s/informer.h"
#include "tests/operator/k8s/fake_apiserver.h"

namespace meshwork::k8s {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using ::testing::HasSubstr;
using testing::FakeApiServer;
using testing::FakeConn;
using testing::FakeRequest;

constexpr auto kEventually = 10s;

std::unique_ptr<Client> MakeClient(const std::string& url, ClientOptions o = {}) {
  Config c;
  c.server = url;
  c.token = "tok-123";
  auto r = Client::FromConfig(c, o);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  return std::move(r).value();
}

json Cm(const std::string& name, const std::string& rv) {
  return {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", "d"}, {"resourceVersion", rv}}}};
}

std::string StatusJson(int code, const std::string& reason, const std::string& msg) {
  return json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"}, {"message", msg},
              {"reason", reason}, {"code", code}}
      .dump();
}

std::string EventLine(const std::string& type, const json& obj) {
  return json{{"type", type}, {"object", obj}}.dump() + "\n";
}

TEST(ClientTest, VerbsPathsHeadersAndBodies) {
  FakeApiServer server([](const FakeRequest& r, FakeConn& c) {
    if (r.method == "GET" && r.path == "/api/v1/namespaces/d/configmaps/x") return c.Respond(200, Cm("x", "5").dump());
    if (r.method == "GET") return c.Respond(404, StatusJson(404, "NotFound", "configmaps \"y\" not found"));
    if (r.method == "POST") return c.Respond(201, r.body);
    if (r.method == "PUT" && r.path.find("/status") != std::string::npos) return c.Respond(200, r.body);
    if (r.method == "PUT") return c.Respond(409, StatusJson(409, "Conflict", "the object has been modified"));
    if (r.method == "PATCH") return c.Respond(200, Cm("x", "6").dump());
    if (r.method == "DELETE") {
      return c.Respond(200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}, {"code", 200}}.dump());
    }
    c.Respond(500, "");
  });
  auto client = MakeClient(server.url());

  auto got = client->Get(resources::ConfigMaps(), "d", "x");
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  EXPECT_EQ((*got)["metadata"]["resourceVersion"], "5");

  auto missing = client->Get(resources::ConfigMaps(), "d", "y");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(IsNotFound(missing.error()));
  EXPECT_THAT(missing.error().message(), HasSubstr("not found"));

  auto created = client->Create(resources::ConfigMaps(), "", Cm("n", ""));
  ASSERT_TRUE(created.ok()) << created.error().ToString();

  auto updated = client->Update(resources::ConfigMaps(), "d", Cm("x", "4"));
  ASSERT_FALSE(updated.ok());
  EXPECT_TRUE(IsConflict(updated.error()));

  auto status = client->UpdateStatus(resources::Custom("meshwork.dev", "v1alpha1", "trainingjobs"), "d", Cm("j", "1"));
  ASSERT_TRUE(status.ok()) << status.error().ToString();

  auto patched = client->MergePatch(resources::ConfigMaps(), "d", "x", {{"data", {{"k", "v"}}}});
  ASSERT_TRUE(patched.ok()) << patched.error().ToString();

  DeleteOptions del;
  del.propagation_policy = "Background";
  del.precondition_uid = "uid-1";
  auto deleted = client->Delete(resources::ConfigMaps(), "d", "x", del);
  ASSERT_TRUE(deleted.ok()) << deleted.error().ToString();

  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 7u);
  for (const auto& r : reqs) EXPECT_EQ(r.Header("authorization"), "Bearer tok-123") << r.target;
  EXPECT_EQ(reqs[2].method, "POST");
  EXPECT_EQ(reqs[2].path, "/api/v1/namespaces/d/configmaps");  // namespace from the object
  EXPECT_THAT(reqs[2].Header("content-type"), HasSubstr("application/json"));
  EXPECT_EQ(reqs[3].method, "PUT");
  EXPECT_EQ(json::parse(reqs[3].body)["metadata"]["resourceVersion"], "4");
  EXPECT_EQ(reqs[4].path, "/apis/meshwork.dev/v1alpha1/namespaces/d/trainingjobs/j/status");
  EXPECT_EQ(reqs[5].method, "PATCH");
  EXPECT_EQ(reqs[5].Header("content-type"), "application/merge-patch+json");
  EXPECT_EQ(json::parse(reqs[5].body), json({{"data", {{"k", "v"}}}}));
  EXPECT_EQ(reqs[6].method, "DELETE");
  json body = json::parse(reqs[6].body);
  EXPECT_EQ(body["propagationPolicy"], "Background");
  EXPECT_EQ(body["preconditions"]["uid"], "uid-1");
}

TEST(ClientTest, MismatchedNamespaceIsRefusedBeforeAnyRequest) {
  FakeApiServer server([](const FakeRequest&, FakeConn& c) { c.Respond(200, "{}"); });
  auto client = MakeClient(server.url());
  auto r = client->Create(resources::ConfigMaps(), "other", Cm("n", ""));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr("\"d\""));
  EXPECT_TRUE(server.requests().empty());
}

TEST(ClientTest, ListFollowsContinueTokensAndFillsKinds) {
  FakeApiServer server([](const FakeRequest& r, FakeConn& c) {
    json page = {{"kind", "ConfigMapList"}, {"apiVersion", "v1"}, {"metadata", json::object()}};
    json a = Cm("a", "1"), b = Cm("b", "2");
    a.erase("kind");
    b.erase("kind");
    if (r.Param("continue").empty()) {
      page["items"] = {a};
      page["metadata"] = {{"resourceVersion", "10"}, {"continue", "next=1"}};
    } else {
      page["items"] = {b};
      page["metadata"] = {{"resourceVersion", "11"}};
    }
    c.Respond(200, page.dump());
  });
  auto client = MakeClient(server.url());
  ListOptions o;
  o.limit = 1;
  o.label_selector = "app=x";
  auto list = client->List(resources::ConfigMaps(), "d", o);
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  ASSERT_EQ((*list)["items"].size(), 2u);
  EXPECT_EQ((*list)["items"][1]["metadata"]["name"], "b");
  EXPECT_EQ((*list)["items"][0]["kind"], "ConfigMap");
  EXPECT_EQ((*list)["metadata"]["resourceVersion"], "11");
  EXPECT_FALSE((*list)["metadata"].contains("continue"));
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].Param("labelSelector"), "app=x");
  EXPECT_EQ(reqs[0].Param("limit"), "1");
  EXPECT_EQ(reqs[1].Param("continue"), "next=1");
}

TEST(ClientTest, TooManyRequestsIsRetriedAfterTheServersDelayCapped) {
  std::atomic<int> calls{0};
  FakeApiServer server([&](const FakeRequest&, FakeConn& c) {
    if (calls++ == 0) {
      return c.Respond(429, StatusJson(429, "TooManyRequests", "slow down"), "Retry-After: 3600\r\n");
    }
    c.Respond(200, Cm("x", "1").dump());
  });
  ClientOptions o;
  o.max_retry_after = std::chrono::seconds(0);  // honour, but never wait an hour in a test
  auto client = MakeClient(server.url(), o);
  auto got = client->Get(resources::ConfigMaps(), "d", "x");
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  EXPECT_EQ(calls.load(), 2);
}

TEST(ClientTest, TooManyRequestsAfterTheLastRetryIsReturnedWithRetryAfter) {
  FakeApiServer server([](const FakeRequest&, FakeConn& c) {
    c.Respond(429, StatusJson(429, "TooManyRequests", "slow down"), "Retry-After: 2\r\n");
  });
  ClientOptions o;
  o.max_retries = 1;
  o.max_retry_after = std::chrono::seconds(0);
  auto client = MakeClient(server.url(), o);
  auto got = client->Get(resources::ConfigMaps(), "d", "x");
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(IsTooManyRequests(got.error()));
  EXPECT_EQ(got.error().retry_after(), std::chrono::seconds(2));
  EXPECT_EQ(server.requests().size(), 2u);
}

// One token every 2 s and a burst of 1: the second request waits for its token, unless the
// first took 2 s itself; the limiter reports the wait. Without a qps nothing waits.
TEST(ClientTest, QpsLimitMakesTheRequestAfterTheBurstWaitForItsToken) {
  FakeApiServer server([](const FakeRequest&, FakeConn& c) { c.Respond(200, Cm("x", "1").dump()); });
  std::vector<double> waits;
  std::mutex mu;
  ClientOptions o;
  o.qps = 0.5;
  o.burst = 1;
  o.on_throttled = [&](double s) {
    std::lock_guard<std::mutex> lock(mu);
    waits.push_back(s);
  };
  auto client = MakeClient(server.url(), o);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(client->Get(resources::ConfigMaps(), "d", "x").ok());
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(client->Get(resources::ConfigMaps(), "d", "x").ok());
  if (first_s >= 1.5) GTEST_SKIP() << "the first request took " << first_s << " s: the token was back before the second";
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_GT(waits[0], 2.0 - first_s - 0.05);
  EXPECT_LE(waits[0], 2.0 + 0.01);

  ClientOptions unlimited;
  unlimited.on_throttled = [&](double s) { waits.push_back(s); };
  auto free_client = MakeClient(server.url(), unlimited);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(free_client->Get(resources::ConfigMaps(), "d", "x").ok());
  EXPECT_EQ(waits.size(), 1u);
}

TEST(ClientTest, ConnectionRefusedIsUnavailableAfterBoundedRetries) {
  int port;
  {
    FakeApiServer closed([](const FakeRequest&, FakeConn&) {});
    port = closed.port();
  }  // nothing listens there now
  ClientOptions o;
  o.max_retries = 2;
  o.retry_backoff = 1ms;
  auto client = MakeClient("http://127.0.0.1:" + std::to_string(port), o);
  auto got = client->Get(resources::ConfigMaps(), "d", "x");
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(IsUnavailable(got.error())) << got.error().ToString();
  EXPECT_THAT(got.error().message(), HasSubstr("127.0.0.1:" + std::to_string(port)));
}

TEST(ClientTest, SilentServerTimesOut) {
  FakeApiServer server([&](const FakeRequest&, FakeConn& c) { c.WaitPeerClosed(kEventually); });
  ClientOptions o;
  o.request_timeout = 200ms;
  o.max_retries = 0;
  auto client = MakeClient(server.url(), o);
  auto got = std::async(std::launch::async, [&] { return client->Get(resources::ConfigMaps(), "d", "x"); });
  ASSERT_EQ(got.wait_for(kEventually), std::future_status::ready);
  auto r = got.get();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsUnavailable(r.error())) << r.error().ToString();
}

TEST(ClientTest, GetLogPassesOptionsAndReturnsText) {
  FakeApiServer server([](const FakeRequest& r, FakeConn& c) { c.Respond(200, "line1\nline2\n", "", "text/plain"); });
  auto client = MakeClient(server.url());
  LogOptions o;
  o.container = "trainer";
  o.tail_lines = 2;
  o.previous = true;
  auto log = client->GetLog("d", "p-0", o);
  ASSERT_TRUE(log.ok()) << log.error().ToString();
  EXPECT_EQ(*log, "line1\nline2\n");
  auto r = server.requests().at(0);
  EXPECT_EQ(r.path, "/api/v1/namespaces/d/pods/p-0/log");
  EXPECT_EQ(r.Param("container"), "trainer");
  EXPECT_EQ(r.Param("tailLines"), "2");
  EXPECT_EQ(r.Param("previous"), "true");
}

// The second event is only sent after the handler has seen the first: the client must decode
// lines as they arrive, with the body still open. An event split over two chunks arrives whole.
TEST(WatchTest, EventsAreDeliveredAsTheyArriveAcrossChunks) {
  std::mutex mu;
  std::condition_variable cv;
  int seen = 0;
  FakeApiServer server([&](const FakeRequest& r, FakeConn& c) {
    c.StartChunked();
    c.Chunk(EventLine("ADDED", Cm("a", "11")));
    {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, kEventually, [&] { return seen >= 1; })) return;  // never EndChunked
    }
    std::string second = EventLine("MODIFIED", Cm("a", "12"));
    c.Chunk(second.substr(0, 17));
    std::this_thread::sleep_for(20ms);
    c.Chunk(second.substr(17));
    c.Chunk(EventLine("BOOKMARK", {{"kind", "ConfigMap"}, {"apiVersion", "v1"}, {"metadata", {{"resourceVersion", "20"}}}}));
    c.EndChunked();
  });
  auto client = MakeClient(server.url());
  std::vector<WatchEvent> events;
  WatchOptions o;
  o.timeout_seconds = 30;
  Error e = client->Watch(resources::ConfigMaps(), "d", "10", o, [&](const WatchEvent& ev) {
    events.push_back(ev);
    std::lock_guard<std::mutex> lock(mu);
    ++seen;
    cv.notify_all();
    return true;
  });
  EXPECT_TRUE(e.ok()) << e.ToString();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].type, WatchEvent::Type::kModified);
  EXPECT_EQ(events[1].resource_version, "12");
  EXPECT_EQ(events[2].type, WatchEvent::Type::kBookmark);
  EXPECT_EQ(events[2].resource_version, "20");
  auto r = server.requests().at(0);
  EXPECT_EQ(r.path, "/api/v1/namespaces/d/configmaps");
  EXPECT_EQ(r.Param("watch"), "1");
  EXPECT_EQ(r.Param("allowWatchBookmarks"), "true");
  EXPECT_EQ(r.Param("resourceVersion"), "10");
  EXPECT_EQ(r.Param("timeoutSeconds"), "30");
}

TEST(WatchTest, CancelFromAnotherThreadEndsAnOpenStreamPromptly) {
  std::atomic<bool> peer_closed{false};
  FakeApiServer server([&](const FakeRequest&, FakeConn& c) {
    c.StartChunked();
    c.Chunk(EventLine("ADDED", Cm("a", "1")));
    peer_closed = c.WaitPeerClosed(kEventually);  // hold the stream open
  });
  auto client = MakeClient(server.url());
  CancelToken cancel;
  std::promise<void> first;
  auto watch = std::async(std::launch::async, [&] {
    bool once = false;
    return client->Watch(resources::ConfigMaps(), "d", "", WatchOptions{}, [&](const WatchEvent&) {
      if (!once) first.set_value();
      once = true;
      return true;
    }, cancel);
  });
  ASSERT_EQ(first.get_future().wait_for(kEventually), std::future_status::ready);
  cancel.Cancel();
  ASSERT_EQ(watch.wait_for(kEventually), std::future_status::ready) << "watch did not end after Cancel()";
  Error e = watch.get();
  EXPECT_TRUE(IsCancelled(e)) << e.ToString();
  server.Stop();
  EXPECT_TRUE(peer_closed.load()) << "the connection was not closed";
}

TEST(WatchTest, HandlerReturningFalseEndsTheWatch) {
  FakeApiServer server([&](const FakeRequest&, FakeConn& c) {
    c.StartChunked();
    c.Chunk(EventLine("ADDED", Cm("a", "1")) + EventLine("ADDED", Cm("b", "2")));
    c.WaitPeerClosed(kEventually);
  });
  auto client = MakeClient(server.url());
  int n = 0;
  Error e = client->Watch(resources::ConfigMaps(), "d", "", WatchOptions{}, [&](const WatchEvent&) {
    ++n;
    return false;
  });
  EXPECT_TRUE(e.ok()) << e.ToString();
  EXPECT_EQ(n, 1);
}

TEST(WatchTest, GoneAsHttpStatusAndAsErrorEvent) {
  FakeApiServer server([&](const FakeRequest& r, FakeConn& c) {
    if (r.Param("resourceVersion") == "1") {
      return c.Respond(410, StatusJson(410, "Expired", "too old resource version: 1 (40)"));
    }
    c.StartChunked();
    c.Chunk(EventLine("ERROR", json::parse(StatusJson(410, "Expired", "too old resource version: 2 (40)"))));
    c.EndChunked();
  });
  auto client = MakeClient(server.url());
  Error http_gone = client->Watch(resources::ConfigMaps(), "d", "1", WatchOptions{}, [](const WatchEvent&) { return true; });
  EXPECT_TRUE(IsGone(http_gone)) << http_gone.ToString();
  std::vector<WatchEvent::Type> types;
  Error event_gone = client->Watch(resources::ConfigMaps(), "d", "2", WatchOptions{}, [&](const WatchEvent& ev) {
    types.push_back(ev.type);
    return true;
  });
  EXPECT_TRUE(IsGone(event_gone)) << event_gone.ToString();
  EXPECT_EQ(types, std::vector<WatchEvent::Type>{WatchEvent::Type::kError});
}

TEST(WatchTest, GarbageLineIsAnInvalidResponse) {
  FakeApiServer server([&](const FakeRequest&, FakeConn& c) {
    c.StartChunked();
    c.Chunk("this is not json\n");
    c.EndChunked();
  });
  auto client = MakeClient(server.url());
  Error e = client->Watch(resources::ConfigMaps(), "d", "", WatchOptions{}, [](const WatchEvent&) { return true; });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidResponse) << e.ToString();
}

// A scripted history: list at rv 10 {a, b}; the first watch (from 10) modifies a, bookmarks 15,
// then the stream ends; the second watch must resume from 15 and gets ERROR 410; the relist at
// rv 30 shows {a (rv 12), c}: b was deleted and c added while we were not watching.
TEST(InformerTest, ResumesFromLastVersionAndRelistsOnGoneWithSyntheticEvents) {
  std::mutex mu;
  std::vector<std::string> watch_rvs;
  std::atomic<int> lists{0};
  FakeApiServer server([&](const FakeRequest& r, FakeConn& c) {
    if (r.Param("watch").empty()) {
      json list = {{"kind", "ConfigMapList"}, {"apiVersion", "v1"}};
      if (lists++ == 0) {
        list["items"] = {Cm("a", "1"), Cm("b", "2")};
        list["metadata"] = {{"resourceVersion", "10"}};
      } else {
        list["items"] = {Cm("a", "12"), Cm("c", "25")};
        list["metadata"] = {{"resourceVersion", "30"}};
      }
      return c.Respond(200, list.dump());
    }
    std::string rv = r.Param("resourceVersion");
    {
      std::lock_guard<std::mutex> lock(mu);
      watch_rvs.push_back(rv);
    }
    c.StartChunked();
    if (rv == "10") {
      c.Chunk(EventLine("MODIFIED", Cm("a", "12")));
      c.Chunk(EventLine("BOOKMARK", {{"kind", "ConfigMap"}, {"metadata", {{"resourceVersion", "15"}}}}));
      c.EndChunked();
    } else if (rv == "15") {
      c.Chunk(EventLine("ERROR", json::parse(StatusJson(410, "Expired", "too old"))));
      c.EndChunked();
    } else {
      c.WaitPeerClosed(kEventually);  // from 30 on: quiet until the informer stops
    }
  });
  auto client = MakeClient(server.url());
  InformerOptions io;
  io.initial_backoff = 10ms;
  Informer informer(client.get(), resources::ConfigMaps(), "d", io);
  std::vector<std::string> log;
  std::condition_variable cv;
  informer.AddEventHandlers({
      [&](const json& o) { std::lock_guard<std::mutex> l(mu); log.push_back("add " + ObjectKey(o)); cv.notify_all(); },
      [&](const json& a, const json& b) {
        std::lock_guard<std::mutex> l(mu);
        log.push_back("update " + ObjectKey(b) + " " + ResourceVersionOf(a) + "->" + ResourceVersionOf(b));
        cv.notify_all();
      },
      [&](const json& o) { std::lock_guard<std::mutex> l(mu); log.push_back("delete " + ObjectKey(o)); cv.notify_all(); },
  });
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(kEventually));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kEventually, [&] { return log.size() >= 5; })) << ::testing::PrintToString(log);
  }
  // Wait until the informer is watching from the relist's version.
  auto deadline = std::chrono::steady_clock::now() + kEventually;
  while (informer.LastResourceVersion() != "30" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  informer.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(log, (std::vector<std::string>{"add d/a", "add d/b", "update d/a 1->12", "delete d/b", "add d/c"}));
  ASSERT_GE(watch_rvs.size(), 2u);
  EXPECT_EQ(watch_rvs[0], "10");
  EXPECT_EQ(watch_rvs[1], "15");  // resumed from the bookmark, not from the list
  EXPECT_EQ(informer.NumLists(), 2);
  EXPECT_EQ(informer.store().Keys(), (std::vector<std::string>{"d/a", "d/c"}));
  EXPECT_EQ(ResourceVersionOf(*informer.store().Get("d/a")), "12");
}

TEST(InformerTest, ResyncHandsEveryCachedObjectToOnUpdate) {
  FakeApiServer server([&](const FakeRequest& r, FakeConn& c) {
    if (r.Param("watch").empty()) {
      json list = {{"kind", "ConfigMapList"}, {"apiVersion", "v1"}, {"metadata", {{"resourceVersion", "5"}}},
                   {"items", {Cm("a", "1"), Cm("b", "2")}}};
      return c.Respond(200, list.dump());
    }
    c.StartChunked();
    c.WaitPeerClosed(kEventually);
  });
  auto client = MakeClient(server.url());
  InformerOptions io;
  io.resync_period = 20ms;
  Informer informer(client.get(), resources::ConfigMaps(), "d", io);
  std::mutex mu;
  std::map<std::string, int> resynced;
  informer.AddEventHandlers({nullptr,
                             [&](const json& a, const json& b) {
                               std::lock_guard<std::mutex> l(mu);
                               if (a == b) ++resynced[ObjectKey(b)];
                             },
                             nullptr});
  informer.Start();
  auto deadline = std::chrono::steady_clock::now() + kEventually;
  bool both = false;
  while (!both && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    std::lock_guard<std::mutex> l(mu);
    both = resynced["d/a"] >= 2 && resynced["d/b"] >= 2;
  }
  informer.Stop();
  EXPECT_TRUE(both);
}

TEST(InformerTest, StopIsPromptWhileTheServerIsDown) {
  int port;
  {
    FakeApiServer closed([](const FakeRequest&, FakeConn&) {});
    port = closed.port();
  }
  ClientOptions o;
  o.max_retries = 0;
  auto client = MakeClient("http://127.0.0.1:" + std::to_string(port), o);
  InformerOptions io;
  io.initial_backoff = 50ms;
  auto informer = std::make_unique<Informer>(client.get(), resources::ConfigMaps(), "d", io);
  informer->Start();
  EXPECT_FALSE(informer->WaitForSync(200ms));
  EXPECT_THAT(informer->LastError(), HasSubstr("Unavailable"));
  auto stopped = std::async(std::launch::async, [&] { informer.reset(); });
  EXPECT_EQ(stopped.wait_for(kEventually), std::future_status::ready);
}

}  // namespace
}  // namespace meshwork::k8s
