// Starting the gang and reporting how far it got (launch.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/controller/gang.h"
#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> CreatedNames(const Decision& d) {
  std::vector<std::string> out;
  for (const auto& pod : d.create) out.push_back(pod["metadata"]["name"]);
  return out;
}

TEST(LaunchTest, ANewJobGetsItsServiceConfigAndEveryRank) {
  const Decision d = Launch(State(Job()).Get());
  EXPECT_THAT(CreatedNames(d), ElementsAre("tiny-0", "tiny-1"));
  EXPECT_TRUE(d.ensure_service);
  EXPECT_TRUE(d.ensure_config_map);
  EXPECT_EQ(d.phase, "Created");
  EXPECT_EQ(d.status["startTime"], FormatTime(kT0));
  EXPECT_FALSE(d.status.contains("launchedGeneration"));  // the executor records it once all are created
  EXPECT_EQ(ReasonOf(d, "Running"), "PodsStarting");
  EXPECT_EQ(d.conditions.at(0).message, "0 of 2 pod(s) started");
  EXPECT_FALSE(d.requeue_after.has_value());  // no Pods to scrape yet
}

TEST(LaunchTest, OnlyMissingRanksAreCreatedWithTheCurrentGeneration) {
  State s(Job({{"config", {{"inline", nullptr}, {"configMapRef", {{"name", "cfg"}}}}}},
              {{"restartGeneration", 3}, {"startTime", FormatTime(kT0)}}),
          {Pod(1, 3, "Pending")});
  s.in().service_exists = true;
  const Decision d = Launch(s.Get());
  EXPECT_THAT(CreatedNames(d), ElementsAre("tiny-0"));
  EXPECT_EQ(d.create[0]["metadata"]["labels"][kGenerationLabel], "3");
  EXPECT_TRUE(d.ensure_service);       // creating Pods: make sure the Service is there
  EXPECT_FALSE(d.ensure_config_map);   // configMapRef: the user's ConfigMap
  EXPECT_FALSE(d.status.contains("startTime"));  // kept
}

TEST(LaunchTest, TheGangRunsOnceEveryRankRuns) {
  struct Case {
    std::string name;
    json status;
    std::vector<std::string> events;
    std::vector<std::string> conditions;  // type=reason
  };
  const std::vector<Case> cases = {
      {"first time", json::object(), {"Running"}, {"Running=AllPodsRunning"}},
      {"already running", {{"conditions", json::array({Condition("Running", "True", "AllPodsRunning")})}}, {},
       {"Running=AllPodsRunning"}},
      {"after a restart", {{"conditions", json::array({Condition("Restarting", "True")})}}, {"Running"},
       {"Running=AllPodsRunning", "Restarting=GangRunning"}},
  };
  for (const auto& c : cases) {
    const Decision d = Launch(State(Job({}, c.status), {Pod(0, 0, "Running"), Pod(1, 0, "Succeeded", 0)}).Get());
    EXPECT_EQ(d.phase, "Running") << c.name;
    EXPECT_THAT(d.create, IsEmpty());
    EXPECT_FALSE(d.ensure_service);  // it exists, and no Pod is missing
    EXPECT_EQ(d.status["launchedGeneration"], 0);
    EXPECT_EQ(Reasons(d.events), c.events) << c.name;
    std::vector<std::string> conditions;
    for (const auto& cond : d.conditions) conditions.push_back(cond.type + "=" + cond.reason);
    EXPECT_EQ(conditions, c.conditions) << c.name;
    EXPECT_EQ(d.requeue_after, seconds(10)) << c.name;  // the report interval: scrape rank 0 again
  }
}

TEST(LaunchTest, AWaitingRankSaysWhy) {
  json pending = Pod(1, 0, "Pending");
  pending["status"]["conditions"] =
      json::array({{{"type", "PodScheduled"}, {"status", "False"}, {"reason", "Unschedulable"}, {"message", "no node"}}});
  const json restarting = {{"conditions", json::array({Condition("Restarting", "True")})}};
  const Decision d = Launch(State(Job({}, restarting), {Pod(0, 0, "Running"), pending}).Get());
  EXPECT_EQ(d.phase, "Restarting");
  EXPECT_EQ(d.conditions.at(0).message, "1 of 2 pod(s) started; tiny-1: Unschedulable (no node)");
}

