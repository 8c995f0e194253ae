// A finished job: cleanPodPolicy and ttlSecondsAfterFinished (finished.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(FinishedTest, StaysFinishedAndCreatesNothingEver) {
  // kubeflow/trainer#2981: after the TTL deleted the Pods, the job was recreated in a loop.
  for (const auto& [type, clean, removed] : std::vector<std::tuple<std::string, CleanPodPolicy, std::vector<std::string>>>{
           {"Succeeded", CleanPodPolicy::kRunning, {"tiny-0"}},
           {"Failed", CleanPodPolicy::kAll, {"tiny-0", "tiny-1"}},
           {"Failed", CleanPodPolicy::kNone, {}}}) {
    const json status = {{"conditions", json::array({Condition(type, "True")})}};
    const Decision d = Finished(status, clean, {ViewPod(Pod(0, 0, "Running")), ViewPod(Pod(1, 0, "Failed", 1))});
    EXPECT_EQ(d.phase, type);
    EXPECT_EQ(Names(d.remove), removed);
    EXPECT_THAT(d.create, IsEmpty());
    EXPECT_FALSE(d.ensure_service);
    EXPECT_THAT(d.events, IsEmpty());
  }
}

TEST(TtlTest, NoOpinionWithoutATtl) {
  EXPECT_FALSE(Ttl(Job(), {{"completionTime", FormatTime(kT0)}}, kT0 + seconds(100), true).has_value());
}

TEST(TtlTest, DeletesTheJobOnceTheTtlHasPassedSinceCompletion) {
  struct Case {
    seconds since_completion;
    bool may_delete;
    bool deleted;
    std::optional<seconds> requeue;
  };
  for (const auto& c : std::vector<Case>{{seconds(10), true, false, seconds(21)},
                                         {seconds(30), true, true, std::nullopt},
                                         {seconds(41), true, true, std::nullopt},
                                         // The reconcile that finishes the job writes its outcome first.
                                         {seconds(30), false, false, seconds(1)}}) {
    const auto d = Ttl(Job({{"runPolicy", {{"ttlSecondsAfterFinished", 30}}}}), {{"completionTime", FormatTime(kT0)}},
                       kT0 + c.since_completion, c.may_delete);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->delete_job, c.deleted) << c.since_completion.count();
    EXPECT_EQ(d->requeue_after, c.requeue) << c.since_completion.count();
    EXPECT_EQ(d->phase, "");
  }
}

TEST(TtlTest, ReadsTheTtlEvenFromASpecThatNoLongerParses) {
  json job = Job({{"image", ""}, {"runPolicy", {{"ttlSecondsAfterFinished", 0}}}});
  const auto d = Ttl(job, {{"completionTime", FormatTime(kT0)}}, kT0, true);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->delete_job);
}

TEST(TtlTest, WithoutACompletionTimeCountsFromNowAsRecorded) {
  const SystemTime now = kT0 + milliseconds(700);
  const auto d = Ttl(Job({{"runPolicy", {{"ttlSecondsAfterFinished", 30}}}}), json::object(), now, true);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->status["completionTime"], FormatTime(kT0));
  EXPECT_FALSE(d->delete_job);
  EXPECT_EQ(d->requeue_after, seconds(30));  // 29.3 s left, rounded down, plus one
}

}  // namespace
}  // namespace meshwork::op::policy
