// The client, watch and informer against the real local control plane (meshwork-controlplane):
// CRUD, optimistic concurrency, watch events, an informer that stays in sync across a SIGKILL
// and restart, and relists after 410 Gone. Skipped, saying why, when the binary is not built.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <thread>

#include "tests/common/free_port.h"
#include "operator/k8s/client.h"
#include "operator/k8s/informer.h"
#include "tests/operator/controlplane_process.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::k8s {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::TempDir;

constexpr auto kEventually = 30s;

using ControlPlane = ::meshwork::testing::ControlPlaneProcess;
using ::meshwork::testing::ControlPlaneBinary;

template <typename F>
bool Eventually(F cond, std::chrono::milliseconds limit = kEventually) {
  return ::meshwork::testing::Eventually(cond, limit);
}

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string missing = ::meshwork::testing::ControlPlaneMissing(); !missing.empty()) {
      GTEST_SKIP() << missing;
    }
  }

  void StartControlPlane(std::vector<std::string> extra = {}) {
    cp_ = std::make_unique<ControlPlane>(dir_.path() + "/cp", std::move(extra));
    std::string err = cp_->Start();
    ASSERT_EQ(err, "");
    client_ = NewClient();
    ASSERT_NE(client_, nullptr);
  }

  std::unique_ptr<Client> NewClient() {
    auto cfg = LoadKubeconfig(cp_->kubeconfig());
    EXPECT_TRUE(cfg.ok()) << cfg.error().ToString();
    if (!cfg.ok()) return nullptr;
    ClientOptions o;
    o.request_timeout = 10s;
    auto c = Client::FromConfig(*cfg, o);
    EXPECT_TRUE(c.ok()) << c.error().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  void EnsureNamespace(const std::string& ns) {
    auto r = client_->Create(resources::Namespaces(), "", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                                           {"metadata", {{"name", ns}}}});
    ASSERT_TRUE(r.ok() || IsAlreadyExists(r.error())) << r.error().ToString();
  }

  static json Cm(const std::string& ns, const std::string& name, const std::string& value) {
    return {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
            {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", "k8s-test"}}}}},
            {"data", {{"v", value}}}};
  }

  TempDir dir_;
  std::unique_ptr<ControlPlane> cp_;
  std::unique_ptr<Client> client_;
};

TEST_F(ControlPlaneTest, ConfigMapCrud) {
  StartControlPlane();
  EnsureNamespace("crud");
  auto created = client_->Create(resources::ConfigMaps(), "crud", Cm("crud", "a", "1"));
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  EXPECT_FALSE(ResourceVersionOf(*created).empty());

  auto again = client_->Create(resources::ConfigMaps(), "crud", Cm("crud", "a", "1"));
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(IsAlreadyExists(again.error())) << again.error().ToString();

  auto got = client_->Get(resources::ConfigMaps(), "crud", "a");
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  EXPECT_EQ((*got)["data"]["v"], "1");

  json upd = *got;
  upd["data"]["v"] = "2";
  auto updated = client_->Update(resources::ConfigMaps(), "crud", upd);
  ASSERT_TRUE(updated.ok()) << updated.error().ToString();
  EXPECT_NE(ResourceVersionOf(*updated), ResourceVersionOf(*got));

  auto patched = client_->MergePatch(resources::ConfigMaps(), "crud", "a", {{"data", {{"w", "3"}}}});
  ASSERT_TRUE(patched.ok()) << patched.error().ToString();
  EXPECT_EQ((*patched)["data"]["v"], "2");
  EXPECT_EQ((*patched)["data"]["w"], "3");

  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "crud", Cm("crud", "b", "x")).ok());
  json other = Cm("crud", "c", "y");
  other["metadata"]["labels"]["app"] = "other";
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "crud", other).ok());
  ListOptions lo;
  lo.label_selector = "app=k8s-test";
  lo.limit = 1;  // two pages
  auto list = client_->List(resources::ConfigMaps(), "crud", lo);
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  std::vector<std::string> names;
  for (const auto& item : (*list)["items"]) names.push_back(item["metadata"]["name"]);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("a", "b"));

  auto deleted = client_->Delete(resources::ConfigMaps(), "crud", "a");
  ASSERT_TRUE(deleted.ok()) << deleted.error().ToString();
  auto gone = client_->Get(resources::ConfigMaps(), "crud", "a");
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(IsNotFound(gone.error())) << gone.error().ToString();
  auto delete_again = client_->Delete(resources::ConfigMaps(), "crud", "a");
  ASSERT_FALSE(delete_again.ok());
  EXPECT_TRUE(IsNotFound(delete_again.error()));
}

