// Attention: causal masking, grouped-query attention in HF's repeat_kv order, and
// compat::CausalAttention against a masked softmax written out by hand.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "trainer/model/compat.h"
#include "trainer/model/llama.h"

namespace meshwork::model {
namespace {

// hidden 32, 4 query heads of dim 8, 2 kv heads (2 query heads per kv head).
LlamaConfig SmallAttentionConfig(int64_t kv_heads = 2) {
  LlamaConfig c;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.intermediate_size = 64;
  c.vocab_size = 64;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 64;
  return c;
}

// Causal attention over [b, h, t, d] in double with explicit loops: position i attends to j <= i
// with softmax(q_i . k_j / sqrt(d)).
torch::Tensor ReferenceCausalAttention(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                       const torch::Tensor& v_in) {
  auto q = q_in.to(torch::kDouble).contiguous();
  auto k = k_in.to(torch::kDouble).contiguous();
  auto v = v_in.to(torch::kDouble).contiguous();
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  auto out = torch::zeros({B, H, T, D}, torch::kDouble);
  auto qa = q.accessor<double, 4>();
  auto ka = k.accessor<double, 4>();
  auto va = v.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> scores(i + 1);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < D; ++d) s += qa[b][h][i][d] * ka[b][h][j][d];
          scores[j] = s * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double denom = 0.0;
        for (int64_t j = 0; j <= i; ++j) denom += std::exp(scores[j] - max_score);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(scores[j] - max_score) / denom;
          for (int64_t d = 0; d < D; ++d) oa[b][h][i][d] += p * va[b][h][j][d];
        }
      }
    }
  }
  return out;
}

TEST(CausalAttentionTest, MatchesHandWrittenMaskedSoftmax) {
  torch::manual_seed(0);
  for (int64_t seq : {1, 2, 7}) {
    auto q = torch::randn({2, 3, seq, 8});
    auto k = torch::randn({2, 3, seq, 8});
    auto v = torch::randn({2, 3, seq, 8});
    auto y = compat::CausalAttention(q, k, v);
    ASSERT_EQ(y.sizes(), q.sizes()) << "seq=" << seq;
    EXPECT_EQ(y.scalar_type(), torch::kFloat);
    auto ref = ReferenceCausalAttention(q, k, v);
    EXPECT_TRUE(torch::allclose(y.to(torch::kDouble), ref, 1e-5, 1e-5))
        << "seq=" << seq << " max diff " << (y.to(torch::kDouble) - ref).abs().max().item<double>();
  }
}

TEST(CausalAttentionTest, FewerKvHeadsEqualTheirRepeatKvWidening) {
  // compat::CausalAttention takes grouped-query k and v as they are (libtorch >= 2.5: enable_gqa,
  // no widened copies); the result and the gradients must be those of the widened heads.
  torch::manual_seed(12);
  auto q = torch::randn({2, 6, 5, 8}, torch::kDouble).requires_grad_(true);
  auto k = torch::randn({2, 2, 5, 8}, torch::kDouble).requires_grad_(true);
  auto v = torch::randn({2, 2, 5, 8}, torch::kDouble).requires_grad_(true);
  auto y = compat::CausalAttention(q, k, v);
  auto ref = ReferenceCausalAttention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1));
  // The softmax runs in fp32 (as the fused kernels do), so double inputs agree to fp32 rounding.
  EXPECT_TRUE(torch::allclose(y, ref, 1e-6, 1e-6)) << (y - ref).abs().max().item<double>();
  auto w = torch::randn_like(y);
  (y * w).sum().backward();
  const auto gk = k.grad().clone(), gv = v.grad().clone(), gq = q.grad().clone();
  auto q2 = q.detach().clone().requires_grad_(true);
  auto k2 = k.detach().repeat_interleave(3, 1).requires_grad_(true);
  auto v2 = v.detach().repeat_interleave(3, 1).requires_grad_(true);
  (compat::CausalAttention(q2, k2, v2) * w).sum().backward();
  EXPECT_TRUE(torch::allclose(gq, q2.grad(), 1e-10, 1e-10));
  // A kv head's gradient is the sum over the query heads that read it.
  EXPECT_TRUE(torch::allclose(gk, k2.grad().view({2, 2, 3, 5, 8}).sum(2), 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(gv, v2.grad().view({2, 2, 3, 5, 8}).sum(2), 1e-10, 1e-10));
}

