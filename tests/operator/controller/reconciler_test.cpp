// The Reconciler on plain objects: caches filled by hand and an in-memory API
// (tests/operator/k8s/fake_object_api.h). It checks what decide_test cannot: the calls each
// reconcile makes and their order (observe, decide once, creates and deletes, one status write,
// then the Events), the expectations, and the reads made only when a decision needs them.
#include "operator/controller/reconciler.h"

#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/controller/desired.h"
#include "operator/controller/kueue.h"
#include "operator/controller/training_runtime.h"
#include "tests/operator/controller/builders.h"
#include "tests/operator/k8s/fake_object_api.h"

namespace meshwork::op {
namespace {

using namespace meshwork::op::testing;
using std::chrono::seconds;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const k8s::ResourceRef kJobs = k8s::resources::Custom(kGroup, kVersion, kPlural);
const std::string kKey = "ml/tiny";

class ReconcilerTest : public ::testing::Test {
 protected:
  ReconcilerTest() {
    ReconcilerOptions options;
    options.expectation_timeout = std::chrono::milliseconds(30000);
    ReconcilerHooks hooks;
    hooks.record_event = [this](const json& job, const EventToRecord& ev) {
      events_.push_back(ev.reason);
      EXPECT_EQ(job["metadata"]["name"], "tiny");
    };
    hooks.log = [this](const std::string& line) { log_.push_back(line); };
    reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, options, hooks);
  }

  // The job as the API server and the cache both have it, as a new version.
  void SetJob(json job) {
    job["metadata"]["resourceVersion"] = std::to_string(++version_);
    api_.Add(kJobs, job);
    jobs_.Upsert(kKey, job);
  }
  // Kueue admits `workload` with one pod set assignment (JSON); the job is reconciled again by a
  // fresh reconciler (no memory of the last look at the Workload).
  ReconcileOutcome ReconcileAdmitted(const json& job, json workload, const std::string& assignment) {
    workload["status"] = {{"admission", {{"clusterQueue", "cq"}, {"podSetAssignments", {json::parse(assignment)}}}},
                          {"conditions", json::parse(R"([{"type": "QuotaReserved", "status": "True"},
                                                         {"type": "Admitted", "status": "True"}])")}};
    api_.Add(k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads"), workload);
    SetJob(job);
    reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                               ReconcilerHooks{});
    return reconciler_->Reconcile(kKey);
  }
  // What the watch brings after our write: the cache catches up with the API server.
  void SyncJob() { jobs_.Upsert(kKey, *api_.Find(kJobs, "ml", "tiny")); }
  void SetPods(const std::vector<json>& pods) {
    for (const auto& key : index_.Get(kKey)) {
      pods_.Remove(key);
      index_.Remove(kKey, key);
    }
    for (const auto& pod : pods) {
      const std::string key = k8s::ObjectKey(pod);
      pods_.Upsert(key, pod);
      index_.Set(kKey, key);
      api_.Add(k8s::resources::Pods(), pod);
    }
  }
  // The Pods the API server has now, into the cache.
  void SyncPods() {
    std::vector<json> pods;
    for (int i = 0; i < 4; ++i) {
      if (auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-" + std::to_string(i))) pods.push_back(*pod);
    }
    SetPods(pods);
  }
  json Status() const { return api_.Find(kJobs, "ml", "tiny")->value("status", json::object()); }
  // The calls of a verb ("create pods", "update-status trainingjobs", ...).
  std::vector<std::string> Calls(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& c : api_.calls()) {
      if (c.rfind(prefix, 0) == 0) out.push_back(c);
    }
    return out;
  }

  k8s::testing::FakeObjectApi api_;
  k8s::Store jobs_, pods_, services_;
  PodIndex index_;
  std::unique_ptr<Reconciler> reconciler_;
  std::vector<std::string> events_;
  std::vector<std::string> log_;
  int version_ = 100;
};

TEST_F(ReconcilerTest, ANewJobGetsItsChildrenThenOneStatusWriteThenItsEvents) {
  SetJob(Job());
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.phase, "Created");
  EXPECT_THAT(api_.calls(), ElementsAre("create services ml/tiny", "create configmaps ml/tiny-config",
                                        "create secrets ml/tiny-rendezvous", "create pods ml/tiny-0",
                                        "create pods ml/tiny-1", "update-status trainingjobs ml/tiny"));
  const json status = Status();
  EXPECT_EQ(status["phase"], "Created");
  EXPECT_EQ(status["launchedGeneration"], 0);  // every Pod of the gang was created
  EXPECT_EQ(status["activeReplicas"], 2);        // the Pods just created count, as the Job controller's do
  EXPECT_THAT(events_, ElementsAre("Created"));
}

TEST_F(ReconcilerTest, ItWaitsForTheCacheToShowItsOwnWrites) {
  SetJob(Job());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  api_.ClearCalls();

  // The cache still has the object our status write replaced: deciding on it would only conflict.
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.requeue_after, seconds(1));
  // The job is new, the Pods not yet: they would look deleted (client-go's expectations).
  SyncJob();
  out = reconciler_->Reconcile(kKey);
  EXPECT_EQ(out.requeue_after, seconds(1));
  EXPECT_EQ(out.phase, "Created");
  EXPECT_THAT(api_.calls(), IsEmpty());

  SyncPods();
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("create pods"), IsEmpty());  // nothing created twice
  // The Pods in the cache, behind the operator's own gate, change nothing the status says.
  EXPECT_THAT(Calls("update-status"), IsEmpty());
}

TEST_F(ReconcilerTest, AFailedRankRestartsTheGangWritingTheStatusFirst) {
  SetJob(Job({}, {{"launchedGeneration", 0}, {"restartGeneration", 0}, {"phase", "Running"}}));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Failed", 137)});
  api_.ClearCalls();
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.phase, "Restarting");
  EXPECT_THAT(api_.calls(), ElementsAre("update-status trainingjobs ml/tiny", "delete pods ml/tiny-0",
                                        "delete pods ml/tiny-1"));
  EXPECT_EQ(Status()["restartGeneration"], 1);
  EXPECT_EQ(Status()["restarts"], 1);
  EXPECT_THAT(events_, Contains("GangRestart"));
}

