// The reconciler's decisions, scenario by scenario, on plain JSON: each lifecycle rule of
// docs/trainingjob.md, and the Kubeflow failures we must not repeat.
#include "operator/controller/decide.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/controller/desired.h"

#include <yaml-cpp/yaml.h>

namespace meshwork::op {
namespace {

using nlohmann::json;
using std::chrono::seconds;
using ::testing::HasSubstr;

const SystemTime kT0 = std::chrono::system_clock::from_time_t(1800000000);

json Job(json spec = json::object(), json status = json()) {
  json base = {{"image", "meshwork/trainer:test"},
               {"replicas", 2},
               {"device", "cpu"},
               {"config", {{"inline", "model:\n  preset: tiny\n"}}}};
  base.merge_patch(spec);
  json job = {{"apiVersion", kApiVersion},
              {"kind", kKind},
              {"metadata", {{"name", "tiny"}, {"namespace", "ml"}, {"uid", "uid-1"}, {"generation", 1}}},
              {"spec", base}};
  if (!status.is_null()) job["status"] = status;
  return job;
}

json Pod(int index, int64_t gen, const std::string& phase, std::optional<int> exit_code = std::nullopt) {
  json pod = {{"metadata",
               {{"name", "tiny-" + std::to_string(index)},
                {"namespace", "ml"},
                {"uid", "pod-uid-" + std::to_string(index) + "-" + std::to_string(gen)},
                {"labels",
                 {{kJobLabel, "tiny"},
                  {kIndexLabel, std::to_string(index)},
                  {kGenerationLabel, std::to_string(gen)},
                  {kWorldSizeLabel, "2"}}}}},
              {"status", {{"phase", phase}}}};
  if (phase == "Running") {
    pod["status"]["conditions"] = json::array({{{"type", "Ready"}, {"status", "True"}}});
    pod["status"]["podIP"] = "127.1.0." + std::to_string(index + 1);
  }
  if (exit_code) {
    pod["status"]["containerStatuses"] = json::array(
        {{{"name", "trainer"}, {"state", {{"terminated", {{"exitCode", *exit_code}, {"reason", "Error"}}}}}}});
  }
  return pod;
}

Observed In(json job, std::vector<json> pods = {}, SystemTime now = kT0) {
  Observed in;
  in.job = std::move(job);
  in.pods = std::move(pods);
  in.service_exists = true;
  in.now = now;
  return in;
}

// Applies a plan's status to the job, as the executor's status write would.
json After(const json& job, const Plan& plan) {
  json next = job;
  next["status"] = plan.status;
  return next;
}

std::vector<std::string> Names(const std::vector<PodView>& pods) {
  std::vector<std::string> out;
  for (const auto& p : pods) out.push_back(p.name);
  return out;
}

std::string ConditionReason(const json& status, const std::string& type) {
  for (const auto& c : status["conditions"]) {
    if (c["type"] == type) return c.value("reason", "");
  }
  return "";
}

// A job whose gang (generation 0) was fully created and is running.
json RunningJob(json spec = json::object()) {
  Plan first = Decide(In(Job(spec)));
  json job = After(Job(spec), first);
  job["status"]["launchedGeneration"] = 0;
  return job;
}

TEST(DecideTest, NewJobCreatesTheGangServiceAndConfigOnce) {
  Plan p = Decide(In(Job(), {}, kT0));
  ASSERT_EQ(p.create.size(), 2u);
  EXPECT_EQ(p.create[0]["metadata"]["name"], "tiny-0");
  EXPECT_EQ(p.create[1]["metadata"]["name"], "tiny-1");
  EXPECT_TRUE(p.ensure_service);
  EXPECT_TRUE(p.ensure_config_map);
  EXPECT_TRUE(p.remove.empty());
  EXPECT_EQ(p.phase, "Created");
  EXPECT_EQ(p.status["phase"], "Created");
  EXPECT_EQ(p.status["worldSize"], 2);
  EXPECT_EQ(p.status["meshShape"], "1x2x1");
  EXPECT_EQ(p.status["startTime"], FormatTime(kT0));
  EXPECT_EQ(p.status["observedGeneration"], 1);
  EXPECT_EQ(p.status["selector"], "meshwork.dev/job=tiny");
  EXPECT_TRUE(ConditionTrue(p.status, "Created"));
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].reason, "Created");
}

// mesh: auto: "auto" until rank 0 reports its choice; a reported mesh stays while the world
// size does, and goes back to "auto" when the gang changes size.
TEST(DecideTest, MeshAutoShowsTheTrainersChoiceOnceReported) {
  const json spec = {{"mesh", {{"auto", true}}}};
  Plan p = Decide(In(Job(spec)));
  EXPECT_EQ(p.status["meshShape"], "auto");
  EXPECT_FALSE(p.status.contains("mesh"));
  const json reported = {{"worldSize", 2}, {"meshShape", "2x1x1"}, {"mesh", {{"dpReplicate", 2}, {"dpShard", 1}, {"tp", 1}}}};
  p = Decide(In(Job(spec, reported)));
  EXPECT_EQ(p.status["meshShape"], "2x1x1");
  EXPECT_EQ(p.status["mesh"]["dpReplicate"], 2);
  json resized = reported;
  resized["worldSize"] = 4;
  p = Decide(In(Job(spec, resized)));
  EXPECT_EQ(p.status["meshShape"], "auto");
  EXPECT_FALSE(p.status.contains("mesh"));
}

std::vector<std::string> UndeclaredStatusFields(const json& status);  // below

