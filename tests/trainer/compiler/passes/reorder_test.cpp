// The reorder pass on golden text: prefetch, reduce-scatter waits, the memory budget, HSDP.
#include "trainer/compiler/passes/reorder.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/trainer/compiler/passes/fixtures.h"
#include "trainer/compiler/passes/bucket.h"
#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

const char* kReordered = R"(%ag0 = all_gather [0]
wait %ag0
%ag1 = all_gather [1,2]
compute fwd embed
free %ag0
wait %ag1
%ag3 = all_gather [3,4]
compute fwd layers.0
free %ag1
wait %ag3
%ag5 = all_gather [5]
compute fwd layers.1
free %ag3
wait %ag5
compute fwd head
%ag6 = all_gather [3,4]
compute bwd head
free %ag5
%rs0 = reduce_scatter [5]
wait %ag6
%ag8 = all_gather [1,2]
compute bwd layers.1
free %ag6
%rs1 = reduce_scatter [3,4]
wait %ag8
%ag10 = all_gather [0]
compute bwd layers.0
free %ag8
%rs3 = reduce_scatter [1,2]
wait %ag10
compute bwd embed
free %ag10
%rs5 = reduce_scatter [0]
wait %rs0
wait %rs1
wait %rs3
wait %rs5
optimizer_step
)";

// Under a budget that cannot keep every full gradient until the step: each reduce-scatter is
// waited for once the next one is issued.
const char* kReorderedWaitsOneBehind = R"(%ag0 = all_gather [0]
wait %ag0
%ag1 = all_gather [1,2]
compute fwd embed
free %ag0
wait %ag1
%ag3 = all_gather [3,4]
compute fwd layers.0
free %ag1
wait %ag3
%ag5 = all_gather [5]
compute fwd layers.1
free %ag3
wait %ag5
compute fwd head
%ag6 = all_gather [3,4]
compute bwd head
free %ag5
%rs0 = reduce_scatter [5]
wait %ag6
%ag8 = all_gather [1,2]
compute bwd layers.1
free %ag6
%rs1 = reduce_scatter [3,4]
wait %rs0
wait %ag8
%ag10 = all_gather [0]
compute bwd layers.0
free %ag8
%rs3 = reduce_scatter [1,2]
wait %rs1
wait %ag10
compute bwd embed
free %ag10
%rs5 = reduce_scatter [0]
wait %rs3
wait %rs5
optimizer_step
)";

TEST(Passes, ReorderPrefetchesAllGathersAndDelaysReduceScatterWaits) {
  const PassContext ctx = Context();
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), ctx, Bucketing::kBlock)), ctx, Bucketing::kBlock));
  Graph r = Ok(Reorder(g, ctx));
  EXPECT_EQ(Ops(r), kReordered);
  const SimResult before = Simulate(g, ctx.cost), after = Simulate(r, ctx.cost);
  EXPECT_LT(after.exposed_comm_seconds, before.exposed_comm_seconds);
  EXPECT_LT(after.step_seconds, before.step_seconds);
}

TEST(Passes, ReorderPrefetchesFurtherWhenOneAheadIsNotEnough) {
  // Slow links: one compute ahead does not hide a layer's all-gather any more.
  const PassContext ctx = Context(0.001, 2e5);
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), ctx, Bucketing::kBlock)), ctx, Bucketing::kBlock));
  Graph one_ahead = Ok(QuickPlan(Naive(), ctx));  // FSDP2's order of the same program
  Graph r = Ok(Reorder(g, ctx));
  EXPECT_LT(Simulate(r, ctx.cost).step_seconds, Simulate(one_ahead, ctx.cost).step_seconds);
  // The last layer's backward all-gather now goes out before the head's forward, two computes
  // ahead, where FSDP2's order issues it one ahead (before the head's backward).
  const std::string ops = Ops(r);
  EXPECT_LT(ops.find("%ag6 = all_gather [3,4]"), ops.find("compute fwd head")) << ops;
  const std::string quick_ops = Ops(one_ahead);
  ASSERT_NE(quick_ops.find("%ag6 = all_gather [3,4]"), std::string::npos) << quick_ops;
  EXPECT_GT(quick_ops.find("%ag6 = all_gather [3,4]"), quick_ops.find("compute fwd head")) << quick_ops;
}

TEST(Passes, ABudgetTooSmallForAnyPrefetchKeepsTheNaiveOrder) {
  const PassContext blocks = Context();
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), blocks, Bucketing::kBlock)), blocks, Bucketing::kBlock));
  // Below even the unprefetched program's peak: nothing can move, and the pass still succeeds.
  const PassContext tight = Context(0.001, 1e6, PeakBytes(g) - 1);
  EXPECT_EQ(Ops(Ok(Reorder(g, tight))), Ops(g));
  EXPECT_TRUE(PipelineWith(Bucketing::kBlock).Run(Naive(), tight).ok());
  // With room for it, the same pass prefetches.
  EXPECT_EQ(Ops(Ok(Reorder(g, Context()))), kReordered);
}