// A status write the API server found unchanged keeps the resourceVersion: there is no newer
// version for the cache to show, and waiting for one would stop the job's reconciles for good.
TEST_F(ReconcilerTest, AStatusWriteTheServerKeptUnchangedDoesNotStopTheReconciles) {
  SetJob(Job({}, {{"launchedGeneration", 0}, {"restartGeneration", 0}, {"phase", "Running"}}));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Failed", 137)});
  api_.StatusWritesKeepTheVersion();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);  // the restart: status first, then the deletes
  SyncJob();
  SyncPods();
  api_.ClearCalls();
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("create pods"), ElementsAre("create pods ml/tiny-0", "create pods ml/tiny-1"));
}

TEST_F(ReconcilerTest, AFailedStatusWriteStopsTheReconcileBeforeAnyDelete) {
  SetJob(Job({}, {{"launchedGeneration", 0}, {"restartGeneration", 0}}));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Failed", 137)});
  api_.FailNext("update-status", "trainingjobs", k8s::Error(k8s::ErrorKind::kConflict, "modified"));
  api_.ClearCalls();
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.error_reason, "conflict");
  EXPECT_THAT(out.message, HasSubstr("writing the status of ml/tiny"));
  EXPECT_THAT(Calls("delete"), IsEmpty());
  EXPECT_THAT(events_, IsEmpty());  // Events only after the status is written
}

// A transition's Events go out once its status is written, whatever fails after: the next
// reconcile finds the transition made and has no Events of its own to give.
TEST_F(ReconcilerTest, ARestartsEventsGoOutEvenWhenItsPodDeletesFail) {
  SetJob(Job({}, {{"launchedGeneration", 0}, {"restartGeneration", 0}, {"phase", "Running"}}));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Failed", 137)});
  api_.FailNext("delete", "pods", k8s::Error(k8s::ErrorKind::kServerError, "boom"));
  api_.ClearCalls();
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("deleting Pod tiny-0"));
  EXPECT_EQ(Status()["restartGeneration"], 1);
  EXPECT_THAT(events_, Contains("GangRestart"));
  EXPECT_THAT(events_, Contains("ReconcileError"));  // and why the reconcile stopped

  // The retry deletes the old gang and says nothing twice.
  SyncJob();
  events_.clear();
  const ReconcileOutcome again = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(again.ok) << again.message;
  EXPECT_THAT(events_, Not(Contains("GangRestart")));
}

TEST_F(ReconcilerTest, TheTrainerConfigIsCheckedOnlyWhenAGangIsAboutToStart) {
  const json spec = {{"config", {{"inline", nullptr}, {"configMapRef", {{"name", "cfg"}}}}}};
  // A running gang: its ConfigMap is not read, even gone.
  SetJob(Job(spec, {{"launchedGeneration", 0}, {"restartGeneration", 0}}));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  api_.ClearCalls();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  EXPECT_THAT(Calls("get configmaps"), IsEmpty());

  // A new gang waits for its ConfigMap: no Pods, a Warning, a look again in 10 s.
  SetJob(Job(spec));
  SetPods({});
  api_.ClearCalls();
  events_.clear();
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("get configmaps"), ElementsAre("get configmaps ml/cfg"));  // once
  EXPECT_THAT(Calls("create pods"), IsEmpty());
  EXPECT_EQ(out.requeue_after, seconds(10));
  EXPECT_THAT(events_, ElementsAre("Created", "ConfigMapNotReady"));
  EXPECT_THAT(log_, Contains(HasSubstr("waiting for ConfigMap ml/cfg (spec.config.configMapRef.name)")));
}

TEST_F(ReconcilerTest, AJobWaitsForItsRuntimeThenRunsWithItMergedUnderItsSpec) {
  const k8s::ResourceRef runtimes = Runtimes();
  // The job says only its size and steps; the image, device and model are the runtime's.
  SetJob(Job({{"image", nullptr},
              {"device", nullptr},
              {"runtimeRef", {{"name", "cpu-pool"}}},
              {"config", {{"inline", "schedule: {steps: 7}\n"}}}}));
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.requeue_after, seconds(10));
  EXPECT_THAT(Calls("create"), IsEmpty());
  EXPECT_THAT(events_, ElementsAre("Created", "RuntimeNotFound"));
  json status = Status();
  EXPECT_EQ(status["phase"], "Created");
  EXPECT_THAT(status["conditions"].dump(), HasSubstr("waiting for TrainingRuntime cpu-pool (spec.runtimeRef.name)"));

  api_.Add(runtimes, {{"metadata", {{"name", "cpu-pool"}}},
                      {"spec",
                       {{"image", "registry/trainer:9"},
                        {"device", "cpu"},
                        {"template", {{"metadata", {{"labels", {{"team", "platform"}}}}}}},
                        {"config", {{"inline", "model: {preset: tiny}\nschedule: {steps: 100}\n"}}}}}});
  SyncJob();
  api_.ClearCalls();
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("get trainingruntimes"), ElementsAre("get trainingruntimes /cpu-pool"));
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-0");
  ASSERT_TRUE(pod.has_value());
  EXPECT_EQ((*pod)["spec"]["containers"][0]["image"], "registry/trainer:9");
  EXPECT_EQ((*pod)["metadata"]["labels"]["team"], "platform");
  EXPECT_THAT((*pod)["spec"]["containers"][0]["command"].dump(), HasSubstr("training.device=cpu"));
  const auto cm = api_.Find(k8s::resources::ConfigMaps(), "ml", "tiny-config");
  ASSERT_TRUE(cm.has_value());
  const std::string config = (*cm)["data"]["config.yaml"];
  EXPECT_THAT(config, HasSubstr("preset: tiny"));
  EXPECT_THAT(config, HasSubstr("steps: 7"));

}

