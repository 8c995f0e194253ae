// The simulator and cost model on programs small enough to work out by hand.
#include "trainer/compiler/simulator.h"

#include <gtest/gtest.h>

#include "tests/trainer/compiler/small_graph.h"
#include "trainer/compiler/frontend.h"

namespace meshwork::compiler {
namespace {

CostModel Cost() {
  CostModel c;
  c.dp_shard = 2;
  c.shard_link = {0.001, 1e6};  // 1 ms + (1/2) bytes / 1 MB/s
  return c;
}

TEST(CostModel, RingFormula) {
  const CostModel c = Cost();
  EXPECT_DOUBLE_EQ(c.CollectiveSeconds(OpKind::kAllGather, 4000), 0.001 + 0.5 * 4000 / 1e6);
  CostModel one = c;
  one.dp_shard = 1;
  EXPECT_EQ(one.CollectiveSeconds(OpKind::kAllGather, 4000), 0);
  CostModel hsdp = c;
  hsdp.dp_replicate = 4;
  hsdp.replicate_link = {0.0, 1e6};
  EXPECT_DOUBLE_EQ(hsdp.CollectiveSeconds(OpKind::kAllReduce, 1000), 2.0 * 3 / 4 * 1000 / 1e6);
}

TEST(CostModel, FitRecoversLatencyAndBandwidth) {
  std::vector<std::pair<int64_t, double>> samples;
  for (int64_t bytes : {1 << 16, 1 << 20, 1 << 23})
    for (int rep = 0; rep < 3; ++rep) samples.push_back({bytes, 50e-6 + 0.75 * bytes / 2e9});
  auto link = FitLink(samples, 4);
  ASSERT_TRUE(link.ok());
  EXPECT_NEAR(link->latency_seconds, 50e-6, 1e-9);
  EXPECT_NEAR(link->bus_bytes_per_second, 2e9, 1e3);
  EXPECT_FALSE(FitLink({{100, 1.0}, {100, 2.0}}, 2).ok());
}

TEST(Simulator, HiddenAndExposedCommunication) {
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [0]
wait %ag0
%ag1 = all_gather [1,2]
compute fwd embed
wait %ag1
compute fwd layers.0
%ag2 = all_gather [3,4]
%ag3 = all_gather [5]
wait %ag2
wait %ag3
compute fwd layers.1
compute fwd head
compute bwd head
compute bwd layers.1
compute bwd layers.0
compute bwd embed
%rs0 = reduce_scatter [0,1,2,3,4,5]
wait %rs0
free %ag0
free %ag1
free %ag2
free %ag3
optimizer_step
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(Validate(*g).ok()) << Validate(*g).ToString();
  const SimResult r = Simulate(*g, Cost());
  // ag0: 0 -> 3 ms (exposed 3). ag1 (4000 B): 3 -> 6 ms, embed computes 3 -> 4, exposed 2.
  // layers.0: 6 -> 16. ag2 (4000 B) 16 -> 19 then ag3 19 -> 22: exposed 6.
  // compute 22 -> 22 + 2 + 4 + 20 + 20 + 2 + 10 = 80 ms. rs0 (32000 B): 80 -> 97, exposed 17.
  EXPECT_NEAR(r.exposed_comm_seconds, 0.003 + 0.002 + 0.006 + 0.017, 1e-12);
  EXPECT_NEAR(r.step_seconds, 0.097, 1e-12);
  EXPECT_NEAR(r.compute_seconds, 0.001 + 0.01 + 0.058, 1e-12);
  EXPECT_NEAR(r.comm_seconds, 0.003 * 4 + 0.017, 1e-12);
  EXPECT_EQ(r.collectives, 5);
  // Peak: all 16000 gathered bytes stay; backward trades each module's activations for its
  // full gradients (16000, in the parameters' dtype), held until the one reduce-scatter, whose
  // issue casts them to the reduction's dtype (32000): both are held for a moment.
  EXPECT_EQ(r.peak_bytes, 16000 + 16000 + 32000);
  EXPECT_EQ(r.static_bytes, 4 * 16000);
  // The step's host time outside forward and backward (norm, optimizer, loss, batch) runs at
  // optimizer_step, after the last wait: a whole step as the trainer times it.
  CostModel whole = Cost();
  whole.step_overhead_seconds = 0.025;
  const SimResult w = Simulate(*g, whole);
  EXPECT_NEAR(w.step_seconds, 0.097 + 0.025, 1e-12);
  EXPECT_NEAR(w.exposed_comm_seconds, r.exposed_comm_seconds, 1e-12);
  EXPECT_NEAR(w.ops.back().start, 0.097, 1e-12);
  EXPECT_NEAR(w.ops.back().end, 0.122, 1e-12);
}


// CPU ranks: communication and compute share the cores. With interference 1 each runs at half
// speed while the other is busy (comm_interference unset: the same as interference).
TEST(Simulator, InterferenceSlowsOverlappingComputeAndCommunication) {
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [3,4]
wait %ag0
%ag1 = all_gather [1,2]
compute fwd layers.1
wait %ag1
free %ag0
free %ag1
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  CostModel c = Cost();
  // Without interference: ag0 0 -> 3 ms (exposed), ag1 3 -> 6 ms hidden under layers.1 3 -> 13.
  EXPECT_NEAR(Simulate(*g, c).step_seconds, 0.013, 1e-12);
  c.interference = 1.0;
  // ag0 alone 0 -> 3. Then ag1 (3 ms of work) and layers.1 (10 ms) share: both at half speed
  // until ag1 ends at 9 ms, when layers.1 has done 3 ms; its last 7 ms alone end at 16 ms.
  const SimResult r = Simulate(*g, c);
  EXPECT_NEAR(r.step_seconds, 0.016, 1e-12);
  EXPECT_NEAR(r.exposed_comm_seconds, 0.003, 1e-12);
  EXPECT_NEAR(r.compute_seconds, 0.010, 1e-12);  // the work, not its stretched duration
  EXPECT_NEAR(r.ops[2].start, 0.003, 1e-12);      // ag1 on the lane
  EXPECT_NEAR(r.ops[2].end, 0.009, 1e-12);
  EXPECT_NEAR(r.ops[3].end, 0.016, 1e-12);        // layers.1
  // Measured apart (a shaped link: compute does not slow the wire): ag1 at full speed 3 -> 6 ms
  // while layers.1 runs at half speed (1.5 ms of its work done), its last 8.5 ms alone: 14.5 ms.
  c.comm_interference = 0;
  const SimResult apart = Simulate(*g, c);
  EXPECT_NEAR(apart.ops[2].end, 0.006, 1e-12);
  EXPECT_NEAR(apart.step_seconds, 0.0145, 1e-12);
}

// Each busy lane is one more communication thread beside the host: with an all-gather and a
// reduce-scatter in flight, compute goes at 1 / (1 + 2 x interference).
TEST(Simulator, TwoBusyLanesSlowComputeTwice) {
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [3,4]
%rs0 = reduce_scatter [1,2]
compute fwd layers.1
wait %ag0
wait %rs0
free %ag0
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  CostModel c = Cost();  // ag0 3 ms, rs0 (8000 B) 5 ms alone
  c.shard_lanes_share = 1.0;
  c.interference = 0.5;
  c.comm_interference = 0;
  // 0 -> 3 ms: both lanes busy, layers.1 at 1 / 2 (1.5 ms of work); 3 -> 5: rs0 alone, at
  // 1 / 1.5 (1.333 ms); the last 7.167 ms alone: 12.167 ms.
  const SimResult r = Simulate(*g, c);
  EXPECT_NEAR(r.ops[2].end, 0.005 + (0.010 - 0.0015 - 0.002 / 1.5), 1e-12);
  EXPECT_NEAR(r.step_seconds, r.ops[2].end, 1e-12);
}

// Collectives queue on their own lane (all-gathers, reduce-scatters): a lane runs one at a time
// in issue order, and the two dp_shard lanes share the link while both run.
TEST(Simulator, AllGatherAndReduceScatterLanesShareTheLink) {
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [3,4]
%rs0 = reduce_scatter [1,2]
%ag1 = all_gather [1,2]
wait %ag1
wait %rs0
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  CostModel c = Cost();  // alone: ag0 and ag1 3 ms each, rs0 (8000 B) 5 ms
  c.shard_lanes_share = 1.0;
  // Independent lanes: ag0 0 -> 3, ag1 behind it 3 -> 6; rs0 0 -> 5.
  SimResult r = Simulate(*g, c);
  EXPECT_NEAR(r.ops[2].start, 0.003, 1e-12);
  EXPECT_NEAR(r.ops[2].end, 0.006, 1e-12);
  EXPECT_NEAR(r.ops[1].end, 0.005, 1e-12);
  EXPECT_NEAR(r.step_seconds, 0.006, 1e-12);
  c.shard_lanes_share = 0.5;
  // Splitting the link: ag0 and rs0 at half speed until ag0 ends at 6 ms (rs0 has 2 ms left);
  // ag1 starts, both at half speed until rs0 ends at 10 ms (ag1 has 1 ms left), alone to 11.
  r = Simulate(*g, c);
  EXPECT_NEAR(r.ops[0].end, 0.006, 1e-12);
  EXPECT_NEAR(r.ops[1].end, 0.010, 1e-12);
  EXPECT_NEAR(r.ops[2].start, 0.006, 1e-12);
  EXPECT_NEAR(r.ops[2].end, 0.011, 1e-12);
  EXPECT_NEAR(r.step_seconds, 0.011, 1e-12);
  EXPECT_NEAR(r.exposed_comm_seconds, 0.011, 1e-12);
  EXPECT_NEAR(r.comm_seconds, 0.011, 1e-12);  // the collectives' own durations
}

// The runtime issues one collective per flat group: a bucket of two groups pays two latencies
// (one ring's bandwidth for the bytes either way); parameters without a group are one collective.
TEST(CostModel, ABucketOfFlatGroupsPaysOneLatencyPerGroup) {
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [1,2,3,4]
wait %ag0
compute fwd layers.0
compute fwd layers.1
free %ag0
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const CostModel c = Cost();
  EXPECT_EQ(CostModel::CollectiveCalls(*g, g->ops[0]), 1);
  EXPECT_NEAR(Simulate(*g, c).comm_seconds, 0.001 + 0.5 * 8000 / 1e6, 1e-12);
  Graph grouped = *g;
  GroupByOwner(grouped);
  EXPECT_EQ(CostModel::CollectiveCalls(grouped, grouped.ops[0]), 2);
  EXPECT_NEAR(Simulate(grouped, c).comm_seconds, 2 * 0.001 + 0.5 * 8000 / 1e6, 1e-12);
}

// layers.1 alone: gathered, forward, backward, its reduce-scatter, free.
const std::string kLayerOneStep = R"(%ag0 = all_gather [3,4]
wait %ag0
compute fwd layers.1
compute bwd layers.1
%rs0 = reduce_scatter [3,4]
wait %rs0
free %ag0
)";

// A module's backward workspace (recomputed activations) counts toward the peak only while
// that backward runs.
TEST(Simulator, BackwardWorkspaceCountsOnlyDuringItsBackward) {
  std::string model = kSmallModel;
  const std::string from = "module layers.1 fwd=0.01 bwd=0.02 act=5000 params=[3,4]";
  model.replace(model.find(from), from.size(), "module layers.1 fwd=0.01 bwd=0.02 act=5000 ws=100000 params=[3,4]");
  auto g = Parse(model + kLayerOneStep);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  // At the end of the backward: gathered 4000, activations 5000, the 100000 workspace and the
  // new gradients, in the parameters' dtype, 3000 + 1000.
  EXPECT_EQ(PeakBytes(*g), 4000 + 5000 + 100000 + 4000);
  EXPECT_EQ(Print(*g).find("ws=100000") != std::string::npos, true);
}

// The head's chunk of logits (tr=) counts only while its compute runs, forward and backward; split
// by vocabulary its chunk is vtr=, which forward holds twice (the logits and log-sum-exp's
// exponentials). Both round-trip on the module line.
TEST(Simulator, TheHeadsChunkOfLogitsCountsWhileItsComputeRuns) {
  const std::string head_ops = R"(%ag0 = all_gather [5]
wait %ag0
compute fwd head
compute bwd head
%rs0 = reduce_scatter [5]
wait %rs0
free %ag0
)";
  auto plain = Parse(kSmallModel + head_ops);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const int64_t without = PeakBytes(*plain);
  std::string model = kSmallModel;
  const std::string from = "module head fwd=0.002 bwd=0.004 act=800 params=[5]";
  model.replace(model.find(from), from.size(), "module head fwd=0.002 bwd=0.004 act=800 tr=100000 vtr=30000 params=[5]");
  auto g = Parse(model + head_ops);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Print(*g), model + head_ops);
  // Gathered 4000, activations 800 and the chunk, in forward and again in backward.
  EXPECT_EQ(PeakBytes(*g), 4000 + 800 + 100000);
  EXPECT_GT(PeakBytes(*g), without);
  // Split by vocabulary, what the head holds for a moment is vtr=, twice in forward.
  auto tied = Parse(kSmallModel);
  ASSERT_TRUE(tied.ok());
  tied->params[0].row_bytes = 640;
  tied->modules[3].params = {5, 0};
  ReadByRows(*tied);
  SplitByVocabulary(*tied);
  Graph split = BuildNaiveProgram(*tied, {true});
  const int64_t split_without = PeakBytes(split);
  split.modules[3].transient_bytes = 100000;
  EXPECT_EQ(PeakBytes(split), split_without) << "tr= does not apply to a head split by vocabulary";
  split.modules[3].vocab_transient_bytes = 30000;
  const int64_t at_30000 = PeakBytes(split);
  EXPECT_GT(at_30000, split_without);
  // The head's forward is now the peak: 10000 more of it is 20000 more peak (held twice).
  split.modules[3].vocab_transient_bytes = 40000;
  EXPECT_EQ(PeakBytes(split), at_30000 + 2 * 10000);
}