TEST_F(ControlPlaneTest, StaleResourceVersionIsAConflict) {
  StartControlPlane();
  EnsureNamespace("occ");
  auto v1 = client_->Create(resources::ConfigMaps(), "occ", Cm("occ", "a", "1"));
  ASSERT_TRUE(v1.ok()) << v1.error().ToString();
  json first = *v1;
  first["data"]["v"] = "2";
  ASSERT_TRUE(client_->Update(resources::ConfigMaps(), "occ", first).ok());
  json stale = *v1;  // still carries the first resourceVersion
  stale["data"]["v"] = "3";
  auto r = client_->Update(resources::ConfigMaps(), "occ", stale);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsConflict(r.error())) << r.error().ToString();
  EXPECT_EQ(r.error().http_code(), 409);

  DeleteOptions pre;
  pre.precondition_resource_version = ResourceVersionOf(*v1);
  auto d = client_->Delete(resources::ConfigMaps(), "occ", "a", pre);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(IsConflict(d.error())) << d.error().ToString();
}

TEST_F(ControlPlaneTest, WatchSeesCreateUpdateDelete) {
  StartControlPlane();
  EnsureNamespace("w");
  auto list = client_->List(resources::ConfigMaps(), "w");
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  std::string rv = (*list)["metadata"]["resourceVersion"];

  std::mutex mu;
  std::vector<std::string> seen;
  CancelToken cancel;
  auto watch = std::async(std::launch::async, [&] {
    WatchOptions o;
    o.timeout_seconds = 60;
    return client_->Watch(resources::ConfigMaps(), "w", rv, o, [&](const WatchEvent& ev) {
      if (ev.type == WatchEvent::Type::kBookmark) return true;
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(std::string(WatchEventTypeName(ev.type)) + " " + ev.object["metadata"].value("name", "") +
                     " " + ev.object["data"].value("v", ""));
      return true;
    }, cancel);
  });
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "w", Cm("w", "a", "1")).ok());
  ASSERT_TRUE(client_->MergePatch(resources::ConfigMaps(), "w", "a", {{"data", {{"v", "2"}}}}).ok());
  ASSERT_TRUE(client_->Delete(resources::ConfigMaps(), "w", "a").ok());
  bool all = Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return seen.size() >= 3;
  });
  cancel.Cancel();
  ASSERT_EQ(watch.wait_for(kEventually), std::future_status::ready);
  EXPECT_TRUE(IsCancelled(watch.get()));
  ASSERT_TRUE(all);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED a 1", "MODIFIED a 2", "DELETED a 2"}));
}

TEST_F(ControlPlaneTest, WatchFromACompactedVersionIsGone) {
  StartControlPlane({"--history-events", "3"});
  EnsureNamespace("g");
  auto list = client_->List(resources::ConfigMaps(), "g");
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  std::string old_rv = (*list)["metadata"]["resourceVersion"];
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "g", Cm("g", "c" + std::to_string(i), "x")).ok());
  }
  WatchOptions o;
  o.timeout_seconds = 5;
  Error e = client_->Watch(resources::ConfigMaps(), "g", old_rv, o, [](const WatchEvent&) { return true; });
  EXPECT_TRUE(IsGone(e)) << e.ToString();
}

