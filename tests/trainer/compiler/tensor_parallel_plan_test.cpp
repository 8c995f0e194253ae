// Tensor parallelism in the schedule compiler: the modules' exchanges in the IR (tp=, gemm=,
// atp=), their price (CostModel::TpSeconds, TpExposedSeconds) and place in the simulated step,
// the async_tp pass, and the modelled Llama module table of a tp rank.
#include <gtest/gtest.h>

#include <string>

#include "trainer/compiler/frontend.h"
#include "trainer/compiler/passes/async_tp.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

// Two layers of 10 ms forward, 20 ms backward, each exchanging 1 MB in 4 collectives each way.
const std::string kTpModel = R"(meshwork-ir 1
mesh dp_shard=2 dp_replicate=1 tp=4
param 0 model.embed_tokens.weight gathered=4000 grad=8000 shard=4000
param 1 model.layers.0.w gathered=3000 grad=6000 shard=3000
param 2 model.layers.1.w gathered=3000 grad=6000 shard=3000
param 3 lm_head.weight gathered=4000 grad=8000 shard=4000
module embed fwd=0 bwd=0 act=100 params=[0]
module layers.0 fwd=0.01 bwd=0.02 act=5000 tp=1000000x4/1000000x4 gemm=0.8 params=[1]
module layers.1 fwd=0.01 bwd=0.02 act=5000 tp=1000000x4/1000000x4 gemm=0.8 params=[2]
module head fwd=0.002 bwd=0.004 act=800 params=[3]
)";

CostModel TpCost() {
  CostModel c;
  c.dp_shard = 2;
  c.shard_link = {0, 1e12};  // FSDP's collectives next to free
  c.tp = 4;
  c.tp_link = {1e-4, 1e8};  // 0.1 ms + (3/4) bytes / 100 MB/s: 7.5 ms per MB
  return c;
}

Graph Ok(Result<Graph> g) {
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Graph();
}

TEST(TensorParallelPlan, ExchangesRoundTripThroughTheText) {
  Graph g = Ok(Parse(kTpModel));
  EXPECT_EQ(g.tp, 4);
  EXPECT_EQ(g.modules[1].tp_fwd.bytes, 1000000);
  EXPECT_EQ(g.modules[1].tp_bwd.calls, 4);
  EXPECT_DOUBLE_EQ(g.modules[1].tp_gemm_share, 0.8);
  g.modules[1].tp_chunks = 4;
  const std::string text = Print(g);
  EXPECT_NE(text.find("mesh dp_shard=2 dp_replicate=1 tp=4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tp=1000000x4/1000000x4 gemm=0.8 atp=4 params=[1]"), std::string::npos) << text;
  EXPECT_EQ(Print(Ok(Parse(text))), text);
  // Without tp the mesh line is as before.
  EXPECT_EQ(Print(Ok(Parse(Print(Graph())))).find("tp="), std::string::npos);
}

TEST(TensorParallelPlan, BadExchangesAreRefusedNamingTheLine) {
  const std::string header = "meshwork-ir 1\nmesh dp_shard=1 dp_replicate=1 tp=2\nparam 0 w gathered=1 grad=1 shard=1\n";
  for (const auto& [line, why] : std::vector<std::pair<std::string, std::string>>{
           {"module m fwd=0 bwd=0 act=0 tp=100x0/0x0 gemm=0.5 params=[0]", "bad tp="},
           {"module m fwd=0 bwd=0 act=0 tp=100x2 gemm=0.5 params=[0]", "bad tp="},
           {"module m fwd=0 bwd=0 act=0 tp=100x2/100x2 params=[0]", "gemm="},
           {"module m fwd=0 bwd=0 act=0 tp=100x2/100x2 gemm=1.5 params=[0]", "gemm="},
           {"module m fwd=0 bwd=0 act=0 atp=1 params=[0]", "bad atp="}}) {
    auto g = Parse(header + line + "\n");
    ASSERT_FALSE(g.ok()) << line;
    EXPECT_NE(g.status().message().find(why), std::string::npos) << g.status().message();
    EXPECT_NE(g.status().message().find("line 4"), std::string::npos) << g.status().message();
  }
  EXPECT_FALSE(Parse("meshwork-ir 1\nmesh dp_shard=1 dp_replicate=1 tp=1\n").ok()) << "tp=1 is never printed";
  // Exchanges on a mesh without tp are not a valid program.
  Graph g = Ok(Parse(kTpModel));
  g.tp = 1;
  EXPECT_FALSE(Validate(g).ok());
}