// mesh: auto: the plan the config check chose starts the gang (its keys on every rank), is
// recorded in status.plan and status.mesh with a PlanChosen Event, and said once: the same plan
// for the next Pods of the gang is not said again; a new world forgets it until its own is chosen.
TEST(DecideTest, MeshAutoStartsTheGangWithThePlanChosenAtAdmission) {
  const json spec = {{"mesh", {{"auto", true}}}};
  AdmissionPlan chosen;
  chosen.overrides = {"mesh.dp_replicate=1", "mesh.dp_shard=1", "mesh.tp=1", "mesh.pp=2", "pipeline.schedule=zb-h1"};
  chosen.mesh.pp = 2;
  chosen.status = {{"worldSize", 2},
                   {"mesh", {{"dpReplicate", 1}, {"dpShard", 1}, {"tp", 1}, {"pp", 2}}},
                   {"meshShape", "pp2x1x1x1"},
                   {"description", "tp 1 x pp 2 x dp_shard 1, zb-h1, 4 micro-batches of 1"}};
  chosen.summary = "planned tp 1 x pp 2 x dp_shard 1, zb-h1, 4 micro-batches of 1 for 2 ranks";
  Observed in = In(Job(spec));
  in.check_config = [&] {
    ConfigCheck c;
    c.plan = chosen;
    return c;
  };
  Plan p = Decide(in);
  ASSERT_EQ(p.create.size(), 2u);
  const std::string pod = p.create[1].dump();
  EXPECT_THAT(pod, HasSubstr("mesh.pp=2"));
  EXPECT_THAT(pod, HasSubstr("pipeline.schedule=zb-h1"));
  EXPECT_THAT(pod, ::testing::Not(HasSubstr("dist.mesh=auto")));
  EXPECT_EQ(p.create[1]["metadata"]["labels"][kMeshLabel], "auto");
  bool pp_env = false;
  for (const auto& e : p.create[1]["spec"]["containers"][0]["env"]) pp_env |= e["name"] == "MESHWORK_MESH_PP" && e["value"] == "2";
  EXPECT_TRUE(pp_env) << "MESHWORK_MESH_PP is the plan's";
  EXPECT_EQ(p.status["plan"]["description"], chosen.status["description"]);
  EXPECT_EQ(p.status["meshShape"], "pp2x1x1x1");
  EXPECT_EQ(p.status["mesh"]["pp"], 2);
  EXPECT_THAT(UndeclaredStatusFields(p.status), ::testing::IsEmpty()) << "the API server would prune them";
  int said = 0;
  for (const auto& e : p.events) said += e.reason == "PlanChosen" && e.message == chosen.summary;
  EXPECT_EQ(said, 1);

  // The next reconcile keeps it in status (no check: every Pod exists) and says nothing more.
  json job = After(Job(spec), p);
  Plan q = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}));
  EXPECT_EQ(q.status["meshShape"], "pp2x1x1x1");
  EXPECT_EQ(q.status["plan"]["description"], chosen.status["description"]);
  for (const auto& e : q.events) EXPECT_NE(e.reason, "PlanChosen");
  // One Pod recreated: the same plan again, not said again.
  Observed again = In(job, {Pod(0, 0, "Running")});
  again.check_config = in.check_config;
  Plan r = Decide(again);
  for (const auto& e : r.events) EXPECT_NE(e.reason, "PlanChosen");
  // Another world size: the plan is forgotten until the new gang's is chosen.
  json grown = job;
  grown["spec"]["replicas"] = 4;
  Plan g = Decide(In(grown, {}));
  EXPECT_FALSE(g.status.contains("plan"));
  EXPECT_EQ(g.status["meshShape"], "auto");
}

TEST(DecideTest, RunningGangIsRunningAndIdempotent) {
  json job = After(Job(), Decide(In(Job())));
  std::vector<json> pods = {Pod(0, 0, "Running"), Pod(1, 0, "Running")};
  Plan p = Decide(In(job, pods, kT0 + seconds(5)));
  EXPECT_TRUE(p.create.empty());
  EXPECT_TRUE(p.remove.empty());
  EXPECT_EQ(p.phase, "Running");
  EXPECT_EQ(p.status["ready"], "2/2");
  EXPECT_EQ(p.status["launchedGeneration"], 0);
  EXPECT_TRUE(ConditionTrue(p.status, "Running"));
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].reason, "Running");
  ASSERT_TRUE(p.requeue_after.has_value());  // to scrape progress

  // The same observation again: nothing to do, nothing to write, nothing to record.
  json again = After(job, p);
  Plan q = Decide(In(again, pods, kT0 + seconds(6)));
  EXPECT_EQ(q.status, again["status"]);
  EXPECT_TRUE(q.events.empty());
  EXPECT_TRUE(q.create.empty());
}

TEST(DecideTest, RetryableFailureRestartsTheWholeGangWithTheNextGeneration) {
  json job = RunningJob({{"runPolicy", {{"backoffLimit", 3}}}});
  Plan p = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Failed", 137)}));
  EXPECT_TRUE(p.status_first);
  EXPECT_EQ(p.status["restarts"], 1);
  EXPECT_EQ(p.status["restartGeneration"], 1);
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_THAT(Names(p.remove), ::testing::UnorderedElementsAre("tiny-0", "tiny-1"));
  EXPECT_TRUE(p.create.empty());
  EXPECT_TRUE(ConditionTrue(p.status, "Restarting"));
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].type, "Warning");
  EXPECT_THAT(p.events[0].message, HasSubstr("pod tiny-1 exited with code 137 (signal 9)"));
  EXPECT_THAT(p.events[0].message, HasSubstr("restart 1 of 3"));

  // While the old gang terminates, nothing new starts (kubeflow/training-operator#1478: a new
  // rank must never meet old ones at the rendezvous).
  json restarting = After(job, p);
  json terminating = Pod(0, 0, "Running");
  terminating["metadata"]["deletionTimestamp"] = FormatTime(kT0);
  Plan q = Decide(In(restarting, {terminating}));
  EXPECT_TRUE(q.create.empty());
  EXPECT_TRUE(q.remove.empty());  // already being deleted
  EXPECT_EQ(q.phase, "Restarting");

  // Once it is gone, the next gang starts with generation 1 in its labels and env.
  Plan r = Decide(In(After(restarting, q), {}));
  ASSERT_EQ(r.create.size(), 2u);
  EXPECT_EQ(r.create[0]["metadata"]["labels"][kGenerationLabel], "1");
  bool env_found = false;
  for (const auto& e : r.create[0]["spec"]["containers"][0]["env"]) {
    if (e["name"] == "MESHWORK_RESTART_GENERATION") env_found = e["value"] == "1";
  }
  EXPECT_TRUE(env_found);
  EXPECT_EQ(r.phase, "Restarting");

  // Running again: Restarting goes False, restarts stays 1.
  Plan s = Decide(In(After(After(restarting, q), r), {Pod(0, 1, "Running"), Pod(1, 1, "Running")}));
  EXPECT_EQ(s.phase, "Running");
  EXPECT_FALSE(ConditionTrue(s.status, "Restarting"));
  EXPECT_EQ(s.status["restarts"], 1);
}

