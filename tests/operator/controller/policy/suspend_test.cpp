// runPolicy.suspend and the resume after it (suspend.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

json Suspended(bool suspend) { return {{"runPolicy", {{"suspend", suspend}}}}; }

TEST(SuspendTest, NoOpinionUnlessTheSpecSaysSuspend) {
  EXPECT_FALSE(Suspend(State(Job()).Get()).has_value());
  EXPECT_FALSE(Suspend(State(Job(Suspended(false))).Get()).has_value());
}

TEST(SuspendTest, SuspendingDeletesThePodsAndBanksTheActiveTime) {
  const json status = {{"startTime", FormatTime(kT0)}, {"activeSeconds", 10}};
  State s(Job(Suspended(true), status), {Pod(0, 0, "Running"), Terminating(Pod(1, 0, "Running"))}, kT0 + seconds(30));
  const auto d = Suspend(s.Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->phase, "Suspended");
  EXPECT_THAT(Names(d->remove), ElementsAre("tiny-0"));  // tiny-1 is already going
  EXPECT_EQ(ReasonOf(*d, "Suspended"), "JobSuspended");
  EXPECT_EQ(ReasonOf(*d, "Running"), "JobSuspended");
  EXPECT_EQ(d->status["activeSeconds"], 40);
  ASSERT_TRUE(d->status.contains("startTime"));
  EXPECT_TRUE(d->status["startTime"].is_null());  // removed: the clock stops
  EXPECT_THAT(Reasons(d->events), ElementsAre("Suspended"));
  EXPECT_TRUE(d->status_first);
}

TEST(SuspendTest, SuspendingMidRestartEndsTheRestart) {
  State s(Job(Suspended(true), {{"conditions", json::array({Condition("Restarting", "True")})}}),
          {Pod(0, 1, "Pending")});
  const auto d = Suspend(s.Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(ReasonOf(*d, "Restarting"), "JobSuspended");
  bool restarting_false = false;
  for (const auto& c : d->conditions) restarting_false = restarting_false || (c.type == "Restarting" && c.value == "False");
  EXPECT_TRUE(restarting_false);
  // Without a restart under way there is no Restarting condition to end.
  State plain(Job(Suspended(true)), {Pod(0, 0, "Running")});
  EXPECT_EQ(ReasonOf(*Suspend(plain.Get()), "Restarting"), "");
}

TEST(SuspendTest, AnAlreadySuspendedJobOnlyLosesPodsThatReappeared) {
  State s(Job(Suspended(true), {{"conditions", json::array({Condition("Suspended", "True")})}}),
          {Pod(0, 0, "Pending")});
  const auto d = Suspend(s.Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->phase, "Suspended");
  EXPECT_THAT(Names(d->remove), ElementsAre("tiny-0"));
  EXPECT_THAT(d->conditions, IsEmpty());
  EXPECT_THAT(d->events, IsEmpty());
  EXPECT_TRUE(d->status.empty());
  EXPECT_FALSE(d->status_first);
}

TEST(ResumeTest, OnlyAJobThatWasSuspendedAndNoLongerIsResumes) {
  const json was_suspended = {{"conditions", json::array({Condition("Suspended", "True")})}};
  const json was_resumed = {{"conditions", json::array({Condition("Suspended", "False")})}};
  EXPECT_FALSE(Resume(State(Job()).Get()).has_value());
  EXPECT_FALSE(Resume(State(Job(Suspended(true), was_suspended)).Get()).has_value());
  EXPECT_FALSE(Resume(State(Job(Suspended(false), was_resumed)).Get()).has_value());
  EXPECT_TRUE(Resume(State(Job(Suspended(false), was_suspended)).Get()).has_value());
}

TEST(ResumeTest, AResumeStartsTheNextGenerationAndIsNoFailure) {
  json status = {{"conditions", json::array({Condition("Suspended", "True")})}, {"restartGeneration", 2}, {"restarts", 1}};
  const auto d = Resume(State(Job(Suspended(false), status)).Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->phase, "");  // an adjustment: the later policies start the gang
  EXPECT_EQ(d->status, json({{"restartGeneration", 3}}));  // restarts stays
  EXPECT_EQ(ReasonOf(*d, "Suspended"), "JobResumed");
  ASSERT_EQ(d->events.size(), 1u);
  EXPECT_EQ(d->events[0].reason, "Resumed");
  EXPECT_EQ(d->events[0].message, "the job is resumed with a new gang (generation 3)");
}

}  // namespace
}  // namespace meshwork::op::policy
