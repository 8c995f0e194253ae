// Each pass on golden text: the small model's naive program through bucketing, reordering and
// free insertion, the memory budget, and the pipeline's controls.
#include "trainer/compiler/passes.h"
#include "trainer/compiler/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "tests/trainer/compiler/small_graph.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

Graph Naive(bool reshard = true) {
  auto g = Parse(kSmallModel);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return BuildNaiveProgram(*g, {reshard});
}

PassContext Context(Bucketing b, double latency = 0.001, double bandwidth = 1e6, int64_t budget = 0) {
  PassContext ctx;
  ctx.cost.dp_shard = 2;
  ctx.cost.shard_link = {latency, bandwidth};
  ctx.bucketing = b;
  ctx.memory_budget_bytes = budget;
  return ctx;
}

// The op lines only (the param and module table is unchanged by passes).
std::string Ops(const Graph& g) {
  std::string text = Print(g);
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("meshwork-ir", 0) == 0 || line.rfind("mesh ", 0) == 0 || line.rfind("param ", 0) == 0 ||
        line.rfind("module ", 0) == 0)
      continue;
    out += line + "\n";
  }
  return out;
}

Graph Ok(Result<Graph> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return Graph();
  EXPECT_TRUE(Validate(*r).ok()) << Validate(*r).ToString();
  return std::move(r).value();
}

TEST(Passes, BlockBucketingMakesOneCollectivePerModule) {
  const PassContext ctx = Context(Bucketing::kBlock);
  Graph g = Ok(BucketAllGathers(Naive(), ctx));
  g = Ok(BucketReduceScatters(g, ctx));
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
  EXPECT_EQ(Print(Ok(BucketAllGathers(naive, Context(Bucketing::kNone)))), Print(naive));
  EXPECT_EQ(Print(Ok(BucketReduceScatters(naive, Context(Bucketing::kNone)))), Print(naive));
}

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
  const PassContext ctx = Context(Bucketing::kBlock);
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), ctx)), ctx));
  Graph r = Ok(Reorder(g, ctx));
  EXPECT_EQ(Ops(r), kReordered);
  const SimResult before = Simulate(g, ctx.cost), after = Simulate(r, ctx.cost);
  EXPECT_LT(after.exposed_comm_seconds, before.exposed_comm_seconds);
  EXPECT_LT(after.step_seconds, before.step_seconds);
}

TEST(Passes, ReorderPrefetchesFurtherWhenOneAheadIsNotEnough) {
  // Slow links: one compute ahead does not hide a layer's all-gather any more.
  const PassContext ctx = Context(Bucketing::kBlock, 0.001, 2e5);
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), ctx)), ctx));
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
  const PassContext blocks = Context(Bucketing::kBlock);
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), blocks)), blocks));
  // Below even the unprefetched program's peak: nothing can move, and the pass still succeeds.
  const PassContext tight = Context(Bucketing::kBlock, 0.001, 1e6, PeakBytes(g) - 1);
  EXPECT_EQ(Ops(Ok(Reorder(g, tight))), Ops(g));
  EXPECT_TRUE(Pipeline::Default().Run(Naive(), tight).ok());
  // With room for it, the same pass prefetches.
  EXPECT_EQ(Ops(Ok(Reorder(g, Context(Bucketing::kBlock)))), kReordered);
}

TEST(Passes, ReduceScatterWaitsMoveToTheStepOnlyWhenTheBudgetHoldsEveryGradient) {
  const PassContext blocks = Context(Bucketing::kBlock);
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), blocks)), blocks));
  const int64_t at_step = PeakBytes(Ok(Reorder(g, blocks)));
  auto one_behind = Parse(kSmallModel + kReorderedWaitsOneBehind);
  ASSERT_TRUE(one_behind.ok()) << one_behind.status().ToString();
  const int64_t behind = PeakBytes(*one_behind);
  ASSERT_LT(behind, at_step) << "holding every gradient until the step must cost memory";
  // A budget between the two: the waits stay one behind, and the peak within the budget.
  Graph r = Ok(Reorder(g, Context(Bucketing::kBlock, 0.001, 1e6, behind)));
  EXPECT_EQ(Ops(r), kReorderedWaitsOneBehind);
  EXPECT_LE(PeakBytes(r), behind);
  EXPECT_EQ(Ops(Ok(Reorder(g, Context(Bucketing::kBlock, 0.001, 1e6, at_step)))), kReordered);
}