TEST_F(ReconcilerTest, WithGangAdmissionPodGroupThePodsNameTheJobsPodGroup) {
  const k8s::ResourceRef pod_groups = k8s::resources::Custom("scheduling.k8s.io", "v1beta1", "podgroups");
  const json spec = {{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "PodGroup"}}}}}};
  SetJob(Job(spec));
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(api_.calls(), ElementsAre("create services ml/tiny", "create configmaps ml/tiny-config",
                                        "create podgroups ml/tiny", "create secrets ml/tiny-rendezvous",
                                        "create pods ml/tiny-0", "create pods ml/tiny-1",
                                        "update-status trainingjobs ml/tiny"));
  const auto group = api_.Find(pod_groups, "ml", "tiny");
  ASSERT_TRUE(group.has_value());
  EXPECT_EQ((*group)["apiVersion"], "scheduling.k8s.io/v1beta1");
  EXPECT_EQ((*group)["spec"], json::parse(R"({"schedulingPolicy": {"gang": {"minCount": 2}}})"));
  EXPECT_EQ((*group)["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-1");
  ASSERT_TRUE(pod.has_value());
  EXPECT_EQ((*pod)["spec"]["schedulingGroup"], json({{"podGroupName", "tiny"}}));
  EXPECT_FALSE((*pod)["spec"].contains("schedulingGates"));  // the scheduler gangs them, not the operator

  // A resized gang: the same PodGroup, its minCount the new size.
  api_.Add(pod_groups, *group);
  json resized = Job(spec);
  resized["spec"]["replicas"] = 3;
  SetJob(resized);
  SetPods({});
  api_.ClearCalls();
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("update podgroups"), ElementsAre("update podgroups ml/tiny"));
  EXPECT_EQ((*api_.Find(pod_groups, "ml", "tiny"))["spec"]["schedulingPolicy"]["gang"]["minCount"], 3);

  // One of that name the job does not own is not taken over.
  json foreign = *group;
  foreign["metadata"]["ownerReferences"] = json::array();
  api_.Add(pod_groups, foreign);
  SetJob(Job(spec));
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  std::vector<std::string> recorded;
  ReconcilerHooks hooks;
  hooks.record_event = [&](const json&, const EventToRecord& ev) { recorded.push_back(ev.reason + ": " + ev.message); };
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{}, hooks);
  out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("PodGroup ml/tiny (scheduling.k8s.io/v1beta1) exists and is not owned by this TrainingJob"));
  // ... and the job says so (kubectl describe), not only the operator's log.
  EXPECT_THAT(recorded, Contains(HasSubstr("ReconcileError: writing PodGroup ml/tiny: AlreadyExists")));
}

TEST_F(ReconcilerTest, AGangKueueAdmittedIsPlacedOnItsResourceFlavors) {
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  const k8s::ResourceRef flavors = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "resourceflavors", false);
  api_.Add(flavors, json::parse(R"({"metadata": {"name": "spot", "namespace": ""}, "spec": {
      "nodeLabels": {"cloud.example.com/pool": "spot"},
      "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}})"));
  api_.Add(flavors, json::parse(R"({"metadata": {"name": "big-memory", "namespace": ""}, "spec": {
      "nodeLabels": {"memory-class": "large"}}})"));
  api_.Add(workloads, json::parse(R"({"metadata": {"name": "trainingjob-tiny", "namespace": "ml", "uid": "wl-1"},
      "spec": {"queueName": "lq", "podSets": [{"name": "trainer", "count": 2}]},
      "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
                   {"name": "trainer", "flavors": {"cpu": "spot", "memory": "big-memory"}, "count": 2}]},
                 "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]}})"));
  json job = Job({{"template", {{"spec", {{"nodeSelector", {{"disk", "ssd"}}}}}}}});
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  SetJob(job);
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-1");
  ASSERT_TRUE(pod.has_value()) << "the admitted gang was not created";
  EXPECT_EQ((*pod)["spec"]["nodeSelector"],
            json::parse(R"({"disk": "ssd", "cloud.example.com/pool": "spot", "memory-class": "large"})"));
  EXPECT_EQ((*pod)["spec"]["tolerations"], json::parse(R"([{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}])"));
  // No topology assignment: no Kueue topology gate.
  EXPECT_EQ((*pod)["spec"]["schedulingGates"], json::parse(R"([{"name": "meshwork.dev/gang"}])"));

  // A flavor whose nodes the template rules out: no Pod, an error naming both.
  json conflicting = Job({{"template", {{"spec", {{"nodeSelector", {{"memory-class", "small"}}}}}}}});
  conflicting["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  SetJob(conflicting);
  SetPods({});
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  api_.ClearCalls();
  out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("ResourceFlavor big-memory places the gang on nodes with memory-class=\"large\", "
                                     "but the Pod template's nodeSelector asks for memory-class=\"small\""));
  EXPECT_THAT(Calls("create pods"), IsEmpty());
}

TEST_F(ReconcilerTest, ATopologyAdmittedGangIsGatedForKueuesTopologyUngater) {
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  // The template asks for one rack: the Workload's pod set says so, with the replica index.
  json job = Job({{"template", {{"metadata", {{"annotations", {{"kueue.x-k8s.io/podset-required-topology", "example.com/rack"}}}}}}}});
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  SetJob(job);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  auto wl = api_.Find(workloads, "ml", "trainingjob-tiny");
  ASSERT_TRUE(wl.has_value());
  EXPECT_EQ((*wl)["spec"]["podSets"][0]["topologyRequest"],
            json::parse(R"({"required": "example.com/rack", "podIndexLabel": "meshwork.dev/replica-index"})"));

  // Admitted with a topology assignment: each Pod waits for Kueue's ungater to place it.
  ASSERT_TRUE(ReconcileAdmitted(job, *wl, R"({"name": "trainer", "count": 2,
      "topologyAssignment": {"levels": ["example.com/rack"], "slices": []}})").ok);
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-1");
  ASSERT_TRUE(pod.has_value()) << "the admitted gang was not created";
  EXPECT_EQ((*pod)["metadata"]["labels"]["kueue.x-k8s.io/podset"], "trainer");
  EXPECT_EQ((*pod)["metadata"]["annotations"]["kueue.x-k8s.io/workload"], "trainingjob-tiny");
  EXPECT_THAT((*pod)["spec"]["schedulingGates"].dump(), HasSubstr(R"({"name":"kueue.x-k8s.io/topology"})"));
}

