// The assembled model: RMSNorm and the loss by hand, HF parameter names and counts, tied output
// projection, causal masking end to end, deterministic init, and an overfitting sanity check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "trainer/model/llama.h"

namespace meshwork::model {
namespace {

// 2 layers, hidden 32, 4 heads of dim 8, 2 kv heads, vocab 48, at most 16 positions.
LlamaConfig TinyConfig(bool tied = true) {
  LlamaConfig c;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = tied;
  return c;
}

// ---------------------------------------------------------------------------------- RMSNorm

TEST(RMSNormTest, EqualsXOverRootMeanSquareTimesWeight) {
  const int64_t dim = 16;
  const double eps = 1e-5;
  RMSNorm norm(dim, eps);
  torch::manual_seed(0);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::randn({dim}));
  }
  auto x = torch::randn({2, 3, dim});
  auto y = norm(x);
  ASSERT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), torch::kFloat);

  auto xd = x.to(torch::kDouble).contiguous();
  auto wd = norm->weight.detach().to(torch::kDouble).contiguous();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      double mean_sq = 0.0;
      for (int64_t i = 0; i < dim; ++i) mean_sq += std::pow(xd[b][t][i].item<double>(), 2);
      mean_sq /= dim;
      const double inv_rms = 1.0 / std::sqrt(mean_sq + eps);
      for (int64_t i = 0; i < dim; ++i) {
        const double expected = xd[b][t][i].item<double>() * inv_rms * wd[i].item<double>();
        EXPECT_NEAR(y[b][t][i].item<float>(), expected, 1e-5) << b << "," << t << "," << i;
      }
    }
  }
}

TEST(RMSNormTest, EpsIsAddedUnderTheSquareRoot) {
  RMSNorm norm(4, 1e-2);
  auto y = norm(torch::zeros({1, 4}));
  EXPECT_TRUE(torch::equal(y, torch::zeros({1, 4})));
  // A constant row c has rms c: the result is c / sqrt(c^2 + eps).
  auto z = norm(torch::full({1, 4}, 0.1f));
  EXPECT_NEAR(z[0][0].item<float>(), 0.1 / std::sqrt(0.01 + 1e-2), 1e-6);
}

TEST(RMSNormTest, Bf16InputAndGainReturnBf16CloseToFp32) {
  const int64_t dim = 32;
  RMSNorm norm(dim, 1e-5);
  torch::manual_seed(1);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::rand({dim}) + 0.5);
  }
  auto x = torch::randn({4, dim}) * 3.0;
  auto expected = norm(x).detach();
  norm->to(torch::kBFloat16);
  auto y = norm(x.to(torch::kBFloat16));
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), expected, 2e-2, 2e-2))
      << "max diff " << (y.to(torch::kFloat) - expected).abs().max().item<float>();
}

TEST(RMSNormTest, ReducesInFp32SoHalfInputDoesNotOverflow) {
  // 300^2 = 90000 overflows fp16 (max 65504); the mean of squares must be taken in fp32.
  RMSNorm norm(4, 1e-5);
  norm->to(torch::kHalf);
  auto x = torch::tensor({300.0f, -300.0f, 300.0f, -300.0f}).view({1, 4}).to(torch::kHalf);
  auto y = norm(x);
  EXPECT_EQ(y.scalar_type(), torch::kHalf);
  auto yf = y.to(torch::kFloat);
  EXPECT_TRUE(torch::isfinite(yf).all().item<bool>());
  EXPECT_TRUE(torch::allclose(yf, torch::tensor({1.0f, -1.0f, 1.0f, -1.0f}).view({1, 4}), 1e-3,
                              1e-3));
}

// ------------------------------------------------------------------------------------- loss

TEST(CausalLmLossTest, UniformLogitsGiveLogVocab) {
  const int64_t vocab = 37;
  auto logits = torch::zeros({2, 5, vocab});
  auto targets = torch::randint(0, vocab, {2, 5}, torch::kLong);
  auto loss = CausalLmLoss(logits, targets);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(loss.item<float>(), std::log(37.0), 1e-6);
}

