// fsdp::SteadyEagerStep: the eager step a compiled plan is fitted to.
#include <gtest/gtest.h>

#include <vector>

#include "trainer/fsdp/compile.h"

namespace meshwork::fsdp {
namespace {

TEST(SteadyEagerStep, MeansStepsOneAndTwoWhenNeitherIsWarmUp) {
  // netlab at 1 Gbit/s: step 1 faster than the steady steps, step 2 slower.
  const EagerStepTimes s = SteadyEagerStep({{6.68, 0.30}, {7.40, 0.28}});
  EXPECT_DOUBLE_EQ(s.step_seconds, (6.68 + 7.40) / 2);
  EXPECT_DOUBLE_EQ(s.outside_seconds, (0.30 + 0.28) / 2);
}

TEST(SteadyEagerStep, LeavesOutAWarmUpFirstStep) {
  // llama3-1b on an H200: step 1 pays cuBLAS's and the allocator's first-use costs.
  const EagerStepTimes s = SteadyEagerStep({{0.761, 0.090}, {0.214, 0.060}});
  EXPECT_DOUBLE_EQ(s.step_seconds, 0.214);
  EXPECT_DOUBLE_EQ(s.outside_seconds, 0.060);
  // Just above and at the ratio.
  EXPECT_DOUBLE_EQ(SteadyEagerStep({{1.51, 0}, {1.0, 0}}).step_seconds, 1.0);
  EXPECT_DOUBLE_EQ(SteadyEagerStep({{1.5, 0}, {1.0, 0}}).step_seconds, 1.25);
  // Against the mean of the later steps.
  EXPECT_DOUBLE_EQ(SteadyEagerStep({{3.0, 0}, {1.0, 0}, {2.0, 0}}).step_seconds, 1.5);
  EXPECT_DOUBLE_EQ(SteadyEagerStep({{2.0, 0}, {1.0, 0}, {2.0, 0}}).step_seconds, 5.0 / 3);
}

TEST(SteadyEagerStep, OneStepOrNone) {
  EXPECT_DOUBLE_EQ(SteadyEagerStep({{0.761, 0.09}}).step_seconds, 0.761);
  const EagerStepTimes none = SteadyEagerStep({});
  EXPECT_EQ(none.step_seconds, 0);
  EXPECT_EQ(none.outside_seconds, 0);
}

}  // namespace
}  // namespace meshwork::fsdp
