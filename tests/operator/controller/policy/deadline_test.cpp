// activeDeadlineSeconds (deadline.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using std::chrono::seconds;
using ::testing::UnorderedElementsAreArray;

json WithDeadline(int64_t s, const std::string& clean = "Running") {
  return {{"runPolicy", {{"activeDeadlineSeconds", s}, {"cleanPodPolicy", clean}}}};
}

TEST(DeadlineTest, NoOpinionWithoutADeadlineOrAStart) {
  EXPECT_FALSE(Deadline(State(Job({}, {{"startTime", FormatTime(kT0)}}), {}, kT0 + seconds(1000)).Get()).has_value());
  EXPECT_FALSE(Deadline(State(Job(WithDeadline(10)), {}, kT0 + seconds(1000)).Get()).has_value());
}

TEST(DeadlineTest, BeforeTheDeadlineComesBackWhenItIsReached) {
  struct Case {
    int64_t banked, since_start, deadline, requeue;
  };
  for (const auto& c : std::vector<Case>{{0, 5, 60, 55}, {50, 5, 60, 5}, {0, 59, 60, 1}}) {
    State s(Job(WithDeadline(c.deadline), {{"startTime", FormatTime(kT0)}, {"activeSeconds", c.banked}}), {},
            kT0 + seconds(c.since_start));
    const auto d = Deadline(s.Get());
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->phase, "");
    EXPECT_EQ(d->requeue_after, seconds(c.requeue));
  }
}

TEST(DeadlineTest, ReachedFailsTheJobAndStopsItsRunningPodsWhateverTheCleanPodPolicy) {
  struct Case {
    std::string clean;
    std::vector<std::string> removed;
  };
  for (const auto& c : std::vector<Case>{{"None", {"tiny-0"}}, {"Running", {"tiny-0"}}, {"All", {"tiny-0", "tiny-1"}}}) {
    State s(Job(WithDeadline(60, c.clean), {{"startTime", FormatTime(kT0)}, {"activeSeconds", 50}}),
            {Pod(0, 0, "Running"), Pod(1, 0, "Succeeded", 0), Terminating(Pod(2, 0, "Running"))}, kT0 + seconds(10));
    const auto d = Deadline(s.Get());
    ASSERT_TRUE(d.has_value()) << c.clean;
    EXPECT_EQ(d->phase, "Failed");
    EXPECT_EQ(ReasonOf(*d, "Failed"), "DeadlineExceeded");
    EXPECT_EQ(d->events.at(0).message, "the job was active for 60 s, reaching activeDeadlineSeconds 60");
    EXPECT_THAT(Names(d->remove), UnorderedElementsAreArray(c.removed)) << c.clean;
    EXPECT_TRUE(d->status_first);
  }
}

}  // namespace
}  // namespace meshwork::op::policy