TEST(CausalLmLossTest, TwoTokenExampleMatchesNegativeLogSoftmaxByHand) {
  const double l0[3] = {2.0, -1.0, 0.5};
  const double l1[3] = {0.1, 0.2, 3.0};
  auto logits = torch::tensor({2.0f, -1.0f, 0.5f, 0.1f, 0.2f, 3.0f}).view({1, 2, 3});
  auto targets = torch::tensor({0L, 1L}).view({1, 2});
  auto nll = [](const double* l, int target) {
    double sum = 0.0;
    for (int i = 0; i < 3; ++i) sum += std::exp(l[i]);
    return -(l[target] - std::log(sum));
  };
  const double expected = (nll(l0, 0) + nll(l1, 1)) / 2.0;
  EXPECT_NEAR(CausalLmLoss(logits, targets).item<float>(), expected, 1e-6);
}

TEST(CausalLmLossTest, Bf16LogitsGiveFp32Loss) {
  auto logits = torch::tensor({2.0f, -1.0f, 0.5f, 0.125f, 0.25f, 3.0f}).view({1, 2, 3});
  auto targets = torch::tensor({2L, 0L}).view({1, 2});
  auto loss = CausalLmLoss(logits.to(torch::kBFloat16), targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  // These logits are exact in bf16, so the loss equals the fp32 one.
  EXPECT_FLOAT_EQ(loss.item<float>(), CausalLmLoss(logits, targets).item<float>());
}

// ------------------------------------------------------------------------------- whole model

std::vector<std::string> ExpectedHfNames(int64_t layers, bool tied) {
  std::vector<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* s :
         {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      names.push_back(p + s);
    }
  }
  if (!tied) names.push_back("lm_head.weight");
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> ParameterNames(torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(LlamaForCausalLMTest, TiedParameterNamesEqualHuggingFace) {
  LlamaForCausalLM model(TinyConfig(/*tied=*/true));
  EXPECT_EQ(ParameterNames(*model), ExpectedHfNames(2, /*tied=*/true));
  EXPECT_FALSE(model->lm_head);
}

TEST(LlamaForCausalLMTest, UntiedParameterNamesAddLmHead) {
  LlamaForCausalLM model(TinyConfig(/*tied=*/false));
  EXPECT_EQ(ParameterNames(*model), ExpectedHfNames(2, /*tied=*/false));
  ASSERT_TRUE(model->lm_head);
}

TEST(LlamaForCausalLMTest, ParameterShapesMatchHfLayout) {
  LlamaForCausalLM model(TinyConfig(/*tied=*/false));
  auto params = model->named_parameters();
  using S = std::vector<int64_t>;
  EXPECT_EQ(params["model.embed_tokens.weight"].sizes(), (S{48, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.q_proj.weight"].sizes(), (S{32, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.k_proj.weight"].sizes(), (S{16, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.v_proj.weight"].sizes(), (S{16, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.o_proj.weight"].sizes(), (S{32, 32}));
  EXPECT_EQ(params["model.layers.1.mlp.gate_proj.weight"].sizes(), (S{64, 32}));
  EXPECT_EQ(params["model.layers.1.mlp.up_proj.weight"].sizes(), (S{64, 32}));
  EXPECT_EQ(params["model.layers.1.mlp.down_proj.weight"].sizes(), (S{32, 64}));
  EXPECT_EQ(params["model.layers.1.input_layernorm.weight"].sizes(), (S{32}));
  EXPECT_EQ(params["model.norm.weight"].sizes(), (S{32}));
  EXPECT_EQ(params["lm_head.weight"].sizes(), (S{48, 32}));
}

int64_t CountParameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(LlamaForCausalLMTest, ParameterCountEqualsConfigNumParameters) {
  for (bool tied : {true, false}) {
    const LlamaConfig c = TinyConfig(tied);
    LlamaForCausalLM model(c);
    EXPECT_EQ(CountParameters(*model), c.NumParameters()) << "tied=" << tied;
  }
  LlamaConfig mqa = TinyConfig();
  mqa.num_key_value_heads = 1;
  LlamaForCausalLM model(mqa);
  EXPECT_EQ(CountParameters(*model), mqa.NumParameters()) << "one kv head";
}

TEST(LlamaForCausalLMTest, LogitsHaveShapeBatchSeqVocab) {
  torch::manual_seed(0);
  LlamaForCausalLM model(TinyConfig());
  auto tokens = torch::randint(0, 48, {3, 7}, torch::kLong);
  auto logits = model(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 7, 48}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

// Tokens 0..39 only, so rows 40..47 of the embedding never feed the hidden states.
torch::Tensor TokensBelow40(int64_t batch, int64_t seq) {
  return torch::randint(0, 40, {batch, seq}, torch::kLong);
}

TEST(LlamaForCausalLMTest, TiedLogitsUseEmbedTokensWeight) {
  torch::manual_seed(1);
  LlamaForCausalLM model(TinyConfig(/*tied=*/true));
  model->InitWeights(0.02);
  ASSERT_FALSE(model->lm_head);
  torch::NoGradGuard no_grad;
  auto tokens = TokensBelow40(2, 6);
  auto before = model(tokens);

  auto& embed = model->model->embed_tokens->weight;
  embed[45].zero_();
  embed[46].copy_(embed[41]);
  auto after = model(tokens);
  // Only the output columns of the edited rows change: logit j = <h, embed_tokens.weight[j]>.
  EXPECT_TRUE(torch::equal(after.select(-1, 45), torch::zeros({2, 6})));
  EXPECT_TRUE(torch::allclose(after.select(-1, 46), after.select(-1, 41)));
  EXPECT_FALSE(torch::allclose(before.select(-1, 46), after.select(-1, 46)));
  EXPECT_TRUE(torch::equal(after.narrow(-1, 0, 45), before.narrow(-1, 0, 45)));
}

TEST(LlamaForCausalLMTest, UntiedLogitsUseLmHeadNotEmbedTokens) {
  torch::manual_seed(2);
  LlamaForCausalLM model(TinyConfig(/*tied=*/false));
  model->InitWeights(0.02);
  ASSERT_TRUE(model->lm_head);
  torch::NoGradGuard no_grad;
  auto tokens = TokensBelow40(2, 6);
  auto before = model(tokens);
  model->model->embed_tokens->weight[45].zero_();  // a token that is never input
  EXPECT_TRUE(torch::equal(model(tokens), before));
  model->lm_head->weight[45].zero_();
  auto after = model(tokens);
  EXPECT_TRUE(torch::equal(after.select(-1, 45), torch::zeros({2, 6})));
  EXPECT_FALSE(torch::allclose(before.select(-1, 45), after.select(-1, 45)));
}

TEST(LlamaForCausalLMTest, ForwardEqualsHfDecoderWrittenOut) {
  const LlamaConfig c = TinyConfig(/*tied=*/true);
  torch::manual_seed(3);
  LlamaForCausalLM model(c);
  model->InitWeights(0.1);
  torch::NoGradGuard no_grad;
  // Non-trivial norm gains, so a missing or misplaced norm shows.
  for (auto& item : model->named_parameters()) {
    if (item.value().dim() == 1) item.value().uniform_(0.5, 1.5);
  }
  auto tokens = torch::randint(0, 48, {2, 9}, torch::kLong);
  RopeTables rope = MakeRopeTables(c, 9, torch::kCPU);

  auto h = model->model->embed_tokens->weight.index_select(0, tokens.reshape({-1})).view({2, 9, 32});
  for (const auto& m : *model->model->layers) {
    auto& layer = *m->as<DecoderLayer>();
    h = h + layer.self_attn(layer.input_layernorm(h), rope);
    auto x = layer.post_attention_layernorm(h);
    auto gate = torch::matmul(x, layer.mlp->gate_proj->weight.t());
    auto up = torch::matmul(x, layer.mlp->up_proj->weight.t());
    h = h + torch::matmul(gate * torch::sigmoid(gate) * up, layer.mlp->down_proj->weight.t());
  }
  auto expected = torch::matmul(model->model->norm(h), model->model->embed_tokens->weight.t());
  auto logits = model(tokens);
  EXPECT_TRUE(torch::allclose(logits, expected, 1e-5, 1e-5))
      << "max diff " << (logits - expected).abs().max().item<float>();
}

// A model switched between two ways of computing the same thing by `use(model, second)`: the
// same loss and the same gradient for every parameter (double: to rounding; fp32: within 1e-5).
void ExpectSameLossAndGradients(const std::function<void(LlamaForCausalLM&, bool)>& use) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    torch::manual_seed(5);
    LlamaForCausalLM model(TinyConfig());
    model->InitWeights(0.1);
    model->to(dtype);
    const auto tokens = torch::randint(0, 48, {2, 10}, torch::kLong);
    const auto inputs = tokens.narrow(1, 0, 9), targets = tokens.narrow(1, 1, 9);
    auto run = [&](bool second) {
      use(model, second);
      model->zero_grad();
      auto loss = model->Loss(inputs, targets);
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
      return std::make_pair(loss.item<double>(), grads);
    };
    const auto [first_loss, first] = run(false);
    const auto [second_loss, second] = run(true);
    EXPECT_NEAR(second_loss, first_loss, tol) << dtype;
    const auto names = model->named_parameters().keys();
    for (size_t i = 0; i < second.size(); ++i) {
      EXPECT_TRUE(torch::allclose(second[i], first[i], tol, tol))
          << names[i] << " " << dtype << " max diff " << (second[i] - first[i]).abs().max().item<double>();
    }
  }
}

// q/k/v and gate/up from one GEMM each (the default) against one GEMM per projection.
TEST(LlamaForCausalLMTest, MergedProjectionsEqualSeparateOnes) {
  ExpectSameLossAndGradients([](LlamaForCausalLM& model, bool merged) { model->set_merged_projections(merged); });
}

// training.fused_kernels: SwiGLU, RoPE and the norms (the final one too) fused (on the CPU, the
// host loops over the CUDA kernels' arithmetic) against the composition.
TEST(LlamaForCausalLMTest, FusedSwiGluAndRopeEqualTheComposition) {
  ExpectSameLossAndGradients([](LlamaForCausalLM& model, bool fused) { model->set_fused_kernels(fused); });
}

// With the head's logit gradient stored, fused_kernels also computes it by the fused softmax.
TEST(LlamaForCausalLMTest, FusedKernelsWithAStoredHeadGradientEqualTheComposition) {
  ExpectSameLossAndGradients([](LlamaForCausalLM& model, bool fused) {
    model->set_loss_gradient(HeadGradient::kStored);
    model->set_fused_kernels(fused);
  });
}

// With the fused kernels a tied table's lookup gradient is sparse and joins the head's dense one
// in place: the table's gradient stays dense, equals the composition's, and accumulates over
// micro-batches (two backward passes); an untied table's only gradient stays dense too.
TEST(LlamaForCausalLMTest, FusedTiedEmbeddingGradientIsDenseAndAccumulates) {
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    torch::manual_seed(6);
    LlamaForCausalLM model(TinyConfig(tied));
    model->InitWeights(0.1);
    model->to(torch::kDouble);
    const auto tokens = torch::randint(0, 48, {2, 10}, torch::kLong);
    const auto inputs = tokens.narrow(1, 0, 9), targets = tokens.narrow(1, 1, 9);
    auto table_grad = [&](bool fused) {
      model->set_fused_kernels(fused);
      model->zero_grad();
      model->Loss(inputs, targets).backward();
      model->Loss(inputs.flip(1), targets.flip(1)).backward();
      return model->model->embed_tokens->weight.grad().clone();
    };
    const auto fused = table_grad(true);
    const auto plain = table_grad(false);
    EXPECT_FALSE(fused.is_sparse());
    EXPECT_TRUE(torch::allclose(fused, plain, 1e-12, 1e-12)) << (fused - plain).abs().max();
  }
}

// A bf16 residual stream applies under CUDA autocast only (fused_ops_gpu_test holds it to fp32
// there): without autocast the stream stays in the weights' dtype, the same losses and gradients.
TEST(LlamaForCausalLMTest, Bf16ResidualStreamLeavesAModelWithoutAutocastAlone) {
  ExpectSameLossAndGradients([](LlamaForCausalLM& model, bool bf16) {
    model->set_residual_dtype(bf16 ? std::optional<torch::ScalarType>(torch::kBFloat16) : std::nullopt);
  });
}

TEST(LlamaForCausalLMTest, LaterTokensDoNotChangeEarlierLogits) {
  torch::manual_seed(4);
  LlamaForCausalLM model(TinyConfig());
  model->InitWeights(0.1);
  torch::NoGradGuard no_grad;
  const int64_t t = 10;
  auto tokens = torch::randint(0, 48, {2, t}, torch::kLong);
  auto base = model(tokens);
  for (int64_t i = 0; i < t - 1; ++i) {
    auto changed = tokens.clone();
    // Shift every later token to a different id.
    changed.narrow(1, i + 1, t - i - 1).add_(1 + i % 5).remainder_(48);
    auto logits = model(changed);
    EXPECT_TRUE(torch::allclose(logits.narrow(1, 0, i + 1), base.narrow(1, 0, i + 1), 1e-5, 1e-6))
        << "positions <= " << i << " changed";
    EXPECT_FALSE(torch::allclose(logits.narrow(1, i + 1, 1), base.narrow(1, i + 1, 1), 1e-3, 1e-4))
        << "position " << i + 1 << " did not change";
  }
}

TEST(LlamaForCausalLMTest, RopeCacheGivesSameLogitsAcrossSequenceLengths) {
  torch::manual_seed(5);
  LlamaForCausalLM model(TinyConfig());
  model->InitWeights(0.1);
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 48, {1, 12}, torch::kLong);
  auto full = model(tokens);
  auto prefix = model(tokens.narrow(1, 0, 4));  // shorter than the cached tables
  EXPECT_TRUE(torch::allclose(prefix, full.narrow(1, 0, 4), 1e-5, 1e-6));
  LlamaForCausalLM fresh(TinyConfig());
  {
    // Same weights, no cached tables yet; first call at length 4, then 12.
    auto src = model->named_parameters();
    for (auto& item : fresh->named_parameters()) item.value().copy_(src[item.key()]);
  }
  EXPECT_TRUE(torch::allclose(fresh(tokens.narrow(1, 0, 4)), prefix, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(fresh(tokens), full, 1e-6, 1e-6));
}

TEST(LlamaForCausalLMTest, ForwardRejectsSequenceLongerThanMaxPositions) {
  LlamaForCausalLM model(TinyConfig());  // max_position_embeddings 16
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(model(torch::zeros({1, 16}, torch::kLong)));
  try {
    model(torch::zeros({1, 17}, torch::kLong));
    FAIL() << "seq 17 > max_position_embeddings 16 was accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_position_embeddings"));
  }
  EXPECT_THROW(model(torch::zeros({16}, torch::kLong)), c10::Error);  // not [batch, seq]
}

