// Learning-rate schedule: warmup, cosine / linear decay endpoints, constant.
#include <gtest/gtest.h>

#include <cmath>

#include "trainer/train/schedule.h"

namespace meshwork::train {
namespace {

config::ScheduleConfig Schedule(int64_t steps, int64_t warmup, const std::string& decay, double min_ratio) {
  config::ScheduleConfig s;
  s.steps = steps;
  s.warmup_steps = warmup;
  s.decay = *ParseName(config::kLrDecayNames, decay);
  s.min_lr_ratio = min_ratio;
  return s;
}

TEST(LearningRate, WarmupRisesLinearlyToBaseLr) {
  auto s = Schedule(100, 10, "cosine", 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 1.0, 0), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 1.0, 4), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(s, 1.0, 9), 1.0);
}

TEST(LearningRate, CosineDecaysFromBaseToMinAtLastStep) {
  auto s = Schedule(100, 10, "cosine", 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 2.0, 10), 2.0);
  EXPECT_NEAR(LearningRate(s, 2.0, 99), 0.2, 1e-12);
  // Halfway through the decay the cosine is at the midpoint of base and min.
  auto mid = Schedule(21, 0, "cosine", 0.0);
  EXPECT_NEAR(LearningRate(mid, 1.0, 10), 0.5, 1e-12);
  for (int64_t i = 11; i < 100; ++i) EXPECT_LE(LearningRate(s, 2.0, i), LearningRate(s, 2.0, i - 1));
}

TEST(LearningRate, LinearDecayIsAStraightLine) {
  auto s = Schedule(11, 0, "linear", 0.0);
  EXPECT_NEAR(LearningRate(s, 1.0, 0), 1.0, 1e-12);
  EXPECT_NEAR(LearningRate(s, 1.0, 5), 0.5, 1e-12);
  EXPECT_NEAR(LearningRate(s, 1.0, 10), 0.0, 1e-12);
}

TEST(LearningRate, ConstantKeepsBaseAfterWarmup) {
  auto s = Schedule(50, 5, "constant", 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 3.0, 5), 3.0);
  EXPECT_DOUBLE_EQ(LearningRate(s, 3.0, 49), 3.0);
}

TEST(LearningRate, NoWarmupStartsAtBase) {
  auto s = Schedule(10, 0, "cosine", 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 1.0, 0), 1.0);
}

}  // namespace
}  // namespace meshwork::train