TEST(CausalAttentionTest, RestrictedKernelIsTheOneThatRunsAndAgrees) {
  // compat::RestrictAttentionKernel (training.attention_backend): "" is SDPA's own choice; a
  // kernel name leaves only that one, which AttentionKernel then reports and which must
  // give the reference result; a kernel this device lacks is an error, not a silent fallback.
  torch::manual_seed(14);
  auto q = torch::randn({2, 4, 6, 8});
  auto k = torch::randn({2, 2, 6, 8});
  auto v = torch::randn({2, 2, 6, 8});
  const auto ref = ReferenceCausalAttention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1));
  ASSERT_TRUE(compat::RestrictAttentionKernel(""));
  EXPECT_FALSE(compat::RestrictAttentionKernel("flash_attention_3"));
  if (!compat::kTorch2) {
    // libtorch 1.13: attention is the composition, which "math" names; nothing else to choose.
    EXPECT_TRUE(compat::RestrictAttentionKernel("math"));
    EXPECT_FALSE(compat::RestrictAttentionKernel("flash_attention"));
    EXPECT_FALSE(compat::RestrictAttentionKernel("cudnn_attention"));
    ASSERT_TRUE(compat::RestrictAttentionKernel(""));
    return;
  }
  const std::string chosen = compat::AttentionKernel(q, k, v);
  // The CPU's kernels (libtorch 2.x): its flash kernel and the math one.
  for (const std::string kernel : {"math", "flash_attention"}) {
    ASSERT_TRUE(compat::RestrictAttentionKernel(kernel));
    EXPECT_EQ(compat::AttentionKernel(q, k, v), kernel);
    const auto y = compat::CausalAttention(q, k, v);
    EXPECT_TRUE(torch::allclose(y.to(torch::kDouble), ref, 1e-5, 1e-5))
        << kernel << ": max diff " << (y.to(torch::kDouble) - ref).abs().max().item<double>();
  }
  for (const std::string kernel : {"cudnn_attention", "efficient_attention"}) {
    ASSERT_TRUE(compat::RestrictAttentionKernel(kernel));
    EXPECT_THROW(compat::AttentionKernel(q, k, v), c10::Error) << kernel << " on the CPU";
  }
  ASSERT_TRUE(compat::RestrictAttentionKernel(""));
  EXPECT_EQ(compat::AttentionKernel(q, k, v), chosen);
}

TEST(RmsNormTest, EqualsHuggingFaceComposition) {
  // LlamaRMSNorm: normalise in fp32, cast back to the input's dtype, multiply by the weight.
  torch::manual_seed(13);
  const auto weight = torch::rand({16}) + 0.5;
  auto reference = [&](const torch::Tensor& x) {
    auto xf = x.to(torch::kFloat);
    return weight * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + 1e-5)).to(x.scalar_type());
  };
  const auto x = torch::randn({3, 4, 16}) * 3;
  auto y = compat::RmsNorm(x, weight, 1e-5);
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(y, reference(x), 1e-5, 1e-6));
  const auto xb = x.to(torch::kBFloat16);
  auto yb = compat::RmsNorm(xb, weight, 1e-5);
  EXPECT_EQ(yb.scalar_type(), torch::kFloat);  // bf16 x fp32 weight promotes, as in HF
  EXPECT_TRUE(torch::equal(yb, reference(xb)));
  // Gradients flow to the input and to the weight.
  auto xg = x.clone().requires_grad_(true);
  auto wg = weight.clone().requires_grad_(true);
  compat::RmsNorm(xg, wg, 1e-5).sum().backward();
  auto xr = x.clone().requires_grad_(true);
  auto wr = weight.clone().requires_grad_(true);
  (wr * (xr * torch::rsqrt(xr.pow(2).mean(-1, true) + 1e-5))).sum().backward();
  EXPECT_TRUE(torch::allclose(xg.grad(), xr.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(wg.grad(), wr.grad(), 1e-4, 1e-5));
}