// An elastic job's Workload lets Kueue admit it smaller (minCount = minReplicas); admitted with
// fewer Pods (podSetAssignments[0].count), the gang runs at that size.
TEST_F(ReconcilerTest, AnElasticJobKueueAdmitsPartiallyRunsAtTheAdmittedCount) {
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  json job = Job({{"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 2}}}});
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  SetJob(job);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  auto wl = api_.Find(workloads, "ml", "trainingjob-tiny");
  ASSERT_TRUE(wl.has_value());
  EXPECT_EQ((*wl)["spec"]["podSets"][0]["count"], 2);
  EXPECT_EQ((*wl)["spec"]["podSets"][0]["minCount"], 1);

  ASSERT_TRUE(ReconcileAdmitted(job, *wl, R"({"name": "trainer", "count": 1})").ok);
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-0");
  ASSERT_TRUE(pod.has_value()) << "the admitted gang was not created";
  EXPECT_EQ((*pod)["metadata"]["labels"]["meshwork.dev/world-size"], "1");
  EXPECT_FALSE(api_.Find(k8s::resources::Pods(), "ml", "tiny-1").has_value()) << "Kueue admitted one Pod";
  EXPECT_EQ(Status()["elastic"]["admittedReplicas"], 1);
  EXPECT_EQ(Status()["elastic"]["replicas"], 1);
}

// The nodes an elastic job lost count as back only once Ready for the grace, schedulable and
// untainted; a Pod's NotReady node keeps the node-loss judgement's entry (with its time), whatever
// the lost list says.
TEST_F(ReconcilerTest, LostNodesAreBackOnlyReadyForTheGraceSchedulableAndUntainted) {
  const std::string long_ago = FormatTime(std::chrono::system_clock::now() - std::chrono::minutes(10));
  const std::string just_now = FormatTime(std::chrono::system_clock::now());
  auto node = [](const std::string& name, const std::string& ready, const std::string& since, json spec) {
    return json{{"metadata", {{"name", name}}},
                {"spec", spec},
                {"status", {{"conditions", json::array({{{"type", "Ready"}, {"status", ready}, {"lastTransitionTime", since},
                                                          {"reason", ready == "True" ? "KubeletReady" : "NodeStatusUnknown"}}})}}}};
  };
  k8s::Store nodes;
  nodes.Upsert("back", node("back", "True", long_ago, json::object()));
  nodes.Upsert("flapped", node("flapped", "True", just_now, json::object()));
  nodes.Upsert("cordoned", node("cordoned", "True", long_ago, {{"unschedulable", true}}));
  nodes.Upsert("tainted", node("tainted", "True", long_ago,
                               {{"taints", json::array({{{"key", "repair"}, {"effect", "NoSchedule"}}})}}));
  nodes.Upsert("down", node("down", "Unknown", long_ago, json::object()));
  reconciler_->SetNodes(&nodes);
  json pod = Pod(0, 0, "Running");
  pod["spec"]["nodeName"] = "down";
  const auto unhealthy = reconciler_->UnhealthyNodes(
      {pod}, json::array({"back", "flapped", "cordoned", "tainted", "down", "gone"}), std::chrono::seconds(30));
  EXPECT_FALSE(unhealthy.count("back"));
  EXPECT_EQ(unhealthy.at("flapped").reason, "Ready for less than 30 s");
  EXPECT_EQ(unhealthy.at("cordoned").reason, "cordoned");
  EXPECT_EQ(unhealthy.at("tainted").reason, "tainted repair");
  EXPECT_TRUE(unhealthy.at("gone").deleted);
  EXPECT_FALSE(unhealthy.at("gone").since.has_value()) << "judges no Pod lost";
  ASSERT_TRUE(unhealthy.at("down").since.has_value()) << "the Pod's node keeps its NotReady time";
  EXPECT_EQ(unhealthy.at("down").reason, "NodeStatusUnknown");
}

// An elastic job shrunk by a node loss grows back as soon as its whole gang fits the Ready nodes,
// read as gang admission reads the room (its own Pods not counted), without waiting for the lost
// nodes; with no such room it stays shrunk, a lost node Ready again within its grace not counting
// as room.
TEST_F(ReconcilerTest, AShrunkElasticJobGrowsBackWhenItsGangFitsElsewhere) {
  const std::string long_ago = FormatTime(std::chrono::system_clock::now() - std::chrono::minutes(10));
  auto node = [&](const std::string& name, const std::string& ready, const std::string& cpu) {
    return json{{"metadata", {{"name", name}}},
                {"spec", json::object()},
                {"status", {{"allocatable", {{"cpu", cpu}, {"memory", "8Gi"}, {"pods", "110"}}},
                            {"conditions", json::array({{{"type", "Ready"}, {"status", ready},
                                                         {"lastTransitionTime", long_ago}, {"reason", "x"}}})}}}};
  };
  for (const std::string cpu : {"1", "4"}) {
    SCOPED_TRACE("n1 has " + cpu + " cpu");
    k8s::Store nodes;
    nodes.Upsert("down", node("down", "Unknown", "4"));
    // Lost too, Ready again only just now (within nodeLossGraceSeconds): not room yet.
    json flapped = node("flapped", "True", "4");
    flapped["status"]["conditions"][0]["lastTransitionTime"] = FormatTime(std::chrono::system_clock::now());
    nodes.Upsert("flapped", flapped);
    nodes.Upsert("n1", node("n1", "True", cpu));
    reconciler_->SetNodes(&nodes);
    RoomLedger room;
    reconciler_->SetRoomLedger(&room);
    json job = Job({{"replicas", 2},
                    {"resources", {{"requests", {{"cpu", "1"}}}}},
                    {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 2}}}});
    job["status"] = {{"phase", "Running"},
                     {"restartGeneration", 1},
                     {"launchedGeneration", 1},
                     {"elastic", {{"shrunkFrom", 2}, {"shrunkTo", 1}, {"lostNodes", json::array({"down", "flapped"})}}}};
    SetJob(job);
    json rank = Pod(0, 1, "Running");
    rank["metadata"]["labels"][kWorldSizeLabel] = "1";
    rank["spec"]["nodeName"] = "n1";
    SetPods({rank});
    events_.clear();
    ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
    const bool grew = std::find(events_.begin(), events_.end(), "ElasticGrow") != events_.end();
    EXPECT_EQ(grew, cpu == "4") << ::testing::PrintToString(events_);
    EXPECT_EQ(Status()["elastic"].contains("shrunkFrom"), cpu == "1") << Status().dump();
  }
}

TEST_F(ReconcilerTest, AKueueJobsWorkloadTakesItsPriorityClass) {
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  json job = Job();
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent";
  SetJob(job);
  // The class does not exist: no Workload, an error naming the label and the class.
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("reading WorkloadPriorityClass urgent for the Workload of ml/tiny (the job's label "
                                     "kueue.x-k8s.io/priority-class)"));
  EXPECT_FALSE(api_.Find(workloads, "ml", "trainingjob-tiny").has_value());

  api_.Add(k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", false),
           {{"metadata", {{"name", "urgent"}, {"namespace", ""}}}, {"value", 5000}});
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  const auto wl = api_.Find(workloads, "ml", "trainingjob-tiny");
  ASSERT_TRUE(wl.has_value());
  EXPECT_EQ((*wl)["spec"]["priorityClassRef"],
            json::parse(R"({"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"})"));
  EXPECT_EQ((*wl)["spec"]["priority"], 5000);
  EXPECT_THAT(Calls("create pods"), IsEmpty());  // held until Kueue admits it

  // Without the label, the Pod template's priorityClassName (a PriorityClass) decides.
  const json pod = DesiredPod(Job({{"template", {{"spec", {{"priorityClassName", "batch-high"}}}}}}),
                              *ParseSpec(Job({{"template", {{"spec", {{"priorityClassName", "batch-high"}}}}}})), 0, 0);
  EXPECT_EQ(WorkloadPriorityClassRef(Job(), pod),
            json::parse(R"({"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "batch-high"})"));
  EXPECT_TRUE(WorkloadPriorityClassRef(Job(), DesiredPod(Job(), *ParseSpec(Job()), 0, 0)).is_null());
}