TEST(DecideTest, PermanentExitCodeFailsWithoutARestart) {
  json job = RunningJob();
  Plan p = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Failed", 2)}));
  EXPECT_EQ(p.phase, "Failed");
  EXPECT_EQ(ConditionReason(p.status, "Failed"), "PermanentExitCode");
  EXPECT_EQ(p.status["restarts"], 0);
  EXPECT_TRUE(p.status_first);  // the outcome is recorded before cleanPodPolicy deletes anything
  EXPECT_THAT(Names(p.remove), ::testing::ElementsAre("tiny-0"));  // cleanPodPolicy Running
  EXPECT_EQ(p.status["completionTime"], FormatTime(kT0));
}

TEST(DecideTest, ExitCodePolicyStillHonoursBackoffLimit) {
  // kubeflow/training-operator#2045: the ExitCode policy ignored backoffLimit.
  json job = RunningJob({{"runPolicy", {{"restartPolicy", "ExitCode"}, {"backoffLimit", 1}}}});
  job["status"]["restarts"] = 1;
  job["status"]["restartGeneration"] = 1;
  job["status"]["launchedGeneration"] = 1;
  Plan p = Decide(In(job, {Pod(0, 1, "Failed", 137), Pod(1, 1, "Running")}));
  EXPECT_EQ(p.phase, "Failed");
  EXPECT_EQ(ConditionReason(p.status, "Failed"), "BackoffLimitExceeded");
  EXPECT_THAT(p.status["conditions"].dump(), HasSubstr("backoffLimit is 1"));
}

TEST(DecideTest, CleanPodPolicyAppliesWhenTheBackoffLimitTrips) {
  // kubeflow/trainer#3419: cleanPodPolicy was ignored when the backoff limit tripped.
  for (const auto& [policy, expected] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"All", {"tiny-0", "tiny-1"}}, {"Running", {"tiny-1"}}, {"None", {}}}) {
    json job = RunningJob({{"runPolicy", {{"backoffLimit", 0}, {"cleanPodPolicy", policy}}}});
    Plan p = Decide(In(job, {Pod(0, 0, "Failed", 1), Pod(1, 0, "Running")}));
    EXPECT_EQ(ConditionReason(p.status, "Failed"), "BackoffLimitExceeded") << policy;
    EXPECT_THAT(Names(p.remove), ::testing::UnorderedElementsAreArray(expected)) << policy;
    // And on every later reconcile of the finished job.
    Plan q = Decide(In(After(job, p), {Pod(0, 0, "Failed", 1), Pod(1, 0, "Running")}));
    EXPECT_THAT(Names(q.remove), ::testing::UnorderedElementsAreArray(expected)) << policy;
    EXPECT_TRUE(q.create.empty());
  }
}

TEST(DecideTest, AFinishedJobCountsAsReadyOnlyThePodsStillRunning) {
  // Issue 20: a Failed job showed READY 1/2 with one Pod left in Error, and a DeadlineExceeded
  // one 2/2 with no Pods.
  for (const auto& [policy, ready_now] :
       std::vector<std::pair<std::string, std::string>>{{"All", "0/2"}, {"Running", "0/2"}, {"None", "1/2"}}) {
    json job = RunningJob({{"runPolicy", {{"backoffLimit", 0}, {"cleanPodPolicy", policy}}}});
    Plan p = Decide(In(job, {Pod(0, 0, "Failed", 1), Pod(1, 0, "Running")}));
    ASSERT_EQ(p.phase, "Failed") << policy;
    EXPECT_EQ(p.status["ready"], ready_now) << policy << ": the running rank is being removed, or (None) runs on";
    EXPECT_EQ(p.status["failedReplicas"], 1) << policy;
    // Later, with what cleanPodPolicy left: the counts follow the Pods.
    std::vector<json> left = {Pod(0, 0, "Failed", 1)};
    if (policy == "None") left.push_back(Pod(1, 0, "Running"));
    if (policy == "All") left.clear();
    Plan q = Decide(In(After(job, p), left));
    EXPECT_EQ(q.status["ready"], ready_now) << policy;
    EXPECT_EQ(q.status["readyReplicas"], policy == "None" ? 1 : 0) << policy;
    EXPECT_EQ(q.status["activeReplicas"], policy == "None" ? 1 : 0) << policy;
    // The rank that kept running (None) finishes: nothing is ready any more.
    if (policy == "None") {
      Plan r = Decide(In(After(After(job, p), q), {Pod(0, 0, "Failed", 1), Pod(1, 0, "Succeeded", 0)}));
      EXPECT_EQ(r.status["ready"], "0/2");
    }
  }
  json deadline = RunningJob({{"runPolicy", {{"activeDeadlineSeconds", 60}}}});
  deadline["status"]["activeSeconds"] = 60;
  Plan d = Decide(In(deadline, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}, kT0 + seconds(1)));
  ASSERT_EQ(ConditionReason(d.status, "Failed"), "DeadlineExceeded");
  EXPECT_EQ(d.status["ready"], "0/2");
  EXPECT_EQ(Decide(In(After(deadline, d), {})).status["ready"], "0/2");
}

