// MixedLinear (trainer/model/mixed_linear.h) against the composition it replaces,
// F::linear(x, cat(w.to(dtype)...)): on the CPU the matmul's dtype is x's, so x in double (or
// bf16) over fp32 weights takes it. The GPU case, fp32 weights under bf16 autocast, is in
// tests/gpu/fused_ops_gpu_test.cpp.
#include "trainer/model/mixed_linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "trainer/model/weight_copies.h"

namespace meshwork::model {
namespace {

namespace F = torch::nn::functional;

struct Outcome {
  torch::Tensor y, dx;
  std::vector<torch::Tensor> dw;
};

// y, and the gradients of sum(y * probe) for x and each weight, by MixedLinear (over `copies`
// where given) or by the composition.
Outcome Forward(bool mixed, const torch::Tensor& x0, const std::vector<torch::Tensor>& w0, const torch::Tensor& probe,
                WeightCopies* copies = nullptr) {
  const auto x = x0.detach().requires_grad_(true);
  std::vector<torch::Tensor> w;
  std::vector<torch::Tensor> cast;
  for (const auto& t : w0) {
    w.push_back(t.detach().requires_grad_(true));
    cast.push_back(w.back().to(x.scalar_type()));
  }
  Outcome run;
  run.y = mixed ? MixedLinear(x, w, copies) : F::linear(x, torch::cat(cast, 0));
  (run.y * probe).sum().backward();
  run.dx = x.grad();
  for (const auto& t : w) run.dw.push_back(t.grad());
  return run;
}

TEST(MixedLinear, AppliesOnlyWhereTheMatmulDtypeIsNotTheWeights) {
  const auto w = torch::randn({4, 3});
  EXPECT_FALSE(MixedLinearApplies(torch::randn({2, 3}), w));
  EXPECT_TRUE(MixedLinearApplies(torch::randn({2, 3}, torch::kDouble), w));
  EXPECT_TRUE(MixedLinearApplies(torch::randn({2, 3}).to(torch::kBFloat16), w));
}

TEST(MixedLinear, StackedWeightsEqualTheCompositionInDouble) {
  torch::manual_seed(1);
  const auto x = torch::randn({2, 5, 16}, torch::kDouble);
  const std::vector<torch::Tensor> w = {torch::randn({8, 16}), torch::randn({4, 16}), torch::randn({4, 16})};
  const auto probe = torch::randn({2, 5, 16}, torch::kDouble);
  const Outcome mixed = Forward(true, x, w, probe);
  const Outcome plain = Forward(false, x, w, probe);
  ASSERT_EQ(mixed.y.scalar_type(), torch::kDouble);
  ASSERT_EQ(mixed.y.sizes(), plain.y.sizes());
  EXPECT_TRUE(torch::allclose(mixed.y, plain.y, 1e-12, 1e-12));
  ASSERT_EQ(mixed.dx.scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::allclose(mixed.dx, plain.dx, 1e-12, 1e-12));
  for (size_t i = 0; i < w.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(mixed.dw[i].scalar_type(), torch::kFloat);  // the weights' own dtype
    ASSERT_EQ(mixed.dw[i].sizes(), w[i].sizes());
    EXPECT_TRUE(torch::allclose(mixed.dw[i], plain.dw[i], 1e-6, 1e-6));
  }
}

// bf16 matmuls over fp32 weights (autocast's arrangement, on the CPU): the same output and
// input gradient as the composition to bf16 rounding, and weight gradients in fp32.
TEST(MixedLinear, Bf16OverFp32WeightsFollowsTheComposition) {
  torch::manual_seed(2);
  const auto x = torch::randn({3, 7, 32}).to(torch::kBFloat16);
  const std::vector<torch::Tensor> w = {torch::randn({24, 32}) * 0.1, torch::randn({8, 32}) * 0.1};
  const auto probe = torch::randn({3, 7, 32}).to(torch::kBFloat16);
  const Outcome mixed = Forward(true, x, w, probe);
  const Outcome plain = Forward(false, x, w, probe);
  ASSERT_EQ(mixed.y.scalar_type(), torch::kBFloat16);
  ASSERT_EQ(mixed.dx.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(mixed.y.to(torch::kFloat), plain.y.to(torch::kFloat), 2e-2, 2e-2));
  EXPECT_TRUE(torch::allclose(mixed.dx.to(torch::kFloat), plain.dx.to(torch::kFloat), 2e-2, 2e-2));
  for (size_t i = 0; i < w.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(mixed.dw[i].scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::allclose(mixed.dw[i], plain.dw[i], 2e-2, 5e-2))
        << (mixed.dw[i] - plain.dw[i]).abs().max().item<float>();
  }
}

// y, x's gradient and each weight's for sum(y * probe) by MixedLinear over `copies`, with
// `weights` the leaves themselves (their gradients reset first).
Outcome OverCopies(const torch::Tensor& x0, const std::vector<torch::Tensor>& weights, const torch::Tensor& probe,
                   WeightCopies& copies) {
  for (auto w : weights) w.mutable_grad() = torch::Tensor();
  const auto x = x0.detach().requires_grad_(true);
  Outcome run;
  run.y = MixedLinear(x, weights, &copies);
  (run.y * probe).sum().backward();
  run.dx = x.grad();
  for (const auto& w : weights) run.dw.push_back(w.grad());
  return run;
}

void ExpectSame(const Outcome& got, const Outcome& want) {
  EXPECT_TRUE(torch::equal(got.y, want.y));
  EXPECT_TRUE(torch::equal(got.dx, want.dx));
  ASSERT_EQ(got.dw.size(), want.dw.size());
  for (size_t i = 0; i < got.dw.size(); ++i) EXPECT_TRUE(torch::equal(got.dw[i], want.dw[i])) << i;
}

// Over persistent bf16 copies of the weights (weight_copies.h): the same bf16 values as the
// casts, so the same output and gradients, bit for bit, on the first forward (which writes the
// copies) and the next (which reads them as they are, not writing them again).
TEST(MixedLinear, WeightCopiesGiveTheSameResultsAsCasting) {
  torch::manual_seed(3);
  const auto x = torch::randn({3, 7, 32}).to(torch::kBFloat16);
  const std::vector<torch::Tensor> w = {torch::randn({24, 32}) * 0.1, torch::randn({8, 32}) * 0.1};
  const auto probe = torch::randn({3, 7, 32}).to(torch::kBFloat16);
  const Outcome cast = Forward(true, x, w, probe);
  std::vector<torch::Tensor> leaves;
  for (const auto& t : w) leaves.push_back(t.clone().requires_grad_(true));
  WeightCopies copies(torch::kBFloat16);
  {
    SCOPED_TRACE("first forward");
    ExpectSame(OverCopies(x, leaves, probe, copies), cast);
  }
  const torch::Tensor stack = copies.Stacked(leaves);
  const auto version = stack._version();
  {
    SCOPED_TRACE("second forward");
    ExpectSame(OverCopies(x, leaves, probe, copies), cast);
  }
  EXPECT_EQ(copies.Stacked(leaves).data_ptr(), stack.data_ptr());
  EXPECT_EQ(stack._version(), version) << "the copies were written again";
}

// The GEMM reads the copies: copies holding another weight's values (twice these), marked
// current, give that weight's output and x's gradient; the gradients still go to these weights.
TEST(MixedLinear, TheGemmReadsTheWeightCopies) {
  torch::manual_seed(4);
  const auto x = torch::randn({2, 5, 16}).to(torch::kBFloat16);
  const std::vector<torch::Tensor> w = {torch::randn({8, 16}) * 0.1, torch::randn({4, 16}) * 0.1};
  const auto probe = torch::randn({2, 5, 12}).to(torch::kBFloat16);
  const Outcome doubled = Forward(true, x, {w[0] * 2, w[1] * 2}, probe);
  std::vector<torch::Tensor> leaves;
  for (const auto& t : w) leaves.push_back(t.clone().requires_grad_(true));
  WeightCopies copies(torch::kBFloat16);
  ASSERT_TRUE(copies.Stacked(leaves).defined());
  for (const auto& leaf : leaves) {
    {
      torch::NoGradGuard no_grad;
      copies.CopyOf(leaf).copy_(leaf * 2);
    }
    copies.MarkWritten(leaf);
  }
  const Outcome got = OverCopies(x, leaves, probe, copies);
  ExpectSame(got, doubled);
  for (size_t i = 0; i < leaves.size(); ++i) EXPECT_EQ(got.dw[i].scalar_type(), torch::kFloat) << i;
}

// Only the gradients asked for; a weight that does not require one gets none.
TEST(MixedLinear, GradientsOnlyWhereAskedFor) {
  const auto x = torch::randn({4, 8}, torch::kDouble).requires_grad_(true);
  const auto a = torch::randn({3, 8}).requires_grad_(true);
  const auto b = torch::randn({5, 8});
  MixedLinear(x, {a, b}).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  // d(sum(x a^T))/da = column sums of x, on every row.
  const auto expected = x.detach().sum(0).to(torch::kFloat).expand({3, 8});
  EXPECT_TRUE(torch::allclose(a.grad(), expected, 1e-5, 1e-5));
}

// The output is not a view of the function's own product: callers may modify it in place.
TEST(MixedLinear, OutputMayBeModifiedInPlace) {
  const auto x = torch::randn({2, 3, 8}, torch::kDouble).requires_grad_(true);
  const auto w = torch::randn({4, 8}).requires_grad_(true);
  auto y = MixedLinear(x, {w});
  EXPECT_NO_THROW(y.mul_(2));
  y.sum().backward();
  const auto expected = 2 * x.detach().reshape({-1, 8}).sum(0).to(torch::kFloat).expand({4, 8});
  EXPECT_TRUE(torch::allclose(w.grad(), expected, 1e-5, 1e-5));
}

TEST(MixedLinear, RefusesWeightsThatDoNotFit) {
  const auto x = torch::randn({2, 8}, torch::kDouble);
  EXPECT_THROW(MixedLinear(x, {}), c10::Error);
  EXPECT_THROW(MixedLinear(x, {torch::randn({3, 7})}), c10::Error);
  EXPECT_THROW(MixedLinear(x, {torch::randn({3, 8}), torch::randn({3, 8}, torch::kDouble)}), c10::Error);
}

}  // namespace
}  // namespace meshwork::model