TEST_F(ControlPlaneTest, WrongTokenIsUnauthorized) {
  StartControlPlane();
  auto cfg = LoadKubeconfig(cp_->kubeconfig());
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  cfg->token = "not-the-token";
  auto bad = Client::FromConfig(*cfg);
  ASSERT_TRUE(bad.ok()) << bad.error().ToString();
  auto r = (*bad)->List(resources::ConfigMaps(), "default");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsUnauthorized(r.error())) << r.error().ToString();
}

// A custom resource by group/version/plural: create, status subresource, and a 422 whose causes
// name the bad field.
TEST_F(ControlPlaneTest, CustomResourceStatusAndInvalidCauses) {
  StartControlPlane();
  EnsureNamespace("cr");
  json crd = json::parse(R"({
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.meshwork.dev"},
    "spec": {"group": "test.meshwork.dev", "scope": "Namespaced",
      "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
      "versions": [{"name": "v1", "served": true, "storage": true,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
          "spec": {"type": "object", "required": ["size"],
                   "properties": {"size": {"type": "integer", "minimum": 1}}},
          "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}})");
  auto made = client_->Create(resources::CustomResourceDefinitions(), "", crd);
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  ResourceRef widgets = resources::Custom("test.meshwork.dev", "v1", "widgets");
  json w = {{"apiVersion", "test.meshwork.dev/v1"}, {"kind", "Widget"},
            {"metadata", {{"name", "w1"}, {"namespace", "cr"}}}, {"spec", {{"size", 2}}}};
  Result<json> created = Error(ErrorKind::kNotFound, "not tried");
  // The CRD may take a moment to be served.
  ASSERT_TRUE(Eventually([&] {
    created = client_->Create(widgets, "cr", w);
    return created.ok() || !IsNotFound(created.error());
  }, 10s));
  ASSERT_TRUE(created.ok()) << created.error().ToString();

  json with_status = *created;
  with_status["status"] = {{"phase", "Running"}};
  with_status["spec"]["size"] = 5;  // ignored by the status subresource
  auto st = client_->UpdateStatus(widgets, "cr", with_status);
  ASSERT_TRUE(st.ok()) << st.error().ToString();
  auto got = client_->Get(widgets, "cr", "w1");
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  EXPECT_EQ((*got)["status"]["phase"], "Running");
  EXPECT_EQ((*got)["spec"]["size"], 2);

  json bad = w;
  bad["metadata"]["name"] = "w2";
  bad["spec"]["size"] = 0;
  auto invalid = client_->Create(widgets, "cr", bad);
  ASSERT_FALSE(invalid.ok());
  ASSERT_TRUE(IsInvalid(invalid.error())) << invalid.error().ToString();
  ASSERT_FALSE(invalid.error().causes().empty());
  EXPECT_EQ(invalid.error().causes()[0].field, "spec.size");
}

struct Recorder {
  std::mutex mu;
  std::vector<std::string> log;
  EventHandlers Handlers() {
    return {[this](const json& o) { Add("add " + o["metadata"].value("name", "")); },
            [this](const json& a, const json& b) {
              if (ResourceVersionOf(a) != ResourceVersionOf(b)) Add("update " + b["metadata"].value("name", ""));
            },
            [this](const json& o) { Add("delete " + o["metadata"].value("name", "")); }};
  }
  void Add(std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(std::move(s));
  }
  bool Has(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(log.begin(), log.end(), s) != log.end();
  }
};

std::map<std::string, std::string> CacheValues(const Informer& inf) {
  std::map<std::string, std::string> out;
  for (const auto& o : inf.store().List()) out[ObjectKey(o)] = o["data"].value("v", "");
  return out;
}

TEST_F(ControlPlaneTest, InformerStaysInSyncAcrossAControlPlaneKillAndRestart) {
  StartControlPlane();
  EnsureNamespace("r");
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "r", Cm("r", "a", "1")).ok());
  InformerOptions io;
  io.initial_backoff = 100ms;
  io.max_backoff = 500ms;
  Informer informer(client_.get(), resources::ConfigMaps(), "r", io);
  Recorder rec;
  informer.AddEventHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(kEventually));
  ASSERT_TRUE(rec.Has("add a"));

  cp_->Kill(SIGKILL);
  ASSERT_EQ(cp_->Start(), "");  // same data dir and port
  auto writer = NewClient();
  ASSERT_NE(writer, nullptr);
  auto a = writer->Get(resources::ConfigMaps(), "r", "a");
  ASSERT_TRUE(a.ok()) << "acknowledged write lost across SIGKILL: " << a.error().ToString();
  ASSERT_TRUE(writer->Create(resources::ConfigMaps(), "r", Cm("r", "b", "1")).ok());
  ASSERT_TRUE(writer->MergePatch(resources::ConfigMaps(), "r", "a", {{"data", {{"v", "2"}}}}).ok());

  bool synced = Eventually([&] {
    return CacheValues(informer) == std::map<std::string, std::string>{{"r/a", "2"}, {"r/b", "1"}};
  });
  informer.Stop();
  EXPECT_TRUE(synced) << "cache: " << ::testing::PrintToString(CacheValues(informer))
                      << "; last error: " << informer.LastError();
  EXPECT_TRUE(rec.Has("add b"));
  EXPECT_TRUE(rec.Has("update a"));
}