TEST(Passes, TheEagerPlanIsFsdp2sDefaults) {
  // As the eager executor does: each reduce-scatter waited for right after the next one is
  // issued (one in flight), so every wait but the last two comes before a backward compute.
  const std::string ops = Ops(Ok(EagerPlan(Naive(), Context(Bucketing::kBlock))));
  const std::vector<std::string> issued = {"%rs0 = ", "%rs1 = ", "%rs3 = ", "%rs5 = "};
  for (size_t k = 0; k + 1 < issued.size(); ++k) {
    const std::string wait = "wait " + issued[k].substr(0, 4);
    ASSERT_NE(ops.find(wait), std::string::npos) << wait << "\n" << ops;
    EXPECT_GT(ops.find(wait), ops.find(issued[k + 1])) << wait << "\n" << ops;
    // Nothing but the wait and its all-reduce between the next issue and the wait.
    EXPECT_EQ(ops.find(wait), ops.find("\n", ops.find(issued[k + 1])) + 1) << wait << "\n" << ops;
  }
  EXPECT_LT(ops.find("wait %rs1"), ops.rfind("compute bwd")) << ops;
  // The root's modules (the embedding here) and the last layer stay gathered from forward to
  // backward; layer 0 is gathered again for its backward.
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = ops.find(what); at != std::string::npos; at = ops.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("all_gather [0]"), 1u) << ops;
  EXPECT_EQ(count("all_gather [3,4]"), 1u) << ops;
  EXPECT_EQ(count("all_gather [1,2]"), 2u) << ops;
  // Without reshard after forward nothing is gathered twice.
  const std::string kept = Ops(Ok(EagerPlan(Naive(false), Context(Bucketing::kBlock))));
  EXPECT_EQ(kept.find("all_gather [1,2]"), kept.rfind("all_gather [1,2]")) << kept;
}

TEST(Passes, BudgetBoundsPeakMemory) {
  const PassContext blocks = Context(Bucketing::kBlock);
  Graph g = Ok(BucketReduceScatters(Ok(BucketAllGathers(Naive(), blocks)), blocks));
  const int64_t unbounded = PeakBytes(Ok(Reorder(g, blocks)));
  const int64_t naive = PeakBytes(g);
  ASSERT_GT(unbounded, naive);
  for (int64_t budget = naive; budget <= unbounded; budget += 1000) {
    Graph r = Ok(Reorder(g, Context(Bucketing::kBlock, 0.001, 1e6, budget)));
    EXPECT_LE(PeakBytes(r), budget) << "budget " << budget;
  }
}

TEST(Passes, InsertFreesReleasesRightAfterTheLastUse) {
  // A hand-written program with frees at the very end: the pass moves each up to its last use.
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [0,5]
wait %ag0
compute fwd embed
%ag1 = all_gather [1,2,3,4]
wait %ag1
compute fwd layers.0
compute fwd layers.1
compute fwd head
compute bwd head
compute bwd layers.1
compute bwd layers.0
compute bwd embed
%rs0 = reduce_scatter [0,1,2,3,4,5]
wait %rs0
free %ag1
free %ag0
optimizer_step
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Graph f = Ok(InsertFrees(*g, Context(Bucketing::kNone)));
  EXPECT_EQ(Ops(f), R"(%ag0 = all_gather [0,5]
wait %ag0
compute fwd embed
%ag1 = all_gather [1,2,3,4]
wait %ag1
compute fwd layers.0
compute fwd layers.1
compute fwd head
compute bwd head
compute bwd layers.1
compute bwd layers.0
free %ag1
compute bwd embed
free %ag0
%rs0 = reduce_scatter [0,1,2,3,4,5]
wait %rs0
optimizer_step
)");
  EXPECT_LT(PeakBytes(f), PeakBytes(*g));
}