TEST(TensorParallelPlan, ExchangesCostLatencyAndBandwidthAndOverlapInChunks) {
  const Graph g = Ok(Parse(kTpModel));
  const CostModel c = TpCost();
  const ModuleInfo& layer = g.modules[1];
  const double comm = 4 * 1e-4 + 0.75 * 1e6 / 1e8;  // 7.9 ms
  EXPECT_DOUBLE_EQ(c.TpSeconds(layer, Phase::kForward), comm);
  EXPECT_DOUBLE_EQ(c.TpExposedSeconds(layer, Phase::kForward, 0.01), comm) << "not overlapped: all of it";
  // Four chunks: four times the latencies; the 8 ms of matmuls beside 7.5 ms of bandwidth time
  // pipeline as (8 + 7.5) / 4 + 3/4 x 8 = 9.875 ms, 1.875 ms over the matmuls.
  ModuleInfo chunked = layer;
  chunked.tp_chunks = 4;
  const double bandwidth = 0.75 * 1e6 / 1e8, gemm = 0.8 * 0.01;
  EXPECT_DOUBLE_EQ(c.TpSeconds(chunked, Phase::kForward), 16 * 1e-4 + bandwidth);
  const double pipelined = (gemm + 16 * 1e-4 + bandwidth) / 4 + 0.75 * (16 * 1e-4 + bandwidth);
  EXPECT_NEAR(c.TpExposedSeconds(chunked, Phase::kForward, 0.01), pipelined - gemm, 1e-12);
  EXPECT_LT(c.TpExposedSeconds(chunked, Phase::kForward, 0.01), comm / 2);
  CostModel no_tp = c;
  no_tp.tp = 1;
  EXPECT_EQ(no_tp.TpSeconds(layer, Phase::kForward), 0);
}

// CPU ranks: a chunk's matmul beside the next chunk's exchange is slowed by Gloo's threads on
// the same cores (CostModel::interference), which the overlap pays and a whole exchange does not.
TEST(TensorParallelPlan, OverlappedChunksPayTheInterference) {
  const Graph g = Ok(Parse(kTpModel));
  CostModel c = TpCost();
  c.interference = 1;  // matmuls at half speed while an exchange runs
  c.comm_interference = 0;
  ModuleInfo chunked = g.modules[1];
  chunked.tp_chunks = 4;
  // Per chunk: 2 ms of matmul, (1.6 + 7.5) / 4 = 2.275 ms of exchange. A middle stage runs both:
  // 2.275 ms together (the matmul does 1.1375 ms of its work), then the matmul's other 0.8625 ms
  // alone: 3.1375 ms, not max(2, 2.275). First exchange + 3 stages + last matmul - the 8 ms of
  // matmuls.
  const double chunk_comm = (16 * 1e-4 + 0.75 * 1e6 / 1e8) / 4, chunk_gemm = 0.002;
  const double stage = chunk_comm + (chunk_gemm - chunk_comm / 2);
  EXPECT_NEAR(c.TpExposedSeconds(chunked, Phase::kForward, 0.01), chunk_comm + chunk_gemm + 3 * stage - 0.008, 1e-12);
  CostModel unslowed = c;
  unslowed.interference = 0;
  EXPECT_LT(unslowed.TpExposedSeconds(chunked, Phase::kForward, 0.01), c.TpExposedSeconds(chunked, Phase::kForward, 0.01));
  ModuleInfo whole = g.modules[1];
  EXPECT_DOUBLE_EQ(c.TpExposedSeconds(whole, Phase::kForward, 0.01), unslowed.TpExposedSeconds(whole, Phase::kForward, 0.01))
      << "a whole exchange blocks the host: nothing runs beside it";
  // The exchange slowed instead (a matmul holding the core its thread needs): the matmul ends
  // after its 2 ms, when the exchange at half speed has done 1 ms of its 2.275; the rest alone.
  CostModel comm_slowed = unslowed;
  comm_slowed.comm_interference = 1;
  EXPECT_NEAR(comm_slowed.TpExposedSeconds(chunked, Phase::kForward, 0.01),
              chunk_comm + chunk_gemm + 3 * (chunk_gemm + (chunk_comm - chunk_gemm / 2)) - 0.008, 1e-12);
  // The pass chunks less as the interference grows: 8 chunks free, 4 at 1, 2 at 3.
  PassContext ctx;
  ctx.cost = unslowed;
  EXPECT_EQ(Ok(AsyncTensorParallel(g, ctx)).modules[1].tp_chunks, 8);
  ctx.cost.interference = 1;
  EXPECT_EQ(Ok(AsyncTensorParallel(g, ctx)).modules[1].tp_chunks, 4);
  ctx.cost.interference = 3;
  EXPECT_EQ(Ok(AsyncTensorParallel(g, ctx)).modules[1].tp_chunks, 2);
}

