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

// A failed rank whose trainer container ended with `message` (its termination message).
json Said(json pod, const std::string& message) {
  pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message;
  return pod;
}

json Rules(const json& rules, json run_policy = json::object()) {
  run_policy["failurePolicy"] = {{"rules", rules}};
  return run_policy;
}

TEST(FailureTest, TheFirstMatchingRuleDecidesForARank) {
  const json rules = json::array(
      {{{"name", "bad-data"}, {"action", "FailJob"}, {"onExitCodes", {{"values", {42}}}}},
       {{"action", "RestartGangAndIgnoreBackoff"}, {"onMessagePattern", "NCCL.*timeout"}},
       {{"action", "RestartGang"}, {"onPodConditions", {{{"type", "DisruptionTarget"}}}}},
       {{"action", "FailJob"}, {"onExitCodes", {{"operator", "NotIn"}, {"values", {1, 137}}}}}});
  struct Case {
    std::string name;
    json pod;
    int restarts;  // so far; backoffLimit is 1
    std::string phase, reason, event, message;
    json status;   // the counters the decision writes (restartGeneration aside)
  };
  const std::vector<Case> cases = {
      {"exit 42: rule 0 fails the job, though restartPolicy would restart",
       Pod(1, 0, "Failed", 42), 0, "Failed", "FailurePolicy", "FailurePolicy",
       "pod tiny-1 exited with code 42, reason Error; failurePolicy rule 0 (bad-data) matched: FailJob", json::object()},
      {"a message rule restarts without counting, even at the backoff limit",
       Said(Pod(1, 0, "Failed", 1), "[rank 1] NCCL watchdog: collective timeout after 600000 ms"), 1, "Restarting",
       "FailurePolicy", "GangRestartUncounted",
       "pod tiny-1 exited with code 1, reason Error: [rank 1] NCCL watchdog: collective timeout after 600000 ms "
       "(failurePolicy rule 1 matched: RestartGangAndIgnoreBackoff); restarting the gang, which does not count against "
       "backoffLimit (uncounted restart 1)",
       {{"uncountedRestarts", 1}}},
      {"a rule makes a disruption count",
       Disrupted(Pod(1, 0, "Failed", 137), "EvictionByEvictionAPI"), 0, "Restarting", "GangRestart", "GangRestart",
       "pod tiny-1 exited with code 137 (signal 9), reason Error (failurePolicy rule 2 matched: RestartGang); "
       "restarting the gang (restart 1 of 1)",
       {{"restarts", 1}}},
      {"a counted restart by rule past the limit ends the job",
       Disrupted(Pod(1, 0, "Failed", 137), "EvictionByEvictionAPI"), 1, "Failed", "BackoffLimitExceeded", "BackoffLimitExceeded",
       "pod tiny-1 exited with code 137 (signal 9), reason Error (failurePolicy rule 2 matched: RestartGang); the gang "
       "was restarted 1 time(s), backoffLimit is 1",
       json::object()},
      {"NotIn: exit 5 is not 1 or 137", Pod(1, 0, "Failed", 5), 0, "Failed", "FailurePolicy", "FailurePolicy",
       "pod tiny-1 exited with code 5, reason Error; failurePolicy rule 3 matched: FailJob", json::object()},
      {"no rule matches exit 1: restartPolicy and backoffLimit as always", Pod(1, 0, "Failed", 1), 0, "Restarting",
       "GangRestart", "GangRestart", "pod tiny-1 exited with code 1, reason Error; restarting the gang (restart 1 of 1)",
       {{"restarts", 1}}},
  };
  for (const auto& c : cases) {
    const auto d =
        Failure(Launched(Rules(rules, {{"restartPolicy", "OnFailure"}, {"backoffLimit", 1}}), {Pod(0, 0, "Running"), c.pod},
                         c.restarts)
                    .Get());
    ASSERT_TRUE(d.has_value()) << c.name;
    EXPECT_EQ(d->phase, c.phase) << c.name;
    EXPECT_EQ(ReasonOf(*d, c.phase == "Failed" ? "Failed" : "Restarting"), c.reason) << c.name;
    ASSERT_EQ(d->events.size(), 1u) << c.name;
    EXPECT_EQ(d->events[0].reason, c.event) << c.name;
    EXPECT_EQ(d->events[0].message, c.message) << c.name;
    for (const auto& [key, value] : c.status.items()) EXPECT_EQ(d->status[key], value) << c.name << " " << key;
    if (c.phase == "Restarting") {
      EXPECT_EQ(d->status["restartGeneration"], 1) << c.name;
    }
  }
}

