// FSDP numerics: sharded training over Gloo (ranks as threads in one process) gives the same
// losses and parameters as one process training on the whole global batch.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "tests/common/needs_gloo.h"
#include "tests/common/parallel_training.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/dist/gloo_communicator.h"
#include "trainer/compiler/planner.h"
#include "trainer/fsdp/fully_shard.h"
#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_ops.h"

namespace meshwork::fsdp {
namespace {

// Uneven on purpose: vocab 37 and intermediate 50 do not divide by 4, so ranks hold padding.
model::LlamaConfig SmallConfig(bool tied) {
  model::LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 40;
  c.intermediate_size = 50;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

constexpr int kSteps = 5;
constexpr int kRowsPerStep = 8;  // global batch
constexpr int kSeq = 12;
constexpr double kClip = 0.5;    // small enough that clipping is active

// Document masking for every model and batch these helpers make, while a DocumentMasking
// object lives (one test at a time: gtest runs a binary's tests in sequence).
// With mask false, the batches hold the separators but the models do not mask.
std::optional<int64_t> g_document_separator;
bool g_mask_documents = false;
struct DocumentMasking {
  DocumentMasking(int64_t separator, bool mask) {
    g_document_separator = separator;
    g_mask_documents = mask;
  }
  ~DocumentMasking() {
    g_document_separator.reset();
    g_mask_documents = false;
  }
};

torch::Tensor Tokens(int step) {
  torch::manual_seed(1000 + step);
  auto tokens = torch::randint(0, 37, {kRowsPerStep, kSeq + 1}, torch::kLong);
  if (g_document_separator) {
    // Every row holds three documents, and the last row's first is one token long.
    tokens.index_put_({torch::indexing::Slice(), 4}, *g_document_separator);
    tokens.index_put_({torch::indexing::Slice(), 8}, *g_document_separator);
    tokens.index_put_({kRowsPerStep - 1, 0}, *g_document_separator);
  }
  return tokens;
}

model::LlamaForCausalLM MakeModel(bool tied) {
  torch::manual_seed(7);
  model::LlamaForCausalLM m(SmallConfig(tied));
  m->InitWeights(0.2);
  if (g_mask_documents) m->set_document_separator(g_document_separator);
  return m;
}

using meshwork::testing::MakeOptimizer;

// Compiled mode for Sharded(): after the first (eager, traced) step, rank 0 plans with these
// settings and every rank switches to the agreed plan.
struct Compile {
  bool on = false;
  compiler::Bucketing bucketing = compiler::Bucketing::kBlock;
  bool reorder = true;
  bool reshard = true;
  // Before step 3, switch to a plan made with this bucketing and the other `reorder` instead (a
  // re-plan mid-run, to a different schedule).
  std::optional<compiler::Bucketing> switch_to{};
  int64_t budget = 0;  // the plan's memory budget in bytes; 0: none
  // Eager steps too: kAll recomputes every layer from the first step.
  LayerCheckpointing checkpointing = LayerCheckpointing::kPlanned;
  // Whether the plan reads the embedding by rows. The tiny model's table is smaller than a step's
  // rows, so the planner left to choose (kWhenFaster, fsdp.embedding_rows) reads it whole.
  compiler::PlanOptions::Rows embedding_rows = compiler::PlanOptions::Rows::kWhenFaster;
  // Whether a tied head splits the table by vocabulary. Such a plan computes the loss, not the
  // logits, so the steps then pass the targets to Forward (the fused head + loss).
  compiler::PlanOptions::Rows vocab = compiler::PlanOptions::Rows::kNever;
};

struct TrainRun {
  std::vector<std::string> plans;  // the plan each rank ran (compiled mode)
  int recomputed_layers = 0;       // checkpointed blocks in rank 0's last autograd graph
  int64_t shard_bytes = 0;  // rank 0's parameter shards
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;
};

TrainRun SingleProcess(bool tied, int accum) {
  TrainRun run;
  auto m = MakeModel(tied);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : m->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opt = MakeOptimizer(decay, no_decay);
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    torch::Tensor batch = Tokens(step);
    double loss_sum = 0;
    const int rows = kRowsPerStep / accum;
    for (int micro = 0; micro < accum; ++micro) {
      auto b = batch.narrow(0, micro * rows, rows);
      auto loss = model::CausalLmLoss(m->forward(b.narrow(1, 0, kSeq)), b.narrow(1, 1, kSeq)) / accum;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(m->parameters(), kClip);
    opt.step();
    run.losses.push_back(loss_sum);
  }
  for (auto& item : m->named_parameters()) run.params[item.key()] = item.value().detach().clone();
  return run;
}

using meshwork::testing::RecomputeNodes;

// `world` ranks as threads; mesh dp_replicate x dp_shard.
TrainRun Sharded(bool tied, int dp_replicate, int dp_shard, int accum, Compile compile = {}) {
  const int world = dp_replicate * dp_shard;
  std::vector<model::LlamaForCausalLM> models;
  for (int r = 0; r < world; ++r) models.push_back(MakeModel(tied));  // same seed: same init
  std::vector<torch::Tensor> batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(Tokens(step));

  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<TrainRun> runs(world);
  std::vector<std::string> errors(world);
  std::vector<std::string> plans(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto fail = [&](const Status& s) { errors[rank] = s.ToString(); };
      dist::CommunicatorOptions copts;
      copts.timeout = std::chrono::seconds(60);
      auto factory = [](c10::intrusive_ptr<c10d::Store> s, int r, int n, const dist::CommunicatorOptions& o) {
        return dist::MakeGlooCommunicator(s, r, n, o, "127.0.0.1");
      };
      auto mesh = dist::DeviceMesh::Create(store, rank, {dp_replicate, dp_shard, 1}, factory, copts);
      if (!mesh.ok()) return fail(mesh.status());
      FsdpOptions fo;
      fo.checkpointing = compile.checkpointing;
      auto fsdp = FullyShardedLlama::Create(
          models[rank], {&(*mesh)->group("dp_shard"), &(*mesh)->group("dp_shard_reduce"), &(*mesh)->group("dp_replicate")},
          fo);
      if (!fsdp.ok()) return fail(fsdp.status());
      auto& f = **fsdp;
      auto opt = MakeOptimizer(f.DecayShards(), f.NoDecayShards());
      runs[rank].shard_bytes = f.ShardBytes();
      const int rows = kRowsPerStep / world / accum;
      for (int step = 0; step < kSteps; ++step) {
        if (compile.on && (step == 1 || (step == 2 && compile.switch_to))) {
          const bool switching = step == 2;  // `compile` is shared by the rank threads: read only
          compiler::Graph skeleton = f.Skeleton();
          // Each rank's own timings, made to differ: the agreed plan must still be rank 0's.
          for (auto& m : skeleton.modules) m.fwd_seconds = m.bwd_seconds = 0.001 * (1 + rank * (&m - &skeleton.modules[0]));
          compiler::CostModel cost;
          cost.dp_shard = dp_shard;
          cost.dp_replicate = dp_replicate;
          cost.shard_link = {0.002, 1e8};
          cost.replicate_link = {0.002, 1e8};
          compiler::PlanOptions options;
          options.bucketing = switching ? *compile.switch_to : compile.bucketing;
          options.reorder = switching ? !compile.reorder : compile.reorder;
          options.reshard_after_forward = compile.reshard;
          options.read_by_rows = compile.embedding_rows;
          options.split_by_vocabulary = compile.vocab;
          options.budget = {compiler::MemoryBudget::Source::kFixed, compile.budget};  // 0: no limit
          auto planned = compiler::PlanStep(skeleton, cost, options);
          if (!planned.ok()) return fail(planned.status());
          auto agreed = AgreeOnPlan((*mesh)->group("world"), planned->compiled);
          if (!agreed.ok()) return fail(agreed.status());
          plans[rank] += compiler::Print(*agreed);
          if (Status s = f.UsePlan(*agreed); !s.ok()) return fail(s);
        }
        f.ZeroGrad();
        double local = 0;
        for (int micro = 0; micro < accum; ++micro) {
          // Global rows of this micro-batch: accum slices, each split across the world.
          const int first = micro * (kRowsPerStep / accum) + rank * rows;
          auto b = batches[step].narrow(0, first, rows);
          f.SetGradientSync(micro == accum - 1);
          auto loss = (compile.vocab != compiler::PlanOptions::Rows::kNever
                           ? f.Forward(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq))
                           : model::CausalLmLoss(f.Forward(b.narrow(1, 0, kSeq)), b.narrow(1, 1, kSeq))) /
                      accum;
          if (rank == 0 && step + 1 == kSteps) runs[rank].recomputed_layers = RecomputeNodes(loss);
          loss.backward();
          local += loss.item<double>();
          if (Status s = f.FinishBackward(); !s.ok()) return fail(s);
        }
        auto norm2 = f.GradNormSquared();
        if (!norm2.ok()) return fail(norm2.status());
        const double norm = std::sqrt(norm2->item<double>());
        if (norm > kClip) f.ScaleGrads(kClip / (norm + 1e-6));
        opt.step();
        // The global loss: average of the ranks' losses (equal batch sizes).
        torch::Tensor l = torch::full({1}, local, torch::kDouble);
        auto w = (*mesh)->group("world").AllReduce(l, dist::ReduceOp::kAvg);
        if (!w.ok()) return fail(w.status());
        if (Status s = (*w)->Wait(); !s.ok()) return fail(s);
        runs[rank].losses.push_back(l.item<double>());
      }
      auto state = f.GatherFullState();
      if (!state.ok()) return fail(state.status());
      runs[rank].params = std::move(*state);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  runs[0].plans = plans;
  return runs[0];
}

void ExpectSame(const TrainRun& want, const TrainRun& got, const std::string& what) {
  ASSERT_EQ(want.losses.size(), got.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what << " step " << i + 1;
  }
  ASSERT_EQ(want.params.size(), got.params.size()) << what;
  for (const auto& [name, p] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << what << ": " << name;
    // fp32 rounding differs (the sum over ranks runs in another order than the sum over one
    // batch); a sharding bug moves weights by ~1e-2.
    const double diff = (got.params.at(name) - p).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << what << ": " << name;
  }
}

class FullyShard : public testing::NeedsGloo<> {};

TEST_F(FullyShard, ShardedLossesAndParamsEqualSingleProcess) {
  const TrainRun want = SingleProcess(/*tied=*/false, 1);
  ExpectSame(want, Sharded(false, 1, 1, 1), "world 1");
  ExpectSame(want, Sharded(false, 1, 2, 1), "dp_shard 2");
  ExpectSame(want, Sharded(false, 1, 4, 1), "dp_shard 4");
  ExpectSame(want, Sharded(false, 2, 2, 1), "HSDP 2x2");
}

TEST_F(FullyShard, CompiledPlansEqualSingleProcessForEveryBucketingAndOrder) {
  const TrainRun want = SingleProcess(/*tied=*/false, 1);
  for (auto b : {compiler::Bucketing::kNone, compiler::Bucketing::kBlock, compiler::Bucketing::kAuto})
    for (bool reorder : {true, false}) {
      const std::string what = std::string("compiled ") + compiler::BucketingName(b) + (reorder ? " reorder" : " in order");
      ExpectSame(want, Sharded(false, 1, 2, 1, {true, b, reorder}), what + ", dp_shard 2");
    }
  ExpectSame(want, Sharded(false, 1, 4, 1, {true, compiler::Bucketing::kAuto, true}), "compiled auto, dp_shard 4");
  ExpectSame(want, Sharded(false, 2, 2, 1, {true, compiler::Bucketing::kAuto, true}), "compiled auto, HSDP 2x2");
  ExpectSame(want, Sharded(false, 1, 2, 1, {true, compiler::Bucketing::kBlock, true, false}), "compiled, no reshard");
  // A budget with room: layers stay gathered from forward to backward (keep_gathered).
  Compile roomy{true, compiler::Bucketing::kAuto, true};
  roomy.budget = int64_t{1} << 30;
  const TrainRun kept = Sharded(false, 1, 2, 1, roomy);
  ExpectSame(want, kept, "compiled with layers kept gathered");
  const TrainRun resharded = Sharded(false, 1, 2, 1, {true, compiler::Bucketing::kAuto, true});
  auto gathers = [](const std::string& plan) {
    int n = 0;
    for (size_t at = plan.find("= all_gather"); at != std::string::npos; at = plan.find("= all_gather", at + 1)) ++n;
    return n;
  };
  ASSERT_FALSE(kept.plans.empty());
  ASSERT_FALSE(resharded.plans.empty());
  EXPECT_LT(gathers(kept.plans[0]), gathers(resharded.plans[0])) << kept.plans[0];
  // A re-plan between steps: the executor switches plans and training goes on unchanged.
  const TrainRun switched =
      Sharded(false, 1, 2, 1, {true, compiler::Bucketing::kNone, true, true, compiler::Bucketing::kAuto});
  ExpectSame(want, switched, "compiled, switching plans before step 3");
  ASSERT_FALSE(switched.plans.empty());
  const std::string& both = switched.plans[0];  // the two plans rank 0 ran, one after the other
  const size_t second = both.find("meshwork-ir 1", 1);
  ASSERT_NE(second, std::string::npos);
  EXPECT_NE(both.substr(0, second), both.substr(second)) << "the second plan must differ from the first";
  ExpectSame(want, Sharded(false, 2, 2, 1, {true, compiler::Bucketing::kBlock, false, true, compiler::Bucketing::kAuto}),
             "compiled HSDP 2x2, switching plans before step 3");
}

// How many modules of a printed plan are checkpointed (ws= in the IR).
int CheckpointedModules(const std::string& plan) {
  int n = 0;
  for (size_t at = plan.find(" ws="); at != std::string::npos; at = plan.find(" ws=", at + 1)) ++n;
  return n;
}

// data.document_masking: the mask is made from each rank's own rows inside the model's forward,
// so eager and compiled FSDP (and recomputed layers) train as one process does with it; and the
// mask changes the losses (the comparison could fail).
TEST_F(FullyShard, DocumentMaskingEqualsSingleProcess) {
  const TrainRun unmasked = [] {
    DocumentMasking separators_only(5, /*mask=*/false);
    return SingleProcess(/*tied=*/false, 1);
  }();
  DocumentMasking masking(5, /*mask=*/true);
  const TrainRun want = SingleProcess(/*tied=*/false, 1);
  EXPECT_GT(std::abs(want.losses.back() - unmasked.losses.back()), 1e-4);
  ExpectSame(want, Sharded(false, 1, 2, 1), "eager, dp_shard 2");
  Compile compiled{true, compiler::Bucketing::kAuto, true};
  compiled.checkpointing = LayerCheckpointing::kAll;
  ExpectSame(want, Sharded(false, 1, 2, 1, compiled), "compiled, every layer recomputed");
  ExpectSame(SingleProcess(true, 2), Sharded(true, 2, 2, 2, compiled), "tied, HSDP 2x2, accum 2");
}

TEST_F(FullyShard, ActivationCheckpointingEqualsSingleProcess) {
  const TrainRun want = SingleProcess(/*tied=*/false, 1);
  Compile all;
  all.checkpointing = LayerCheckpointing::kAll;
  const TrainRun eager_all = Sharded(false, 1, 2, 1, all);
  ExpectSame(want, eager_all, "eager, every layer checkpointed");
  EXPECT_EQ(eager_all.recomputed_layers, 2);
  ExpectSame(want, Sharded(false, 2, 2, 1, all), "eager HSDP 2x2, every layer checkpointed");
  all.on = true;
  all.bucketing = compiler::Bucketing::kAuto;
  const TrainRun compiled_all = Sharded(false, 1, 2, 1, all);
  ExpectSame(want, compiled_all, "compiled, every layer checkpointed");
  ASSERT_FALSE(compiled_all.plans.empty());
  EXPECT_EQ(CheckpointedModules(compiled_all.plans[0]), 2) << compiled_all.plans[0];
  EXPECT_EQ(compiled_all.recomputed_layers, 2);
  // selective, every 2nd layer of the 2: layer 0 only, eager and compiled (the plan checkpoints
  // that one and no other, however tight its budget).
  Compile selective;
  selective.checkpointing = LayerCheckpointing::kSelective;
  const TrainRun eager_selective = Sharded(false, 1, 2, 1, selective);
  ExpectSame(want, eager_selective, "eager, layer 0 checkpointed");
  EXPECT_EQ(eager_selective.recomputed_layers, 1);
  selective.on = true;
  selective.bucketing = compiler::Bucketing::kAuto;
  selective.budget = 1;
  const TrainRun compiled_selective = Sharded(false, 1, 2, 1, selective);
  ExpectSame(want, compiled_selective, "compiled, layer 0 checkpointed");
  ASSERT_FALSE(compiled_selective.plans.empty());
  EXPECT_EQ(CheckpointedModules(compiled_selective.plans[0]), 1) << compiled_selective.plans[0];
  EXPECT_EQ(compiled_selective.recomputed_layers, 1);
  // A budget no plan meets: the planner checkpoints layers (earliest first) as far as that
  // lowers the peak, and the executor recomputes exactly those.
  Compile tight{true, compiler::Bucketing::kAuto, true};
  tight.budget = 1;
  const TrainRun fitted = Sharded(false, 1, 2, 1, tight);
  ExpectSame(want, fitted, "compiled under a budget below eager's peak");
  ASSERT_FALSE(fitted.plans.empty());
  EXPECT_GE(CheckpointedModules(fitted.plans[0]), 1) << fitted.plans[0];
  EXPECT_EQ(fitted.recomputed_layers, CheckpointedModules(fitted.plans[0])) << "the executor recomputes what the plan says";
  ExpectSame(want, Sharded(false, 2, 2, 1, tight), "compiled HSDP 2x2 under a budget below eager's peak");
  // Without candidates (training.activation_checkpointing: none) the plan checkpoints nothing.
  tight.checkpointing = LayerCheckpointing::kNone;
  const TrainRun none = Sharded(false, 1, 2, 1, tight);
  ExpectSame(want, none, "compiled, checkpointing off");
  ASSERT_FALSE(none.plans.empty());
  EXPECT_EQ(CheckpointedModules(none.plans[0]), 0) << none.plans[0];
  EXPECT_EQ(none.recomputed_layers, 0);
}

TEST_F(FullyShard, CompiledWithTiedEmbeddingsAndAccumulation) {
  ExpectSame(SingleProcess(true, 1), Sharded(true, 1, 2, 1, {true, compiler::Bucketing::kAuto, true}), "tied");
  ExpectSame(SingleProcess(false, 2), Sharded(false, 1, 2, 2, {true, compiler::Bucketing::kAuto, true}), "accum 2");
}

// The embedding read by rows (row_gather / row_reduce, compiler::ReadByRows): the same losses and
// weights as one process, untied and tied (the head still gathers the table), with gradient
// accumulation (row gradients held back until the last micro-batch), and at dp_shard 2 and 4
// (the tiny table's 37 x 40 elements split mid-row at both: every rank owns part of a row).
// Off, or with replicas (HSDP), the plan gathers and reduce-scatters the table whole.
TEST_F(FullyShard, CompiledPlansReadTheEmbeddingByRows) {
  auto count = [](const std::string& plan, const std::string& what) {
    int n = 0;
    for (size_t at = plan.find(what); at != std::string::npos; at = plan.find(what, at + 1)) ++n;
    return n;
  };
  Compile plan{true, compiler::Bucketing::kAuto, true};
  plan.embedding_rows = compiler::PlanOptions::Rows::kAlways;
  for (bool tied : {false, true}) {
    const std::string what = tied ? "tied" : "untied";
    const TrainRun rows2 = Sharded(tied, 1, 2, 1, plan);
    ExpectSame(SingleProcess(tied, 1), rows2, what + ", dp_shard 2");
    ASSERT_FALSE(rows2.plans.empty());
    EXPECT_EQ(count(rows2.plans[0], "= row_gather [0]"), 1) << rows2.plans[0];
    EXPECT_EQ(count(rows2.plans[0], "= row_reduce [0]"), 1) << rows2.plans[0];
    EXPECT_EQ(count(rows2.plans[0], "module embed fwd="), 1);
    EXPECT_NE(rows2.plans[0].find(" rows=[0] params=[]"), std::string::npos) << rows2.plans[0];
    ExpectSame(SingleProcess(tied, 2), Sharded(tied, 1, 4, 2, plan), what + ", dp_shard 4, accum 2");
  }
  Compile whole = plan;
  whole.embedding_rows = compiler::PlanOptions::Rows::kNever;
  const TrainRun off = Sharded(true, 1, 2, 1, whole);
  ExpectSame(SingleProcess(true, 1), off, "tied, embedding_rows off");
  ASSERT_FALSE(off.plans.empty());
  EXPECT_EQ(count(off.plans[0], "row_gather"), 0) << off.plans[0];
  const TrainRun hsdp = Sharded(false, 2, 2, 1, plan);
  ASSERT_FALSE(hsdp.plans.empty());
  EXPECT_EQ(count(hsdp.plans[0], "row_gather"), 0) << hsdp.plans[0];
}

// The tied head split by vocabulary (compiler::SplitByVocabulary, on top of reading the table by
// rows): each rank computes the logits of the rows it owns for every rank's tokens. The same
// losses and weights as one process at dp_shard 2 and 4 (the tiny table's 37 x 40 elements split
// mid-row at both, so ranks assemble their last row with the next rank's first elements and hand
// its gradient back), with gradient accumulation; the table is then never all-gathered or
// reduce-scattered.
TEST_F(FullyShard, CompiledPlansSplitATiedHeadByVocabulary) {
  Compile plan{true, compiler::Bucketing::kAuto, true};
  plan.embedding_rows = compiler::PlanOptions::Rows::kAlways;
  plan.vocab = compiler::PlanOptions::Rows::kAlways;
  const TrainRun two = Sharded(true, 1, 2, 1, plan);
  ExpectSame(SingleProcess(true, 1), two, "dp_shard 2");
  ASSERT_FALSE(two.plans.empty());
  EXPECT_NE(two.plans[0].find("module head "), std::string::npos);
  EXPECT_NE(two.plans[0].find(" vocab=[0] params=["), std::string::npos) << two.plans[0];
  // Parameter 0 (the table) is in no all-gather or reduce-scatter.
  for (const std::string op : {"= all_gather [0", "= reduce_scatter [0"})
    EXPECT_EQ(two.plans[0].find(op), std::string::npos) << op << "\n" << two.plans[0];
  ExpectSame(SingleProcess(true, 2), Sharded(true, 1, 4, 2, plan), "dp_shard 4, accum 2");
  // An untied head has nothing to split: the plan is the by-rows one.
  const TrainRun untied = Sharded(false, 1, 2, 1, plan);
  ExpectSame(SingleProcess(false, 1), untied, "untied");
  ASSERT_FALSE(untied.plans.empty());
  EXPECT_EQ(untied.plans[0].find("vocab="), std::string::npos) << untied.plans[0];
}

TEST_F(FullyShard, RanksWithDifferentTimingsRunRankZerosPlan) {
  const TrainRun run = Sharded(false, 1, 4, 1, {true, compiler::Bucketing::kAuto, true});
  ASSERT_EQ(run.plans.size(), 4u);
  ASSERT_NE(run.plans[0], "");
  for (int r = 1; r < 4; ++r) EXPECT_EQ(run.plans[r], run.plans[0]) << "rank " << r;
}

TEST_F(FullyShard, TiedEmbeddingsShardAsOneParameter) {
  ExpectSame(SingleProcess(/*tied=*/true, 1), Sharded(true, 1, 2, 1), "tied, dp_shard 2");
}

TEST_F(FullyShard, GradientAccumulationSkipsCommunicationUntilTheLastMicroBatch) {
  ExpectSame(SingleProcess(false, 2), Sharded(false, 1, 2, 2), "dp_shard 2, accum 2");
}

// Each of `models` on a rank of its own (threads over one Gloo group of them all), wrapped by
// FullyShardedLlama with `options`; then body(rank, f, group). A failed set-up or a status body
// returns fails the test, naming the rank.
void OnRanks(std::vector<model::LlamaForCausalLM> models, const FsdpOptions& options,
             const std::function<Status(int, FullyShardedLlama&, dist::Communicator&)>& body) {
  const int world = static_cast<int>(models.size());
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      dist::CommunicatorOptions copts;
      copts.timeout = std::chrono::seconds(60);
      auto group = dist::MakeGlooCommunicator(store, rank, world, copts, "127.0.0.1");
      if (!group.ok()) {
        errors[rank] = group.status().ToString();
        return;
      }
      auto fsdp = FullyShardedLlama::Create(models[rank], {group->get(), nullptr, nullptr}, options);
      if (!fsdp.ok()) {
        errors[rank] = fsdp.status().ToString();
        return;
      }
      if (Status s = body(rank, **fsdp, **group); !s.ok()) errors[rank] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Meshwork's AdamW kernel takes 16-byte packs of a shard, its gradient and its moments only where
// the three share their offset within a 16-byte line (fused::CommonPackStart). With a width no 4
// divides (42), shards start at odd elements of their flat group; their gradients, views of the
// reduced flat gradient, must stay at the same offset through accumulation over micro-batches
// that each reduce (an out-of-place sum would put them back at the allocator's alignment).
TEST_F(FullyShard, ShardGradientsShareTheirShardsOffsetWithinA16ByteLine) {
  model::LlamaConfig c = SmallConfig(false);
  c.hidden_size = 42;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  std::vector<model::LlamaForCausalLM> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(7);
    models.emplace_back(c);
  }
  std::vector<std::vector<std::string>> off_line(2);
  std::vector<int> shifted(2, 0);
  OnRanks(models, FsdpOptions{}, [&](int rank, FullyShardedLlama& f, dist::Communicator&) {
    f.ZeroGrad();
    for (int micro = 0; micro < 2; ++micro) {
      const auto b = Tokens(micro).narrow(0, rank * 2, 2);
      f.SetGradientSync(true);  // every micro-batch reduces: the gradients are summed here
      model::CausalLmLoss(f.Forward(b.narrow(1, 0, kSeq)), b.narrow(1, 1, kSeq)).backward();
      MW_RETURN_IF_ERROR(f.FinishBackward());
    }
    std::vector<torch::Tensor> shards = f.DecayShards(), more = f.NoDecayShards();
    shards.insert(shards.end(), more.begin(), more.end());
    for (const torch::Tensor& shard : shards) {
      if (shard.numel() < 7) continue;  // 7: room for a whole pack after up to 3 loose elements
      std::ostringstream what;
      what << shard.sizes() << " at element " << shard.storage_offset();
      if (!shard.grad().defined()) {
        off_line[rank].push_back(what.str() + ", no gradient");
        continue;
      }
      const torch::Tensor moment = model::ZerosInLineWith(shard);
      const int64_t start = model::fused::CommonPackStart(
          shard.numel(), {{shard.data_ptr(), 4}, {shard.grad().data_ptr(), 4}, {moment.data_ptr(), 4}});
      if (start > 0) ++shifted[rank];
      if (start < 0) off_line[rank].push_back(what.str() + ", its gradient at " + std::to_string(shard.grad().storage_offset()));
    }
    return Status::Ok();
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(off_line[r], std::vector<std::string>{}) << "rank " << r;
  EXPECT_GT(shifted[0] + shifted[1], 0) << "no shard off the 16-byte line, so this checks nothing";
}

TEST_F(FullyShard, ShardBytesFallAsOneOverTheWorld) {
  int64_t full = 0, one_row_each = 0;
  for (auto& p : MakeModel(false)->parameters()) {
    full += p.numel() * 4;
    one_row_each += p.numel() / p.size(0) * 4;
  }
  EXPECT_EQ(Sharded(false, 1, 1, 1).shard_bytes, full);
  for (int world : {2, 4}) {
    const int64_t bytes = Sharded(false, 1, world, 1).shard_bytes;
    // 1/N of the model plus at most one padding row per parameter.
    EXPECT_GE(bytes, full / world);
    EXPECT_LE(bytes, full / world + one_row_each) << "world " << world;
  }
}

// Bytes currently allocated under a parameter's storage (0 while FSDP has it freed).
size_t StorageBytes(FullyShardedLlama& f, const std::string& name) {
  for (auto& item : f.module()->named_parameters())
    if (item.key() == name) return item.value().storage().nbytes();
  ADD_FAILURE() << "no parameter " << name;
  return 0;
}

// Two ranks (threads); rank 0 records, after each phase of one step, whether layer weights are
// allocated and which collectives were issued.
struct Lifecycle {
  size_t layer0_after_forward = 0, last_after_forward = 0, layer0_after_backward = 0, root_after_backward = 0;
  int64_t reduce_scatters_without_sync = 0, reduce_scatters_with_sync = 0, all_gathers_per_step = 0;
  // The flat layout: the last layer's parameters after forward (its all-gather's output), layer
  // 0's gradients after an unsynced backward (the reduce-scatter's input to be), and layer 0's
  // shard gradients after the step (the reduced shard) are each one storage, back to back.
  bool params_one_storage = false, grads_one_storage = false, shard_grads_one_storage = false;
  int64_t gradient_copies = -1;
  // Whether the layers' shard gradients were there once loss.backward() returned, before
  // FinishBackward: their reduce-scatter had been waited for during backward.
  bool last_reduced_in_backward = false, layer0_reduced_in_backward = false;
};

bool AllDefined(const std::vector<torch::Tensor>& ts) {
  for (const auto& t : ts)
    if (!t.defined()) return false;
  return !ts.empty();
}

// Whether `ts` are views of one storage, each starting where the one before ends.
bool BackToBack(const std::vector<torch::Tensor>& ts) {
  if (ts.empty() || !ts[0].defined()) return false;
  int64_t next = ts[0].storage_offset();
  for (const auto& t : ts) {
    if (!t.defined() || !t.is_contiguous() || t.storage().data() != ts[0].storage().data() ||
        t.storage_offset() != next)
      return false;
    next += t.numel();
  }
  return true;
}

std::vector<torch::Tensor> Prefixed(FullyShardedLlama& f, const std::string& prefix, bool grads, bool shards) {
  std::vector<torch::Tensor> out;
  for (const auto& p : f.sharded_params()) {
    if (p.name.rfind(prefix, 0) != 0) continue;
    if (shards && p.shard.numel() == 0) continue;
    const torch::Tensor& t = shards ? p.shard : p.full;
    out.push_back(grads ? t.grad() : t);
  }
  return out;
}

Lifecycle Observe(const FsdpOptions& options) {
  Lifecycle seen;
  OnRanks({MakeModel(false), MakeModel(false)}, options, [&](int rank, FullyShardedLlama& f, dist::Communicator& group) {
    const std::string layer0 = "model.layers.0.mlp.up_proj.weight", last = "model.layers.1.mlp.up_proj.weight";
    auto count = [&](dist::Collective c) { return group.stats().calls[static_cast<int>(c)]; };
    auto b = Tokens(0).narrow(0, rank * 4, 4);
    auto micro = [&](bool sync) {
      f.SetGradientSync(sync);
      auto loss = model::CausalLmLoss(f.Forward(b.narrow(1, 0, kSeq)), b.narrow(1, 1, kSeq));
      if (rank == 0 && sync) {
        seen.layer0_after_forward = StorageBytes(f, layer0);
        seen.last_after_forward = StorageBytes(f, last);
        seen.params_one_storage = BackToBack(Prefixed(f, "model.layers.1.", false, false));
      }
      loss.backward();
      if (rank == 0 && sync) {
        seen.last_reduced_in_backward = AllDefined(Prefixed(f, "model.layers.1.", true, true));
        seen.layer0_reduced_in_backward = AllDefined(Prefixed(f, "model.layers.0.", true, true));
      }
      MW_RETURN_IF_ERROR(f.FinishBackward());
      if (rank == 0 && !sync) seen.grads_one_storage = BackToBack(Prefixed(f, "model.layers.0.", true, false));
      return Status::Ok();
    };
    const int64_t rs0 = count(dist::Collective::kReduceScatter), ag0 = count(dist::Collective::kAllGather);
    MW_RETURN_IF_ERROR(micro(false));
    const int64_t rs1 = count(dist::Collective::kReduceScatter);
    MW_RETURN_IF_ERROR(micro(true));
    if (rank != 0) return Status::Ok();
    seen.reduce_scatters_without_sync = rs1 - rs0;
    seen.reduce_scatters_with_sync = count(dist::Collective::kReduceScatter) - rs1;
    seen.all_gathers_per_step = (count(dist::Collective::kAllGather) - ag0) / 2;
    seen.layer0_after_backward = StorageBytes(f, layer0);
    seen.root_after_backward = StorageBytes(f, "model.embed_tokens.weight");
    seen.shard_grads_one_storage = BackToBack(Prefixed(f, "model.layers.0.", true, true));
    seen.gradient_copies = f.TakeStats().gradient_copies;
    return Status::Ok();
  });
  return seen;
}

// Bytes of one decoder layer's flat group, gathered in fp32 over 2 ranks (padded to even).
size_t LayerGroupBytes() {
  int64_t numel = 0;
  for (auto& item : MakeModel(false)->named_parameters())
    if (item.key().rfind("model.layers.0.", 0) == 0) numel += item.value().numel();
  return static_cast<size_t>((numel + 1) / 2 * 2 * 4);
}

TEST_F(FullyShard, ReshardAfterForwardFreesLayersUntilTheirBackward) {
  const Lifecycle seen = Observe(FsdpOptions());
  EXPECT_EQ(seen.layer0_after_forward, 0u) << "layer 0 stays gathered after its forward";
  // The last layer, which backward needs first, stays gathered (FSDP2's default for the last
  // block under torchtitan).
  EXPECT_EQ(seen.last_after_forward, LayerGroupBytes());
  EXPECT_EQ(seen.layer0_after_backward, 0u);
  EXPECT_EQ(seen.root_after_backward, 0u);
  // Forward gathers the root (embedding and head groups) + 2 layers; backward gathers layer 0
  // again, not the last layer (freeing it after forward would only gather it again at once).
  EXPECT_EQ(seen.all_gathers_per_step, 5);
  // Gradient accumulation: no reduce-scatter until the last micro-batch, then one per group.
  EXPECT_EQ(seen.reduce_scatters_without_sync, 0);
  EXPECT_EQ(seen.reduce_scatters_with_sync, 4);
  // No copies around the collectives: what they write and read is the parameters' own memory.
  EXPECT_TRUE(seen.params_one_storage) << "the all-gather writes the parameters' storage";
  EXPECT_TRUE(seen.grads_one_storage) << "autograd accumulates into the reduce-scatter's input";
  EXPECT_EQ(seen.gradient_copies, 0) << "gradients copied into the flat buffers after the fact";
  EXPECT_TRUE(seen.shard_grads_one_storage) << "the shard gradients are views of the reduced shard";
}

TEST_F(FullyShard, WithoutReshardLayersStayGatheredUntilTheirBackward) {
  FsdpOptions options;
  options.reshard_after_forward = false;
  const Lifecycle seen = Observe(options);
  EXPECT_EQ(seen.layer0_after_forward, LayerGroupBytes());  // the whole layer, fp32
  EXPECT_EQ(seen.last_after_forward, LayerGroupBytes());
  EXPECT_EQ(seen.layer0_after_backward, 0u) << "freed after backward";
  EXPECT_EQ(seen.all_gathers_per_step, 4) << "one gather per group, none again in backward";
}

// FSDP2 keeps one reduce-scatter in flight: a layer's post-backward waits for the one the layer
// after it issued. So by the end of backward the last layer's gradients are reduced (layer 0's,
// issued last, are still in flight), where waiting for every reduce-scatter at the end of
// backward would hold every layer's full gradients until then.
TEST_F(FullyShard, EagerWaitsForEachReduceScatterAtTheNextLayersPostBackward) {
  for (bool reshard : {true, false}) {
    FsdpOptions options;
    options.reshard_after_forward = reshard;
    const Lifecycle seen = Observe(options);
    EXPECT_TRUE(seen.last_reduced_in_backward) << "reshard " << reshard;
    EXPECT_FALSE(seen.layer0_reduced_in_backward) << "reshard " << reshard;
  }
}

}  // namespace
}  // namespace meshwork::fsdp
