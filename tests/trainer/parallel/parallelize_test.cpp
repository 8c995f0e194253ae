// Tensor parallelism composed with FSDP and HSDP (parallel/parallelize.h): a mesh dp_replicate x
// dp_shard x tp of threads in one process (Gloo) trains with the same losses, gradient norms,
// evaluation losses and parameters as one process training the whole model on the same batches,
// in eager and compiled FSDP, with sequence parallelism on and off, activation checkpointing and
// gradient accumulation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "tests/common/needs_gloo.h"
#include "tests/common/parallel_training.h"
#include "trainer/compiler/planner.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/parallel/parallelize.h"

namespace meshwork::parallel {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 6;
constexpr int kRows = 8;  // the global batch of a step
constexpr int kSeq = 12;
constexpr double kClip = 0.5;  // small enough that clipping is active

struct Case {
  int dp_replicate = 1, dp_shard = 2, tp = 2;
  bool tied = true;
  bool sequence_parallel = true;
  fsdp::LayerCheckpointing checkpointing = fsdp::LayerCheckpointing::kPlanned;  // none in eager steps
  int accum = 1;          // micro-batches a step
  bool compiled = false;  // a compiled plan from step 2 on
  int async_chunks = 1;   // overlapped TP
  // Compiled: the plan carries TP's exchanges on a slow tp link, and the async_tp pass chooses
  // each layer's chunks.
  bool plan_tp = false;
  std::string what() const {
    return "dp_replicate " + std::to_string(dp_replicate) + " x dp_shard " + std::to_string(dp_shard) + " x tp " +
           std::to_string(tp) + (compiled ? ", compiled" : ", eager") + (sequence_parallel ? "" : ", no SP") +
           (accum > 1 ? ", accum " + std::to_string(accum) : "") +
           (async_chunks > 1 ? ", async TP in " + std::to_string(async_chunks) + " chunks" : "");
  }
};

model::LlamaForCausalLM MakeModel(const Case& s) {
  torch::manual_seed(7);
  model::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = s.tied;
  model::LlamaForCausalLM m(c);
  m->InitWeights(0.2);
  return m;
}

torch::Tensor Tokens(int step) {
  torch::manual_seed(1000 + step);
  return torch::randint(0, 40, {kRows, kSeq + 1}, torch::kLong);
}

struct TrainRun {
  std::vector<double> losses, grad_norms;
  double eval_loss = 0;
  std::map<std::string, torch::Tensor> params;
  std::string plan;  // compiled: the plan rank 0 ran
  std::vector<int> layer_chunks;  // tp: each decoder layer's overlapped-TP chunks at the end
  bool skeleton_exchanges = false;  // compiled: whether the skeleton carried TP's exchanges
};

using meshwork::testing::MakeOptimizer;

TrainRun SingleProcess(const Case& s) {
  TrainRun run;
  auto m = MakeModel(s);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : m->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opt = MakeOptimizer(decay, no_decay);
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    const torch::Tensor batch = Tokens(step);
    double loss_sum = 0;
    for (int micro = 0; micro < s.accum; ++micro) {
      const torch::Tensor b = batch.narrow(0, micro * kRows / s.accum, kRows / s.accum);
      auto loss = m->Loss(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq)) / s.accum;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    run.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(m->parameters(), kClip));
    opt.step();
    run.losses.push_back(loss_sum);
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor b = Tokens(99);
  run.eval_loss = m->Loss(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq)).item<double>();
  for (auto& item : m->named_parameters()) run.params[item.key()] = item.value().detach().clone();
  return run;
}