TEST(LlamaForCausalLMTest, InitWeightsIsDeterministicUnderManualSeed) {
  torch::manual_seed(100);
  LlamaForCausalLM a(TinyConfig(/*tied=*/false));
  torch::manual_seed(200);  // different construction-time weights
  LlamaForCausalLM b(TinyConfig(/*tied=*/false));
  torch::manual_seed(7);
  a->InitWeights(0.02);
  torch::manual_seed(7);
  b->InitWeights(0.02);
  auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
  torch::manual_seed(8);
  b->InitWeights(0.02);
  EXPECT_FALSE(torch::equal(a->named_parameters()["model.layers.0.self_attn.q_proj.weight"],
                            b->named_parameters()["model.layers.0.self_attn.q_proj.weight"]));
}

TEST(LlamaForCausalLMTest, InitWeightsSetsNormGainsToOneAndScalesResidualProjections) {
  LlamaConfig c = TinyConfig(/*tied=*/false);
  LlamaForCausalLM model(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(3.0);
  }
  torch::manual_seed(9);
  const double std = 0.02;
  model->InitWeights(std);
  std::vector<torch::Tensor> residual, other;
  int norms = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    if (name.find("layernorm") != std::string::npos || name == "model.norm.weight") {
      ++norms;
      EXPECT_TRUE(torch::equal(item.value(), torch::ones_like(item.value()))) << name;
    } else if (name.find("o_proj") != std::string::npos ||
               name.find("down_proj") != std::string::npos) {
      residual.push_back(item.value().detach().flatten());
    } else {
      other.push_back(item.value().detach().flatten());
    }
  }
  EXPECT_EQ(norms, 2 * 2 + 1);
  const double other_std = torch::cat(other).std().item<double>();
  const double residual_std = torch::cat(residual).std().item<double>();
  EXPECT_NEAR(other_std, std, 0.05 * std);
  EXPECT_NEAR(residual_std, std / std::sqrt(2.0 * 2.0), 0.05 * std / 2.0);
  EXPECT_NEAR(torch::cat(other).mean().item<double>(), 0.0, 0.05 * std);
}