TEST(CausalAttentionTest, SingleTokenReturnsItsValue) {
  torch::manual_seed(1);
  auto q = torch::randn({1, 2, 1, 4});
  auto k = torch::randn({1, 2, 1, 4});
  auto v = torch::randn({1, 2, 1, 4});
  EXPECT_TRUE(torch::allclose(compat::CausalAttention(q, k, v), v));
}

TEST(CausalAttentionTest, Bf16InputsGiveBf16OutputCloseToReference) {
  torch::manual_seed(2);
  auto q = torch::randn({1, 2, 5, 8});
  auto k = torch::randn({1, 2, 5, 8});
  auto v = torch::randn({1, 2, 5, 8});
  auto y = compat::CausalAttention(q.to(torch::kBFloat16), k.to(torch::kBFloat16),
                                   v.to(torch::kBFloat16));
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  auto ref = ReferenceCausalAttention(q, k, v);
  EXPECT_TRUE(torch::allclose(y.to(torch::kDouble), ref, 5e-2, 5e-2));
}

TEST(AttentionTest, OutputShapeIsBatchSeqHidden) {
  const LlamaConfig c = SmallAttentionConfig();
  torch::manual_seed(3);
  Attention attn(c);
  RopeTables rope = MakeRopeTables(c, 5, torch::kCPU);
  auto y = attn(torch::randn({3, 5, c.hidden_size}), rope);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, c.hidden_size}));
}

TEST(AttentionTest, LaterPositionsDoNotChangeEarlierOutputs) {
  const LlamaConfig c = SmallAttentionConfig();
  torch::manual_seed(4);
  Attention attn(c);
  torch::NoGradGuard no_grad;
  const int64_t t = 7;
  RopeTables rope = MakeRopeTables(c, t, torch::kCPU);
  auto x = torch::randn({2, t, c.hidden_size});
  auto base = attn(x, rope);
  for (int64_t i = 0; i < t - 1; ++i) {
    auto perturbed = x.clone();
    perturbed.narrow(1, i + 1, t - i - 1).add_(torch::randn({2, t - i - 1, c.hidden_size}));
    auto y = attn(perturbed, rope);
    EXPECT_TRUE(torch::allclose(y.narrow(1, 0, i + 1), base.narrow(1, 0, i + 1), 1e-6, 1e-6))
        << "positions <= " << i << " changed";
    // The perturbed positions themselves do change, so the check above can fail.
    EXPECT_FALSE(torch::allclose(y.narrow(1, i + 1, 1), base.narrow(1, i + 1, 1), 1e-3, 1e-3))
        << "position " << i + 1;
  }
}

// o_proj(v_0) with each kv head's value repeated for the query heads it serves.
torch::Tensor SelfOnlyOutput(AttentionImpl& attn, const LlamaConfig& c, const torch::Tensor& x0) {
  const int64_t b = x0.size(0), d = c.head_dim();
  const int64_t rep = c.num_attention_heads / c.num_key_value_heads;
  auto v0 = attn.v_proj(x0).view({b, c.num_key_value_heads, d});
  auto per_head = v0.repeat_interleave(rep, /*dim=*/1).reshape({b, c.num_attention_heads * d});
  return attn.o_proj(per_head);
}