TEST(Passes, AutoBucketingMergesWhenLatencyDominates) {
  // 20 ms per collective: fewer, larger buckets win.
  const PassContext slow = Context(Bucketing::kAuto, 0.02, 1e9);
  const PassContext block = Context(Bucketing::kBlock, 0.02, 1e9);
  auto count = [](const Graph& g, OpKind k) {
    int n = 0;
    for (const auto& op : g.ops) n += op.kind == k;
    return n;
  };
  Graph blocks = Ok(Pipeline::Default().Run(Naive(), block));
  Graph merged = Ok(Pipeline::Default().Run(Naive(), slow));
  EXPECT_LT(count(merged, OpKind::kAllGather) + count(merged, OpKind::kReduceScatter),
            count(blocks, OpKind::kAllGather) + count(blocks, OpKind::kReduceScatter));
  EXPECT_LT(Simulate(merged, slow.cost).step_seconds, Simulate(blocks, slow.cost).step_seconds);
  // When communication is free, merging gains nothing and auto keeps the blocks.
  const PassContext fast = Context(Bucketing::kAuto, 0, 1e15);
  EXPECT_EQ(Ops(Ok(Pipeline::Default().Run(Naive(), fast))), Ops(Ok(Pipeline::Default().Run(Naive(), Context(Bucketing::kBlock, 0, 1e15)))));
}

TEST(Passes, AutoBucketingRespectsTheBudget) {
  const PassContext slow = Context(Bucketing::kAuto, 0.02, 1e9);
  const int64_t free_peak = PeakBytes(Ok(Pipeline::Default().Run(Naive(), slow)));
  Graph blocks = Ok(EagerPlan(Naive(), slow));
  const int64_t budget = PeakBytes(blocks);
  if (free_peak > budget) {
    Graph bounded = Ok(Pipeline::Default().Run(Naive(), Context(Bucketing::kAuto, 0.02, 1e9, budget)));
    EXPECT_LE(PeakBytes(bounded), budget);
  }
}

TEST(Passes, EveryCombinationYieldsAValidProgram) {
  for (bool reshard : {true, false})
    for (Bucketing b : {Bucketing::kNone, Bucketing::kBlock, Bucketing::kAuto})
      for (bool reorder : {true, false}) {
        Pipeline p = Pipeline::Default();
        if (!reorder) {
          ASSERT_TRUE(p.Disable("reorder").ok());
        }
        auto out = p.Run(Naive(reshard), Context(b));
        EXPECT_TRUE(out.ok()) << BucketingName(b) << " reorder " << reorder << ": " << out.status().ToString();
      }
}

TEST(Passes, PipelineDisablesOptionalPassesByName) {
  Pipeline p = Pipeline::Default();
  EXPECT_EQ(p.Describe(),
            "async_tp, checkpoint, keep_gathered, bucket_all_gathers, bucket_reduce_scatters, reorder, insert_frees");
  ASSERT_TRUE(p.Disable("reorder").ok());
  EXPECT_EQ(p.Describe(), "async_tp, checkpoint, keep_gathered, bucket_all_gathers, bucket_reduce_scatters, "
                          "reorder (disabled), insert_frees");
  Status unknown = p.Disable("fuse");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidConfig);
  EXPECT_NE(unknown.message().find("unknown pass 'fuse'"), std::string::npos);
  EXPECT_EQ(p.Disable("insert_frees").code(), StatusCode::kInvalidConfig);
  std::ostringstream dump;
  auto out = p.Run(Naive(), Context(Bucketing::kBlock), &dump);
  ASSERT_TRUE(out.ok());
  EXPECT_NE(dump.str().find("== input =="), std::string::npos);
  EXPECT_NE(dump.str().find("== reorder (disabled) =="), std::string::npos);
  EXPECT_NE(dump.str().find("== insert_frees ==\nmeshwork-ir 1"), std::string::npos);
}