TEST(DecideTest, NeverPolicyFailsOnTheFirstFailure) {
  json job = RunningJob({{"runPolicy", {{"restartPolicy", "Never"}}}});
  Plan p = Decide(In(job, {Pod(0, 0, "Failed", 137), Pod(1, 0, "Running")}));
  EXPECT_EQ(ConditionReason(p.status, "Failed"), "RestartPolicyNever");
}

TEST(DecideTest, OnFailureRetriesEvenConfigExitCodes) {
  json job = RunningJob({{"runPolicy", {{"restartPolicy", "OnFailure"}}}});
  Plan p = Decide(In(job, {Pod(0, 0, "Failed", 2), Pod(1, 0, "Running")}));
  EXPECT_EQ(p.phase, "Restarting");
}

TEST(DecideTest, WithSuccessPolicyRank0ARankFailingAfterRankZeroDoesNotMatter) {
  // The other rank lost rank 0's store as rank 0 exited, and failed: the job still succeeded.
  json job = RunningJob({{"runPolicy", {{"successPolicy", "Rank0"}, {"restartPolicy", "Never"}}}});
  Plan p = Decide(In(job, {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Failed", 5)}));
  EXPECT_EQ(p.phase, "Succeeded");
  EXPECT_EQ(ConditionReason(p.status, "Succeeded"), "Rank0Succeeded");
  // With AllRanks (the default) that failure fails the job.
  json all = RunningJob({{"runPolicy", {{"restartPolicy", "Never"}}}});
  EXPECT_EQ(Decide(In(all, {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Failed", 5)})).phase, "Failed");
}

TEST(DecideTest, APodDeletedAfterLaunchRestartsTheGang) {
  json job = RunningJob();
  Plan p = Decide(In(job, {Pod(0, 0, "Running")}));
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_TRUE(p.create.empty());
  EXPECT_THAT(p.events[0].message, HasSubstr("pod tiny-1 was deleted"));
}

TEST(DecideTest, APodNotYetCreatedIsCreatedNotMournedBeforeLaunch) {
  json job = After(Job(), Decide(In(Job())));  // launchedGeneration not recorded yet
  Plan p = Decide(In(job, {Pod(0, 0, "Running")}));
  ASSERT_EQ(p.create.size(), 1u);
  EXPECT_EQ(p.create[0]["metadata"]["name"], "tiny-1");
  EXPECT_EQ(p.phase, "Created");
}

TEST(DecideTest, SuccessThenTtlDeletesTheJobAndNeverRecreatesPods) {
  json job = RunningJob({{"runPolicy", {{"ttlSecondsAfterFinished", 30}}}});
  Plan p = Decide(In(job, {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Succeeded", 0)}, kT0 + seconds(10)));
  EXPECT_EQ(p.phase, "Succeeded");
  EXPECT_EQ(ConditionReason(p.status, "Succeeded"), "AllRanksSucceeded");
  EXPECT_EQ(p.status["completionTime"], FormatTime(kT0 + seconds(10)));
  EXPECT_TRUE(p.remove.empty());  // finished Pods stay for their logs (cleanPodPolicy Running)
  EXPECT_TRUE(p.status_first);
  ASSERT_TRUE(p.requeue_after.has_value());
  json done = After(job, p);

  // kubeflow/trainer#2981: after the TTL deleted the Pods, the job was recreated in a loop.
  // A finished job with no Pods creates nothing.
  Plan early = Decide(In(done, {}, kT0 + seconds(20)));
  EXPECT_TRUE(early.create.empty());
  EXPECT_FALSE(early.ensure_service);
  EXPECT_FALSE(early.delete_job);
  ASSERT_TRUE(early.requeue_after.has_value());
  EXPECT_LE(*early.requeue_after, seconds(21));
  Plan late = Decide(In(done, {}, kT0 + seconds(41)));
  EXPECT_TRUE(late.delete_job);
  EXPECT_TRUE(late.create.empty());
}

TEST(DecideTest, SuspendDeletesThePodsAndResumeStartsANewGeneration) {
  json job = RunningJob();
  job["spec"]["runPolicy"] = {{"suspend", true}};
  Plan p = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}, kT0 + seconds(30)));
  EXPECT_EQ(p.phase, "Suspended");
  EXPECT_EQ(p.remove.size(), 2u);
  EXPECT_TRUE(p.create.empty());
  EXPECT_EQ(p.status["activeSeconds"], 30);
  EXPECT_FALSE(p.status.contains("startTime"));
  json suspended = After(job, p);

  suspended["spec"]["runPolicy"]["suspend"] = false;
  Plan r = Decide(In(suspended, {}, kT0 + seconds(100)));
  EXPECT_EQ(r.status["restartGeneration"], 1);
  EXPECT_EQ(r.status["restarts"], 0);  // a resume is not a failure
  EXPECT_FALSE(ConditionTrue(r.status, "Suspended"));
  ASSERT_EQ(r.create.size(), 2u);
  EXPECT_EQ(r.create[0]["metadata"]["labels"][kGenerationLabel], "1");
  EXPECT_EQ(r.status["startTime"], FormatTime(kT0 + seconds(100)));
}

TEST(DecideTest, DeadlineCountsActiveTimeOnlyAndStopsRunningPods) {
  json job = RunningJob({{"runPolicy", {{"activeDeadlineSeconds", 60}, {"cleanPodPolicy", "None"}}}});
  job["status"]["activeSeconds"] = 50;  // 50 s before a suspension
  Plan early = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}, kT0 + seconds(5)));
  EXPECT_EQ(early.phase, "Running");
  ASSERT_TRUE(early.requeue_after.has_value());
  EXPECT_LE(*early.requeue_after, seconds(5));
  Plan late = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Succeeded", 0)}, kT0 + seconds(10)));
  EXPECT_EQ(ConditionReason(late.status, "Failed"), "DeadlineExceeded");
  EXPECT_THAT(Names(late.remove), ::testing::ElementsAre("tiny-0"));  // running, despite None
}

TEST(DecideTest, InvalidSpecFailsOnceNamingTheFieldAndDoesNotLoop) {
  struct Case {
    json spec;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"image", ""}}, "spec.image: is required"},
      {{{"mesh", {{"dpShard", 3}}}}, "spec.mesh: dpReplicate x dpShard x tp = 1x3x1 = 3 does not equal"},
      {{{"config", {{"inline", nullptr}, {"configMapRef", {{"name", "x"}}}}}, {"replicas", 1}}, ""},
      {{{"runPolicy", {{"restartPolicy", "Never"}, {"permanentExitCodes", {2}}}}},
       "spec.runPolicy.permanentExitCodes: needs restartPolicy ExitCode"},
  };
  for (const auto& c : cases) {
    if (c.message.empty()) continue;
    json job = Job(c.spec);
    Plan p = Decide(In(job));
    EXPECT_EQ(p.phase, "Failed") << c.message;
    EXPECT_EQ(ConditionReason(p.status, "Failed"), "InvalidSpec") << c.message;
    EXPECT_THAT(p.status["conditions"].dump(), HasSubstr(c.message));
    EXPECT_TRUE(p.create.empty());
    ASSERT_FALSE(p.events.empty());
    EXPECT_EQ(p.events.back().reason, "InvalidSpec");
    Plan again = Decide(In(After(job, p), {}, kT0 + seconds(1)));
    EXPECT_EQ(again.status, After(job, p)["status"]) << c.message;
    EXPECT_TRUE(again.events.empty());
    EXPECT_FALSE(again.requeue_after.has_value());
  }
}

TEST(DecideTest, ConfigErrorIsInvalidSpec) {
  Observed in = In(Job());
  in.config_error = "spec.config.inline: the trainer refuses this config: key 'model.preset': ...";
  Plan p = Decide(in);
  EXPECT_EQ(ConditionReason(p.status, "Failed"), "InvalidSpec");
  EXPECT_TRUE(p.create.empty());
}

TEST(DecideTest, ScaleRestartsTheGangAtTheNewSize) {
  json job = RunningJob();
  job["spec"]["replicas"] = 1;
  Plan p = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}));
  // Every rank was started with world size 2: the whole gang goes, a new generation follows.
  EXPECT_TRUE(p.status_first);
  EXPECT_THAT(Names(p.remove), ::testing::UnorderedElementsAre("tiny-0", "tiny-1"));
  EXPECT_TRUE(p.create.empty());
  EXPECT_EQ(p.status["restartGeneration"], 1);
  EXPECT_EQ(p.status["restarts"], 0);  // not a failure
  EXPECT_EQ(ConditionReason(p.status, "Restarting"), "Resized");
  Plan q = Decide(In(After(job, p), {}));
  ASSERT_EQ(q.create.size(), 1u);
  EXPECT_EQ(q.create[0]["metadata"]["labels"][kWorldSizeLabel], "1");
}

