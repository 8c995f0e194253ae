// A spec or trainer config the operator cannot run (invalid_spec.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using ::testing::ElementsAre;

TEST(InvalidSpecTest, FailsTheJobNamingTheFieldAndStopsItsRunningPods) {
  const std::string message = "spec.image: is required";
  const std::vector<PodView> pods = {ViewPod(Pod(0, 0, "Running")), ViewPod(Pod(1, 0, "Succeeded", 0)),
                                     ViewPod(Terminating(Pod(2, 0, "Running")))};
  const Decision d = InvalidSpec(json::object(), pods, message, kT0);
  EXPECT_EQ(d.phase, "Failed");
  EXPECT_EQ(ReasonOf(d, "Failed"), "InvalidSpec");
  EXPECT_EQ(d.conditions.at(0).message, message);
  EXPECT_THAT(Names(d.remove), ElementsAre("tiny-0"));  // cleanPodPolicy Running, whatever the spec says
  EXPECT_TRUE(d.status_first);
  ASSERT_EQ(d.events.size(), 1u);
  EXPECT_EQ(d.events[0].type, "Warning");
  EXPECT_EQ(d.events[0].reason, "InvalidSpec");
  EXPECT_EQ(d.events[0].message, message);
}

}  // namespace
}  // namespace meshwork::op::policy