TEST(TensorParallelPlan, TheSimulatedStepCarriesTheExposedExchanges) {
  const Graph naive = BuildNaiveProgram(Ok(Parse(kTpModel)), {});
  const CostModel c = TpCost();
  const SimResult r = Simulate(naive, c);
  const double per_phase = 4 * 1e-4 + 0.75 * 1e6 / 1e8;
  EXPECT_NEAR(r.tp_comm_seconds, 4 * per_phase, 1e-12);  // 2 layers x forward and backward
  EXPECT_NEAR(r.tp_exposed_seconds, 4 * per_phase, 1e-12);
  CostModel no_tp = c;
  no_tp.tp = 1;
  const SimResult plain = Simulate(naive, no_tp);
  EXPECT_NEAR(r.step_seconds - plain.step_seconds, 4 * per_phase, 1e-9);
  EXPECT_EQ(r.collectives - plain.collectives, 16);
}

TEST(TensorParallelPlan, AsyncTpPassPicksTheChunksThatHideMost) {
  PassContext ctx;
  ctx.cost = TpCost();
  const Graph g = Ok(Parse(kTpModel));
  const Graph out = Ok(AsyncTensorParallel(g, ctx));
  for (int m : {1, 2}) {
    const int k = out.modules[m].tp_chunks;
    EXPECT_GT(k, 1) << out.modules[m].name;
    for (int other : {1, 2, 4, 8}) {
      ModuleInfo trial = out.modules[m];
      trial.tp_chunks = other;
      const double mine = ctx.cost.TpExposedSeconds(out.modules[m], Phase::kForward, 0.01) +
                          ctx.cost.TpExposedSeconds(out.modules[m], Phase::kBackward, 0.02);
      const double theirs = ctx.cost.TpExposedSeconds(trial, Phase::kForward, 0.01) +
                            ctx.cost.TpExposedSeconds(trial, Phase::kBackward, 0.02);
      EXPECT_LE(mine, theirs + 1e-15) << other << " chunks";
    }
  }
  EXPECT_EQ(out.modules[0].tp_chunks, 1) << "no exchange, nothing to overlap";
  // Latency-bound exchanges (a slow start, a fast wire) stay whole.
  PassContext latency = ctx;
  latency.cost.tp_link = {5e-3, 1e12};
  EXPECT_EQ(Ok(AsyncTensorParallel(g, latency)).modules[1].tp_chunks, 1);
  // The planner runs it unless told not to, and says what it chose.
  PlanOptions options;
  auto plans = PlanStep(g, ctx.cost, options);
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  EXPECT_GT(plans->compiled.modules[1].tp_chunks, 1);
  EXPECT_EQ(plans->eager.modules[1].tp_chunks, 1) << "the eager plan is TP without overlap";
  bool said = false;
  for (const std::string& c : plans->choices) said = said || c.rfind("async TP on 2 of 2 modules", 0) == 0;
  EXPECT_TRUE(said);
  options.async_tp = false;
  auto off = PlanStep(g, ctx.cost, options);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->compiled.modules[1].tp_chunks, 1);
  EXPECT_LT(Simulate(plans->compiled, ctx.cost).step_seconds, Simulate(off->compiled, ctx.cost).step_seconds);
}

// The trainer overlaps a layer only where its chunks divide each rank's tokens (else it runs the
// exchanges whole), so the pass must not plan on chunks that never run.
TEST(TensorParallelPlan, AsyncTpPassChoosesOnlyChunksThatDivideEachRanksTokens) {
  PassContext ctx;
  ctx.cost = TpCost();
  const Graph g = Ok(Parse(kTpModel));
  const int free_choice = Ok(AsyncTensorParallel(g, ctx)).modules[1].tp_chunks;
  ASSERT_GT(free_choice, 2) << "the test needs a cost model that prefers more than 2 chunks";
  EXPECT_EQ(Ok(AsyncTensorParallel(g, ctx, {free_choice * 3})).modules[1].tp_chunks, free_choice);
  EXPECT_EQ(Ok(AsyncTensorParallel(g, ctx, {6})).modules[1].tp_chunks, 2) << "4 and 8 do not divide 6 tokens";
  EXPECT_EQ(Ok(AsyncTensorParallel(g, ctx, {7})).modules[1].tp_chunks, 1) << "no chunk count divides 7 tokens";
  // The planner hands the pass the trainer's tokens (PlanOptions::tp_tokens_per_rank).
  PlanOptions options;
  options.tp_tokens_per_rank = 6;
  auto plans = PlanStep(g, ctx.cost, options);
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  EXPECT_EQ(plans->compiled.modules[1].tp_chunks, 2);
}

TEST(TensorParallelPlan, CheckpointingRepeatsTheForwardsExchanges) {
  ModuleInfo m;
  m.activation_bytes = 100;
  m.checkpoint_input_bytes = 10;
  m.tp_fwd = {1000, 4};
  m.tp_bwd = {1000, 4};
  Checkpoint(m);
  EXPECT_EQ(m.tp_bwd.bytes, 2000);
  EXPECT_EQ(m.tp_bwd.calls, 8);
}

