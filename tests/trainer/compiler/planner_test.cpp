// The planner: compute fitted to a measured step, traced compute unslowed by the communication
// beside it, and a device budget below the eager plan's peak met by checkpointing.
#include "trainer/compiler/planner.h"

#include <gtest/gtest.h>

#include "tests/trainer/compiler/passes/fixtures.h"
#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

TEST(Planner, ComputeIsScaledSoThatTheEagerPlanTakesTheMeasuredStep) {
  const PassContext ctx = Context(0.001, 1e8);
  const Graph skeleton = Naive();
  const PlanOptions options;
  for (double truth : {0.4, 1.0, 2.5}) {
    const double measured = Simulate(Ok(EagerPlan(ScaleCompute(skeleton, truth), ctx)), ctx.cost).step_seconds;
    EXPECT_NEAR(FitComputeScale(skeleton, ctx.cost, options, measured), truth, 1e-3 * truth) << truth;
  }
  EXPECT_EQ(FitComputeScale(skeleton, ctx.cost, options, 0), 1.0) << "nothing measured: the trace as it is";
  // A measurement no scale can explain (shorter than the communication alone) is clamped.
  EXPECT_EQ(FitComputeScale(skeleton, ctx.cost, options, 1e-9), 0.05);
  const Graph doubled = ScaleCompute(skeleton, 2);
  for (size_t m = 0; m < skeleton.modules.size(); ++m) {
    EXPECT_DOUBLE_EQ(doubled.modules[m].fwd_seconds, 2 * skeleton.modules[m].fwd_seconds);
    EXPECT_DOUBLE_EQ(doubled.modules[m].bwd_seconds, 2 * skeleton.modules[m].bwd_seconds);
  }
}

TEST(Planner, TracedComputeIsUnslowedByTheCommunicationBesideIt) {
  // CPU ranks: the eager step's collectives slowed each traced module (interference), and the
  // simulator slows compute under communication again. Traced times made by simulating known
  // compute come back to it.
  PassContext ctx = Context(0.001, 1e6);
  ctx.cost.interference = 0.5;
  auto parsed = Parse(kSmallModel);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Graph& truth = *parsed;
  const PlanOptions options;
  const Graph eager = Ok(EagerPlan(BuildNaiveProgram(truth, {options.reshard_after_forward}), ctx));
  const SimResult sim = Simulate(eager, ctx.cost);
  Graph traced = truth;
  for (auto& m : traced.modules) m.fwd_seconds = m.bwd_seconds = 0;
  for (size_t i = 0; i < eager.ops.size(); ++i) {
    const Op& op = eager.ops[i];
    if (op.kind != OpKind::kCompute) continue;
    ModuleInfo& m = traced.modules[op.module];
    (op.phase == Phase::kForward ? m.fwd_seconds : m.bwd_seconds) += sim.ops[i].end - sim.ops[i].start;
  }
  const ModuleScales scales = UnslowTracedCompute(traced, ctx.cost, options);
  const Graph unslowed = ScaleCompute(traced, scales);
  int slowed = 0;
  for (size_t m = 0; m < truth.modules.size(); ++m) {
    const ModuleInfo &want = truth.modules[m], &got = unslowed.modules[m];
    EXPECT_NEAR(got.fwd_seconds, want.fwd_seconds, 1e-3 * want.fwd_seconds) << want.name;
    EXPECT_NEAR(got.bwd_seconds, want.bwd_seconds, 1e-3 * want.bwd_seconds) << want.name;
    for (double f : {scales.fwd[m], scales.bwd[m]}) {
      EXPECT_GE(f, 1 / 1.5 - 1e-12) << want.name;
      EXPECT_LE(f, 1.0) << want.name;
      slowed += f < 0.99;
    }
  }
  EXPECT_GT(slowed, 0) << "on this link communication runs beside compute: some module was slowed";
  EXPECT_LT(scales.Mean(), 1.0);
  ctx.cost.interference = 0;  // GPUs, NCCL: nothing to undo
  const ModuleScales none = UnslowTracedCompute(traced, ctx.cost, options);
  for (size_t m = 0; m < truth.modules.size(); ++m) {
    EXPECT_EQ(none.fwd[m], 1.0);
    EXPECT_EQ(none.bwd[m], 1.0);
  }
}

// A budget below the eager plan's peak still yields a plan that fits it: the compiled plan
// checkpoints and waits for reduce-scatters early where the eager plan cannot.
TEST(Planner, ADeviceBudgetBelowTheEagerPeakIsMetByCheckpointing) {
  const Graph skeleton = CheckpointableNaive();
  PlanOptions options;
  options.bucketing = Bucketing::kBlock;
  const CostModel cost = Context().cost;
  const int64_t least = PeakBytes(BuildNaiveProgram(skeleton, {}));  // the least-memory order
  const int64_t device = StaticBytes(skeleton) + least - 1;
  options.budget = {MemoryBudget::Source::kDeviceMemory, device};
  auto plans = PlanStep(skeleton, cost, options);
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  EXPECT_EQ(plans->ctx.memory_budget_bytes, device - StaticBytes(skeleton));
  EXPECT_GT(PeakBytes(plans->eager), plans->ctx.memory_budget_bytes) << "eager would not fit";
  EXPECT_LE(PeakBytes(plans->compiled), plans->ctx.memory_budget_bytes);
  ASSERT_FALSE(plans->choices.empty());
  EXPECT_NE(plans->choices[0].find("activation checkpointing on "), std::string::npos) << plans->choices[0];
  EXPECT_NE(plans->choices[0].find("of 2 candidate modules (layers.0"), std::string::npos) << plans->choices[0];
  EXPECT_NE(plans->choices.back().find("all-gathers and"), std::string::npos) << plans->choices.back();
}

}  // namespace
}  // namespace meshwork::compiler
