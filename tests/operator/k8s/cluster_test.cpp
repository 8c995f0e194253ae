// The client, watch and informer against a real kube-apiserver (meshwork-cluster without nodes,
// shared by the tests of this binary: tests/operator/local_cluster.h): CRUD, optimistic
// concurrency, watch events, 410 Gone, client-certificate authentication, a custom resource's
// status subresource and schema errors, the node agent's uid-guarded Pod status patch, an informer that stays in sync across a SIGKILL and
// restart of kube-apiserver, and one that relists after 410 Gone. Skipped, saying why, when the
// binaries are not built.
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

#include "controlplane/agent/pod_status_patch.h"
#include "tests/common/free_port.h"
#include "operator/k8s/client.h"
#include "operator/k8s/informer.h"
#include "tests/operator/local_cluster.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::k8s {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::TempDir;

constexpr auto kEventually = 30s;
// The controller manager puts this ConfigMap (the cluster's CA) in every namespace.
constexpr const char* kRootCa = "kube-root-ca.crt";

template <typename F>
bool Eventually(F cond, std::chrono::milliseconds limit = kEventually) {
  return ::meshwork::testing::Eventually(cond, limit);
}

class ClusterTest : public ::meshwork::testing::LocalClusterTest {
 protected:
  static json Cm(const std::string& ns, const std::string& name, const std::string& value) {
    return {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
            {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", "k8s-test"}}}}},
            {"data", {{"v", value}}}};
  }

};

TEST_F(ClusterTest, ConfigMapCrud) {
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

TEST_F(ClusterTest, StaleResourceVersionIsAConflict) {
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

// The node agent's Pod status patch (controlplane/agent/pod_status_patch.h) names the Pod's uid: a
// status of a Pod that was deleted and made again under its name (a gang restart reuses its ranks'
// names) is refused and leaves the new Pod alone: by name alone, an old rank's exit would land on
// the new rank, and the operator would restart the gang again.
TEST_F(ClusterTest, PodStatusPatchOfARecreatedPodIsRefused) {
  using controlplane::agent::PodStatusPatch;
  using controlplane::agent::RecreatedUnderSameName;
  EnsureNamespace("podstatus");
  const json pod = {{"apiVersion", "v1"},
                    {"kind", "Pod"},
                    {"metadata", {{"name", "rank-0"}, {"namespace", "podstatus"}}},
                    {"spec", {{"containers", json::array({{{"name", "trainer"}, {"image", "busybox"}}})}}}};
  // Until the controller manager has made the namespace's default ServiceAccount, and until the
  // old Pod is gone, the create is refused.
  auto create = [&]() -> std::string {
    std::string uid;
    Eventually([&] {
      auto made = client_->Create(resources::Pods(), "podstatus", pod);
      if (made.ok()) uid = (*made)["metadata"].value("uid", "");
      return made.ok();
    });
    return uid;
  };
  const std::string old_uid = create();
  ASSERT_FALSE(old_uid.empty());
  const json exited = {{"phase", "Failed"}, {"message", "exited with code 9"}};
  auto own = client_->MergePatch(resources::Pods(), "podstatus", "rank-0", PodStatusPatch(old_uid, exited), "status");
  ASSERT_TRUE(own.ok()) << own.error().ToString();
  EXPECT_EQ((*own)["status"].value("phase", ""), "Failed");

  DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client_->Delete(resources::Pods(), "podstatus", "rank-0", now).ok());
  const std::string new_uid = create();
  ASSERT_FALSE(new_uid.empty());
  ASSERT_NE(new_uid, old_uid);

  auto stale = client_->MergePatch(resources::Pods(), "podstatus", "rank-0", PodStatusPatch(old_uid, exited), "status");
  ASSERT_FALSE(stale.ok()) << "the old Pod's status was written on the new Pod: " << (*stale)["status"].dump();
  EXPECT_TRUE(RecreatedUnderSameName(stale.error())) << stale.error().ToString();
  auto current = client_->Get(resources::Pods(), "podstatus", "rank-0");
  ASSERT_TRUE(current.ok()) << current.error().ToString();
  EXPECT_EQ((*current)["metadata"].value("uid", ""), new_uid);
  EXPECT_NE((*current)["status"].value("phase", ""), "Failed");

  // Other refusals are not taken for it: a Pod that is not there at all, a bad status.
  auto missing = client_->MergePatch(resources::Pods(), "podstatus", "rank-9", PodStatusPatch(old_uid, exited), "status");
  ASSERT_FALSE(missing.ok());
  EXPECT_FALSE(RecreatedUnderSameName(missing.error())) << missing.error().ToString();
  auto invalid = client_->MergePatch(resources::Pods(), "podstatus", "rank-0",
                                     PodStatusPatch(new_uid, {{"podIP", "not-an-ip"}, {"podIPs", json::array({{{"ip", "not-an-ip"}}})}}), "status");
  ASSERT_FALSE(invalid.ok());
  EXPECT_TRUE(IsInvalid(invalid.error())) << invalid.error().ToString();
  EXPECT_FALSE(RecreatedUnderSameName(invalid.error())) << invalid.error().ToString();
}

TEST_F(ClusterTest, WatchSeesCreateUpdateDelete) {
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
      if (ev.object["metadata"].value("name", "") == kRootCa) return true;
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

// kube-apiserver's watch cache starts at etcd's current revision when it starts, so after a
// restart a watch from an older resourceVersion is 410 Gone (as after a compaction).
TEST_F(ClusterTest, WatchFromAVersionOlderThanTheServersWindowIsGone) {
  EnsureNamespace("g");
  auto list = client_->List(resources::ConfigMaps(), "g");
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  std::string old_rv = (*list)["metadata"]["resourceVersion"];
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "g", Cm("g", "c" + std::to_string(i), "x")).ok());
  }
  ASSERT_EQ(cluster_->KillApiServer(), "");
  WatchOptions o;
  o.timeout_seconds = 5;
  Error e = client_->Watch(resources::ConfigMaps(), "g", old_rv, o, [](const WatchEvent&) { return true; });
  EXPECT_TRUE(IsGone(e)) << e.ToString();
}