TEST(Passes, BucketingNamesParse) {
  EXPECT_EQ(*ParseName(kBucketingNames, "auto"), Bucketing::kAuto);
  EXPECT_FALSE(ParseName(kBucketingNames, "blocks").has_value());
  EXPECT_STREQ(BucketingName(Bucketing::kBlock), "block");
  EXPECT_EQ(NameList(kBucketingNames), "none, block, auto");
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
  PassContext ctx = Context(Bucketing::kBlock);
  ctx.cost.dp_replicate = 2;
  ctx.cost.replicate_link = {0.001, 1e6};
  const Graph eager = Ok(EagerPlan(naive, ctx));
  const Graph compiled = Ok(Reorder(Ok(BucketReduceScatters(Ok(BucketAllGathers(naive, ctx)), ctx)), ctx));
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

TEST(Planner, ComputeIsScaledSoThatTheEagerPlanTakesTheMeasuredStep) {
  const PassContext ctx = Context(Bucketing::kBlock, 0.001, 1e8);
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
  PassContext ctx = Context(Bucketing::kBlock, 0.001, 1e6);
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

// The small model with its two layers as checkpointing candidates, their activations large
// enough (50000) to make the peak, as in a real model (not a reduce-scatter's copy-in of a few
// thousand bytes). layers.0 keeps 1000 bytes (its input) when checkpointed; layers.1's input is
// as large as its activations, so checkpointing it saves nothing and costs its recompute.
Graph CheckpointableNaive() {
  Graph g = Naive();
  for (auto& m : g.modules) {
    if (m.name.rfind("layers.", 0) != 0) continue;
    m.activation_bytes = 50000;
    m.checkpoint_input_bytes = m.name == "layers.0" ? 1000 : 50000;
  }
  return g;
}

TEST(Passes, CheckpointingTakesAsFewLayersAsTheBudgetNeedsEarliestFirst) {
  const Graph naive = CheckpointableNaive();
  Graph first = naive, both = naive;
  Checkpoint(first.modules[1]);
  Checkpoint(both.modules[1]);
  Checkpoint(both.modules[2]);
  const int64_t none_peak = PeakBytes(naive), first_peak = PeakBytes(first), both_peak = PeakBytes(both);
  ASSERT_LT(first_peak, none_peak);
  // layers.1 recomputed holds its input and its activations at once: no lower a peak.
  ASSERT_GE(both_peak, first_peak);

  auto checkpointed = [](const Graph& g) {
    std::string names;
    for (const auto& m : g.modules)
      if (IsCheckpointed(m)) names += m.name + " ";
    return names;
  };
  // A budget that holds the naive program: nothing checkpointed (it only costs time).
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(Bucketing::kBlock, 0.001, 1e6, none_peak)))), "");
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(Bucketing::kBlock)))), "") << "no budget";
  // Just below it: the first layer only.
  const Graph one = Ok(CheckpointToFit(naive, Context(Bucketing::kBlock, 0.001, 1e6, none_peak - 1)));
  EXPECT_EQ(checkpointed(one), "layers.0 ");
  EXPECT_EQ(PeakBytes(one), first_peak);
  // A checkpointed layer recomputes its forward in backward and holds the recomputed activations
  // only then.
  EXPECT_DOUBLE_EQ(one.modules[1].bwd_seconds, naive.modules[1].bwd_seconds + naive.modules[1].fwd_seconds);
  EXPECT_EQ(one.modules[1].activation_bytes, 1000);
  EXPECT_EQ(one.modules[1].backward_workspace_bytes, naive.modules[1].activation_bytes);
  EXPECT_EQ(one.modules[1].checkpoint_input_bytes, 0);
  // Below that, checkpointing layers.1 too would not help: the pass stops at layers.0 and the
  // plan is still produced (over the budget; the summary says so).
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(Bucketing::kBlock, 0.001, 1e6, first_peak - 1)))),
            "layers.0 ");
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(Bucketing::kBlock, 0.001, 1e6, 1)))), "layers.0 ");
  // With three layers and the budget far below, the earlier ones are checkpointed first.
  std::string three = kSmallModel;
  three.replace(three.find("module head"), 0, "module layers.2 fwd=0.01 bwd=0.02 act=50000 ckpt=1000 params=[]\n");
  for (const std::string layer : {"layers.0 fwd=0.01 bwd=0.02 act=5000 ", "layers.1 fwd=0.01 bwd=0.02 act=5000 "}) {
    three.replace(three.find(layer), layer.size(), layer.substr(0, layer.size() - 1) + "0 ckpt=1000 ");
  }
  auto parsed = Parse(three);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Graph naive3 = BuildNaiveProgram(*parsed, {});
  const std::string taken = checkpointed(Ok(CheckpointToFit(naive3, Context(Bucketing::kBlock, 0.001, 1e6, 1))));
  EXPECT_EQ(taken.rfind("layers.0 layers.1 ", 0), 0u) << "earliest first: " << taken;
  // Without candidates (the trainer's skeleton today) the pass changes nothing.
  EXPECT_EQ(Print(Ok(CheckpointToFit(Naive(), Context(Bucketing::kBlock, 0.001, 1e6, 1)))), Print(Naive()));
}