// Every rank of the mesh as a thread; a tp group reads one batch, the data parallel ranks their
// rows of it.
std::vector<TrainRun> Parallel(const Case& s) {
  const int world = s.dp_replicate * s.dp_shard * s.tp, dp = s.dp_replicate * s.dp_shard;
  // Models and batches before the threads: torch::manual_seed and the draws share one generator.
  std::vector<model::LlamaForCausalLM> models;
  for (int r = 0; r < world; ++r) models.push_back(MakeModel(s));
  std::vector<torch::Tensor> batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(Tokens(step));
  const torch::Tensor eval_batch = Tokens(99);
  std::vector<TrainRun> runs(world);
  const std::vector<std::string> errors =
      meshwork::testing::RunMesh({s.dp_replicate, s.dp_shard, s.tp}, [&](int rank, dist::DeviceMesh& m) {
        auto fail = [](const Status& st) { return st; };
        ParallelGroups groups;
        groups.tp = s.tp > 1 ? &m.group("tp") : nullptr;
        groups.fsdp = {&m.group("dp_shard"), &m.group("dp_shard_reduce"),
                       s.dp_replicate > 1 ? &m.group("dp_replicate") : nullptr};
        ParallelOptions options;
        options.tp.sequence_parallel = s.sequence_parallel;
        options.tp.async_chunks = s.async_chunks;
        options.fsdp.checkpointing = s.checkpointing;
        auto created = ParallelLlama::Create(models[rank], groups, options);
        if (!created.ok()) return fail(created.status());
        ParallelLlama& p = **created;
        auto opt = MakeOptimizer(p.fsdp().DecayShards(), p.fsdp().NoDecayShards());
        const int dp_rank = rank / s.tp, rows = kRows / s.accum / dp;
        for (int step = 0; step < kSteps; ++step) {
          if (s.compiled && step == 1) {
            // Rank 0 plans from its traced eager step (one plan for the whole mesh).
            compiler::Graph skeleton = p.fsdp().Skeleton();
            compiler::CostModel cost;
            cost.dp_shard = s.dp_shard;
            cost.dp_replicate = s.dp_replicate;
            cost.shard_link = {0.002, 1e8};
            cost.replicate_link = {0.002, 1e8};
            runs[rank].skeleton_exchanges = skeleton.CarriesTpExchanges();
            if (s.plan_tp) {
              // A link slow enough that overlapping the exchanges in chunks hides the most.
              cost.tp = s.tp;
              cost.tp_link = {1e-5, 2e6};
            }
            compiler::PlanOptions plan_options;
            plan_options.bucketing = compiler::Bucketing::kAuto;
            plan_options.async_tp = p.fsdp().PlansTensorParallelChunks();
            plan_options.tp_tokens_per_rank = p.fsdp().TensorParallelTokensPerRank();
            // What fsdp/compile.cpp plans for a model with its own embedding and loss.
            plan_options.read_by_rows = compiler::PlanOptions::Rows::kNever;
            plan_options.split_by_vocabulary = compiler::PlanOptions::Rows::kNever;
            auto planned = compiler::PlanStep(skeleton, cost, plan_options);
            if (!planned.ok()) return fail(planned.status());
            // A plan reading the embedding by rows would bypass the vocabulary split: refused.
            plan_options.read_by_rows = compiler::PlanOptions::Rows::kAlways;
            auto by_rows = compiler::PlanStep(skeleton, cost, plan_options);
            if (!by_rows.ok()) return fail(by_rows.status());
            const Status refused = p.fsdp().UsePlan(by_rows->compiled);
            if (refused.ok() || refused.message().find("tensor parallelism") == std::string::npos) {
              return fail(Internal("a plan reading rows was not refused: " + refused.ToString()));
            }
            auto agreed = fsdp::AgreeOnPlan(m.group("world"), planned->compiled);
            if (!agreed.ok()) return fail(agreed.status());
            if (Status st = p.fsdp().UsePlan(*agreed); !st.ok()) return fail(st);
            runs[rank].plan = compiler::Print(*agreed);
          }
          p.fsdp().ZeroGrad();
          double local = 0;
          for (int micro = 0; micro < s.accum; ++micro) {
            const torch::Tensor b = batches[step].narrow(0, micro * kRows / s.accum + dp_rank * rows, rows);
            p.SetGradientSync(micro + 1 == s.accum);
            auto loss = p.Forward(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq)) / s.accum;
            loss.backward();
            local += loss.item<double>();
            if (Status st = p.FinishBackward(); !st.ok()) return fail(st);
          }
          auto norm2 = p.GradNormSquared();
          if (!norm2.ok()) return fail(norm2.status());
          const double norm = std::sqrt(norm2->item<double>());
          if (norm > kClip) p.fsdp().ScaleGrads(kClip / (norm + 1e-6));
          opt.step();
          // The step's loss: the data parallel ranks' mean (a tp group's ranks hold the same).
          torch::Tensor l = torch::full({1}, local, torch::kDouble);
          auto w = m.group("world").AllReduce(l, dist::ReduceOp::kAvg);
          if (!w.ok()) return fail(w.status());
          if (Status st = (*w)->Wait(); !st.ok()) return fail(st);
          runs[rank].losses.push_back(l.item<double>());
          runs[rank].grad_norms.push_back(norm);
        }
        if (p.tp() != nullptr) runs[rank].layer_chunks = p.tp()->layer_chunks();
        const torch::Tensor& b = eval_batch;
        runs[rank].eval_loss = p.ForwardNoGrad(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq)).item<double>();
        auto full = p.GatherFullState();
        if (!full.ok()) return fail(full.status());
        runs[rank].params = std::move(*full);
        return Status::Ok();
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << s.what() << ": rank " << r;
  return runs;
}