TEST(AttentionTest, PositionZeroAttendsOnlyToItself) {
  const LlamaConfig c = SmallAttentionConfig();
  torch::manual_seed(5);
  Attention attn(c);
  torch::NoGradGuard no_grad;
  RopeTables rope = MakeRopeTables(c, 6, torch::kCPU);
  auto x = torch::randn({2, 6, c.hidden_size});
  auto x0 = x.select(1, 0);
  auto expected = SelfOnlyOutput(*attn, c, x0);

  auto y = attn(x, rope);
  EXPECT_TRUE(torch::allclose(y.select(1, 0), expected, 1e-5, 1e-5));
  // A single token sees only itself too.
  auto single = attn(x.narrow(1, 0, 1), rope);
  EXPECT_TRUE(torch::allclose(single.select(1, 0), expected, 1e-5, 1e-5));
  // Position 1 does mix in position 0, so it is not its own value.
  EXPECT_FALSE(
      torch::allclose(y.select(1, 1), SelfOnlyOutput(*attn, c, x.select(1, 1)), 1e-3, 1e-3));
}

TEST(AttentionTest, GroupedQueryEqualsMultiHeadWithKvDuplicatedInRepeatKvOrder) {
  const LlamaConfig gqa_config = SmallAttentionConfig(/*kv_heads=*/2);
  const LlamaConfig mha_config = SmallAttentionConfig(/*kv_heads=*/4);
  torch::manual_seed(6);
  Attention gqa(gqa_config);
  Attention mha(mha_config);
  const int64_t d = gqa_config.head_dim();
  const int64_t rep = gqa_config.num_attention_heads / gqa_config.num_key_value_heads;
  {
    torch::NoGradGuard no_grad;
    mha->q_proj->weight.copy_(gqa->q_proj->weight);
    mha->o_proj->weight.copy_(gqa->o_proj->weight);
    // Query head h uses kv head h / rep: kv rows [g*d, (g+1)*d) become rows of heads g*rep..
    for (int64_t h = 0; h < mha_config.num_attention_heads; ++h) {
      const int64_t g = h / rep;
      mha->k_proj->weight.narrow(0, h * d, d).copy_(gqa->k_proj->weight.narrow(0, g * d, d));
      mha->v_proj->weight.narrow(0, h * d, d).copy_(gqa->v_proj->weight.narrow(0, g * d, d));
    }
  }
  torch::NoGradGuard no_grad;
  RopeTables rope = MakeRopeTables(gqa_config, 6, torch::kCPU);
  auto x = torch::randn({2, 6, gqa_config.hidden_size});
  auto y_gqa = gqa(x, rope);
  auto y_mha = mha(x, rope);
  EXPECT_TRUE(torch::allclose(y_gqa, y_mha, 1e-5, 1e-5))
      << "max diff " << (y_gqa - y_mha).abs().max().item<float>();

  // The other plausible order (head h uses kv head h % KV, i.e. repeat instead of
  // repeat_interleave) gives a different result, so the test pins the order down.
  Attention tiled(mha_config);
  {
    torch::NoGradGuard no_grad2;
    tiled->q_proj->weight.copy_(gqa->q_proj->weight);
    tiled->o_proj->weight.copy_(gqa->o_proj->weight);
    for (int64_t h = 0; h < mha_config.num_attention_heads; ++h) {
      const int64_t g = h % gqa_config.num_key_value_heads;
      tiled->k_proj->weight.narrow(0, h * d, d).copy_(gqa->k_proj->weight.narrow(0, g * d, d));
      tiled->v_proj->weight.narrow(0, h * d, d).copy_(gqa->v_proj->weight.narrow(0, g * d, d));
    }
  }
  EXPECT_FALSE(torch::allclose(y_gqa, tiled(x, rope), 1e-3, 1e-3));
}