// Without CEL (or with the schema's rules bypassed) an edit of a running tensor parallel job that
// breaks the mesh rules fails it naming the values, rather than starting a gang the mesh does
// not fit.
TEST(DecideTest, AnEditThatBreaksATensorParallelMeshIsInvalidSpec) {
  const json tp_mesh = {{"replicas", 2}, {"processesPerReplica", 2}, {"mesh", {{"dpShard", 2}, {"tp", 2}}}};
  json job = RunningJob(tp_mesh);
  EXPECT_EQ(job["status"]["meshShape"], "1x2x2");
  EXPECT_EQ(job["status"]["mesh"], json({{"dpReplicate", 1}, {"dpShard", 2}, {"tp", 2}, {"pp", 1}}));
  const std::vector<std::pair<json, std::string>> edits = {
      {{{"replicas", 3}},  // kubectl scale alone
       "spec.mesh: dpReplicate x dpShard x tp = 1x2x2 = 4 does not equal replicas x processesPerReplica = 3x2 = 6"},
      {{{"processesPerReplica", 3}, {"mesh", {{"dpShard", 3}}}},
       "spec.mesh.tp: 2 does not divide processesPerReplica 3"},
  };
  for (const auto& [edit, message] : edits) {
    json edited = job;
    edited["spec"].merge_patch(edit);
    Plan p = Decide(In(edited, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}));
    EXPECT_EQ(p.phase, "Failed") << message;
    EXPECT_EQ(ConditionReason(p.status, "Failed"), "InvalidSpec") << message;
    EXPECT_THAT(p.status["conditions"].dump(), HasSubstr(message));
    EXPECT_TRUE(p.create.empty());
  }
}

TEST(DecideTest, ResizeWithCheckpointsFailsInsteadOfCrashLooping) {
  json job = RunningJob({{"checkpoint", {{"path", "/ckpt"}}}});
  job["spec"]["replicas"] = 1;
  Plan p = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}));
  EXPECT_EQ(p.phase, "Failed");
  EXPECT_EQ(ConditionReason(p.status, "Failed"), "InvalidSpec");
  EXPECT_THAT(p.status["conditions"].dump(), HasSubstr("set spec.elasticPolicy to resize a job that checkpoints"));
  EXPECT_EQ(p.remove.size(), 2u);
}

