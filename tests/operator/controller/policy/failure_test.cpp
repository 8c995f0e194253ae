// Gang failure: restart, permanent failure, backoffLimit (failure.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

// Launched gang 0 of a job with `run_policy`, `restarts` restarts so far.
State Launched(const json& run_policy, std::vector<json> pods, int restarts = 0) {
  return State(Job({{"runPolicy", run_policy}},
                   {{"restartGeneration", 0}, {"restarts", restarts}, {"launchedGeneration", 0}}),
               std::move(pods));
}

TEST(FailureTest, NoOpinionWithoutAFailedOrDeletedRank) {
  EXPECT_FALSE(Failure(Launched({}, {Pod(0, 0, "Running"), Pod(1, 0, "Succeeded", 0)}).Get()).has_value());
  // Not launched yet: a missing rank is created, not mourned.
  EXPECT_FALSE(Failure(State(Job(), {Pod(0, 0, "Running")}).Get()).has_value());
  // A failed Pod of an older gang is not this gang's failure.
  EXPECT_FALSE(Failure(Launched({}, {Pod(0, 0, "Running"), Pod(1, 0, "Running"), Pod(0, 7, "Failed", 1)}).Get())
                   .has_value());
}

TEST(FailureTest, RestartPolicyAndExitCodeDecideBetweenARestartAndTheEnd) {
  struct Case {
    std::string restart_policy;  // "" = the default, ExitCode
    int exit_code;
    std::string phase;
    std::string reason;  // of Failed, or of Restarting
  };
  for (const auto& c : std::vector<Case>{{"", 137, "Restarting", "GangRestart"},
                                         {"", 2, "Failed", "PermanentExitCode"},
                                         {"", 3, "Failed", "PermanentExitCode"},
                                         {"ExitCode", 1, "Restarting", "GangRestart"},
                                         {"OnFailure", 2, "Restarting", "GangRestart"},
                                         {"Never", 137, "Failed", "RestartPolicyNever"}}) {
    const json rp = c.restart_policy.empty() ? json::object() : json{{"restartPolicy", c.restart_policy}};
    const auto d = Failure(Launched(rp, {Pod(0, 0, "Running"), Pod(1, 0, "Failed", c.exit_code)}).Get());
    ASSERT_TRUE(d.has_value()) << c.restart_policy << " " << c.exit_code;
    EXPECT_EQ(d->phase, c.phase) << c.restart_policy << " " << c.exit_code;
    EXPECT_EQ(ReasonOf(*d, c.phase == "Failed" ? "Failed" : "Restarting"), c.reason);
  }
}

TEST(FailureTest, ARestartReplacesTheWholeGangWithTheNextGeneration) {
  const auto d = Failure(Launched({{"backoffLimit", 3}}, {Pod(0, 0, "Running"), Pod(1, 0, "Failed", 137),
                                                          Terminating(Pod(0, 7, "Running"))}, 1)
                             .Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->status, json({{"restarts", 2}, {"restartGeneration", 1}}));
  EXPECT_EQ(ReasonOf(*d, "Running"), "GangRestart");
  EXPECT_THAT(Names(d->remove), UnorderedElementsAre("tiny-0", "tiny-1"));  // every rank, not just the failed one
  EXPECT_TRUE(d->status_first);
  ASSERT_EQ(d->events.size(), 1u);
  EXPECT_EQ(d->events[0].type, "Warning");
  EXPECT_EQ(d->events[0].message,
            "pod tiny-1 exited with code 137 (signal 9), reason Error; restarting the gang (restart 2 of 3)");
}

TEST(FailureTest, ADeletedRankOfALaunchedGangIsAFailure) {
  for (const auto& [policy, phase] : std::vector<std::pair<std::string, std::string>>{
           {"ExitCode", "Restarting"}, {"OnFailure", "Restarting"}, {"Never", "Failed"}}) {
    const auto d = Failure(Launched({{"restartPolicy", policy}}, {Pod(0, 0, "Running")}).Get());
    ASSERT_TRUE(d.has_value()) << policy;
    EXPECT_EQ(d->phase, phase) << policy;
    EXPECT_THAT(d->events.at(0).message, HasSubstr("pod tiny-1 was deleted")) << policy;
  }
}

