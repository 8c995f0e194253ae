// Tensor parallelism numerics: the Llama model split over tp ranks (threads in one process, Gloo)
// trains with the same losses, gradient norms and parameters as one process training the whole
// model on the same batches; bad splits are refused naming the values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "tests/common/needs_gloo.h"
#include "tests/common/parallel_training.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/model/recompute.h"
#include "trainer/tp/tensor_parallel.h"

namespace meshwork::tp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

model::LlamaConfig SmallConfig(bool tied) {
  model::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;  // set per test (Case)
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

constexpr int kSteps = 6;
constexpr int kRows = 4;  // one batch, the same on every tp rank
constexpr int kSeq = 12;
constexpr double kClip = 0.5;  // small enough that clipping is active

struct Case {
  bool tied = true;
  int64_t heads = 4;
  int64_t kv_heads = 2;  // grouped-query attention: two query heads per kv head
  bool sequence_parallel = true;
  bool checkpointing = false;
  bool fused = false;
  int rows = kRows;
  int seq = kSeq;
  int accum = 1;  // micro-batches a step (rows / accum each)
  int async_chunks = 1;  // overlapped TP (TensorParallelOptions::async_chunks)
  int64_t loss_chunk_rows = 0;  // the head's tokens a chunk (0: the default, one chunk here)
};

torch::Tensor Tokens(int step, const Case& s) {
  torch::manual_seed(1000 + step);
  return torch::randint(0, 40, {s.rows, s.seq + 1}, torch::kLong);
}

model::LlamaForCausalLM MakeModel(const Case& s) {
  torch::manual_seed(7);
  model::LlamaConfig c = SmallConfig(s.tied);
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  model::LlamaForCausalLM m(c);
  m->InitWeights(0.2);
  m->set_fused_kernels(s.fused);
  if (s.loss_chunk_rows > 0) m->set_loss_chunk_rows(s.loss_chunk_rows);
  return m;
}

using meshwork::testing::MakeOptimizer;

struct TrainRun {
  std::vector<double> losses, grad_norms, eval_losses;
  std::map<std::string, torch::Tensor> params;
  int recomputed_layers = 0;
};

model::LayerRunner Checkpointed() {
  return [](int64_t, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
    return model::CheckpointedLayer(layer, h, rope);
  };
}

TrainRun SingleProcess(const Case& s) {
  TrainRun run;
  auto m = MakeModel(s);
  const auto eval = [&](const torch::Tensor& b, int seq) {
    return model::CausalLmLoss(m->forward(b.narrow(1, 0, seq)), b.narrow(1, 1, seq)).item<double>();
  };
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : m->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opt = MakeOptimizer(decay, no_decay);
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    const torch::Tensor batch = Tokens(step, s);
    double loss_sum = 0;
    for (int micro = 0; micro < s.accum; ++micro) {
      const torch::Tensor b = batch.narrow(0, micro * s.rows / s.accum, s.rows / s.accum);
      auto loss = model::CausalLmLoss(m->forward(b.narrow(1, 0, s.seq)), b.narrow(1, 1, s.seq)) / s.accum;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    run.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(m->parameters(), kClip));
    opt.step();
    run.losses.push_back(loss_sum);
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor b = Tokens(99, s);
  run.eval_losses.push_back(eval(b, s.seq));
  run.eval_losses.push_back(eval(b.narrow(0, 0, 1).narrow(1, 0, 4), 3));
  for (auto& item : m->named_parameters()) run.params[item.key()] = item.value().detach().clone();
  return run;
}

using meshwork::testing::RecomputeNodes;

// `tp` ranks as threads, each with the same whole model split by TensorParallelLlama; the
// clipping is the trainer's (the global norm from GradNormSquared, one factor for every slice).
std::vector<TrainRun> Split(const Case& s, int tp) {
  // Models and batches are made before the threads start: torch::manual_seed and the draws
  // share one generator, which rank threads seeding at once would interleave.
  std::vector<model::LlamaForCausalLM> models;
  for (int r = 0; r < tp; ++r) models.push_back(MakeModel(s));
  std::vector<torch::Tensor> batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(Tokens(step, s));
  const torch::Tensor eval_batch = Tokens(99, s);
  std::vector<TrainRun> runs(tp);
  const std::vector<std::string> errors = meshwork::testing::RunMesh({1, 1, tp}, [&](int rank, dist::DeviceMesh& mesh) {
        auto fail = [](const Status& st) { return st; };
        TensorParallelOptions options;
        options.sequence_parallel = s.sequence_parallel;
        options.async_chunks = s.async_chunks;
        auto split = TensorParallelLlama::Create(models[rank], mesh.group("tp"), options);
        if (!split.ok()) return fail(split.status());
        TensorParallelLlama& t = **split;
        std::vector<torch::Tensor> decay, no_decay;
        for (const LocalParam& p : t.params()) (p.value.dim() >= 2 ? decay : no_decay).push_back(p.value);
        auto opt = MakeOptimizer(decay, no_decay);
        for (int step = 0; step < kSteps; ++step) {
          opt.zero_grad();
          double loss_sum = 0;
          for (int micro = 0; micro < s.accum; ++micro) {
            const torch::Tensor b = batches[step].narrow(0, micro * s.rows / s.accum, s.rows / s.accum);
            auto loss = t.Loss(b.narrow(1, 0, s.seq), b.narrow(1, 1, s.seq),
                               s.checkpointing ? Checkpointed() : model::LayerRunner{}) /
                        s.accum;
            if (step == 0) runs[rank].recomputed_layers = RecomputeNodes(loss);
            loss.backward();
            loss_sum += loss.item<double>();
          }
          if (Status st = t.FinishBackward(); !st.ok()) return fail(st);
          auto norm2 = t.GradNormSquared();
          if (!norm2.ok()) return fail(norm2.status());
          const double norm = std::sqrt(norm2->item<double>());
          const double factor = kClip / (norm + 1e-6);
          if (factor < 1) {
            torch::NoGradGuard no_grad;
            for (const LocalParam& p : t.params()) p.value.mutable_grad().mul_(factor);
          }
          opt.step();
          runs[rank].losses.push_back(loss_sum);
          runs[rank].grad_norms.push_back(norm);
        }
        {
          torch::NoGradGuard no_grad;
          const torch::Tensor& b = eval_batch;
          runs[rank].eval_losses.push_back(t.Loss(b.narrow(1, 0, s.seq), b.narrow(1, 1, s.seq)).item<double>());
          // 1 x 3 tokens divide by neither 2 nor 4: the plain regions, as an evaluation's last batch may run.
          const torch::Tensor last = b.narrow(0, 0, 1).narrow(1, 0, 4);
          runs[rank].eval_losses.push_back(t.Loss(last.narrow(1, 0, 3), last.narrow(1, 1, 3)).item<double>());
        }
        auto full = t.GatherFullState();
        if (!full.ok()) return fail(full.status());
        runs[rank].params = std::move(*full);
        return Status::Ok();
      });
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

void ExpectSameTraining(const Case& s, int tp) {
  const TrainRun want = SingleProcess(s);
  const std::vector<TrainRun> got = Split(s, tp);
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(got[r].losses.size(), want.losses.size());
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(got[r].losses[step], want.losses[step], 1e-5) << "step " << step;
      EXPECT_NEAR(got[r].grad_norms[step], want.grad_norms[step], 1e-5 * want.grad_norms[step]) << "step " << step;
    }
    ASSERT_EQ(got[r].eval_losses.size(), 2u);
    EXPECT_NEAR(got[r].eval_losses[0], want.eval_losses[0], 1e-5);
    EXPECT_NEAR(got[r].eval_losses[1], want.eval_losses[1], 1e-5) << "3 tokens: the plain regions";
    ASSERT_EQ(got[r].params.size(), want.params.size());
    for (const auto& [name, value] : want.params) {
      ASSERT_TRUE(got[r].params.count(name)) << name;
      EXPECT_EQ(got[r].params.at(name).sizes(), value.sizes()) << name;
      EXPECT_TRUE(torch::allclose(got[r].params.at(name), value, 1e-4, 1e-5))
          << name << ": max difference " << (got[r].params.at(name) - value).abs().max().item<double>();
    }
  }
  // The losses must have moved: equal losses of a model that does not change would prove little
  // (on random tokens they need not fall).
  const auto [low, high] = std::minmax_element(want.losses.begin(), want.losses.end());
  EXPECT_GT(*high - *low, 0.05);
}

