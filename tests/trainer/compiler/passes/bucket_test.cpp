// The bucket_all_gathers and bucket_reduce_scatters passes: block and auto bucketing on golden
// text, auto bucketing within the budget, and the option's names.
#include "trainer/compiler/passes/bucket.h"

#include <gtest/gtest.h>

#include "tests/trainer/compiler/passes/fixtures.h"
#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

TEST(Passes, BlockBucketingMakesOneCollectivePerModule) {
  const PassContext ctx = Context();
  Graph g = Ok(BucketAllGathers(Naive(), ctx, Bucketing::kBlock));
  g = Ok(BucketReduceScatters(g, ctx, Bucketing::kBlock));
  EXPECT_EQ(Ops(g), R"(%ag0 = all_gather [0]
wait %ag0
compute fwd embed
free %ag0
%ag1 = all_gather [1,2]
wait %ag1
compute fwd layers.0
free %ag1
%ag3 = all_gather [3,4]
wait %ag3
compute fwd layers.1
free %ag3
%ag5 = all_gather [5]
wait %ag5
compute fwd head
compute bwd head
free %ag5
%rs0 = reduce_scatter [5]
wait %rs0
%ag6 = all_gather [3,4]
wait %ag6
compute bwd layers.1
free %ag6
%rs1 = reduce_scatter [3,4]
wait %rs1
%ag8 = all_gather [1,2]
wait %ag8
compute bwd layers.0
free %ag8
%rs3 = reduce_scatter [1,2]
wait %rs3
%ag10 = all_gather [0]
wait %ag10
compute bwd embed
free %ag10
%rs5 = reduce_scatter [0]
wait %rs5
optimizer_step
)");
}

TEST(Passes, NoBucketingKeepsTheDeclaredCollectives) {
  const Graph naive = Naive();
  EXPECT_EQ(Print(Ok(BucketAllGathers(naive, Context(), Bucketing::kNone))), Print(naive));
  EXPECT_EQ(Print(Ok(BucketReduceScatters(naive, Context(), Bucketing::kNone))), Print(naive));
}

TEST(Passes, AutoBucketingMergesWhenLatencyDominates) {
  // 20 ms per collective: fewer, larger buckets win.
  const PassContext slow = Context(0.02, 1e9);
  auto count = [](const Graph& g, OpKind k) {
    int n = 0;
    for (const auto& op : g.ops) n += op.kind == k;
    return n;
  };
  Graph blocks = Ok(PipelineWith(Bucketing::kBlock).Run(Naive(), slow));
  Graph merged = Ok(PipelineWith(Bucketing::kAuto).Run(Naive(), slow));
  EXPECT_LT(count(merged, OpKind::kAllGather) + count(merged, OpKind::kReduceScatter),
            count(blocks, OpKind::kAllGather) + count(blocks, OpKind::kReduceScatter));
  EXPECT_LT(Simulate(merged, slow.cost).step_seconds, Simulate(blocks, slow.cost).step_seconds);
  // When communication is free, merging gains nothing and auto keeps the blocks.
  const PassContext fast = Context(0, 1e15);
  EXPECT_EQ(Ops(Ok(PipelineWith(Bucketing::kAuto).Run(Naive(), fast))), Ops(Ok(PipelineWith(Bucketing::kBlock).Run(Naive(), fast))));
}

TEST(Passes, AutoBucketingRespectsTheBudget) {
  const PassContext slow = Context(0.02, 1e9);
  const int64_t free_peak = PeakBytes(Ok(PipelineWith(Bucketing::kAuto).Run(Naive(), slow)));
  Graph blocks = Ok(EagerPlan(Naive(), slow));
  const int64_t budget = PeakBytes(blocks);
  if (free_peak > budget) {
    Graph bounded = Ok(PipelineWith(Bucketing::kAuto).Run(Naive(), Context(0.02, 1e9, budget)));
    EXPECT_LE(PeakBytes(bounded), budget);
  }
}

TEST(Passes, BucketingNamesParse) {
  EXPECT_EQ(*ParseName(kBucketingNames, "auto"), Bucketing::kAuto);
  EXPECT_FALSE(ParseName(kBucketingNames, "blocks").has_value());
  EXPECT_STREQ(BucketingName(Bucketing::kBlock), "block");
  EXPECT_EQ(NameList(kBucketingNames), "none, block, auto");
}

}  // namespace
}  // namespace meshwork::compiler