// `runs`, where given: the mesh's runs, for what a test checks besides.
void ExpectSameTraining(const Case& s, std::vector<TrainRun>* runs = nullptr) {
  SCOPED_TRACE(s.what());
  const TrainRun want = SingleProcess(s);
  const std::vector<TrainRun> got = Parallel(s);
  if (runs != nullptr) *runs = got;
  for (size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(got[r].losses.size(), want.losses.size());
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(got[r].losses[step], want.losses[step], 1e-5) << "step " << step;
      EXPECT_NEAR(got[r].grad_norms[step], want.grad_norms[step], 1e-5 * want.grad_norms[step]) << "step " << step;
    }
    EXPECT_NEAR(got[r].eval_loss, want.eval_loss, 1e-5);
    ASSERT_EQ(got[r].params.size(), want.params.size());
    for (const auto& [name, value] : want.params) {
      ASSERT_TRUE(got[r].params.count(name)) << name;
      EXPECT_EQ(got[r].params.at(name).sizes(), value.sizes()) << name;
      EXPECT_TRUE(torch::allclose(got[r].params.at(name), value, 1e-4, 1e-5))
          << name << ": max difference " << (got[r].params.at(name) - value).abs().max().item<double>();
    }
  }
  if (s.compiled) {
    EXPECT_THAT(got[0].plan, HasSubstr("all_gather")) << "no compiled plan ran";
  }
  // The losses must have moved: equal losses of a model that does not change would prove little.
  const auto [low, high] = std::minmax_element(want.losses.begin(), want.losses.end());
  EXPECT_GT(*high - *low, 0.05);
}

using ParallelTraining = meshwork::testing::NeedsGloo<>;

TEST_F(ParallelTraining, FsdpTimesTensorParallelEqualsOneProcess) { ExpectSameTraining({}); }

TEST_F(ParallelTraining, HsdpTimesTensorParallelWithoutSequenceParallelismEqualsOneProcess) {
  Case s;
  s.dp_replicate = 2;
  s.dp_shard = 1;
  s.tied = false;
  s.sequence_parallel = false;
  ExpectSameTraining(s);
}

TEST_F(ParallelTraining, CompiledFsdpTimesTensorParallelEqualsOneProcess) {
  Case s;
  s.compiled = true;
  s.tied = false;
  ExpectSameTraining(s);
}