TEST_F(ReconcilerTest, MultiKueuesCopyOfAJobWaitsForThePrebuiltWorkload) {
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  json job = Job();
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  job["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] = "tiny-f00d";
  SetJob(job);
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("create"), IsEmpty());  // not its own Workload, and no Pods
  EXPECT_THAT(Status().dump(), HasSubstr("waiting for Workload tiny-f00d, which MultiKueue makes"));
  // MultiKueue's Workload, admitted in this (worker) cluster: the gang starts.
  api_.Add(workloads, json::parse(R"({"metadata": {"name": "tiny-f00d", "namespace": "ml"},
      "spec": {"queueName": "lq", "podSets": [{"name": "trainer", "count": 2}]},
      "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "trainer", "count": 2}]},
                 "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]}})"));
  SetJob(job);
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("create pods"), ElementsAre("create pods ml/tiny-0", "create pods ml/tiny-1"));
}

TEST_F(ReconcilerTest, AJobManagedByAnotherControllerIsLeftAlone) {
  // MultiKueue's management cluster: the job is a copy that MultiKueue runs elsewhere.
  SetJob(Job({{"managedBy", "kueue.x-k8s.io/multikueue"}}));
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_TRUE(out.ok) << out.message;
  EXPECT_THAT(api_.calls(), IsEmpty());  // no children, no status write
  EXPECT_THAT(events_, IsEmpty());
  // With a queue, the one thing done here is the Workload MultiKueue dispatches to a worker.
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  json queued = Job({{"managedBy", "kueue.x-k8s.io/multikueue"}});
  queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  SetJob(queued);
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(api_.calls(), ElementsAre("get workloads ml/trainingjob-tiny", "create workloads ml/trainingjob-tiny"));
  EXPECT_EQ((*api_.Find(workloads, "ml", "trainingjob-tiny"))["spec"]["podSets"][0]["count"], 2);
  api_.ClearCalls();
  out = reconciler_->Reconcile(kKey);
  EXPECT_THAT(api_.calls(), ElementsAre("get workloads ml/trainingjob-tiny"));  // made once
  // Another manager's job with a queue: nothing at all.
  queued["spec"]["managedBy"] = "example.com/other-controller";
  SetJob(queued);
  api_.ClearCalls();
  out = reconciler_->Reconcile(kKey);
  EXPECT_THAT(api_.calls(), IsEmpty());
  // Naming this operator is the same as not naming any.
  SetJob(Job({{"managedBy", "meshwork.dev/trainingjob-controller"}}));
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("create pods"), ElementsAre("create pods ml/tiny-0", "create pods ml/tiny-1"));
}