TEST(AttentionTest, ProjectionShapesFollowKvHeads) {
  const LlamaConfig c = SmallAttentionConfig(/*kv_heads=*/1);
  Attention attn(c);
  EXPECT_EQ(attn->q_proj->weight.sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(attn->k_proj->weight.sizes(), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(attn->v_proj->weight.sizes(), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(attn->o_proj->weight.sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_FALSE(attn->q_proj->bias.defined());
}

// Document masking: a token's document is the number of separators before it (the separator
// ends its own document); attention is causal within a document.
TEST(DocumentMaskTest, SeparatorsCutTheWindowIntoDocuments) {
  const auto tokens = torch::tensor({3, 4, 9, 6, 9, 9, 2}, torch::kLong).unsqueeze(0);
  const auto mask = DocumentMask(tokens, 9);
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{1, 1, 7, 7}));
  const std::vector<int64_t> document = {0, 0, 0, 1, 1, 2, 3};
  for (int64_t i = 0; i < 7; ++i) {
    for (int64_t j = 0; j < 7; ++j) {
      EXPECT_EQ(mask[0][0][i][j].item<bool>(), j <= i && document[i] == document[j]) << i << "," << j;
    }
  }
}

TEST(DocumentMaskTest, MaskedAttentionMatchesTheReferencePerDocument) {
  torch::manual_seed(3);
  const auto q = torch::randn({1, 2, 6, 4}, torch::kDouble);
  const auto k = torch::randn({1, 2, 6, 4}, torch::kDouble);
  const auto v = torch::randn({1, 2, 6, 4}, torch::kDouble);
  const auto mask = DocumentMask(torch::tensor({1, 2, 0, 4, 5, 6}, torch::kLong).unsqueeze(0), 0);
  const auto got = compat::MaskedAttention(q, k, v, mask);
  // Documents [0, 3) and [3, 6), each plain causal attention on its own.
  using torch::indexing::Slice;
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 3}, {3, 6}}) {
    const auto want = ReferenceCausalAttention(q.index({Slice(), Slice(), Slice(begin, end)}),
                                               k.index({Slice(), Slice(), Slice(begin, end)}),
                                               v.index({Slice(), Slice(), Slice(begin, end)}));
    EXPECT_TRUE(torch::allclose(got.index({Slice(), Slice(), Slice(begin, end)}), want, 1e-12, 1e-12)) << begin;
  }
}

// The model with a separator: the second document of a packed window gets the logits it gets
// alone (RoPE depends on distances only), and the first is untouched; without the mask the
// second document's logits change (the check can fail).
TEST(DocumentMaskTest, APackedDocumentComputesWhatItWouldAlone) {
  torch::manual_seed(11);
  LlamaConfig c = SmallAttentionConfig();
  LlamaForCausalLM model(c);
  model->InitWeights(0.2);
  model->to(torch::kDouble);
  const int sep = 7;
  const auto first = torch::tensor({1, 5, 9, 12, sep}, torch::kLong).unsqueeze(0);
  const auto second = torch::tensor({1, 30, 2, 44, 8, 3}, torch::kLong).unsqueeze(0);
  const auto packed = torch::cat({first, second}, 1);
  using torch::indexing::Slice;
  const auto plain = model->forward(packed);
  model->set_document_separator(sep);
  const auto masked = model->forward(packed);
  const auto alone = model->forward(second);
  // Within 1e-6, not exactly: the rotary tables are fp32, and angles at positions 5-10 round
  // otherwise than at 0-5 (measured 9e-8; the unmasked logits differ by more than 1e-3).
  EXPECT_TRUE(torch::allclose(masked.index({Slice(), Slice(5, 11)}), alone, 1e-6, 1e-6))
      << (masked.index({Slice(), Slice(5, 11)}) - alone).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(masked.index({Slice(), Slice(0, 5)}), plain.index({Slice(), Slice(0, 5)}), 1e-12, 1e-12));
  EXPECT_FALSE(torch::allclose(plain.index({Slice(), Slice(5, 11)}), alone, 1e-3, 1e-3));

  // Gradients flow through the masked attention (libtorch 1.13 spells it out; 2.x's SDPA).
  const auto loss = model->Loss(packed.index({Slice(), Slice(0, 10)}), packed.index({Slice(), Slice(1, 11)}));
  loss.backward();
  EXPECT_TRUE(model->model->layers[0]->as<DecoderLayer>()->self_attn->q_proj->weight.grad().abs().sum().item<double>() > 0);
}

}  // namespace
}  // namespace meshwork::model