// The fields of `status` the CRD's status schema does not declare, as paths: the API server prunes
// them from a status write, so the operator would never read them back.
void Undeclared(const json& value, const YAML::Node& schema, const std::string& path, std::vector<std::string>* out) {
  if (value.is_object()) {
    const YAML::Node props = schema["properties"];
    if (schema["x-kubernetes-preserve-unknown-fields"] || !props) return;
    for (const auto& [key, child] : value.items()) {
      if (!props[key]) {
        out->push_back(path + "." + key);
        continue;
      }
      Undeclared(child, props[key], path + "." + key, out);
    }
  } else if (value.is_array() && schema["items"]) {
    for (const auto& item : value) Undeclared(item, schema["items"], path + "[]", out);
  }
}

std::vector<std::string> UndeclaredStatusFields(const json& status) {
  const YAML::Node crd = YAML::LoadFile(MESHWORK_SOURCE_DIR "/crds/trainingjob.yaml");
  std::vector<std::string> out;
  Undeclared(status, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"], "status", &out);
  return out;
}

// An elastic job scaled down: the gang goes, the next starts at the new size with the global batch
// its config check found (training.global_batch_size on every rank), and when its rank 0 reports
// the step it resumed from, status.elastic.lastResize and an Event say it with both sizes.
TEST(DecideTest, AnElasticScaleStartsTheNewSizeAtTheSameGlobalBatchAndReportsTheStepItResumedFrom) {
  const json elastic = {{"checkpoint", {{"path", "/ckpt"}}}, {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 2}}}};
  json job = RunningJob(elastic);
  EXPECT_EQ(job["status"]["elastic"]["replicas"], 2);
  job["spec"]["replicas"] = 1;
  Plan p = Decide(In(job, {Pod(0, 0, "Running"), Pod(1, 0, "Running")}));
  EXPECT_NE(p.phase, "Failed");
  EXPECT_THAT(Names(p.remove), ::testing::UnorderedElementsAre("tiny-0", "tiny-1"));
  EXPECT_EQ(p.status["restartGeneration"], 1);
  EXPECT_EQ(p.status["restarts"], 0);
  EXPECT_EQ(p.status["elastic"]["lastResize"]["fromReplicas"], 2);
  EXPECT_EQ(p.status["elastic"]["lastResize"]["toReplicas"], 1);

  Observed next = In(After(job, p), {});
  next.check_config = [] {
    ConfigCheck c;
    c.global_batch_size = 32;
    return c;
  };
  Plan q = Decide(next);
  ASSERT_EQ(q.create.size(), 1u);
  EXPECT_THAT(q.create[0].dump(), HasSubstr("training.global_batch_size=32"));
  EXPECT_EQ(q.status["elastic"]["globalBatchSize"], 32);
  EXPECT_EQ(q.status["elastic"]["replicas"], 1);

  json running = After(After(job, p), q);
  json one_rank = Pod(0, 1, "Running");
  one_rank["metadata"]["labels"][kWorldSizeLabel] = "1";
  Observed reported = In(running, {one_rank});
  reported.report = TrainerReport{};
  reported.report->step = 41;
  reported.report->total_steps = 100;
  reported.report->resumed_from_step = 40;
  Plan r = Decide(reported);
  EXPECT_EQ(r.status["elastic"]["lastResize"]["resumedFromStep"], 40);
  EXPECT_THAT(UndeclaredStatusFields(r.status), ::testing::IsEmpty()) << "the API server would prune them";
  EXPECT_EQ(r.status["trainer"]["resumedFromStep"], 40);
  ASSERT_FALSE(r.events.empty());
  bool said = false;
  for (const auto& e : r.events) {
    said |= e.reason == "ResumedFromCheckpoint" &&
            e.message.find("at 1 replicas (resized from 2) resumed from the checkpoint of step 40 of 100") != std::string::npos;
  }
  EXPECT_TRUE(said) << r.status.dump();
}

// An elastic job with an explicit mesh keeps its tp on a resize; dpShard is what the new world
// leaves, in the Pods' overrides, their mesh label and status.mesh.
TEST(DecideTest, AnElasticScaleKeepsTheExplicitMeshsTpAndShardsOverWhatTheWorldLeaves) {
  const json elastic = {{"checkpoint", {{"path", "/ckpt"}}},
                        {"processesPerReplica", 2},
                        {"mesh", {{"tp", 2}}},
                        {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 2}}}};
  json job = RunningJob(elastic);
  EXPECT_EQ(job["status"]["meshShape"], "1x2x2");
  job["spec"]["replicas"] = 1;
  auto of_four = [](json pod) {  // the running gang: 2 Pods of 2 ranks
    pod["metadata"]["labels"][kWorldSizeLabel] = "4";
    pod["metadata"]["labels"][kMeshLabel] = "1x2x2";
    return pod;
  };
  Plan p = Decide(In(job, {of_four(Pod(0, 0, "Running")), of_four(Pod(1, 0, "Running"))}));
  EXPECT_NE(p.phase, "Failed") << p.status.dump();
  EXPECT_EQ(p.remove.size(), 2u);
  EXPECT_EQ(p.status["elastic"]["lastResize"]["toReplicas"], 1);
  Plan q = Decide(In(After(job, p), {}));
  ASSERT_EQ(q.create.size(), 1u);
  const std::string pod = q.create[0].dump();
  EXPECT_THAT(pod, HasSubstr("mesh.dp_shard=1"));
  EXPECT_THAT(pod, HasSubstr("mesh.tp=2"));
  EXPECT_EQ(q.create[0]["metadata"]["labels"][kMeshLabel], "1x1x2");
  EXPECT_EQ(q.status["meshShape"], "1x1x2");
  EXPECT_EQ(q.status["mesh"]["dpShard"], 1);
  EXPECT_EQ(q.status["mesh"]["tp"], 2);
  EXPECT_EQ(q.status["worldSize"], 2);
}