TEST_F(ClusterTest, WrongTokenIsUnauthorized) {
  auto cfg = LoadKubeconfig(cluster_->kubeconfig());
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  cfg->client_cert_pem.clear();  // the admin's certificate would authenticate it
  cfg->client_key_pem.clear();
  cfg->token = "not-the-token";
  auto bad = Client::FromConfig(*cfg);
  ASSERT_TRUE(bad.ok()) << bad.error().ToString();
  auto r = (*bad)->List(resources::ConfigMaps(), "default");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsUnauthorized(r.error())) << r.error().ToString();
}

// A custom resource by group/version/plural: create, status subresource, and a 422 whose causes
// name the bad field.
TEST_F(ClusterTest, CustomResourceStatusAndInvalidCauses) {
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
  // The CRD may take a moment to be served: 404, or 503 "the request has been made before all
  // known HTTP paths have been installed" (seen on a loaded machine).
  ASSERT_TRUE(Eventually([&] {
    created = client_->Create(widgets, "cr", w);
    return created.ok() || !(IsNotFound(created.error()) || created.error().http_code() == 503);
  }, 30s));
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
  for (const auto& o : inf.store().List()) {
    if (o["metadata"].value("name", "") != kRootCa) out[ObjectKey(o)] = o["data"].value("v", "");
  }
  return out;
}

TEST_F(ClusterTest, InformerStaysInSyncAcrossAnApiServerKillAndRestart) {
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

  ASSERT_EQ(cluster_->KillApiServer(), "");  // the supervisor restarts it on the same port
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

// The server records managedFields on every write; the informer's cache drops them (they are
// often half of a small object's bytes), and an Update of a cached object keeps the server's.
TEST_F(ClusterTest, InformerCacheDropsManagedFieldsAndUpdatesKeepThem) {
  EnsureNamespace("mf");
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "mf", Cm("mf", "a", "1")).ok());
  auto got = client_->Get(resources::ConfigMaps(), "mf", "a");
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  ASSERT_TRUE((*got)["metadata"].contains("managedFields")) << got->dump();
  Informer informer(client_.get(), resources::ConfigMaps(), "mf");
  Recorder rec;
  informer.AddEventHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(kEventually));
  auto cached = informer.store().Get("mf/a");
  ASSERT_TRUE(cached.has_value());
  EXPECT_FALSE((*cached)["metadata"].contains("managedFields")) << cached->dump();
  json upd = *cached;
  upd["data"]["v"] = "2";
  ASSERT_TRUE(client_->Update(resources::ConfigMaps(), "mf", upd).ok());
  ASSERT_TRUE(Eventually([&] { return CacheValues(informer)["mf/a"] == "2"; }));
  EXPECT_FALSE((*informer.store().Get("mf/a"))["metadata"].contains("managedFields"));
  informer.Stop();
  auto after = client_->Get(resources::ConfigMaps(), "mf", "a");
  ASSERT_TRUE(after.ok()) << after.error().ToString();
  EXPECT_FALSE((*after)["metadata"].value("managedFields", json::array()).empty()) << after->dump();
}

// While the informer is cut off (kube-apiserver killed, the informer's retry backing off), the
// restarted API server takes writes. Its watch cache starts at etcd's revision when it starts,
// which a write elsewhere has moved past the informer's last version, so the informer's watch
// gets 410, it relists, and handlers hear the missed delete and add as synthetic events.
TEST_F(ClusterTest, InformerRelistsAfterGoneAndSynthesizesMissedEvents) {
  EnsureNamespace("rl");
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "rl", Cm("rl", "old", "1")).ok());
  InformerOptions io;
  io.initial_backoff = 30s;  // long enough to restart kube-apiserver and write before it retries
  io.max_backoff = 30s;
  Informer informer(client_.get(), resources::ConfigMaps(), "rl", io);
  Recorder rec;
  informer.AddEventHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(kEventually));
  // An event through the watch proves the stream is established before the kill (a watch
  // request still on its way could otherwise reach the restarted control plane before the writes).
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "rl", Cm("rl", "probe", "1")).ok());
  ASSERT_TRUE(Eventually([&] { return rec.Has("add probe"); }));
  EnsureNamespace("rl-elsewhere");
  ASSERT_TRUE(client_->Create(resources::ConfigMaps(), "rl-elsewhere", Cm("rl-elsewhere", "x", "1")).ok());

  auto cut_off = std::chrono::steady_clock::now();
  ASSERT_EQ(cluster_->KillApiServer(), "");
  auto writer = NewClient();
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Delete(resources::ConfigMaps(), "rl", "old").ok());
  ASSERT_TRUE(writer->Create(resources::ConfigMaps(), "rl", Cm("rl", "new", "1")).ok());
  auto writes_done = std::chrono::steady_clock::now() - cut_off;

  bool synced = Eventually([&] {
    return CacheValues(informer) == std::map<std::string, std::string>{{"rl/new", "1"}, {"rl/probe", "1"}};
  }, 75s);
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
