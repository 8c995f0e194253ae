// Pods of an older gang or beyond the replica count (stale_gang.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(StaleGangTest, NoOpinionWhenEveryPodBelongsToTheCurrentGang) {
  EXPECT_FALSE(StaleGang(State(Job(), {Pod(0, 0, "Running"), Pod(1, 0, "Failed", 1)}).Get()).has_value());
  EXPECT_FALSE(StaleGang(State(Job()).Get()).has_value());
}

TEST(StaleGangTest, StalePodsGoBeforeAnythingStarts) {
  struct Case {
    std::string name;
    json status;
    std::vector<json> pods;
    std::vector<std::string> removed;
    std::string phase;
  };
  json no_index = Pod(1, 1, "Running");
  no_index["metadata"]["labels"].erase(kIndexLabel);
  const json restarting = {{"restartGeneration", 1}, {"conditions", json::array({Condition("Restarting", "True")})}};
  const std::vector<Case> cases = {
      {"an old gang after a restart", restarting, {Pod(0, 0, "Running"), Pod(0, 1, "Running")}, {"tiny-0"},
       "Restarting"},
      {"beyond the replica count", json::object(), {Pod(0, 0, "Running"), Pod(2, 0, "Running")}, {"tiny-2"},
       "Created"},
      {"was running", {{"phase", "Running"}}, {Pod(3, 0, "Running")}, {"tiny-3"}, "Restarting"},
      {"no index label", {{"restartGeneration", 1}}, {no_index}, {"tiny-1"}, "Created"},
      {"already terminating", restarting, {Terminating(Pod(0, 0, "Running"))}, {}, "Restarting"},
  };
  for (const auto& c : cases) {
    const auto d = StaleGang(State(Job({}, c.status), c.pods).Get());
    ASSERT_TRUE(d.has_value()) << c.name;
    EXPECT_EQ(Names(d->remove), c.removed) << c.name;
    EXPECT_EQ(d->phase, c.phase) << c.name;
    EXPECT_EQ(d->requeue_after, seconds(5)) << c.name;  // to start the gang once they are gone
    EXPECT_THAT(d->create, IsEmpty());
    EXPECT_THAT(d->events, IsEmpty());
  }
}

}  // namespace
}  // namespace meshwork::op::policy