TEST_F(ReconcilerTest, WithGangAdmissionVolcanoTheGangIsVolcanosPodGroup) {
  const k8s::ResourceRef volcano = k8s::resources::Custom("scheduling.volcano.sh", "v1beta1", "podgroups");
  const json spec = {
      {"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Volcano"}, {"queue", "research"}, {"priorityClass", "high"}}}}}};
  SetJob(Job(spec));
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("create podgroups"), ElementsAre("create podgroups ml/tiny"));
  const auto group = api_.Find(volcano, "ml", "tiny");
  ASSERT_TRUE(group.has_value()) << "no scheduling.volcano.sh PodGroup";
  EXPECT_EQ((*group)["apiVersion"], "scheduling.volcano.sh/v1beta1");
  EXPECT_EQ((*group)["spec"], json::parse(R"({"minMember": 2, "queue": "research", "priorityClassName": "high"})"));
  EXPECT_EQ((*group)["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  for (const std::string pod_name : {"tiny-0", "tiny-1"}) {
    const auto pod = api_.Find(k8s::resources::Pods(), "ml", pod_name);
    ASSERT_TRUE(pod.has_value());
    EXPECT_EQ((*pod)["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "tiny");
    EXPECT_EQ((*pod)["spec"]["schedulerName"], "volcano");
    EXPECT_FALSE((*pod)["spec"].contains("schedulingGates"));  // Volcano holds them, not the operator
    EXPECT_FALSE((*pod)["spec"].contains("schedulingGroup"));
  }

  // A resize: minMember follows; what Volcano wrote into the spec stays.
  json have = *group;
  have["spec"]["minResources"] = {{"cpu", "2"}};
  api_.Add(volcano, have);
  json resized = Job(spec);
  resized["spec"]["replicas"] = 3;
  SetJob(resized);
  SetPods({});
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  api_.ClearCalls();
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_THAT(Calls("update podgroups"), ElementsAre("update podgroups ml/tiny"));
  EXPECT_EQ((*api_.Find(volcano, "ml", "tiny"))["spec"],
            json::parse(R"({"minMember": 3, "queue": "research", "priorityClassName": "high", "minResources": {"cpu": "2"}})"));
}

TEST_F(ReconcilerTest, WithGangAdmissionCoschedulingThePodsCarryThePodGroupLabel) {
  const k8s::ResourceRef coscheduling = k8s::resources::Custom("scheduling.x-k8s.io", "v1alpha1", "podgroups");
  const json spec = {{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Coscheduling"}, {"scheduleTimeoutSeconds", 90}}}}},
                     {"template", {{"spec", {{"schedulerName", "scheduler-plugins-scheduler"}}}}}};
  SetJob(Job(spec));
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  const auto group = api_.Find(coscheduling, "ml", "tiny");
  ASSERT_TRUE(group.has_value()) << "no scheduling.x-k8s.io PodGroup";
  EXPECT_EQ((*group)["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ((*group)["spec"], json::parse(R"({"minMember": 2, "scheduleTimeoutSeconds": 90})"));
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-0");
  ASSERT_TRUE(pod.has_value());
  EXPECT_EQ((*pod)["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "tiny");
  EXPECT_EQ((*pod)["spec"]["schedulerName"], "scheduler-plugins-scheduler");  // the template's
  EXPECT_FALSE((*pod)["spec"].contains("schedulingGates"));

  // Without the CRD, the reconcile fails naming the API the job needs.
  api_.FailNext("create", "podgroups", k8s::Error(k8s::ErrorKind::kNotFound, "the server could not find the requested resource"));
  SetPods({});
  SetJob(Job(spec, {{"launchedGeneration", 0}, {"restartGeneration", 1}, {"phase", "Restarting"}}));
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("needs the scheduler-plugins PodGroup CRD, scheduling.x-k8s.io/v1alpha1"));
}

TEST_F(ReconcilerTest, EveryGangOfAJobSharesOneRandomRendezvousTokenFromItsOwnSecret) {
  SetJob(Job());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  const auto secret = api_.Find(k8s::resources::Secrets(), "ml", "tiny-rendezvous");
  ASSERT_TRUE(secret.has_value());
  EXPECT_EQ((*secret)["type"], "Opaque");
  EXPECT_EQ((*secret)["metadata"]["ownerReferences"][0]["uid"], "uid-1");  // deleted with the job
  const std::string token = (*secret)["data"].value("token", "");
  EXPECT_EQ(token.size(), 88u);  // 64 hex digits, base64-encoded
  // Every Pod reads it from the Secret; its value never appears in the Pod.
  const auto pod = api_.Find(k8s::resources::Pods(), "ml", "tiny-1");
  ASSERT_TRUE(pod.has_value());
  const std::string env = (*pod)["spec"]["containers"][0]["env"].dump();
  EXPECT_THAT(env, HasSubstr(R"({"name":"MESHWORK_RENDEZVOUS_TOKEN","valueFrom":{"secretKeyRef":{"key":"token","name":"tiny-rendezvous"}}})"));

  // The next gang (a restart) keeps the job's token: the Secret is read, not replaced.
  SetJob(Job({}, {{"launchedGeneration", 0}, {"restartGeneration", 1}, {"phase", "Restarting"}}));
  SetPods({});
  api_.ClearCalls();
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  EXPECT_THAT(Calls("create secrets"), ElementsAre("create secrets ml/tiny-rendezvous"));  // refused: it exists
  EXPECT_THAT(Calls("create pods"), Not(IsEmpty()));
  EXPECT_EQ((*api_.Find(k8s::resources::Secrets(), "ml", "tiny-rendezvous"))["data"]["token"], token);

  // Another job's, or a user's, Secret of that name is not taken over, and no Pod is made.
  json foreign = *secret;
  foreign["metadata"]["ownerReferences"] = json::array();
  api_.Add(k8s::resources::Secrets(), foreign);
  api_.ClearCalls();
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("Secret ml/tiny-rendezvous exists and is not owned by this TrainingJob"));
  EXPECT_THAT(Calls("create pods"), IsEmpty());
}

// The job's Service and inline config's ConfigMap are the job's own: one of the same name that
// it does not own (a user's, another job's) is an error naming it, never overwritten.
TEST_F(ReconcilerTest, AConfigMapOrServiceTheJobDoesNotOwnIsNotTakenOver) {
  const json users = json::parse(R"({"metadata": {"name": "tiny-config", "namespace": "ml"},
      "data": {"config.yaml": "theirs", "tokenizer.json": "{}"}})");
  api_.Add(k8s::resources::ConfigMaps(), users);
  SetJob(Job());
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("ConfigMap ml/tiny-config exists and is not owned by this TrainingJob"));
  EXPECT_EQ((*api_.Find(k8s::resources::ConfigMaps(), "ml", "tiny-config"))["data"], users["data"]);
  EXPECT_THAT(Calls("create pods"), IsEmpty());

  // Its own ConfigMap (an earlier gang's) follows the spec.
  json ours = users;
  ours["metadata"]["ownerReferences"] = json::array({{{"uid", "uid-1"}, {"kind", kKind}, {"name", "tiny"}}});
  api_.Add(k8s::resources::ConfigMaps(), ours);
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ((*api_.Find(k8s::resources::ConfigMaps(), "ml", "tiny-config"))["data"],
            json({{"config.yaml", "model:\n  preset: tiny\n"}}));

  // A Service of the job's name that it does not own: the ranks' names would not resolve.
  SetJob(Job());
  SetPods({});
  (void)api_.Delete(k8s::resources::Services(), "ml", "tiny", {});  // whether or not a reconcile made it
  api_.Add(k8s::resources::Services(), json::parse(R"({"metadata": {"name": "tiny", "namespace": "ml"},
      "spec": {"selector": {"app": "web"}}})"));
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  api_.ClearCalls();
  out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.message, HasSubstr("Service ml/tiny exists and is not owned by this TrainingJob"));
  EXPECT_THAT(Calls("create pods"), IsEmpty());
}

// A queued job whose spec stops parsing (an edit the CRD let through) fails, and hands its quota
// back: its Workload is Finished, as for any other finish.
TEST_F(ReconcilerTest, AKueueJobFailedForItsSpecFinishesItsWorkload) {
  const k8s::ResourceRef workloads = k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads");
  api_.Add(workloads, json::parse(R"({"metadata": {"name": "trainingjob-tiny", "namespace": "ml", "uid": "wl-1"},
      "spec": {"queueName": "lq", "podSets": [{"name": "trainer", "count": 2}]},
      "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "trainer", "count": 2}]},
                 "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]}})"));
  json job = Job({{"runPolicy", {{"backoffLimit", 2000000}}}},
                 {{"launchedGeneration", 0}, {"restartGeneration", 0}, {"phase", "Running"}});
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq";
  SetJob(job);
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(Status()["phase"], "Failed");
  const json conditions = (*api_.Find(workloads, "ml", "trainingjob-tiny"))["status"]["conditions"];
  bool finished = false;
  for (const auto& c : conditions) finished = finished || (c["type"] == "Finished" && c["status"] == "True");
  EXPECT_TRUE(finished) << conditions.dump();
}

TEST_F(ReconcilerTest, ARuntimeEditThatBreaksTheSpecDoesNotKillARunningGang) {
  api_.Add(Runtimes(), {{"metadata", {{"name", "cpu-pool"}}},
                        {"spec", {{"device", "cpu"}, {"config", {{"inline", "model: [unclosed"}}}}}});
  SetJob(Job({{"runtimeRef", {{"name", "cpu-pool"}}}}, {{"launchedGeneration", 0}, {"restartGeneration", 0}, {"phase", "Running"}}));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  api_.ClearCalls();
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_FALSE(out.invalid_spec);
  EXPECT_THAT(Calls("delete"), IsEmpty());
  EXPECT_THAT(events_, Contains("RuntimeInvalid"));
  EXPECT_EQ(out.requeue_after, seconds(10));
}

TEST_F(ReconcilerTest, ARuntimeDeletedUnderARunningJobLeavesItsLifecycleGoingOnTheLastCopy) {
  api_.Add(Runtimes(), {{"metadata", {{"name", "cpu-pool"}, {"namespace", ""}}}, {"spec", {{"device", "cpu"}}}});
  const json running = {{"launchedGeneration", 0}, {"restartGeneration", 0}, {"phase", "Running"}};
  SetJob(Job({{"runtimeRef", {{"name", "cpu-pool"}}}}, running));
  SetPods({Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);  // merged: the operator keeps this copy

  // The runtime is deleted; then the gang finishes. The job still sees it and succeeds.
  ASSERT_TRUE(api_.Delete(Runtimes(), "", "cpu-pool", k8s::DeleteOptions{}).ok());
  SetJob(Job({{"runtimeRef", {{"name", "cpu-pool"}}}}, running));
  SetPods({Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Succeeded", 0)});
  events_.clear();
  ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.phase, "Succeeded");
  EXPECT_THAT(events_, Contains("RuntimeNotFound"));
  EXPECT_THAT(events_, Contains("AllRanksSucceeded"));

  // An operator restarted since has no copy: the job waits for its runtime, as before.
  SetJob(Job({{"runtimeRef", {{"name", "cpu-pool"}}}}, running));
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.phase, "Running");
  EXPECT_EQ(out.requeue_after, seconds(10));
}

TEST_F(ReconcilerTest, ASpecWrongOnlyOnceMergedNamesTheRuntime) {
  api_.Add(Runtimes(),
           {{"metadata", {{"name", "cpu-pool"}}}, {"spec", {{"device", "cpu"}}}});  // no image
  SetJob(Job({{"image", nullptr}, {"device", nullptr}, {"runtimeRef", {{"name", "cpu-pool"}}}}));
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_TRUE(out.invalid_spec);
  EXPECT_THAT(Status().dump(), HasSubstr("spec.image: is required"));
  EXPECT_THAT(Status().dump(), HasSubstr("(in the spec merged with TrainingRuntime cpu-pool)"));
}

TEST_F(ReconcilerTest, APodTheApiServerRefusesAsInvalidFailsTheJobInsteadOfRetryingForEver) {
  SetJob(Job());
  api_.FailNext("create", "pods",
                k8s::Error(k8s::ErrorKind::kInvalid,
                           "Pod \"tiny-0\" is invalid: spec.containers[0].securityContext.runAsUser: Invalid value: -5")
                    .set_http_code(422));
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_TRUE(out.invalid_spec);
  EXPECT_EQ(out.phase, "Failed");
  EXPECT_THAT(Calls("create pods"), ElementsAre("create pods ml/tiny-0"));  // not tiny-1 too
  EXPECT_THAT(Status().dump(), HasSubstr("spec.template: the API server refused Pod tiny-0 that the job's spec makes: "
                                         "Pod \\\"tiny-0\\\" is invalid: spec.containers[0].securityContext.runAsUser"));
  EXPECT_THAT(events_, ElementsAre("Created", "InvalidSpec"));
  // A Pod refused for another reason (a quota, RBAC, an outage) is retried, not the spec's fault.
  SetJob(Job());
  SetPods({});
  reconciler_ = std::make_unique<Reconciler>(&api_, &jobs_, &pods_, &services_, &index_, ReconcilerOptions{},
                                             ReconcilerHooks{});
  api_.FailNext("create", "pods", k8s::Error(k8s::ErrorKind::kForbidden, "exceeded quota").set_http_code(403));
  EXPECT_FALSE(reconciler_->Reconcile(kKey).ok);
}

TEST_F(ReconcilerTest, ABadTrainerConfigFailsTheJobWithoutCreatingAnything) {
  SetJob(Job({{"config", {{"inline", "model:\n  preset: no-such-preset\n"}}}}));
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_TRUE(out.invalid_spec);
  EXPECT_EQ(out.phase, "Failed");
  EXPECT_THAT(api_.calls(), ElementsAre("update-status trainingjobs ml/tiny"));
  EXPECT_THAT(Status().dump(), HasSubstr("spec.config.inline"));
  EXPECT_FALSE(Status().contains("worldSize"));  // as for any spec failure
  EXPECT_THAT(events_, ElementsAre("Created", "InvalidSpec"));
}

TEST_F(ReconcilerTest, AForeignPodHoldingARanksNameIsReported) {
  SetJob(Job());
  json squatter = Pod(1, 0, "Running");
  squatter["metadata"]["ownerReferences"] = json::array();
  api_.Add(k8s::resources::Pods(), squatter);
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.requeue_after, seconds(10));
  EXPECT_THAT(Calls("get pods"), ElementsAre("get pods ml/tiny-1"));
  EXPECT_FALSE(Status().contains("launchedGeneration"));  // the gang is not complete
  EXPECT_THAT(events_, ElementsAre("Created", "PodNameTaken"));
}

TEST_F(ReconcilerTest, SuccessReadsRankZerosFinalLineIntoTheStatus) {
  SetJob(Job({}, {{"launchedGeneration", 0},
                  {"restartGeneration", 0},
                  {"trainer", {{"step", 190}, {"totalSteps", 200}, {"loss", 3.0}, {"tokensPerSecond", 10.0}}}}));
  SetPods({Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Succeeded", 0)});
  api_.SetLog("ml", "tiny-0", "step 200 ...\ndone: 200 steps, 1000 tokens in 5 s | final loss 2.34567 | 1234.56 tok/s\n");
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.phase, "Succeeded");
  EXPECT_THAT(Calls("log"), ElementsAre("log pods ml/tiny-0"));
  const json trainer = Status()["trainer"];
  EXPECT_EQ(trainer["step"], 200);
  EXPECT_DOUBLE_EQ(trainer["loss"].get<double>(), 2.3457);
  EXPECT_DOUBLE_EQ(trainer["tokensPerSecond"].get<double>(), 1234.6);

  // Finished: later reconciles read no log and write nothing.
  SyncJob();
  api_.ClearCalls();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  EXPECT_THAT(api_.calls(), IsEmpty());
}

TEST_F(ReconcilerTest, TheTtlDeletesAFinishedJob) {
  const json status = {{"conditions", json::array({Condition("Succeeded", "True")})},
                       {"completionTime", FormatTime(std::chrono::system_clock::now() - std::chrono::hours(1))},
                       {"phase", "Succeeded"}};
  SetJob(Job({{"runPolicy", {{"ttlSecondsAfterFinished", 0}}}}, status));
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_EQ(out.phase, "");  // gone
  EXPECT_THAT(api_.calls(), ElementsAre("delete trainingjobs ml/tiny"));
  EXPECT_FALSE(api_.Find(kJobs, "ml", "tiny").has_value());
}

TEST_F(ReconcilerTest, AJobBeingDeletedOrGoneIsLeftAlone) {
  EXPECT_TRUE(reconciler_->Reconcile(kKey).ok);  // not in the cache
  json job = Job();
  job["metadata"]["deletionTimestamp"] = FormatTime(kT0);
  SetJob(job);
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.phase, "");
  EXPECT_THAT(api_.calls(), IsEmpty());
}

TEST_F(ReconcilerTest, AFailedCreateIsRetriedWithoutAStatusWrite) {
  SetJob(Job());
  api_.FailNext("create", "pods", k8s::Error(k8s::ErrorKind::kForbidden, "quota"));
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.error_reason, "api");
  EXPECT_THAT(out.message, HasSubstr("creating Pod tiny-0"));
  EXPECT_THAT(Calls("update-status"), IsEmpty());
  EXPECT_THAT(events_, Not(Contains("Created")));
}

// Gang admission counts the room Pods take from the ledger the informer keeps (SetRoomLedger),
// with no list per admission: a foreign Pod there keeps the gang gated until it is gone.
TEST_F(ReconcilerTest, GangAdmissionReadsTheRoomLedgerNotAList) {
  RoomLedger holding;
  reconciler_->SetRoomLedger(&holding);
  api_.Add(k8s::resources::Nodes(), json::parse(R"({"metadata": {"name": "n1"},
    "status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"}}})"));
  SetJob(Job({{"resources", {{"requests", {{"cpu", "1"}}}}}}));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);  // the gang's Pods, behind their gate
  SyncJob();
  SyncPods();
  holding.Set("other/big", json::parse(R"({"metadata": {"name": "big", "namespace": "other", "uid": "big-uid"},
    "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
    "status": {"phase": "Running"}})"));
  // A GangWaiting Event lost with its status write (a conflict) is given again by the retry. The
  // cache still shows the status before the Pods were counted, so this reconcile writes it.
  json stale = *api_.Find(kJobs, "ml", "tiny");
  stale["status"]["activeReplicas"] = 0;
  jobs_.Upsert(kKey, stale);
  api_.FailNext("update-status", "trainingjobs", k8s::Error(k8s::ErrorKind::kConflict, "modified"));
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok);
  EXPECT_THAT(events_, Not(Contains("GangWaiting")));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  EXPECT_THAT(events_, Contains("GangWaiting"));
  EXPECT_THAT(Calls("patch pods"), IsEmpty());
  // Said once per reason.
  events_.clear();
  SyncJob();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok);
  EXPECT_THAT(events_, Not(Contains("GangWaiting")));
  holding.Remove("other/big");
  SyncJob();
  // The ledger shows the released Pods only a while after their PATCH (the watch): the admission
  // must not end before it does, or the next one would count their room as free.
  std::atomic<bool> returned{false};
  std::atomic<bool> returned_before_cache{false};
  std::thread watch([&] {
    while (Calls("patch pods").size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    returned_before_cache = returned.load();
    for (const char* name : {"tiny-0", "tiny-1"}) holding.Set(std::string("ml/") + name, *api_.Find(k8s::resources::Pods(), "ml", name));
  });
  const ReconcileOutcome out = reconciler_->Reconcile(kKey);
  returned = true;
  watch.join();
  ASSERT_TRUE(out.ok) << out.message;
  EXPECT_FALSE(returned_before_cache) << "the admission ended before the ledger showed the released Pods";
  EXPECT_THAT(events_, Contains("GangAdmitted"));
  EXPECT_THAT(Calls("patch pods"), ElementsAre("patch pods ml/tiny-0", "patch pods ml/tiny-1"));
  EXPECT_THAT(Calls("list pods"), IsEmpty());
}

}  // namespace
}  // namespace meshwork::op