// Normal progress (containers being created, the operator's own gang gate) is not written into
// the condition, so each step a Pod takes does not cost a status write; another party's gate and
// a container that cannot start still show.
TEST(LaunchTest, RoutineWaitsAreNotReportedButOtherReasonsAre) {
  auto waiting = [](const std::string& reason, const std::string& message, bool our_gate) {
    json pod = Pod(1, 0, "Pending");
    if (reason == "SchedulingGated") {
      pod["status"]["conditions"] =
          json::array({{{"type", "PodScheduled"}, {"status", "False"}, {"reason", reason}, {"message", message}}});
      pod["spec"]["schedulingGates"] = json::array({{{"name", our_gate ? kGangGate : "example.com/quota"}}});
    } else {
      pod["status"]["containerStatuses"] = json::array(
          {{{"name", kTrainerContainer}, {"state", {{"waiting", {{"reason", reason}, {"message", message}}}}}}});
    }
    return Launch(State(Job(), {Pod(0, 0, "Running"), pod}).Get()).conditions.at(0).message;
  };
  EXPECT_EQ(waiting("ContainerCreating", "", false), "1 of 2 pod(s) started");
  EXPECT_EQ(waiting("PodInitializing", "", false), "1 of 2 pod(s) started");
  EXPECT_EQ(waiting("SchedulingGated", "gated", true), "1 of 2 pod(s) started");
  EXPECT_EQ(waiting("SchedulingGated", "gated", false), "1 of 2 pod(s) started; tiny-1: SchedulingGated (gated)");
  EXPECT_EQ(waiting("ErrImagePull", "no such image", false),
            "1 of 2 pod(s) started; tiny-1: ErrImagePull (no such image)");
}