// A budget below the eager plan's peak still yields a plan that fits it: the compiled plan
// checkpoints and waits for reduce-scatters early where the eager plan cannot.
TEST(Planner, ADeviceBudgetBelowTheEagerPeakIsMetByCheckpointing) {
  const Graph skeleton = CheckpointableNaive();
  PlanOptions options;
  options.bucketing = Bucketing::kBlock;
  const CostModel cost = Context(Bucketing::kBlock).cost;
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

// The planner reads the embedding by rows where its rows' exchange moves less than the table's
// collectives and the plan is then faster (kWhenFaster), always with kAlways, never with kNever
// or with replicas (HSDP); it says which and why.
TEST(Planner, TheEmbeddingIsReadByRowsWhereThatIsFaster) {
  auto plan = [](int64_t row_bytes, PlanOptions::Rows rows, int dp_replicate = 1) {
    auto g = Parse(kSmallModel);
    EXPECT_TRUE(g.ok());
    g->params[0].row_bytes = row_bytes;
    g->dp_replicate = dp_replicate;
    PlanOptions options;
    options.bucketing = Bucketing::kBlock;
    options.read_by_rows = rows;
    CostModel cost = Context(Bucketing::kBlock).cost;
    cost.dp_replicate = dp_replicate;
    auto plans = PlanStep(*g, cost, options);
    EXPECT_TRUE(plans.ok()) << plans.status().ToString();
    int row_ops = 0;
    for (const Op& op : plans->compiled.ops) row_ops += op.kind == OpKind::kRowGather || op.kind == OpKind::kRowReduce;
    std::string said;
    for (const std::string& c : plans->choices) said += c + "\n";
    return std::make_pair(row_ops, said);
  };
  // Rows of 100 bytes against a 4000-byte table: read by rows.
  auto [ops, said] = plan(100, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(ops, 2) << said;
  EXPECT_NE(said.find("the embedding is read by rows: predicted step"), std::string::npos) << said;
  EXPECT_NE(said.find("model.embed_tokens.weight read by rows: 200 B of rows"), std::string::npos) << said;
  // Rows of 40000 bytes (dp_shard 2: 80000 exchanged): gathered whole, and why.
  std::tie(ops, said) = plan(40000, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(ops, 0) << said;
  EXPECT_NE(said.find("the embedding is gathered whole: exchanging every rank's rows (dp_shard 2 x "), std::string::npos)
      << said;
  std::tie(ops, said) = plan(40000, PlanOptions::Rows::kAlways);
  EXPECT_EQ(ops, 2) << said;
  std::tie(ops, said) = plan(100, PlanOptions::Rows::kNever);
  EXPECT_EQ(ops, 0) << said;
  EXPECT_EQ(said.find("the embedding is"), std::string::npos) << said;
  std::tie(ops, said) = plan(100, PlanOptions::Rows::kAlways, 2);
  EXPECT_EQ(ops, 0) << "HSDP: " << said;
}

// A tied head splits the table by vocabulary where that is faster than gathering the table for
// it (kWhenFaster: a slow, low-latency link and small hidden states), always with kAlways, never with kNever
// or when the plan does not read the table by rows; the plan summary says which and why.
TEST(Planner, ATiedHeadIsSplitByVocabularyWhereThatIsFaster) {
  auto plan = [](int64_t row_bytes, PlanOptions::Rows vocab, PlanOptions::Rows rows = PlanOptions::Rows::kAlways) {
    auto g = Parse(kSmallModel);
    EXPECT_TRUE(g.ok());
    g->params[0].row_bytes = row_bytes;
    g->modules[3].params = {5, 0};  // tied
    PlanOptions options;
    options.bucketing = Bucketing::kBlock;
    options.read_by_rows = rows;
    options.split_by_vocabulary = vocab;
    auto plans = PlanStep(*g, Context(Bucketing::kBlock, 0.0001, 1e5).cost, options);
    EXPECT_TRUE(plans.ok()) << plans.status().ToString();
    std::string said;
    for (const std::string& c : plans->choices) said += c + "\n";
    return std::make_pair(plans->compiled.modules[3].vocab.size(), said);
  };
  // Hidden states of 100 bytes against a 4000-byte table on a 100 kB/s link: split.
  auto [split, said] = plan(100, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(split, 1u) << said;
  EXPECT_NE(said.find("the output head is split by vocabulary"), std::string::npos) << said;
  EXPECT_NE(said.find("never gathered or reduce-scattered whole: the output head splits it by vocabulary"),
            std::string::npos) << said;
  // Hidden states of 40000 bytes: the head gathers the table, and says why.
  std::tie(split, said) = plan(40000, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(split, 0u) << said;
  EXPECT_NE(said.find("the output head gathers the table whole: splitting it by vocabulary is predicted"),
            std::string::npos) << said;
  std::tie(split, said) = plan(40000, PlanOptions::Rows::kAlways);
  EXPECT_EQ(split, 1u) << said;
  std::tie(split, said) = plan(100, PlanOptions::Rows::kNever);
  EXPECT_EQ(split, 0u) << said;
  EXPECT_EQ(said.find("vocabulary"), std::string::npos) << said;
  std::tie(split, said) = plan(100, PlanOptions::Rows::kAlways, PlanOptions::Rows::kNever);
  EXPECT_EQ(split, 0u) << "the table is not read by rows: " << said;
}

// How many all-gathers a step issues for parameter `p`.
int GathersOf(const Graph& g, int p) {
  int n = 0;
  for (const Op& o : g.ops)
    if (o.kind == OpKind::kAllGather && std::find(o.params.begin(), o.params.end(), p) != o.params.end()) ++n;
  return n;
}

TEST(Passes, KeepGatheredDropsExposedReGathersWithinTheBudget) {
  const Graph naive = Naive();  // params 1,2: layers.0; 3,4: layers.1
  ASSERT_EQ(GathersOf(naive, 1), 2);
  ASSERT_EQ(GathersOf(naive, 3), 2);
  // A slow link: the backward re-gathers are exposed. Room for everything: both layers stay
  // gathered from forward to backward, and the program is still valid.
  const PassContext slow = Context(Bucketing::kBlock, 0.001, 1e5, int64_t{1} << 30);
  const Graph kept = Ok(KeepGatheredWithinBudget(naive, slow));
  EXPECT_TRUE(Validate(kept).ok()) << Validate(kept).ToString();
  for (int p : {1, 2, 3, 4}) EXPECT_EQ(GathersOf(kept, p), 1) << "param " << p;
  EXPECT_EQ(GathersOf(kept, 0), 2) << "embed is not a layer: resharded as before";
  // A budget that holds nothing more keeps the resharding.
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(naive, Context(Bucketing::kBlock, 0.001, 1e5, 1)))), Print(naive));
  // Without a budget, or with communication hidden anyway (a fast link), nothing changes.
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(naive, Context(Bucketing::kBlock, 0.001, 1e5, 0)))), Print(naive));
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(naive, Context(Bucketing::kBlock, 1e-6, 1e12, int64_t{1} << 30)))),
            Print(naive));
  // Without reshard after forward there is nothing to keep.
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(Naive(false), slow))), Print(Naive(false)));
}

}  // namespace
}  // namespace meshwork::compiler