// The gradients accumulate in the parameters' dtype, in the buffer a reduce-scatter reads. When
// the reduction runs in another dtype (bf16 weights, fp32 reduction: grad = 2 x gathered here)
// its issue casts them (both held for a moment); with rs_recv=full (Gloo) it also holds a
// receive buffer as large as its input until its wait.
TEST(Simulator, ReduceScatterReceiveBufferCountsUntilItsWait) {
  const std::string& ops = kLayerOneStep;
  auto nccl = Parse(kSmallModel + ops);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  // At the issue: gathered 4000, the bf16 gradients 4000 and their fp32 cast 8000.
  EXPECT_EQ(PeakBytes(*nccl), 4000 + 4000 + 8000);
  std::string model = kSmallModel;
  model.replace(model.find("dp_replicate=1"), 14, "dp_replicate=1 rs_recv=full");
  auto gloo = Parse(model + ops);
  ASSERT_TRUE(gloo.ok()) << gloo.status().ToString();
  EXPECT_TRUE(gloo->reduce_scatter_receives_input);
  EXPECT_EQ(Print(*gloo), model + ops);
  // Then the bf16 gradients go and the receive buffer comes: gathered, the cast, the receive.
  EXPECT_EQ(PeakBytes(*gloo), 4000 + 8000 + 8000);
  // Reduced in the parameters' dtype, the gradient buffer itself is the input: no copy. The
  // peak is the end of the backward (gathered, activations, gradients).
  Graph same = *nccl;
  for (auto& p : same.params) p.grad_bytes = p.gathered_bytes;
  EXPECT_EQ(PeakBytes(same), 4000 + 5000 + 4000);
}