using TensorParallelTraining = meshwork::testing::NeedsGloo<>;

TEST_F(TensorParallelTraining, TwoRanksWithSequenceParallelismEqualOneProcess) { ExpectSameTraining({}, 2); }

TEST_F(TensorParallelTraining, TwoRanksWithoutSequenceParallelismEqualOneProcess) {
  Case s;
  s.sequence_parallel = false;
  ExpectSameTraining(s, 2);
}

TEST_F(TensorParallelTraining, UntiedHeadAndOneKvHeadPerRankEqualOneProcess) {
  Case s;
  s.tied = false;
  s.kv_heads = 4;
  ExpectSameTraining(s, 4);
}

TEST_F(TensorParallelTraining, FourRanksGroupedQueryHeadsEqualOneProcess) {
  Case s;
  s.heads = 8;  // two query heads per kv head on each of the 4 ranks
  s.kv_heads = 4;
  ExpectSameTraining(s, 4);
}

// 3 x 11 tokens do not split over 2 ranks: each forward runs the plain regions (every rank the
// whole stream), which the norms' whole weights allow, with the same results.
TEST_F(TensorParallelTraining, TokensThatDoNotDivideRunThePlainRegions) {
  Case s;
  s.rows = 3;
  s.seq = 11;
  ExpectSameTraining(s, 2);
}

TEST_F(TensorParallelTraining, GradientAccumulationWithSequenceParallelismEqualsOneProcess) {
  Case s;
  s.accum = 2;
  ExpectSameTraining(s, 2);
}