LlamaShape Shape(int tp, bool sequence_parallel) {
  auto c = model::PresetConfig("llama3-8b");
  EXPECT_TRUE(c.ok());
  LlamaShape s;
  s.config = *c;
  s.batch = 2;
  s.seq_len = 1024;
  s.tp = tp;
  s.sequence_parallel = sequence_parallel;
  return s;
}

TEST(TensorParallelPlan, ALlamaTpRankHoldsItsSlicesAndExchangesTheStream) {
  const Graph whole = LlamaSkeleton(Shape(1, true));
  const Graph split = LlamaSkeleton(Shape(4, true));
  EXPECT_EQ(split.tp, 4);
  ASSERT_EQ(whole.params.size(), split.params.size());
  int64_t whole_bytes = 0, split_bytes = 0, norm_bytes = 0;
  for (size_t p = 0; p < whole.params.size(); ++p) {
    whole_bytes += whole.params[p].gathered_bytes;
    split_bytes += split.params[p].gathered_bytes;
    const bool norm = whole.params[p].name.find("norm") != std::string::npos;
    if (norm) norm_bytes += whole.params[p].gathered_bytes;
    EXPECT_EQ(split.params[p].gathered_bytes, norm ? whole.params[p].gathered_bytes : whole.params[p].gathered_bytes / 4)
        << whole.params[p].name;
  }
  EXPECT_EQ(split_bytes, (whole_bytes - norm_bytes) / 4 + norm_bytes);
  // A quarter of the compute (the norms' is not modelled), and more than a quarter of the
  // activations, less than half: the gathered inputs of q/k/v and gate/up stay whole.
  const ModuleInfo& l1 = whole.modules[1];
  const ModuleInfo& l4 = split.modules[1];
  EXPECT_NEAR(l4.fwd_seconds, l1.fwd_seconds / 4, 1e-15);
  EXPECT_GT(l4.activation_bytes, l1.activation_bytes / 4);
  EXPECT_LT(l4.activation_bytes, l1.activation_bytes / 2);
  EXPECT_EQ(l4.checkpoint_input_bytes, l1.checkpoint_input_bytes / 4) << "the stream is split by tokens";
  // Each layer: two regions, an all-gather and a reduce-scatter of the stream each, both ways.
  const int64_t stream = 2 * 1024 * 4096 * 2;  // tokens x hidden x bf16
  EXPECT_EQ(l4.tp_fwd.bytes, 4 * stream);
  EXPECT_EQ(l4.tp_fwd.calls, 4);
  EXPECT_EQ(l4.tp_bwd.bytes, 4 * stream);
  EXPECT_GT(l4.tp_gemm_share, 0.5);
  EXPECT_LT(l4.tp_gemm_share, 1.0);
  // The embedding cannot be read by rows under tp (its own lookup), and no module splits by
  // vocabulary: the head's loss is tensor parallelism's.
  for (const auto& p : split.params) EXPECT_EQ(p.row_bytes, 0) << p.name;
  // The head's loss keeps no logits: its vocabulary slice's exist a chunk at a time (4 times the
  // whole head's 523 tokens of Llama 3's 128,256 ids: all 2048 here), recomputed in backward.
  const ModuleInfo& head1 = whole.modules.back();
  const ModuleInfo& head4 = split.modules.back();
  const int64_t tokens = 2 * 1024, vocab = 128256;
  EXPECT_EQ(head1.transient_bytes, 523 * vocab * 4);
  EXPECT_EQ(head4.transient_bytes, tokens * (vocab / 4) * 4);
  EXPECT_LT(head4.activation_bytes, tokens * 4096 * 8) << "the stream's bytes and a log-sum-exp, no logits";
  EXPECT_NEAR(head4.bwd_seconds, 3 * head4.fwd_seconds, 1e-12);
  // Without sequence parallelism the stream is whole on every rank: more memory, the same
  // bytes on the wire in half the collectives (all-reduces).
  const Graph plain = LlamaSkeleton(Shape(4, false));
  EXPECT_GT(plain.modules[1].activation_bytes, l4.activation_bytes);
  EXPECT_EQ(plain.modules[1].checkpoint_input_bytes, l1.checkpoint_input_bytes);
  EXPECT_EQ(plain.modules[1].tp_fwd.bytes, l4.tp_fwd.bytes);
  EXPECT_EQ(plain.modules[1].tp_fwd.calls, 2);
  EXPECT_TRUE(Validate(BuildNaiveProgram(split, {})).ok());
}

}  // namespace
}  // namespace meshwork::compiler