// The flat layout makes no copies around collectives: the all-gather costs the host nothing.
// Gloo's reduce-scatter sums the all-to-all's chunks into the shard at its wait: host work.
TEST(Simulator, GlooReductionAtTheWaitIsTheOnlyHostWorkAroundCollectives) {
  std::string model = kSmallModel;
  model.replace(model.find("dp_replicate=1"), 14, "dp_replicate=1 rs_recv=full");
  auto g = Parse(model + kLayerOneStep);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  CostModel c = Cost();
  c.host_copy_bytes_per_second = 1e6;
  // ag0 (4000 B) 0 -> 3 ms, blocked all of it; forward 3 -> 13; backward 13 -> 33; rs0 (8000 B
  // input) 33 -> 38, blocked; its reduction (8000 / 2 B) 38 -> 42.
  const SimResult r = Simulate(*g, c);
  EXPECT_NEAR(r.step_seconds, 0.042, 1e-12);
  EXPECT_NEAR(r.exposed_comm_seconds, 0.008, 1e-12);
  EXPECT_NEAR(r.copy_seconds, 0.004, 1e-12);
  EXPECT_NEAR(r.ops[1].end, 0.003, 1e-12);  // the all-gather's wait: no copy-out
  Graph nccl = *g;
  nccl.reduce_scatter_receives_input = false;
  EXPECT_NEAR(Simulate(nccl, c).copy_seconds, 0, 1e-12);
}

}  // namespace
}  // namespace meshwork::compiler