TEST_F(TensorParallelTraining, ActivationCheckpointingRecomputesEveryLayerAndEqualsOneProcess) {
  Case s;
  s.checkpointing = true;
  ExpectSameTraining(s, 2);
  const std::vector<TrainRun> runs = Split(s, 2);
  EXPECT_EQ(runs[0].recomputed_layers, 2);
}

// Overlapped TP: each region's all-gather + matmul and matmul + reduce-scatter in chunks (3 of a
// rank's 24 tokens at tp 2, with every layer recomputed; 2 of 12 at tp 4). The evaluation's last
// batch (3 tokens) does not divide and runs the plain regions.
TEST_F(TensorParallelTraining, OverlappedInChunksEqualsOneProcess) {
  Case s;
  s.async_chunks = 3;
  s.checkpointing = true;
  ExpectSameTraining(s, 2);
  Case four;
  four.kv_heads = 4;
  four.async_chunks = 2;
  four.fused = true;
  ExpectSameTraining(four, 4);
}

// The vocabulary-parallel loss a chunk of tokens at a time (5 rows of the whole vocabulary's
// logits, so 10 of a slice's at tp 2 and 20 at tp 4: 48 tokens in 5 chunks; with accumulation
// 24 tokens a micro-batch in 2; the last ones partial), recomputed in backward; with an untied
// head too.
TEST_F(TensorParallelTraining, TheLossInChunksOfTokensEqualsOneProcess) {
  ExpectSameTraining({.loss_chunk_rows = 5}, 2);
  ExpectSameTraining({.tied = false, .heads = 8, .kv_heads = 4, .accum = 2, .loss_chunk_rows = 5}, 4);
}

TEST_F(TensorParallelTraining, FusedKernelsEqualOneProcess) {
  Case s;
  s.fused = true;
  ExpectSameTraining(s, 2);
}

// A rank's slices are what the split promises: q/k/v and gate/up by rows, o and down by
// columns, the vocabulary by rows, norms whole.
TEST_F(TensorParallelTraining, EachRankHoldsItsSlices) {
  Case s;
  s.tied = false;
  std::vector<model::LlamaForCausalLM> models = {MakeModel(s), MakeModel(s)};
  std::vector<std::map<std::string, LocalParam>> held(2);
  const std::vector<std::string> errors = meshwork::testing::RunMesh({1, 1, 2}, [&](int rank, dist::DeviceMesh& mesh) {
    auto& whole = models[rank];
    std::map<std::string, torch::Tensor> before;
    for (auto& item : whole->named_parameters()) before[item.key()] = item.value().detach().clone();
    MW_ASSIGN_OR_RETURN(auto split, TensorParallelLlama::Create(whole, mesh.group("tp"), {}));
    std::string wrong;
    for (const LocalParam& p : split->params()) {
      held[rank][p.name] = p;
      const torch::Tensor& b = before.at(p.name);
      torch::Tensor expect = p.split == Split::kRows      ? b.narrow(0, p.begin, b.size(0) / 2)
                             : p.split == Split::kColumns ? b.narrow(1, p.begin, b.size(1) / 2)
                                                          : b;
      if (!torch::equal(p.value.detach(), expect)) wrong += p.name + " is not its slice; ";
    }
    return wrong.empty() ? Status::Ok() : Internal(wrong);
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  const auto& r1 = held[1];
  EXPECT_EQ(r1.at("model.layers.0.self_attn.q_proj.weight").split, Split::kRows);
  EXPECT_EQ(r1.at("model.layers.0.self_attn.q_proj.weight").begin, 16);  // heads 2, 3 of 4, 8 wide
  EXPECT_EQ(r1.at("model.layers.0.self_attn.k_proj.weight").value.size(0), 8);  // kv head 1 of 2
  EXPECT_EQ(r1.at("model.layers.0.self_attn.o_proj.weight").split, Split::kColumns);
  EXPECT_EQ(r1.at("model.layers.0.mlp.down_proj.weight").value.sizes(), (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(r1.at("model.embed_tokens.weight").value.size(0), 20);
  EXPECT_EQ(r1.at("lm_head.weight").begin, 20);
  EXPECT_EQ(r1.at("model.norm.weight").split, Split::kReplicated);
}

TEST(TensorParallelSplit, ModelsThatDoNotDivideAreRefusedNamingTheValues) {
  model::LlamaConfig c = SmallConfig(true);
  c.num_key_value_heads = 2;
  EXPECT_EQ(WhyNotSplittable(c, 2), "");
  EXPECT_THAT(WhyNotSplittable(c, 4), AllOf(HasSubstr("model.num_key_value_heads=2"), HasSubstr("mesh.tp=4")));
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3;
  EXPECT_THAT(WhyNotSplittable(c, 4), HasSubstr("model.num_attention_heads=6"));
  c = SmallConfig(true);
  c.num_key_value_heads = 4;
  c.intermediate_size = 50;
  EXPECT_THAT(WhyNotSplittable(c, 4), HasSubstr("model.intermediate_size=50"));
  c = SmallConfig(true);
  c.vocab_size = 37;
  EXPECT_THAT(WhyNotSplittable(c, 2), HasSubstr("model.vocab_size=37"));
}

}  // namespace
}  // namespace meshwork::tp
