// What every policy relies on (policy.cpp): Apply, the one place a decision reaches the plan;
// Finish; cleanPodPolicy; the current gang and its counts.
#include "operator/controller/policy/policy.h"

#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

TEST(ApplyTest, SetsConditionsFieldsAndThePhaseInTheStatus) {
  Plan plan;
  plan.status = {{"startTime", "x"}, {"restarts", 1}};
  Decision d;
  d.phase = "Restarting";
  d.conditions = {{"Restarting", "True", "GangRestart", "m"}};
  d.status = {{"restarts", 2}, {"startTime", nullptr}};
  Apply(d, plan, kT0);
  EXPECT_EQ(plan.phase, "Restarting");
  EXPECT_EQ(plan.status["phase"], "Restarting");
  EXPECT_EQ(plan.status["restarts"], 2);
  EXPECT_FALSE(plan.status.contains("startTime"));  // null removes a field
  EXPECT_TRUE(ConditionTrue(plan.status, "Restarting"));
}

TEST(ApplyTest, AnAdjustmentLeavesThePhaseAlone) {
  Plan plan;
  plan.status = {{"phase", "Running"}};
  plan.phase = "";
  Decision d;
  d.status = {{"restartGeneration", 1}};
  Apply(d, plan, kT0);
  EXPECT_EQ(plan.phase, "");
  EXPECT_EQ(plan.status["phase"], "Running");
}

TEST(ApplyTest, RequeuesNoLaterThanAskedBeforeAndNeverUnderASecond) {
  struct Case {
    std::optional<seconds> before, asked, want;
  };
  for (const auto& c : std::vector<Case>{{std::nullopt, seconds(5), seconds(5)},
                                         {seconds(3), seconds(5), seconds(3)},
                                         {seconds(10), seconds(5), seconds(5)},
                                         {std::nullopt, seconds(0), seconds(1)},
                                         {seconds(7), std::nullopt, seconds(7)}}) {
    Plan plan;
    plan.requeue_after = c.before;
    Decision d;
    d.requeue_after = c.asked;
    Apply(d, plan, kT0);
    EXPECT_EQ(plan.requeue_after, c.want);
  }
}

TEST(ApplyTest, AppendsPodsAndEventsAndOrsTheFlags) {
  Plan plan;
  plan.events = {{"Normal", "Created", "m"}};
  plan.status_first = true;
  Decision d;
  d.events = {{"Warning", "GangRestart", "m"}};
  d.remove = {ViewPod(Pod(0, 0, "Running"))};
  d.ensure_service = true;
  Apply(d, plan, kT0);
  EXPECT_THAT(Reasons(plan.events), ElementsAre("Created", "GangRestart"));
  EXPECT_THAT(Names(plan.remove), ElementsAre("tiny-0"));
  EXPECT_TRUE(plan.status_first);
  EXPECT_TRUE(plan.ensure_service);
  EXPECT_FALSE(plan.ensure_config_map);
}

TEST(FinishTest, EndsTheJobAndRecordsTheOutcomeFirst) {
  for (const bool restarting : {false, true}) {
    json status = {{"conditions", json::array({Condition("Restarting", restarting ? "True" : "False")})}};
    Decision d = Finish(status, "Failed", "DeadlineExceeded", "too long", kT0);
    EXPECT_EQ(d.phase, "Failed");
    EXPECT_EQ(ReasonOf(d, "Failed"), "DeadlineExceeded");
    EXPECT_EQ(ReasonOf(d, "Running"), "DeadlineExceeded");
    EXPECT_EQ(ReasonOf(d, "Restarting"), restarting ? "DeadlineExceeded" : "");
    EXPECT_EQ(d.status["completionTime"], FormatTime(kT0));
    EXPECT_TRUE(d.status_first);
    ASSERT_EQ(d.events.size(), 1u);
    EXPECT_EQ(d.events[0].type, "Warning");
  }
  EXPECT_EQ(Finish(json::object(), "Succeeded", "AllRanksSucceeded", "", kT0).events[0].type, "Normal");
}

TEST(CleanTest, RemovesWhatThePolicySaysAndNeverATerminatingPod) {
  const std::vector<PodView> pods = {ViewPod(Pod(0, 0, "Running")), ViewPod(Pod(1, 0, "Succeeded")),
                                     ViewPod(Terminating(Pod(2, 0, "Running")))};
  EXPECT_THAT(Names(Clean(CleanPodPolicy::kAll, pods)), ElementsAre("tiny-0", "tiny-1"));
  EXPECT_THAT(Names(Clean(CleanPodPolicy::kRunning, pods)), ElementsAre("tiny-0"));
  EXPECT_TRUE(Clean(CleanPodPolicy::kNone, pods).empty());
}

TEST(JobStateTest, TheCurrentGangIsTheStatusGenerationWithinReplicas) {
  State s(Job({}, {{"restartGeneration", 1}}),
          {Pod(0, 0, "Running"), Pod(0, 1, "Running"), Pod(2, 1, "Running"), Pod(1, 1, "Pending")});
  const JobState job = s.Get();
  EXPECT_EQ(job.generation(), 1);
  EXPECT_THAT(Names(job.Current()), UnorderedElementsAre("tiny-0", "tiny-1"));
  EXPECT_TRUE(job.Missing().empty());
  State fresh(Job(), {Pod(1, 0, "Running")});
  EXPECT_THAT(fresh.Get().Missing(), ElementsAre(0));
}

// A diverged run reports a NaN loss: JSON has no NaN (it would go out as null, which the API
// server prunes), so the field is left out, and the rest of the report still goes.
TEST(ReportJsonTest, ANonFiniteLossOrRateIsLeftOut) {
  TrainerReport r;
  r.step = 7;
  r.total_steps = 10;
  r.loss = std::nan("");
  r.tokens_per_second = std::numeric_limits<double>::infinity();
  const json report = ReportJson(r, SystemTime{}, 2);
  EXPECT_FALSE(report.contains("loss"));
  EXPECT_FALSE(report.contains("tokensPerSecond"));
  EXPECT_EQ(report["step"], 7);
  EXPECT_EQ(report.dump().find("null"), std::string::npos) << report.dump();
  r.loss = 2.34567;
  r.tokens_per_second = 100;
  EXPECT_DOUBLE_EQ(ReportJson(r, SystemTime{}, 2)["loss"].get<double>(), 2.3457);
  EXPECT_DOUBLE_EQ(ReportJson(r, SystemTime{}, 2)["tokensPerSecond"].get<double>(), 200.0);
}

TEST(CountsTest, CountTheCurrentGang) {
  json ready_but_gone = Terminating(Pod(1, 0, "Running"));
  State s(Job(), {Pod(0, 0, "Running"), ready_but_gone, Pod(0, 1, "Failed")});
  const json counts = Counts(s.Get());
  EXPECT_EQ(counts["replicas"], 2);
  EXPECT_EQ(counts["readyReplicas"], 1);  // a terminating Pod is neither ready nor active
  EXPECT_EQ(counts["activeReplicas"], 1);
  EXPECT_EQ(counts["failedReplicas"], 0);  // generation 1 is not the current gang
  EXPECT_EQ(counts["ready"], "1/2");
}

}  // namespace
}  // namespace meshwork::op::policy