// An elastic job that loses a node goes on without it (a disruption, not a failure) and grows
// back to spec.replicas once the node is Ready again.
TEST(DecideTest, AnElasticJobShrinksWhenANodeIsLostAndGrowsBackWhenItReturns) {
  const json elastic = {{"checkpoint", {{"path", "/ckpt"}}},
                        {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 2}}},
                        {"runPolicy", {{"backoffLimit", 0}, {"nodeLossGraceSeconds", 5}}}};
  json job = RunningJob(elastic);
  auto on = [](json pod, const std::string& node) {
    pod["spec"]["nodeName"] = node;
    return pod;
  };
  NodeHealth down;
  down.ready = "Unknown";
  down.since = kT0 - std::chrono::seconds(60);
  Observed lost = In(job, {on(Pod(0, 0, "Running"), "node-b"), on(Pod(1, 0, "Running"), "node-a")});
  lost.unhealthy_nodes["node-a"] = down;
  Plan p = Decide(lost);
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_EQ(p.status["restarts"], 0);
  EXPECT_EQ(p.status["disruptionRestarts"], 1);
  EXPECT_EQ(p.status["elastic"]["replicas"], 1);
  EXPECT_EQ(p.status["elastic"]["shrunkFrom"], 2);
  EXPECT_EQ(p.status["elastic"]["lostNodes"], json::array({"node-a"}));
  EXPECT_EQ(p.status["elastic"]["lastResize"]["reason"], "NodeLost");
  EXPECT_THAT(UndeclaredStatusFields(p.status), ::testing::IsEmpty()) << "the API server would prune them";
  EXPECT_THAT(p.events.at(0).message, HasSubstr("the elastic job goes on at 1 replicas without the lost node(s)"));

  // The next gang: one Pod, world size 1, while node-a stays down.
  Observed smaller = In(After(job, p), {});
  smaller.unhealthy_nodes["node-a"] = down;
  Plan q = Decide(smaller);
  ASSERT_EQ(q.create.size(), 1u);
  EXPECT_EQ(q.create[0]["metadata"]["labels"][kWorldSizeLabel], "1");
  EXPECT_EQ(q.status["replicas"], 1);
  EXPECT_EQ(q.status["worldSize"], 1);

  // node-a is back: the job grows to its 2 replicas, a resize (a new gang, from the checkpoint).
  json one_rank = on(Pod(0, 1, "Running"), "node-b");
  one_rank["metadata"]["labels"][kWorldSizeLabel] = "1";
  json shrunk = After(After(job, p), q);
  shrunk["status"]["launchedGeneration"] = 1;
  Plan r = Decide(In(shrunk, {one_rank}));
  EXPECT_EQ(r.status["restartGeneration"], 2);
  EXPECT_EQ(ConditionReason(r.status, "Restarting"), "Resized");
  EXPECT_FALSE(r.status["elastic"].contains("shrunkFrom"));
  EXPECT_FALSE(r.status["elastic"].contains("lostNodes"));
  EXPECT_EQ(r.status["elastic"]["lastResize"]["toReplicas"], 2);
  bool grew = false;
  for (const auto& e : r.events) {
    grew |= e.reason == "ElasticGrow" &&
            e.message == "node node-a is back (Ready, schedulable, untainted): the job grows back to spec.replicas 2";
  }
  EXPECT_TRUE(grew);
  EXPECT_EQ(Names(r.remove), std::vector<std::string>{"tiny-0"});
  Plan next = Decide(In(After(shrunk, r), {}));
  EXPECT_EQ(next.create.size(), 2u);
}

