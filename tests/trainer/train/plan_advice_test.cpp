// The plan advice (train/plan_advice.h): the compute rate refitted to a measured step, and the
// search on the refitted profile judged against the running plan.
#include "trainer/train/plan_advice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/plan_search.h"
#include "trainer/config/config.h"

namespace meshwork::train {
namespace {

using ::testing::HasSubstr;

compiler::HardwareProfile Cpu() {
  auto p = compiler::BuiltinProfile("cpu-gloo-local");
  EXPECT_TRUE(p.ok()) << p.status().message();
  return *p;
}

config::TrainConfig Config(const std::string& yaml) {
  auto c = config::LoadConfigFromString(yaml, {});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

double StepAt(const compiler::HardwareProfile& profile, double mfu, const compiler::SearchSpec& spec,
              const compiler::ParallelPlan& plan) {
  compiler::HardwareProfile p = profile;
  p.achieved_mfu = mfu;
  auto s = compiler::ScorePlan(p, spec, plan);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? s->step_seconds : 0;
}

TEST(PlanAdviceTest, RunningPlanReadsTheConfigAndTheResolvedMesh) {
  const config::TrainConfig pipelined = Config(
      "model: {preset: tiny}\nmesh: {pp: 2, dp_shard: 1}\npipeline: {schedule: zb-h1}\n"
      "data: {batch_size: 2, seq_len: 64}\ntraining: {grad_accum: 4, activation_checkpointing: none}\n");
  const compiler::ParallelPlan p = RunningPlan(pipelined, {1, 1, 1});
  EXPECT_EQ(p.pp, 2);
  EXPECT_EQ(p.schedule, compiler::pipeline::ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(p.microbatches, 4);
  EXPECT_EQ(p.microbatch, 2);
  EXPECT_EQ(p.checkpoint_every, 0);
  const compiler::SearchSpec spec = RunningSearch(pipelined, p);
  EXPECT_EQ(spec.gpus, 2);
  EXPECT_EQ(spec.global_batch, 8);
  EXPECT_EQ(spec.seq_len, 64);

  const config::TrainConfig sharded =
      Config("model: {preset: tiny}\ndata: {batch_size: 3, seq_len: 64}\ntraining: {grad_accum: 2}\n");
  const compiler::ParallelPlan s = RunningPlan(sharded, {2, 2, 1});
  EXPECT_EQ(s.dp_replicate * s.dp_shard, 4);
  EXPECT_EQ(s.microbatch, 6) << "a rank's step: batch_size x grad_accum";
  EXPECT_EQ(RunningSearch(sharded, s).global_batch, 24);
}

// The fit finds the rate a step was measured at: a step priced at MFU 0.2 is fitted back to 0.2
// from the profile's 0.5, and the running plan's prediction at the fit is the measured step.
TEST(PlanAdviceTest, TheRefitRecoversTheComputeRateOfTheMeasuredStep) {
  const compiler::HardwareProfile profile = Cpu();
  const config::TrainConfig cfg = Config("model: {preset: llama-100m}\ndata: {batch_size: 2, seq_len: 256}\n");
  const compiler::ParallelPlan running = RunningPlan(cfg, {1, 4, 1});
  const compiler::SearchSpec spec = RunningSearch(cfg, running);
  const double measured = StepAt(profile, 0.2, spec, running);
  ASSERT_GT(measured, 0);
  auto a = AdvisePlan(profile, spec, running, measured);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_NEAR(a->fitted_mfu, 0.2, 1e-3);
  EXPECT_FALSE(a->fit_at_bound);
  EXPECT_NEAR(a->running_at_fit_seconds, measured, 1e-6 * measured);
  EXPECT_DOUBLE_EQ(a->profile_mfu, profile.achieved_mfu);
  EXPECT_LT(a->predicted_at_profile_seconds, measured) << "the profile's 0.5 predicts a faster step";
  EXPECT_GT(a->speedup, 0);
  EXPECT_THAT(DescribeAdvice(*a), HasSubstr("plan advice: the running plan (tp 1 x pp 1 x dp_shard 4"));
  EXPECT_THAT(DescribeAdvice(*a), HasSubstr("refitted MFU 0.2000"));
}

// The search's own choice at the refitted rate, measured at its prediction: nothing to advise.
TEST(PlanAdviceTest, TheSearchsChoiceRunningIsNotAdvisedAgainst) {
  compiler::HardwareProfile fitted = Cpu();
  fitted.achieved_mfu = 0.3;
  const config::TrainConfig cfg = Config("model: {preset: llama-100m}\ndata: {batch_size: 2, seq_len: 256}\n");
  compiler::SearchSpec spec = RunningSearch(cfg, RunningPlan(cfg, {1, 4, 1}));
  auto search = compiler::SearchPlans(fitted, spec);
  ASSERT_TRUE(search.ok()) << search.status().message();
  const compiler::ParallelPlan best = search->chosen().plan;
  const double measured = StepAt(Cpu(), 0.3, spec, best);
  auto a = AdvisePlan(Cpu(), spec, best, measured);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_NEAR(a->fitted_mfu, 0.3, 1e-3);
  EXPECT_FALSE(a->advised);
  EXPECT_TRUE(a->best_keys.empty());
  EXPECT_NEAR(a->speedup, 1.0, 0.01);
  EXPECT_THAT(DescribeAdvice(*a), HasSubstr("the running plan is the search's best at the refitted rate"));
}

// A plan far from the best (every layer's activations checkpointed and a 4-stage GPipe pipeline
// of a small batch) gets advice: another plan, predicted >= 1.10x as fast, with keys the
// trainer loads.
TEST(PlanAdviceTest, APlanFarFromTheBestIsAdvisedAgainstWithKeysTheTrainerLoads) {
  const config::TrainConfig cfg = Config(
      "model: {preset: llama-100m}\nmesh: {pp: 4, dp_shard: 1}\npipeline: {schedule: gpipe}\n"
      "data: {batch_size: 1, seq_len: 256}\ntraining: {grad_accum: 4, activation_checkpointing: all}\n");
  const compiler::ParallelPlan running = RunningPlan(cfg, {1, 1, 1});
  const compiler::SearchSpec spec = RunningSearch(cfg, running);
  const double measured = StepAt(Cpu(), 0.25, spec, running);
  auto a = AdvisePlan(Cpu(), spec, running, measured);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(a->advised) << DescribeAdvice(*a);
  EXPECT_GE(a->speedup, kAdviseSpeedup);
  EXPECT_NEAR(a->best.simulated->step_seconds * a->speedup, a->running_at_fit_seconds, 1e-9);
  const std::string line = DescribeAdvice(*a);
  EXPECT_THAT(line, HasSubstr("another plan is predicted x"));
  EXPECT_THAT(line, HasSubstr("its keys: mesh: {dp_replicate: "));
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line";
  auto loads = config::LoadConfigFromString("model: {preset: llama-100m}\n" + a->best_keys, {});
  EXPECT_TRUE(loads.ok()) << loads.status().message() << "\n" << a->best_keys;
}

TEST(PlanAdviceTest, AStepTheComputeRateCannotExplainIsFittedAtTheBoundAndSaysSo) {
  const config::TrainConfig cfg = Config("model: {preset: tiny}\ndata: {batch_size: 2, seq_len: 64}\n");
  const compiler::ParallelPlan running = RunningPlan(cfg, {1, 2, 1});
  const compiler::SearchSpec spec = RunningSearch(cfg, running);
  auto slow = AdvisePlan(Cpu(), spec, running, 1e6);
  ASSERT_TRUE(slow.ok()) << slow.status().message();
  EXPECT_TRUE(slow->fit_at_bound);
  EXPECT_DOUBLE_EQ(slow->fitted_mfu, kMinFittedMfu);
  EXPECT_THAT(DescribeAdvice(*slow), HasSubstr("the compute rate alone does not explain the step"));
  auto fast = AdvisePlan(Cpu(), spec, running, 1e-12);
  ASSERT_TRUE(fast.ok()) << fast.status().message();
  EXPECT_TRUE(fast->fit_at_bound);
  EXPECT_DOUBLE_EQ(fast->fitted_mfu, 1.0);
  EXPECT_THAT(DescribeAdvice(*fast), HasSubstr("faster than the profile's peak and links predict"));
}

TEST(PlanAdviceTest, BadInputsAreRefusedNamingTheValue) {
  const config::TrainConfig cfg = Config("model: {preset: tiny}\ndata: {batch_size: 2, seq_len: 64}\n");
  const compiler::ParallelPlan running = RunningPlan(cfg, {1, 2, 1});
  const compiler::SearchSpec spec = RunningSearch(cfg, running);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    auto a = AdvisePlan(Cpu(), spec, running, bad);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidConfig);
    EXPECT_THAT(a.status().message(), HasSubstr("measured step"));
  }
  compiler::SearchSpec wrong = spec;
  wrong.gpus = 3;
  auto mismatched = AdvisePlan(Cpu(), wrong, running, 1.0);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(mismatched.status().message(), HasSubstr("make 2 ranks, not the 3"));
}

}  // namespace
}  // namespace meshwork::train