TEST(LaunchTest, RankZerosReportGoesIntoTheStatus) {
  State s(Job({{"metricsPort", 0}}), {Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  s.in().report = TrainerReport{120, 300, 2.5, 4000, "", std::nullopt};
  const Decision d = Launch(s.Get());
  EXPECT_EQ(d.status["trainer"]["step"], 120);
  EXPECT_DOUBLE_EQ(d.status["trainer"]["tokensPerSecond"].get<double>(), 8000);  // rank 0's x world size
  EXPECT_FALSE(d.requeue_after.has_value());  // metrics off: nothing to scrape
}

// Progress a person reads: percent of the steps, and an ETA from the rate since the last report.
TEST(LaunchTest, ProgressAndEtaFromTwoReports) {
  State first(Job({{"metricsPort", 0}}), {Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  first.in().report = TrainerReport{100, 400, 2.5, 4000, "", std::nullopt};
  Decision d = Launch(first.Get());
  EXPECT_DOUBLE_EQ(d.status["trainer"]["percent"].get<double>(), 25.0);
  EXPECT_EQ(d.status["trainer"]["progress"], "25.0%");
  EXPECT_FALSE(d.status["trainer"].contains("eta"));  // one report gives no rate
  EXPECT_THAT(Reasons(d.events), ElementsAre("Running"));  // a first gang past step 0 has not resumed
  // 50 steps in 100 s later: 250 steps left at 2 s each.
  json status = {{"trainer", d.status["trainer"]}};
  State second(Job({{"metricsPort", 0}}, status), {Pod(0, 0, "Running"), Pod(1, 0, "Running")}, kT0 + seconds(100));
  second.in().report = TrainerReport{150, 400, 2.4, 4000, "", std::nullopt};
  d = Launch(second.Get());
  EXPECT_EQ(d.status["trainer"]["etaSeconds"], 500);
  EXPECT_EQ(d.status["trainer"]["eta"], "8m20s");
  EXPECT_EQ(d.status["trainer"]["progress"], "37.5%");
  EXPECT_THAT(Reasons(d.events), ElementsAre("Running"));
  EXPECT_EQ(FormatDuration(7620), "2h07m");
  EXPECT_EQ(FormatDuration(42), "42s");
}

// STEP goes back only by a checkpoint, and an Event says which: a new gang that starts past 0
// resumed; the same gang reporting less than before restarted in place (counted).
TEST(LaunchTest, AStepThatGoesBackIsARestartInPlaceAndANewGangPastZeroResumed) {
  json status = {{"trainer", {{"step", 88}, {"totalSteps", 200}, {"generation", 0}, {"updateTime", FormatTime(kT0)}}}};
  State same(Job({{"metricsPort", 0}}, status), {Pod(0, 0, "Running"), Pod(1, 0, "Running")}, kT0 + seconds(30));
  same.in().report = TrainerReport{50, 200, 3.0, 4000, "", std::nullopt};
  Decision d = Launch(same.Get());
  EXPECT_EQ(d.status["inPlaceRestarts"], 1);
  ASSERT_THAT(Reasons(d.events), ElementsAre("Running", "GangRestartedInPlace"));
  EXPECT_THAT(d.events[1].message, ::testing::HasSubstr("step 50 after 88"));
  EXPECT_FALSE(d.status["trainer"].contains("eta"));  // no rate across the restart

  json restarted = {{"restartGeneration", 1}, {"restarts", 1}, {"trainer", status["trainer"]}};
  State next(Job({{"metricsPort", 0}}, restarted), {Pod(0, 1, "Running"), Pod(1, 1, "Running")}, kT0 + seconds(60));
  next.in().report = TrainerReport{80, 200, 3.0, 4000, "", std::nullopt};
  d = Launch(next.Get());
  EXPECT_FALSE(d.status.contains("inPlaceRestarts"));
  ASSERT_THAT(Reasons(d.events), ElementsAre("Running", "ResumedFromCheckpoint"));
  EXPECT_THAT(d.events[1].message, ::testing::HasSubstr("step 80 of 200 (the previous one reached 88)"));
  EXPECT_EQ(d.status["trainer"]["generation"], 1);
}

// mesh: auto: the status shows the mesh rank 0 chose, once it reports one of the gang's size.
TEST(LaunchTest, WithMeshAutoTheReportedMeshGoesIntoTheStatus) {
  State s(Job({{"metricsPort", 0}, {"mesh", {{"auto", true}}}}), {Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  TrainerReport report{120, 300, 2.5, 4000, "", std::nullopt};
  report.mesh = "2x1x1";
  s.in().report = report;
  Decision d = Launch(s.Get());
  EXPECT_EQ(d.status["meshShape"], "2x1x1");
  EXPECT_EQ(d.status["mesh"], json::parse(R"({"dpReplicate": 2, "dpShard": 1, "tp": 1, "pp": 1})"));
  EXPECT_THAT(d.conditions.at(0).message, ::testing::HasSubstr("mesh auto (rank 0 chooses dpReplicate x dpShard)"));
  // A mesh of another size (a stale scrape) or none is not taken.
  for (const std::string bad : {"1x4x1", "", "2x1"}) {
    report.mesh = bad;
    s.in().report = report;
    d = Launch(s.Get());
    EXPECT_FALSE(d.status.contains("meshShape")) << bad;
  }
  // An explicit mesh is the spec's, whatever the trainer says.
  State e(Job({{"metricsPort", 0}}), {Pod(0, 0, "Running"), Pod(1, 0, "Running")});
  report.mesh = "2x1x1";
  e.in().report = report;
  EXPECT_FALSE(Launch(e.Get()).status.contains("meshShape"));
}

TEST(AwaitConfigTest, TheGangWaitsForItsConfigMap) {
  const std::string why = "waiting for ConfigMap ml/cfg (spec.config.configMapRef.name)";
  for (const auto& [status, phase] : std::vector<std::pair<json, std::string>>{
           {json::object(), "Created"}, {{{"conditions", json::array({Condition("Restarting", "True")})}}, "Restarting"}}) {
    const Decision d = AwaitConfig(State(Job({}, status)).Get(), why);
    EXPECT_EQ(d.phase, phase);
    EXPECT_EQ(ReasonOf(d, "Running"), "ConfigMapNotReady");
    ASSERT_EQ(d.events.size(), 1u);
    EXPECT_EQ(d.events[0].type, "Warning");
    EXPECT_EQ(d.events[0].message, why);
    EXPECT_THAT(d.create, IsEmpty());
    EXPECT_EQ(d.requeue_after, seconds(10));
  }
}

}  // namespace
}  // namespace meshwork::op::policy