// While shrunk: the job looks at its lost nodes again within 10 s (nothing else would wake it);
// room for the whole gang elsewhere ends the shrink; a scale ends it at the new size; Kueue's
// admitted count caps the size.
TEST(DecideTest, AShrunkElasticJobLooksAgainEndsTheShrinkOnAScaleAndKueueCapsIt) {
  json job = RunningJob({{"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 3}}}, {"replicas", 3}});
  job["status"]["elastic"]["shrunkFrom"] = 3;
  job["status"]["elastic"]["shrunkTo"] = 2;
  job["status"]["elastic"]["lostNodes"] = json::array({"node-a"});
  NodeHealth down;
  down.ready = "Unknown";
  Observed still_down = In(job);
  still_down.unhealthy_nodes["node-a"] = down;
  Plan p = Decide(still_down);
  EXPECT_EQ(p.gang_replicas, 2);
  ASSERT_TRUE(p.requeue_after.has_value());
  EXPECT_LE(p.requeue_after->count(), 10);

  // Room for the whole gang elsewhere (gang admission's fit): it grows back without node-a.
  Observed room = still_down;
  room.room_for_spec = "its 3 Pods fit the Ready nodes";
  Plan grown = Decide(room);
  EXPECT_EQ(grown.gang_replicas, 3);
  EXPECT_FALSE(grown.status["elastic"].contains("shrunkFrom"));
  EXPECT_FALSE(grown.status["elastic"].contains("lostNodes"));
  bool said = false;
  for (const auto& e : grown.events) {
    said |= e.reason == "ElasticGrow" &&
            e.message == "the cluster has room for spec.replicas 3 again (its 3 Pods fit the Ready nodes) while node(s) "
                         "node-a stay lost: the job grows back";
  }
  EXPECT_TRUE(said);

  still_down.admitted_replicas = 1;  // Kueue admitted one Pod
  EXPECT_EQ(Decide(still_down).gang_replicas, 1);

  json scaled = job;
  scaled["spec"]["replicas"] = 1;
  Observed after_scale = In(scaled);
  after_scale.unhealthy_nodes["node-a"] = down;
  Plan q = Decide(after_scale);
  EXPECT_EQ(q.gang_replicas, 1);
  EXPECT_FALSE(q.status["elastic"].contains("shrunkFrom"));
  EXPECT_FALSE(q.status["elastic"].contains("lostNodes"));
}

// Below minReplicas the gang restarts at its size (and waits for room) rather than shrinking.
TEST(DecideTest, AnElasticJobAtMinReplicasRestartsAtItsSizeAfterANodeLoss) {
  json job = RunningJob({{"elasticPolicy", {{"minReplicas", 2}, {"maxReplicas", 2}}}});
  json pod = Pod(1, 0, "Running");
  pod["spec"]["nodeName"] = "node-a";
  Observed lost = In(job, {Pod(0, 0, "Running"), pod});
  NodeHealth gone;
  gone.deleted = true;
  lost.unhealthy_nodes["node-a"] = gone;
  Plan p = Decide(lost);
  EXPECT_EQ(p.status["disruptionRestarts"], 1);
  EXPECT_FALSE(p.status["elastic"].contains("shrunkFrom"));
  EXPECT_EQ(p.status["elastic"]["replicas"], 2);
}

TEST(DecideTest, AMissingConfigMapHoldsTheLaunch) {
  Observed in = In(Job());
  in.config_wait = "waiting for ConfigMap ml/cfg (spec.config.configMapRef.name)";
  Plan p = Decide(in);
  EXPECT_TRUE(p.create.empty());
  EXPECT_EQ(p.phase, "Created");
  EXPECT_EQ(ConditionReason(p.status, "Running"), "ConfigMapNotReady");
  ASSERT_TRUE(p.requeue_after.has_value());
}

// The config check's pipeline (ValidateTrainerConfig) is recorded when a gang starts, and goes
// when the next gang's config has no pipeline stages.
TEST(DecideTest, TheGangsPipelineScheduleGoesIntoStatus) {
  const json pipeline = {{"schedule", "1f1b"}, {"microBatches", 4}, {"virtualStages", 1}, {"stages", 2},
                         {"scheduleBubble", 0.2}};
  Observed in = In(Job());
  in.check_config = [&] { return ConfigCheck{std::nullopt, std::nullopt, pipeline}; };
  Plan p = Decide(in);
  ASSERT_EQ(p.create.size(), 2u);
  EXPECT_EQ(p.status["pipeline"], pipeline);
  Observed next = In(After(Job(), p));
  next.check_config = [] { return ConfigCheck{}; };
  p = Decide(next);
  EXPECT_FALSE(p.status.contains("pipeline")) << p.status.dump();
}

TEST(DecideTest, TtlCountsFromAFailureToo) {
  json job = RunningJob({{"runPolicy", {{"ttlSecondsAfterFinished", 60}, {"restartPolicy", "Never"}}}});
  Plan p = Decide(In(job, {Pod(0, 0, "Failed", 1), Pod(1, 0, "Running")}));
  EXPECT_EQ(p.phase, "Failed");
  ASSERT_TRUE(p.requeue_after.has_value());
  EXPECT_EQ(*p.requeue_after, seconds(61));
}

TEST(DecideTest, ReportGoesIntoStatus) {
  Observed in = In(RunningJob(), {Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  in.report = TrainerReport{120, 300, 2.5, 4000, "", std::nullopt};
  Plan p = Decide(in);
  EXPECT_EQ(p.status["trainer"]["step"], 120);
  EXPECT_EQ(p.status["trainer"]["totalSteps"], 300);
  EXPECT_DOUBLE_EQ(p.status["trainer"]["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(p.status["trainer"]["tokensPerSecond"].get<double>(), 8000);  // rank 0's x world size
}

// The trainer's plan advice (its refitted compute rate) is kept in status.calibration, beside
// the plan's profile, and written again only when it changes.
TEST(DecideTest, TheRefittedComputeRateGoesIntoStatusCalibration) {
  json job = RunningJob();
  job["status"]["plan"] = {{"hardwareProfile", "cpu ranks"}};
  const std::vector<json> pods = {Pod(0, 0, "Running"), Pod(1, 0, "Running")};
  Observed before = In(job, pods);
  before.report = TrainerReport{5, 300, 2.5, 4000, "", std::nullopt};
  Plan none = Decide(before);
  EXPECT_FALSE(none.status.contains("calibration")) << "not advised yet";

  Observed in = In(job, pods);
  in.report = TrainerReport{12, 300, 2.5, 4000, "", std::nullopt};
  in.report->plan_fitted_mfu = 0.031234;
  in.report->plan_predicted_speedup = 1.2567;
  Plan p = Decide(in);
  const json& c = p.status["calibration"];
  EXPECT_DOUBLE_EQ(c["achievedMfu"].get<double>(), 0.0312);
  EXPECT_DOUBLE_EQ(c["predictedSpeedup"].get<double>(), 1.257);
  EXPECT_EQ(c["hardwareProfile"], "cpu ranks");
  EXPECT_EQ(c["generation"], 0);
  EXPECT_EQ(c["updateTime"], FormatTime(kT0));
  EXPECT_THAT(UndeclaredStatusFields(p.status), ::testing::IsEmpty()) << "the API server would prune them";

  // The same advice later: the status keeps the first write's time.
  Observed again = In(After(job, p), pods, kT0 + seconds(30));
  again.report = in.report;
  again.report->step = 20;
  Plan q = Decide(again);
  EXPECT_EQ(q.status["calibration"]["updateTime"], FormatTime(kT0));
}

TEST(DecideTest, TimesRoundTrip) {
  EXPECT_EQ(FormatTime(kT0), "2027-01-15T08:00:00Z");
  EXPECT_EQ(ParseTime("2027-01-15T08:00:00Z"), kT0);
  EXPECT_EQ(ParseTime("2027-01-15T08:00:00.123456Z"), kT0);
  EXPECT_FALSE(ParseTime("2027-01-15 08:00:00").has_value());
  EXPECT_FALSE(ParseTime("").has_value());
}

}  // namespace
}  // namespace meshwork::op