// On the host clock (Gloo) the compiled plan carries TP's exchanges (the skeleton's tp=, its
// compute without the time blocked in them); on a slow tp link the async_tp pass splits every
// decoder layer's exchanges into chunks, the runtime runs them so, and the numbers stay one
// process's.
TEST_F(ParallelTraining, CompiledPlanOverlapsTensorParallelLayerByLayerAndEqualsOneProcess) {
  Case s;
  s.compiled = true;
  s.plan_tp = true;
  std::vector<TrainRun> got;
  ExpectSameTraining(s, &got);
  ASSERT_FALSE(got.empty());
  EXPECT_TRUE(got[0].skeleton_exchanges);
  EXPECT_THAT(got[0].plan, HasSubstr(" atp=")) << got[0].plan;
  ASSERT_EQ(got[0].layer_chunks.size(), 3u);
  for (int chunks : got[0].layer_chunks) EXPECT_GT(chunks, 1) << got[0].plan;
  // Two micro-batches a step: each rank holds 12 tokens between the regions (2 rows of 12 over
  // tp 2), and the plan chooses only chunks that divide them (8, its choice above for 24, would
  // not: the layer would run its exchanges whole while the plan priced them hidden).
  s.accum = 2;
  got.clear();
  ExpectSameTraining(s, &got);
  ASSERT_FALSE(got.empty());
  ASSERT_EQ(got[0].layer_chunks.size(), 3u);
  for (int chunks : got[0].layer_chunks) {
    EXPECT_GT(chunks, 1) << got[0].plan;
    EXPECT_EQ(12 % chunks, 0) << chunks << " chunks\n" << got[0].plan;
  }
}

// mesh.async_tp_chunks fixes the chunks: no plan changes them (the pass does not run), the plan
// still carries the exchanges.
TEST_F(ParallelTraining, FixedAsyncTpChunksAreNotThePlansToChoose) {
  Case s;
  s.compiled = true;
  s.plan_tp = true;
  s.async_chunks = 2;
  const std::vector<TrainRun> got = Parallel(s);
  ASSERT_FALSE(got.empty());
  EXPECT_TRUE(got[0].skeleton_exchanges);
  EXPECT_EQ(got[0].layer_chunks, (std::vector<int>{2, 2, 2}));
  // The plan prices the layers as they run: each with atp=2, the pass having chosen nothing.
  for (int layer = 0; layer < 3; ++layer) {
    const std::string name = "module layers." + std::to_string(layer) + " ";
    const size_t at = got[0].plan.find(name);
    ASSERT_NE(at, std::string::npos) << got[0].plan;
    const std::string line = got[0].plan.substr(at, got[0].plan.find('\n', at) - at);
    EXPECT_THAT(line, HasSubstr(" atp=2")) << line;
  }
}

TEST_F(ParallelTraining, CheckpointedLayersAndGradientAccumulationEqualOneProcess) {
  Case s;
  s.checkpointing = fsdp::LayerCheckpointing::kAll;
  s.accum = 2;
  ExpectSameTraining(s);
  s.async_chunks = 2;  // and overlapped TP: 12 tokens a rank, in chunks of 6
  ExpectSameTraining(s);
}

TEST_F(ParallelTraining, TensorParallelForwardWithoutTargetsIsRefused) {
  Case s;
  s.dp_shard = 1;
  s.tp = 2;
  std::vector<model::LlamaForCausalLM> models{MakeModel(s), MakeModel(s)};
  const std::vector<std::string> errors = meshwork::testing::RunMesh({1, 1, 2}, [&](int rank, dist::DeviceMesh& mesh) {
    ParallelGroups groups{&mesh.group("tp"), {&mesh.group("dp_shard"), nullptr, nullptr}};
    MW_ASSIGN_OR_RETURN(auto p, ParallelLlama::Create(models[rank], groups, {}));
    p->Forward(torch::zeros({1, 4}, torch::kLong), {});  // throws: RunMesh reports what
    return Internal("no error");
  });
  for (const std::string& e : errors) EXPECT_THAT(e, HasSubstr("targets are needed"));
}

}  // namespace
}  // namespace meshwork::parallel