TEST(FailureTest, TheBackoffLimitEndsTheJobAndCleanPodPolicyStillApplies) {
  // kubeflow/training-operator#2045 (ExitCode ignored backoffLimit), kubeflow/trainer#3419
  // (cleanPodPolicy ignored when the backoff limit tripped).
  for (const auto& [clean, removed] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"All", {"tiny-0", "tiny-1"}}, {"Running", {"tiny-1"}}, {"None", {}}}) {
    const auto d = Failure(Launched({{"backoffLimit", 1}, {"cleanPodPolicy", clean}},
                                    {Pod(0, 0, "Failed", 137), Pod(1, 0, "Running")}, 1)
                               .Get());
    ASSERT_TRUE(d.has_value()) << clean;
    EXPECT_EQ(d->phase, "Failed");
    EXPECT_EQ(ReasonOf(*d, "Failed"), "BackoffLimitExceeded");
    EXPECT_THAT(d->events.at(0).message, HasSubstr("the gang was restarted 1 time(s), backoffLimit is 1"));
    EXPECT_THAT(Names(d->remove), UnorderedElementsAreArray(removed)) << clean;
    EXPECT_FALSE(d->status.contains("restarts"));  // not counted again
  }
}

TEST(FailureTest, APermanentExitCodeWinsOverAnEarlierRetryableOne) {
  const auto d = Failure(Launched({}, {Pod(0, 0, "Failed", 137), Pod(1, 0, "Failed", 2)}).Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(ReasonOf(*d, "Failed"), "PermanentExitCode");
  EXPECT_THAT(d->events.at(0).message, HasSubstr("pod tiny-1 exited with code 2"));
}

// Preempted, evicted or drained (DisruptionTarget=True): the gang restarts without spending
// backoffLimit, even at the limit and with restartPolicy Never; a rank that failed on its own
// in the same gang still decides.
json Disrupted(json pod, const std::string& reason) {
  pod["status"]["conditions"] = json::array({{{"type", "DisruptionTarget"}, {"status", "True"}, {"reason", reason}}});
  return pod;
}

TEST(FailureTest, ADisruptionRestartsTheGangWithoutCounting) {
  for (const json& policy : {json{{"backoffLimit", 0}}, json{{"restartPolicy", "Never"}}}) {
    const auto d = Failure(Launched(policy, {Disrupted(Pod(0, 0, "Failed", 143), "PreemptionByScheduler"),
                                             Pod(1, 0, "Running")})
                               .Get());
    ASSERT_TRUE(d.has_value()) << policy;
    EXPECT_EQ(d->phase, "Restarting");
    EXPECT_FALSE(d->status.contains("restarts")) << "not counted";
    EXPECT_EQ(d->status["disruptionRestarts"], 1);
    EXPECT_EQ(d->status["restartGeneration"], 1);
    EXPECT_EQ(d->events.at(0).reason, "GangRestartAfterDisruption");
    EXPECT_THAT(d->events.at(0).message, HasSubstr("DisruptionTarget: PreemptionByScheduler"));
    EXPECT_THAT(Names(d->remove), UnorderedElementsAre("tiny-0", "tiny-1"));
  }
  // The other rank failed by itself, before or after it in order: that failure counts (here: the
  // limit is reached).
  for (bool disrupted_first : {true, false}) {
    std::vector<json> pods = {Disrupted(Pod(0, 0, "Failed", 143), "EvictionByEvictionAPI"), Pod(1, 0, "Failed", 1)};
    if (!disrupted_first) pods = {Pod(0, 0, "Failed", 1), Disrupted(Pod(1, 0, "Failed", 143), "EvictionByEvictionAPI")};
    const auto d = Failure(Launched({{"backoffLimit", 0}}, pods).Get());
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(ReasonOf(*d, "Failed"), "BackoffLimitExceeded") << disrupted_first;
  }
}

}  // namespace
}  // namespace meshwork::op::policy