TEST(Passes, ReduceScatterWaitsMoveToTheStepOnlyWhenTheBudgetHoldsEveryGradient) {
  const PassContext blocks = Context();
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), blocks, Bucketing::kBlock)), blocks, Bucketing::kBlock));
  const int64_t at_step = PeakBytes(Ok(Reorder(g, blocks)));
  auto one_behind = Parse(kSmallModel + kReorderedWaitsOneBehind);
  ASSERT_TRUE(one_behind.ok()) << one_behind.status().ToString();
  const int64_t behind = PeakBytes(*one_behind);
  ASSERT_LT(behind, at_step) << "holding every gradient until the step must cost memory";
  // A budget between the two: the waits stay one behind, and the peak within the budget.
  Graph r = Ok(Reorder(g, Context(0.001, 1e6, behind)));
  EXPECT_EQ(Ops(r), kReorderedWaitsOneBehind);
  EXPECT_LE(PeakBytes(r), behind);
  EXPECT_EQ(Ops(Ok(Reorder(g, Context(0.001, 1e6, at_step)))), kReordered);
}

TEST(Passes, BudgetBoundsPeakMemory) {
  const PassContext blocks = Context();
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), blocks, Bucketing::kBlock)), blocks, Bucketing::kBlock));
  const int64_t unbounded = PeakBytes(Ok(Reorder(g, blocks)));
  const int64_t naive = PeakBytes(g);
  ASSERT_GT(unbounded, naive);
  for (int64_t budget = naive; budget <= unbounded; budget += 1000) {
    Graph r = Ok(Reorder(g, Context(0.001, 1e6, budget)));
    EXPECT_LE(PeakBytes(r), budget) << "budget " << budget;
  }
}

TEST(Passes, WithHsdpTheAllReducesStartDuringBackwardWhenThatIsFaster) {
  // Two replicas on a slow replicate link: waiting for every reduce-scatter, and issuing every
  // all-reduce, after backward leaves the all-reduces exposed; the compiled plan starts each one
  // during backward, as the eager executor (FSDP2) does, and the simulator says it is faster.
  std::string text = kSmallModel;
  text.replace(text.find("dp_replicate=1"), 14, "dp_replicate=2");
  auto hsdp = Parse(text);
  ASSERT_TRUE(hsdp.ok()) << hsdp.status().ToString();
  const Graph naive = BuildNaiveProgram(*hsdp, {true});
  PassContext ctx = Context();
  ctx.cost.dp_replicate = 2;
  ctx.cost.replicate_link = {0.001, 1e6};
  const Graph eager = Ok(EagerPlan(naive, ctx));
  const Graph compiled = Ok(Reorder(Ok(BucketReduceScatters(Ok(BucketAllGathers(naive, ctx, Bucketing::kBlock)), ctx, Bucketing::kBlock)), ctx));
  const std::string ops = Ops(compiled), eager_ops = Ops(eager);
  const size_t first_all_reduce = ops.find("all_reduce");
  ASSERT_NE(first_all_reduce, std::string::npos) << ops;
  EXPECT_LT(first_all_reduce, ops.rfind("compute bwd")) << ops;
  EXPECT_LT(eager_ops.find("all_reduce"), eager_ops.rfind("compute bwd")) << eager_ops;
  // Every all-reduce issued after backward instead: slower, by the simulator.
  Graph late = compiled;
  std::vector<Op> moved;
  for (size_t i = 0; i < late.ops.size();) {
    const Op& op = late.ops[i];
    const bool all_reduce_chain = op.kind == OpKind::kAllReduce ||
                                  (op.kind == OpKind::kWait && op.id.rfind("%rs", 0) == 0);
    if (all_reduce_chain) {
      moved.push_back(op);
      late.ops.erase(late.ops.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  int step = -1;
  for (size_t i = 0; i < late.ops.size(); ++i)
    if (late.ops[i].kind == OpKind::kWait && late.ops[i].id.rfind("%ar", 0) == 0 && step < 0) step = static_cast<int>(i);
  ASSERT_GE(step, 0) << Ops(late);
  late.ops.insert(late.ops.begin() + step, moved.begin(), moved.end());
  ASSERT_TRUE(Validate(late).ok()) << Validate(late).ToString() << "\n" << Ops(late);
  EXPECT_LT(Simulate(compiled, ctx.cost).step_seconds, Simulate(late, ctx.cost).step_seconds);
}

}  // namespace
}  // namespace meshwork::compiler