// While the informer is cut off (the control plane killed, its retry backing off), the
// restarted control plane takes more writes than its history keeps: the informer's watch gets
// 410, it relists, and handlers hear the missed delete and add as synthetic events.
TEST_F(ControlPlaneTest, InformerRelistsAfterGoneAndSynthesizesMissedEvents) {
  StartControlPlane({"--history-events", "3"});
  EnsureNamespace("rl");
  EnsureNamespace("noise");
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "rl", Cm("rl", "old", "1")).ok());
  InformerOptions io;
  io.initial_backoff = 6s;  // long enough to restart and write before the informer retries
  io.max_backoff = 6s;
  Informer informer(client_.get(), resources::ConfigMaps(), "rl", io);
  Recorder rec;
  informer.AddEventHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(kEventually));
  // An event through the watch proves the stream is established before the kill (a watch
  // request still on its way could otherwise reach the restarted control plane before the writes).
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "rl", Cm("rl", "probe", "1")).ok());
  ASSERT_TRUE(Eventually([&] { return rec.Has("add probe"); }));

  cp_->Kill(SIGKILL);
  auto cut_off = std::chrono::steady_clock::now();
  ASSERT_EQ(cp_->Start(), "");
  auto writer = NewClient();
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Delete(resources::ConfigMaps(), "rl", "old").ok());
  ASSERT_TRUE(writer->Create(resources::ConfigMaps(), "rl", Cm("rl", "new", "1")).ok());
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(writer->Create(resources::ConfigMaps(), "noise", Cm("noise", "n" + std::to_string(i), "x")).ok());
  }
  auto writes_done = std::chrono::steady_clock::now() - cut_off;

  bool synced = Eventually([&] {
    return CacheValues(informer) == std::map<std::string, std::string>{{"rl/new", "1"}, {"rl/probe", "1"}};
  });
  informer.Stop();
  EXPECT_TRUE(synced) << "cache: " << ::testing::PrintToString(CacheValues(informer))
                      << "; last error: " << informer.LastError();
  EXPECT_TRUE(rec.Has("delete old"));
  EXPECT_TRUE(rec.Has("add new"));
  EXPECT_GE(informer.NumLists(), 2)
      << "no relist; the restart and writes took "
      << std::chrono::duration_cast<std::chrono::milliseconds>(writes_done).count()
      << " ms, so the informer may have reconnected before they were done";
}

}  // namespace
}  // namespace meshwork::k8s