double TrainSteps(LlamaForCausalLM& model, torch::optim::Optimizer& opt, const torch::Tensor& batch,
                  int steps, double* first_loss) {
  auto inputs = batch.narrow(1, 0, batch.size(1) - 1);
  auto targets = batch.narrow(1, 1, batch.size(1) - 1);
  double loss_value = 0.0;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto loss = CausalLmLoss(model(inputs), targets);
    loss.backward();
    opt.step();
    loss_value = loss.item<double>();
    if (s == 0) *first_loss = loss_value;
  }
  torch::NoGradGuard no_grad;
  return CausalLmLoss(model(inputs), targets).item<double>();
}

TEST(LlamaForCausalLMTest, AdamOverfitsOneFixedBatch) {
  torch::manual_seed(10);
  LlamaForCausalLM model(TinyConfig());
  model->InitWeights(0.02);
  auto batch = torch::randint(0, 48, {2, 16}, torch::kLong);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0.0;
  const double last = TrainSteps(model, opt, batch, 40, &first);
  EXPECT_NEAR(first, std::log(48.0), 0.1);  // small init: close to uniform
  EXPECT_LT(last, 0.3 * first) << "first " << first << " last " << last;
}

TEST(LlamaForCausalLMTest, SgdStepsReduceLossOnOneFixedBatch) {
  torch::manual_seed(11);
  LlamaForCausalLM model(TinyConfig(/*tied=*/false));
  model->InitWeights(0.02);
  auto batch = torch::randint(0, 48, {2, 16}, torch::kLong);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  double first = 0.0;
  const double last = TrainSteps(model, opt, batch, 20, &first);
  EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
}

TEST(LlamaForCausalLMTest, Bf16ModelLossIsCloseToFp32) {
  torch::manual_seed(12);
  LlamaForCausalLM model(TinyConfig());
  model->InitWeights(0.1);
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 48, {2, 9}, torch::kLong);
  auto inputs = tokens.narrow(1, 0, 8), targets = tokens.narrow(1, 1, 8);
  const double fp32_loss = CausalLmLoss(model(inputs), targets).item<double>();
  model->to(torch::kBFloat16);
  auto logits = model(inputs);
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  const double bf16_loss = CausalLmLoss(logits, targets).item<double>();
  EXPECT_NEAR(bf16_loss, fp32_loss, 0.05);
}

}  // namespace
}  // namespace meshwork::model