TEST(FailureTest, ARuleNeedsAllItsMatchersAndTheWorstRankDecides) {
  // Exit code 1 AND a message: a rank with only one of them does not match.
  const json rules = json::array({{{"action", "FailJob"},
                                   {"onExitCodes", {{"values", {1}}}},
                                   {"onMessagePattern", "CUDA out of memory"}}});
  for (const auto& [pod, phase] : std::vector<std::pair<json, std::string>>{
           {Said(Pod(1, 0, "Failed", 1), "RuntimeError: CUDA out of memory. Tried to allocate"), "Failed"},
           {Said(Pod(1, 0, "Failed", 1), "loss is NaN"), "Restarting"},
           {Said(Pod(1, 0, "Failed", 4), "CUDA out of memory"), "Restarting"}}) {
    const auto d = Failure(Launched(Rules(rules), {Pod(0, 0, "Running"), pod}).Get());
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->phase, phase) << pod.dump();
  }
  // A condition's reason narrows it; a Pod-level message counts as well as the container's.
  const json preempt = json::array(
      {{{"action", "FailJob"}, {"onPodConditions", {{{"type", "DisruptionTarget"}, {"reason", "PreemptionByScheduler"}}}}}});
  EXPECT_EQ(Failure(Launched(Rules(preempt), {Disrupted(Pod(0, 0, "Failed", 143), "PreemptionByScheduler"),
                                              Pod(1, 0, "Running")})
                        .Get())
                ->phase,
            "Failed");
  EXPECT_EQ(Failure(Launched(Rules(preempt), {Disrupted(Pod(0, 0, "Failed", 143), "EvictionByEvictionAPI"),
                                              Pod(1, 0, "Running")})
                        .Get())
                ->events.at(0)
                .reason,
            "GangRestartAfterDisruption");  // no rule: the disruption default
  json evicted = Pod(0, 0, "Failed");
  evicted["status"]["reason"] = "Evicted";
  evicted["status"]["message"] = "The node was low on resource: memory.";
  const json low_memory = json::array({{{"action", "RestartGangAndIgnoreBackoff"}, {"onMessagePattern", "low on resource"}}});
  EXPECT_EQ(Failure(Launched(Rules(low_memory, {{"backoffLimit", 0}}), {evicted, Pod(1, 0, "Running")}).Get())->phase,
            "Restarting");
  // Two failed ranks: an uncounted one and one the rules fail the job for; the job fails.
  const json two = json::array({{{"action", "RestartGangAndIgnoreBackoff"}, {"onExitCodes", {{"values", {137}}}}},
                                {{"action", "FailJob"}, {"onExitCodes", {{"values", {3}}}}}});
  const auto d = Failure(Launched(Rules(two), {Pod(0, 0, "Failed", 137), Pod(1, 0, "Failed", 3)}).Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(ReasonOf(*d, "Failed"), "FailurePolicy");
  EXPECT_THAT(d->events.at(0).message, HasSubstr("pod tiny-1 exited with code 3"));
  // A deleted rank has nothing to match: the default applies.
  const auto deleted = Failure(Launched(Rules(two), {Pod(0, 0, "Running")}).Get());
  ASSERT_TRUE(deleted.has_value());
  EXPECT_EQ(deleted->phase, "Restarting");
  EXPECT_THAT(deleted->events.at(0).message, HasSubstr("pod tiny-1 was deleted"));
}

}  // namespace
}  // namespace meshwork::op::policy
