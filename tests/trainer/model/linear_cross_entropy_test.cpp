// LinearCrossEntropy, the output head fused with the loss: its loss and both gradients equal
// matmul + CausalLmLoss under plain autograd, in one chunk and in chunks that do not divide the
// rows, with the logits' gradient stored by forward (chunk by chunk, or by the fused softmax) and
// recomputed by backward; the model's Loss
// equals forward + CausalLmLoss (tied and untied, both ways). That the logits never exist whole
// is measured in train_test (the step's tensor peak). The bf16 paths under CUDA autocast are
// held to fp32 in fused_ops_gpu_test.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "trainer/model/linear_cross_entropy.h"
#include "trainer/model/llama.h"

namespace meshwork::model {
namespace {

struct Result {
  torch::Tensor loss, grad_hidden, grad_weight;
};

// matmul + cross-entropy (CausalLmLoss for fp32; in double, without its cast to fp32).
Result Plain(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets) {
  auto h = hidden.clone().requires_grad_(true);
  auto w = weight.clone().requires_grad_(true);
  auto logits = torch::matmul(h, w.t());
  auto loss = hidden.scalar_type() == torch::kDouble
                  ? torch::nn::functional::cross_entropy(logits.reshape({-1, w.size(0)}), targets.reshape({-1}))
                  : CausalLmLoss(logits, targets);
  loss.backward();
  return {loss.detach(), h.grad(), w.grad()};
}

Result Fused(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets, int64_t chunk,
             HeadGradient gradient, bool fused_softmax = false) {
  auto h = hidden.clone().requires_grad_(true);
  auto w = weight.clone().requires_grad_(true);
  auto loss = LinearCrossEntropy(h, w, targets, chunk, gradient, fused_softmax);
  loss.backward();
  return {loss.detach(), h.grad(), w.grad()};
}

const char* Name(HeadGradient g) { return g == HeadGradient::kStored ? "stored" : "recompute"; }

// The ways the head gets its logits' gradient: recomputed; stored, chunk by chunk; stored, by the
// fused softmax (SoftmaxGradientInPlace).
struct Way {
  HeadGradient gradient;
  bool fused_softmax;
};
constexpr Way kWays[] = {{HeadGradient::kRecompute, false}, {HeadGradient::kStored, false}, {HeadGradient::kStored, true}};
std::string Name(const Way& w) { return std::string(Name(w.gradient)) + (w.fused_softmax ? "_fused" : ""); }
void PrintTo(const Way& w, std::ostream* os) { *os << Name(w); }

class LinearCrossEntropyTest : public ::testing::TestWithParam<std::tuple<int64_t, Way>> {};

TEST_P(LinearCrossEntropyTest, LossAndGradientsEqualTheComposition) {
  const auto [chunk, way] = GetParam();
  torch::manual_seed(7);
  // [batch 2, seq 5] tokens, hidden 16, vocab 37: 10 rows, chunks of 1, 3 (uneven), 10 and 64.
  const auto hidden = torch::randn({2, 5, 16}, torch::kDouble);
  const auto weight = torch::randn({37, 16}, torch::kDouble);
  const auto targets = torch::randint(0, 37, {2, 5}, torch::kLong);
  const Result want = Plain(hidden, weight, targets);
  const Result got = Fused(hidden, weight, targets, chunk, way.gradient, way.fused_softmax);
  EXPECT_EQ(got.loss.dim(), 0);
  EXPECT_NEAR(got.loss.item<double>(), want.loss.item<double>(), 1e-12);
  EXPECT_TRUE(torch::allclose(got.grad_hidden, want.grad_hidden, 1e-10, 1e-12));
  EXPECT_TRUE(torch::allclose(got.grad_weight, want.grad_weight, 1e-10, 1e-12));
  EXPECT_EQ(got.grad_hidden.sizes(), hidden.sizes());
  EXPECT_EQ(got.grad_hidden.scalar_type(), torch::kDouble);
  EXPECT_EQ(got.grad_weight.scalar_type(), torch::kDouble);
}

INSTANTIATE_TEST_SUITE_P(ChunkRows, LinearCrossEntropyTest,
                         ::testing::Combine(::testing::Values(1, 3, 10, 64), ::testing::ValuesIn(kWays)),
                         [](const auto& info) {
                           return Name(std::get<1>(info.param)) + "_chunk" + std::to_string(std::get<0>(info.param));
                         });

TEST(LinearCrossEntropyTest, Fp32MatchesWithinRounding) {
  for (const Way& way : kWays) {
    torch::manual_seed(8);
    const auto hidden = torch::randn({3, 4, 32});
    const auto weight = torch::randn({50, 32}) * 0.2;
    const auto targets = torch::randint(0, 50, {3, 4}, torch::kLong);
    const Result want = Plain(hidden, weight, targets);
    const Result got = Fused(hidden, weight, targets, 5, way.gradient, way.fused_softmax);
    EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
    EXPECT_NEAR(got.loss.item<float>(), want.loss.item<float>(), 1e-5) << Name(way);
    EXPECT_TRUE(torch::allclose(got.grad_hidden, want.grad_hidden, 1e-4, 1e-6)) << Name(way);
    EXPECT_TRUE(torch::allclose(got.grad_weight, want.grad_weight, 1e-4, 1e-6)) << Name(way);
  }
}

TEST(LinearCrossEntropyTest, ScalesWithTheIncomingGradient) {
  // Gradient accumulation divides the loss: both gradients must scale with it.
  for (const Way& way : kWays) {
    torch::manual_seed(9);
    const auto hidden = torch::randn({6, 8}, torch::kDouble).requires_grad_(true);
    const auto weight = torch::randn({11, 8}, torch::kDouble).requires_grad_(true);
    const auto targets = torch::randint(0, 11, {6}, torch::kLong);
    (LinearCrossEntropy(hidden, weight, targets, 4, way.gradient, way.fused_softmax) / 4.0).backward();
    const auto quarter_hidden = hidden.grad().clone(), quarter_weight = weight.grad().clone();
    hidden.mutable_grad() = torch::Tensor();
    weight.mutable_grad() = torch::Tensor();
    LinearCrossEntropy(hidden, weight, targets, 4, way.gradient, way.fused_softmax).backward();
    EXPECT_TRUE(torch::allclose(quarter_hidden * 4.0, hidden.grad(), 1e-12, 1e-14)) << Name(way);
    EXPECT_TRUE(torch::allclose(quarter_weight * 4.0, weight.grad(), 1e-12, 1e-14)) << Name(way);
  }
}

TEST(LinearCrossEntropyTest, StoredGradientIsOnlyKeptWhenOneWillBeAskedFor) {
  // Evaluation (no input requires a gradient) gets the same loss both ways and no graph; when
  // only the weight asks for a gradient, it is the composition's.
  torch::manual_seed(10);
  const auto hidden = torch::randn({6, 8});
  const auto weight = torch::randn({11, 8});
  const auto targets = torch::randint(0, 11, {6}, torch::kLong);
  const auto recomputed = LinearCrossEntropy(hidden, weight, targets, 4, HeadGradient::kRecompute);
  const auto stored = LinearCrossEntropy(hidden, weight, targets, 4, HeadGradient::kStored);
  EXPECT_FALSE(stored.requires_grad());
  EXPECT_FLOAT_EQ(stored.item<float>(), recomputed.item<float>());
  // The fused softmax too: nothing stored, the chunked path's loss.
  const auto fused = LinearCrossEntropy(hidden, weight, targets, 4, HeadGradient::kStored, true);
  EXPECT_FALSE(fused.requires_grad());
  EXPECT_FLOAT_EQ(fused.item<float>(), recomputed.item<float>());
  // Only the weight asks: the hidden states' gradient is not computed.
  const auto w = weight.clone().requires_grad_(true);
  LinearCrossEntropy(hidden, w, targets, 4, HeadGradient::kStored).backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_TRUE(torch::allclose(w.grad(), Plain(hidden, weight, targets).grad_weight, 1e-4, 1e-6));
}

TEST(LinearCrossEntropyTest, UniformLogitsGiveLogVocab) {
  const auto hidden = torch::zeros({4, 8});
  const auto weight = torch::randn({64, 8});
  const auto targets = torch::randint(0, 64, {4}, torch::kLong);
  EXPECT_NEAR(LinearCrossEntropy(hidden, weight, targets, 3).item<float>(), std::log(64.0), 1e-5);
}

TEST(LinearCrossEntropyTest, MismatchedShapesAreRefused) {
  const auto hidden = torch::zeros({4, 8});
  EXPECT_THROW(LinearCrossEntropy(hidden, torch::zeros({10, 7}), torch::zeros({4}, torch::kLong)), c10::Error);
  EXPECT_THROW(LinearCrossEntropy(hidden, torch::zeros({10, 8}), torch::zeros({5}, torch::kLong)), c10::Error);
  // A weight copy not in the matmul's dtype (hidden's, on the CPU), or not the weight's shape.
  const auto targets = torch::zeros({4}, torch::kLong);
  EXPECT_THROW(LinearCrossEntropy(hidden, torch::zeros({10, 8}), targets, 0, HeadGradient::kRecompute, false,
                                  torch::zeros({10, 8}, torch::kBFloat16)),
               c10::Error);
  EXPECT_THROW(LinearCrossEntropy(hidden.to(torch::kBFloat16), torch::zeros({10, 8}), targets, 0,
                                  HeadGradient::kRecompute, false, torch::zeros({9, 8}, torch::kBFloat16)),
               c10::Error);
}

// The weight's bf16 copy (weight_copies.h) is what the matmuls read: given the copy of another
// weight (twice this one), the loss and both gradients are bit for bit those of that weight cast,
// each way, and the weight's gradient is still fp32 and still this weight's.
TEST(LinearCrossEntropyTest, TheMatmulsReadTheWeightCopy) {
  torch::manual_seed(8);
  const auto hidden = torch::randn({2, 5, 16}).to(torch::kBFloat16);
  const auto weight = torch::randn({37, 16});
  const auto targets = torch::randint(0, 37, {2, 5}, torch::kLong);
  for (const Way& way : kWays) {
    SCOPED_TRACE(Name(way));
    const Result cast = Fused(hidden, weight * 2, targets, 3, way.gradient, way.fused_softmax);
    auto h = hidden.clone().requires_grad_(true);
    auto w = weight.clone().requires_grad_(true);
    auto loss =
        LinearCrossEntropy(h, w, targets, 3, way.gradient, way.fused_softmax, (weight * 2).to(torch::kBFloat16));
    loss.backward();
    EXPECT_TRUE(torch::equal(loss.detach(), cast.loss));
    EXPECT_TRUE(torch::equal(h.grad(), cast.grad_hidden));
    ASSERT_EQ(w.grad().scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(w.grad(), cast.grad_weight));
  }
}

TEST(LinearCrossEntropyTest, ChunkRowsKeepAQuarterGibibyteOfLogits) {
  EXPECT_EQ(LossChunkRows(128256), (int64_t{256} << 20) / (128256 * 4));  // Llama 3: 523 rows
  EXPECT_EQ(LossChunkRows(int64_t{1} << 40), 1);
}

LlamaConfig TinyConfig() {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  return c;
}

TEST(LlamaLossTest, EqualsForwardThenCausalLmLoss) {
  for (const auto& [tied, gradient] : {std::pair{false, HeadGradient::kRecompute}, std::pair{true, HeadGradient::kRecompute},
                                      std::pair{false, HeadGradient::kStored}, std::pair{true, HeadGradient::kStored}}) {
    torch::manual_seed(11);
    LlamaConfig c = TinyConfig();
    c.tie_word_embeddings = tied;
    LlamaForCausalLM model(c);
    model->InitWeights(0.1);
    model->set_loss_gradient(gradient);
    const auto tokens = torch::randint(0, c.vocab_size, {2, 9}, torch::kLong);
    const auto inputs = tokens.narrow(1, 0, 8), targets = tokens.narrow(1, 1, 8);

    auto plain = CausalLmLoss(model->forward(inputs), targets);
    plain.backward();
    std::vector<torch::Tensor> want;
    for (auto& p : model->parameters()) {
      want.push_back(p.grad().clone());
      p.mutable_grad() = torch::Tensor();
    }
    auto fused = model->Loss(inputs, targets);
    fused.backward();
    EXPECT_NEAR(fused.item<float>(), plain.item<float>(), 1e-6) << "tied " << tied << " " << Name(gradient);
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i].grad(), want[i], 1e-4, 1e-6)) << "parameter " << i << " tied " << tied << " " << Name(gradient);
    }
  }
}

}  // namespace
}  // namespace meshwork::model
