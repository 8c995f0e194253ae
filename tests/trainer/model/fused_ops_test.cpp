// The fused SwiGLU and rotary embedding (fused_ops.h) on the CPU, where they run the CUDA
// kernels' arithmetic (fused_elementwise.h) in a host loop, against the composition they
// replace: forward and backward, in double (to rounding), fp32 and bf16, on the strided views
// the model hands them. The kernels themselves: tests/gpu/fused_ops_gpu_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/trainer/model/fused_reference.h"
#include "trainer/model/compat.h"
#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_norm.h"
#include "trainer/model/fused_softmax.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/llama.h"

namespace meshwork::model {
namespace {

double Tolerance(torch::ScalarType dtype) { return dtype == torch::kDouble ? 1e-12 : 1e-6; }

using testing::ForwardBackward;
using testing::Misaligned;
using testing::SwiGluComposition;

TEST(FusedSwiGluTest, EqualsTheCompositionForwardAndBackward) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    torch::manual_seed(1);
    const auto gate_up = torch::randn({3, 5, 14}, dtype) * 3;
    const auto upstream = torch::randn({3, 5, 7}, dtype);
    const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, upstream);
    const auto [y_ref, grad_ref] = ForwardBackward(SwiGluComposition, gate_up, upstream);
    EXPECT_EQ(y.sizes(), y_ref.sizes());
    EXPECT_TRUE(torch::allclose(y, y_ref, Tolerance(dtype), Tolerance(dtype))) << (y - y_ref).abs().max();
    EXPECT_TRUE(torch::allclose(grad, grad_ref, Tolerance(dtype), Tolerance(dtype))) << (grad - grad_ref).abs().max();
  }
}

// A non-contiguous input (a column slice of a wider GEMM output) and a non-contiguous upstream
// gradient are read by their strides.
TEST(FusedSwiGluTest, ReadsStridedInputsAndGradients) {
  torch::manual_seed(2);
  const auto wide = torch::randn({4, 20}, torch::kDouble);
  const auto gate_up = wide.narrow(1, 2, 12);
  const auto upstream = torch::randn({6, 4}, torch::kDouble).t();
  ASSERT_FALSE(gate_up.is_contiguous());
  ASSERT_FALSE(upstream.is_contiguous());
  const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, upstream);
  const auto [y_ref, grad_ref] = ForwardBackward(SwiGluComposition, gate_up, upstream);
  EXPECT_TRUE(torch::allclose(y, y_ref, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(grad, grad_ref, 1e-12, 1e-12));
}

// bf16 rounds once, at the end: within one bf16 rounding of the fp32 result on the same bf16
// inputs, and no further from it than the composition in bf16 (which rounds silu(gate) too).
TEST(FusedSwiGluTest, Bf16RoundsOnceFromTheFp32Result) {
  torch::manual_seed(3);
  const auto gate_up = (torch::randn({64, 256}) * 3).to(torch::kBFloat16);
  const auto upstream = torch::randn({64, 128}).to(torch::kBFloat16);
  const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, upstream);
  const auto [y32, grad32] = ForwardBackward(SwiGluComposition, gate_up.to(torch::kFloat), upstream.to(torch::kFloat));
  const auto [y16, grad16] = ForwardBackward(SwiGluComposition, gate_up, upstream);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(grad.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), y32, 1.0 / 256, 1e-6));
  EXPECT_TRUE(torch::allclose(grad.to(torch::kFloat), grad32, 1.0 / 256, 1e-6));
  auto distance = [](const torch::Tensor& a, const torch::Tensor& exact) {
    return ((a.to(torch::kFloat) - exact).norm() / exact.norm()).item<double>();
  };
  EXPECT_LE(distance(y, y32), distance(y16, y32));
  EXPECT_LE(distance(grad, grad32), distance(grad16, grad32) * 1.01);
}

TEST(FusedSwiGluTest, RefusesOddWidthsAndIntegerTensorsByName) {
  try {
    FusedSwiGlu(torch::zeros({2, 5}));
    FAIL() << "an odd width was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("even dimension"), std::string::npos) << e.what();
  }
  try {
    FusedSwiGlu(torch::zeros({2, 4}, torch::kInt));
    FAIL() << "an int tensor was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype Int"), std::string::npos) << e.what();
  }
}

LlamaConfig RopeConfig() {
  LlamaConfig c;
  c.hidden_size = 48;
  c.num_attention_heads = 4;  // head dim 12
  c.num_key_value_heads = 2;
  c.rope_theta = 10000.0;
  return c;
}

// q and k as the model makes them: column blocks of the merged q/k/v GEMM's output, viewed as
// heads and transposed to [batch, heads, seq, dim] (seq's stride is the GEMM row's width), taken
// inside the function so that the op itself reads the strided view and autograd carries its
// gradient back into the GEMM output's columns.
TEST(FusedRopeTest, EqualsApplyRopeOnTheModelsStridedViews) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    torch::manual_seed(4);
    const LlamaConfig c = RopeConfig();
    const RopeTables rope = MakeRopeTables(c, 16, torch::kCPU);  // longer than the sequence
    const int64_t b = 2, t = 9, heads = 4, kv = 2, d = 12;
    const auto qkv = torch::randn({b, t, (heads + 2 * kv) * d}, dtype);
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, heads}, {heads, kv}}) {
      auto view = [&, first = first, count = count](const torch::Tensor& all) {
        const auto x = all.narrow(-1, first * d, count * d).view({b, t, count, d}).transpose(1, 2);
        EXPECT_FALSE(x.is_contiguous());
        return x;
      };
      const auto upstream = torch::randn({b, count, t, d}, dtype);
      // x's gradient comes back in x's own layout ([batch, seq, heads, dim] in memory), so that
      // the transpose and view back into the GEMM output's columns copy nothing.
      bool gradient_heads_inner = false;
      auto fused = [&](const torch::Tensor& all) {
        auto x = view(all);
        x.register_hook([&](const torch::Tensor& g) { gradient_heads_inner = g.transpose(1, 2).is_contiguous(); });
        return FusedRope(x, rope.cos, rope.sin);
      };
      auto plain = [&](const torch::Tensor& all) { return ApplyRope(view(all), rope); };
      const auto [y, grad] = ForwardBackward(fused, qkv, upstream);
      const auto [y_ref, grad_ref] = ForwardBackward(plain, qkv, upstream);
      // The output is laid out as the composition's is ([batch, seq, heads, dim] in memory), so
      // that attention's output, which SDPA's kernels allocate like q, transposes back to
      // [batch, seq, hidden] without a copy.
      EXPECT_TRUE(y.transpose(1, 2).is_contiguous());
      EXPECT_EQ(y.strides(), y_ref.strides());
      EXPECT_TRUE(gradient_heads_inner);
      EXPECT_TRUE(torch::allclose(y, y_ref, Tolerance(dtype), Tolerance(dtype))) << (y - y_ref).abs().max();
      EXPECT_TRUE(torch::allclose(grad, grad_ref, Tolerance(dtype), Tolerance(dtype))) << (grad - grad_ref).abs().max();
    }
  }
}

// FusedQkvRope: the merged q/k/v GEMM's output split, q and k rotated and v copied, against the
// composition's split, views, transposes and ApplyRope; forward values and layouts, and qkv's
// gradient with every output used and with one unused (its columns' gradient zero).
TEST(FusedQkvRopeTest, EqualsSplitAndApplyRopeForwardAndBackward) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    torch::manual_seed(24);
    const LlamaConfig c = RopeConfig();
    const RopeTables rope = MakeRopeTables(c, 16, torch::kCPU);
    const int64_t b = 2, t = 9, heads = 4, kv = 2, d = 12;
    const auto qkv_in = torch::randn({b, t, (heads + 2 * kv) * d}, dtype);
    const auto up_q = torch::randn({b, heads, t, d}, dtype);
    const auto up_k = torch::randn({b, kv, t, d}, dtype);
    const auto up_v = torch::randn({b, kv, t, d}, dtype);
    auto composition = [&](const torch::Tensor& qkv) {
      const auto parts = qkv.split_with_sizes({heads * d, kv * d, kv * d}, -1);
      return std::vector<torch::Tensor>{ApplyRope(parts[0].view({b, t, heads, d}).transpose(1, 2), rope),
                                        ApplyRope(parts[1].view({b, t, kv, d}).transpose(1, 2), rope),
                                        parts[2].view({b, t, kv, d}).transpose(1, 2)};
    };
    auto fused = [&](const torch::Tensor& qkv) { return FusedQkvRope(qkv, heads, kv, rope.cos, rope.sin); };
    for (const bool use_k : {true, false}) {
      SCOPED_TRACE(use_k ? "q, k and v used" : "k unused");
      auto run = [&](const std::function<std::vector<torch::Tensor>(const torch::Tensor&)>& f) {
        auto qkv = qkv_in.clone().requires_grad_(true);
        const auto out = f(qkv);
        auto loss = (out[0] * up_q).sum() + (out[2] * up_v).sum();
        if (use_k) loss = loss + (out[1] * up_k).sum();
        loss.backward();
        return std::make_pair(out, qkv.grad());
      };
      const auto [got, grad] = run(fused);
      const auto [want, grad_ref] = run(composition);
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(torch::allclose(got[i], want[i], Tolerance(dtype), Tolerance(dtype))) << i;
        // Laid out as the GEMM output orders them, and not views of it (v is a copy).
        EXPECT_TRUE(got[i].transpose(1, 2).is_contiguous()) << i;
        EXPECT_FALSE(got[i].is_alias_of(qkv_in)) << i;
      }
      EXPECT_TRUE(torch::allclose(grad, grad_ref, Tolerance(dtype), Tolerance(dtype))) << (grad - grad_ref).abs().max();
      if (!use_k) {
        EXPECT_TRUE(torch::equal(grad.narrow(2, heads * d, kv * d), torch::zeros({b, t, kv * d}, dtype)));
      }
    }
  }
}

TEST(FusedQkvRopeTest, RefusesAWidthThatIsNotTheHeads) {
  const RopeTables rope = MakeRopeTables(RopeConfig(), 16, torch::kCPU);
  EXPECT_THROW(FusedQkvRope(torch::zeros({1, 4, 95}), 4, 2, rope.cos, rope.sin), c10::Error);
  EXPECT_THROW(FusedQkvRope(torch::zeros({1, 20, 96}), 4, 2, rope.cos, rope.sin), c10::Error);  // past the tables
}

// Backward is the rotation's transpose: for any upstream gradient g, <rope(x), g> = <x, rope^T(g)>,
// checked through autograd with a non-contiguous upstream gradient.
TEST(FusedRopeTest, BackwardIsTheTransposeForStridedGradients) {
  torch::manual_seed(5);
  const RopeTables rope = MakeRopeTables(RopeConfig(), 7, torch::kCPU);
  const auto x = torch::randn({2, 3, 7, 12}, torch::kDouble).requires_grad_(true);
  const auto g = torch::randn({2, 7, 3, 12}, torch::kDouble).transpose(1, 2);
  ASSERT_FALSE(g.is_contiguous());
  const auto y = FusedRope(x, rope.cos, rope.sin);
  y.backward(g);
  const double lhs = (y * g).sum().item<double>();
  const double rhs = (x.detach() * x.grad()).sum().item<double>();
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs) + 1e-12);
}

TEST(FusedRopeTest, Bf16IsWithinOneRoundingOfFp32) {
  torch::manual_seed(6);
  const RopeTables rope = MakeRopeTables(RopeConfig(), 32, torch::kCPU);
  const auto x = torch::randn({2, 4, 32, 12}).to(torch::kBFloat16);
  const auto upstream = torch::randn({2, 4, 32, 12}).to(torch::kBFloat16);
  auto fused = [&](const torch::Tensor& in) { return FusedRope(in, rope.cos, rope.sin); };
  auto plain = [&](const torch::Tensor& in) { return ApplyRope(in, rope); };
  const auto [y, grad] = ForwardBackward(fused, x, upstream);
  const auto [y32, grad32] = ForwardBackward(plain, x.to(torch::kFloat), upstream.to(torch::kFloat));
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), y32, 1.0 / 256, 1e-6));
  EXPECT_TRUE(torch::allclose(grad.to(torch::kFloat), grad32, 1.0 / 256, 1e-6));
}

TEST(FusedRopeTest, RefusesTablesThatDoNotCoverTheSequence) {
  const RopeTables rope = MakeRopeTables(RopeConfig(), 4, torch::kCPU);
  try {
    FusedRope(torch::zeros({1, 2, 5, 12}), rope.cos, rope.sin);
    FAIL() << "tables of 4 positions were accepted for 5";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not cover"), std::string::npos) << e.what();
  }
}

// softmax - onehot(target), log-sum-exp and target logit as the composition computes them.
struct SoftmaxReference {
  torch::Tensor gradient, lse, target_logit;
};
SoftmaxReference SoftmaxComposition(const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto x = logits.to(logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat);
  const auto lse = torch::logsumexp(x, -1);
  auto gradient = (x - lse.unsqueeze(1)).exp();
  gradient.scatter_add_(1, targets.unsqueeze(1), torch::full({x.size(0), 1}, -1.0, x.options()));
  return {gradient, lse, x.gather(1, targets.unsqueeze(1)).squeeze(1)};
}

// Vocabularies wider than the 512 lanes and not a multiple of them, and narrower than them (most
// lanes empty); targets at the first and last column too; logits up to +-60 (exp would overflow
// fp32 without the running maximum).
TEST(SoftmaxGradientTest, EqualsTheCompositionInPlace) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    for (const int64_t vocab : {int64_t{1}, int64_t{37}, int64_t{512}, int64_t{1100}, int64_t{5000}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " vocab " + std::to_string(vocab));
      torch::manual_seed(7);
      auto logits = torch::randn({9, vocab}, dtype) * 20;
      logits[3] += 40;  // one row far from 0
      auto targets = torch::randint(0, vocab, {9}, torch::kLong);
      targets[0] = 0;
      targets[1] = vocab - 1;
      const SoftmaxReference want = SoftmaxComposition(logits, targets);
      const SoftmaxGradientStats got = SoftmaxGradientInPlace(logits, targets);
      const double tol = dtype == torch::kDouble ? 1e-12 : 2e-6;
      EXPECT_TRUE(torch::allclose(logits, want.gradient, tol, tol)) << (logits - want.gradient).abs().max();
      EXPECT_TRUE(torch::allclose(got.lse, want.lse, tol, tol)) << (got.lse - want.lse).abs().max();
      EXPECT_TRUE(torch::equal(got.target_logit, want.target_logit));
      EXPECT_EQ(got.lse.scalar_type(), dtype);
    }
  }
}

// bf16 logits: the statistics in fp32 from the bf16 values, the gradient rounded to bf16 once.
TEST(SoftmaxGradientTest, Bf16LogitsGiveFp32StatisticsAndABf16Gradient) {
  torch::manual_seed(8);
  auto logits = (torch::randn({16, 3000}) * 4).to(torch::kBFloat16);
  const auto targets = torch::randint(0, 3000, {16}, torch::kLong);
  const SoftmaxReference want = SoftmaxComposition(logits, targets);
  const SoftmaxGradientStats got = SoftmaxGradientInPlace(logits, targets);
  EXPECT_EQ(got.lse.scalar_type(), torch::kFloat);
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(got.lse, want.lse, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(logits.to(torch::kFloat), want.gradient, 1.0 / 128, 1e-6));
}

// -inf logits (masked columns) count for nothing, as in torch::logsumexp and softmax: no NaN.
TEST(SoftmaxGradientTest, MinusInfinityLogitsCountForNothing) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const int64_t vocab : {int64_t{5}, int64_t{1300}}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    torch::manual_seed(12);
    auto logits = torch::randn({3, vocab}, torch::kDouble);
    logits.narrow(1, 0, 3).fill_(-inf);       // the first three columns of every row
    logits.narrow(1, vocab - 1, 1).fill_(-inf);  // and the last
    const auto targets = torch::tensor({3, 4, 3}, torch::kLong);
    const SoftmaxReference want = SoftmaxComposition(logits, targets);
    const SoftmaxGradientStats got = SoftmaxGradientInPlace(logits, targets);
    EXPECT_FALSE(logits.isnan().any().item<bool>());
    EXPECT_TRUE(torch::allclose(logits, want.gradient, 1e-12, 1e-12));
    EXPECT_TRUE(torch::allclose(got.lse, want.lse, 1e-12, 1e-12));
  }
}

TEST(SoftmaxGradientTest, RefusesTargetsOutsideTheVocabularyByValue) {
  auto logits = torch::zeros({2, 10});
  try {
    SoftmaxGradientInPlace(logits, torch::tensor({3, 10}, torch::kLong));
    FAIL() << "target 10 of a 10-token vocabulary was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("targets in [3, 10], outside [0, 10)"), std::string::npos) << e.what();
  }
}

// RMSNorm as the model composes it (compat::RmsNorm), then cast to `out`.
torch::Tensor RmsNormComposition(const torch::Tensor& x, const torch::Tensor& weight, torch::ScalarType out) {
  return compat::RmsNorm(x, weight, 1e-5).to(out);
}

// Rows wider than the 256 lanes and not a multiple of them, narrower ones (most lanes idle), the
// widest a lane's 32 columns allow (8192), and more rows than the backward's 1024 blocks (each
// block then takes several): output, x's and the weight's gradients against the composition.
TEST(FusedRmsNormTest, EqualsTheCompositionForwardAndBackward) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{3, 1}, {5, 37}, {4, 256}, {6, 300}, {2, 8192},
                                    {1500, 8}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " dim " + std::to_string(dim));
      torch::manual_seed(9);
      const auto x = torch::randn({rows, dim}, dtype) * 3;
      const auto weight = (torch::rand({dim}, dtype) + 0.5).requires_grad_(true);
      const auto upstream = torch::randn({rows, dim}, dtype);
      auto run = [&](bool fused) {
        auto xi = x.clone().requires_grad_(true);
        auto w = weight.detach().clone().requires_grad_(true);
        auto y = fused ? FusedRmsNorm(xi, w, 1e-5, dtype) : RmsNormComposition(xi, w, dtype);
        y.backward(upstream);
        return std::make_tuple(y.detach(), xi.grad(), w.grad());
      };
      const auto [y, dx, dw] = run(true);
      const auto [y_ref, dx_ref, dw_ref] = run(false);
      const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
      EXPECT_TRUE(torch::allclose(y, y_ref, tol, tol)) << (y - y_ref).abs().max();
      EXPECT_TRUE(torch::allclose(dx, dx_ref, tol, tol)) << (dx - dx_ref).abs().max();
      EXPECT_TRUE(torch::allclose(dw, dw_ref, tol, tol)) << (dw - dw_ref).abs().max();
    }
  }
}

// h = x + delta and the norm of h in one: both outputs and all three gradients (h's own gradient
// from the residual stream included) against the composition.
TEST(FusedRmsNormTest, AddRmsNormEqualsTheComposition) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    torch::manual_seed(10);
    const auto x = torch::randn({2, 7, 300}, dtype);
    const auto delta = torch::randn({2, 7, 300}, dtype);
    const auto weight = torch::rand({300}, dtype) + 0.5;
    const auto up_h = torch::randn({2, 7, 300}, dtype), up_y = torch::randn({2, 7, 300}, dtype);
    auto run = [&](bool fused) {
      auto xi = x.clone().requires_grad_(true), di = delta.clone().requires_grad_(true);
      auto w = weight.clone().requires_grad_(true);
      torch::Tensor h, y;
      if (fused) {
        std::tie(h, y) = FusedAddRmsNorm(xi, di, w, 1e-5, dtype);
      } else {
        h = xi + di;
        y = RmsNormComposition(h, w, dtype);
      }
      torch::autograd::backward({h, y}, {up_h, up_y});
      return std::make_tuple(h.detach(), y.detach(), xi.grad(), di.grad(), w.grad());
    };
    const auto got = run(true);
    const auto want = run(false);
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    EXPECT_TRUE(torch::allclose(std::get<0>(got), std::get<0>(want), tol, tol)) << "h";
    EXPECT_TRUE(torch::allclose(std::get<1>(got), std::get<1>(want), tol, tol)) << "y";
    EXPECT_TRUE(torch::allclose(std::get<2>(got), std::get<2>(want), tol, tol)) << "dx";
    EXPECT_TRUE(torch::allclose(std::get<3>(got), std::get<3>(want), tol, tol)) << "ddelta";
    EXPECT_TRUE(torch::allclose(std::get<4>(got), std::get<4>(want), tol, tol)) << "dweight";
  }
}

// The norm passing x on (the decoder layer's first norm): x comes back unchanged (a view of x,
// no copy), and x's gradient is the norm's plus what x's later uses sent back through it, as
// autograd adds them in the composition; also when nothing comes back through it. And the add +
// norm taking the passed-on x, as the layer chains them: the same gradients as the composition.
TEST(FusedRmsNormTest, PassingXOnSumsItsGradientInTheNormsBackward) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    torch::manual_seed(12);
    const auto x = torch::randn({3, 5, 300}, dtype);
    const auto delta = torch::randn({3, 5, 300}, dtype);
    const auto weight = torch::rand({300}, dtype) + 0.5, weight2 = torch::rand({300}, dtype) + 0.5;
    const auto up_y = torch::randn({3, 5, 300}, dtype), up_h = torch::randn({3, 5, 300}, dtype);
    const auto up_y2 = torch::randn({3, 5, 300}, dtype);
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    for (const bool chained : {false, true}) {
      SCOPED_TRACE(chained ? "through the add + norm" : "through a plain use");
      auto run = [&](bool fused, bool use_through) {
        auto xi = x.clone().requires_grad_(true), di = delta.clone().requires_grad_(true);
        auto w = weight.clone().requires_grad_(true), w2 = weight2.clone().requires_grad_(true);
        torch::Tensor through = xi, y;
        if (fused) {
          std::tie(through, y) = FusedRmsNormPassingX(xi, w, 1e-5, dtype);
          EXPECT_TRUE(torch::equal(through, xi));
          EXPECT_EQ(through.data_ptr(), xi.data_ptr());
        } else {
          y = RmsNormComposition(xi, w, dtype);
        }
        std::vector<torch::Tensor> outs{y}, ups{up_y};
        if (use_through && chained) {
          torch::Tensor h, y2;
          if (fused) {
            std::tie(h, y2) = FusedAddRmsNorm(through, di, w2, 1e-5, dtype);
          } else {
            h = through + di;
            y2 = RmsNormComposition(h, w2, dtype);
          }
          outs.insert(outs.end(), {h, y2});
          ups.insert(ups.end(), {up_h, up_y2});
        } else if (use_through) {
          outs.push_back(through * 2);
          ups.push_back(up_h);
        }
        torch::autograd::backward(outs, ups);
        return std::make_tuple(y.detach(), xi.grad(), w.grad());
      };
      for (const bool use_through : {true, false}) {
        const auto [y, dx, dw] = run(true, use_through);
        const auto [y_ref, dx_ref, dw_ref] = run(false, use_through);
        EXPECT_TRUE(torch::allclose(y, y_ref, tol, tol)) << (y - y_ref).abs().max();
        EXPECT_TRUE(torch::allclose(dx, dx_ref, tol, tol)) << use_through << " " << (dx - dx_ref).abs().max();
        EXPECT_TRUE(torch::allclose(dw, dw_ref, tol, tol)) << (dw - dw_ref).abs().max();
      }
    }
  }
}

// Under autocast's dtypes: fp32 residual, bf16 block output, bf16 norm output (the cast the next
// matmul would make, folded in): within one bf16 rounding of the fp32 composition, and the
// delta's gradient in bf16.
TEST(FusedRmsNormTest, Bf16DeltaAndOutputRoundOnce) {
  torch::manual_seed(11);
  const auto x = torch::randn({16, 512});
  const auto delta = torch::randn({16, 512}).to(torch::kBFloat16);
  const auto weight = torch::rand({512}) + 0.5;
  auto xi = x.clone().requires_grad_(true), di = delta.clone().requires_grad_(true);
  auto w = weight.clone().requires_grad_(true);
  const auto [h, y] = FusedAddRmsNorm(xi, di, w, 1e-5, torch::kBFloat16);
  EXPECT_EQ(h.scalar_type(), torch::kFloat);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  const auto h32 = x + delta.to(torch::kFloat);
  EXPECT_TRUE(torch::equal(h, h32));
  const auto y32 = RmsNormComposition(h32, weight, torch::kFloat);
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), y32, 1.0 / 256, 1e-6));
  y.sum().backward();
  EXPECT_EQ(di.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(di.grad().to(torch::kFloat), xi.grad(), 1.0 / 256, 1e-6));
}

// The bf16 residual stream (training.residual_dtype): x, the block output and the norm output
// all bf16. h is the fp32 sum of the two rounded once (bit-exact), y one bf16 rounding from the
// fp32 norm of that h, and every gradient (x's passed on through the first norm, too) within
// bf16's precision of the fp32 composition's on the same values.
TEST(FusedRmsNormTest, AllBf16RowsAddAndNormaliseInFp32AndRoundOnce) {
  torch::manual_seed(13);
  const auto x = torch::randn({16, 512}).to(torch::kBFloat16);
  const auto delta = torch::randn({16, 512}).to(torch::kBFloat16);
  const auto weight = torch::rand({512}) + 0.5;
  const auto up_y = torch::randn({16, 512}).to(torch::kBFloat16), up_h = torch::randn({16, 512}).to(torch::kBFloat16);
  const auto up_y1 = torch::randn({16, 512}).to(torch::kBFloat16);
  // Fused, all bf16: the layer's chain, x passed on through the first norm into the add + norm.
  auto xi = x.clone().requires_grad_(true), di = delta.clone().requires_grad_(true);
  auto w1 = weight.clone().requires_grad_(true), w2 = weight.clone().requires_grad_(true);
  const auto [through, y1] = FusedRmsNormPassingX(xi, w1, 1e-5, torch::kBFloat16);
  const auto [h, y] = FusedAddRmsNorm(through, di, w2, 1e-5, torch::kBFloat16);
  EXPECT_EQ(h.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(y1.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(h, (x.to(torch::kFloat) + delta.to(torch::kFloat)).to(torch::kBFloat16)));
  torch::autograd::backward({y1, h, y}, {up_y1, up_h, up_y});
  // The fp32 composition on the same (bf16-valued) inputs.
  auto x32 = x.to(torch::kFloat).requires_grad_(true), d32 = delta.to(torch::kFloat).requires_grad_(true);
  auto v1 = weight.clone().requires_grad_(true), v2 = weight.clone().requires_grad_(true);
  const auto y1_32 = compat::RmsNorm(x32, v1, 1e-5);
  const auto h32 = x32 + d32;
  const auto y32 = compat::RmsNorm(h32, v2, 1e-5);
  torch::autograd::backward({y1_32, h32, y32},
                            {up_y1.to(torch::kFloat), up_h.to(torch::kFloat), up_y.to(torch::kFloat)});
  const auto near = [](const torch::Tensor& got, const torch::Tensor& want) {
    return torch::allclose(got.to(torch::kFloat), want, 1.0 / 128, 1e-2);
  };
  EXPECT_TRUE(near(y1, y1_32)) << (y1.to(torch::kFloat) - y1_32).abs().max();
  EXPECT_TRUE(near(y, y32)) << (y.to(torch::kFloat) - y32).abs().max();
  EXPECT_EQ(xi.grad().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(di.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(near(xi.grad(), x32.grad())) << (xi.grad().to(torch::kFloat) - x32.grad()).abs().max();
  EXPECT_TRUE(near(di.grad(), d32.grad())) << (di.grad().to(torch::kFloat) - d32.grad()).abs().max();
  // The weights' gradients sum 16 rows of products in fp32, the second norm's from the bf16 h it
  // kept (each product one bf16 rounding off): by relative norm, within bf16's precision.
  for (const auto& [got, want] : {std::pair{w1.grad(), v1.grad()}, std::pair{w2.grad(), v2.grad()}}) {
    const double relative = ((got - want).norm() / want.norm()).item<double>();
    EXPECT_LT(relative, 1.0 / 256) << relative;
  }
}

// The tied table's lookup: torch::embedding's rows forward; backward a coalesced sparse
// gradient (each token's row once, its occurrences summed) equal to the dense one.
TEST(EmbeddingWithSparseGradientTest, RowsForwardAndACoalescedSparseGradient) {
  torch::manual_seed(14);
  const auto table = torch::randn({40, 24}, torch::kDouble);
  const auto tokens = torch::tensor({3, 7, 3, 3, 39, 0, 7, 12}, torch::kLong).view({2, 4});
  const auto upstream = torch::randn({2, 4, 24}, torch::kDouble);
  auto sparse_table = table.clone().requires_grad_(true), dense_table = table.clone().requires_grad_(true);
  const auto rows = EmbeddingWithSparseGradient(sparse_table, tokens);
  const auto want = torch::embedding(dense_table, tokens);
  EXPECT_TRUE(torch::equal(rows, want));
  // As the backward hands it on (a leaf's .grad would be a re-wrapped copy, flagged uncoalesced).
  const auto grad = torch::autograd::grad({rows}, {sparse_table}, {upstream})[0];
  want.backward(upstream);
  ASSERT_TRUE(grad.is_sparse());
  EXPECT_TRUE(grad.is_coalesced());
  EXPECT_EQ(grad._nnz(), 5);  // tokens 0, 3, 7, 12, 39: each row once
  EXPECT_TRUE(torch::allclose(grad.to_dense(), dense_table.grad(), 1e-12, 1e-12));
}

TEST(FusedRmsNormTest, SupportsSaysWhichDtypesAndWidthsQualify) {
  const auto x = torch::zeros({2, 64});
  EXPECT_TRUE(FusedRmsNormSupports(x, torch::Tensor(), torch::kFloat));
  EXPECT_TRUE(FusedRmsNormSupports(x, torch::Tensor(), torch::kBFloat16));
  EXPECT_TRUE(FusedRmsNormSupports(x, x.to(torch::kBFloat16), torch::kBFloat16));
  EXPECT_FALSE(FusedRmsNormSupports(x, x.to(torch::kBFloat16), torch::kHalf));
  EXPECT_FALSE(FusedRmsNormSupports(x.to(torch::kBFloat16), x, torch::kBFloat16));
  EXPECT_TRUE(FusedRmsNormSupports(x.to(torch::kBFloat16), x.to(torch::kBFloat16), torch::kBFloat16));
  EXPECT_FALSE(FusedRmsNormSupports(x, torch::zeros({2, 63}), torch::kFloat));
  EXPECT_FALSE(FusedRmsNormSupports(torch::zeros({2, 8193}), torch::Tensor(), torch::kFloat));
  EXPECT_FALSE(FusedRmsNormSupports(x.to(torch::kInt), torch::Tensor(), torch::kInt));
}

// 16-byte packs where shapes and addresses allow (fused_elementwise.h) and one element at a time
// where they do not give the same bits: each element's arithmetic is the same either way. The
// host loops choose the width by the same functions as the kernels.
TEST(FusedPackTest, PackedAndElementwiseSwiGluAndRopeAgreeBitForBit) {
  for (const auto dtype : {torch::kBFloat16, torch::kFloat, torch::kDouble}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    const size_t b = c10::elementSize(dtype);
    const int pack = static_cast<int>(16 / b);
    torch::manual_seed(21);
    const int64_t f = 64;
    const auto gate_up = (torch::randn({6, 2 * f}) * 3).to(dtype);
    const auto upstream = torch::randn({6, f}).to(dtype);
    ASSERT_EQ(fused::PackFor({f}, {{gate_up.data_ptr(), b}}), pack);
    ASSERT_EQ(fused::PackFor({f}, {{Misaligned(gate_up).data_ptr(), b}}), 1);
    ASSERT_EQ(fused::PackFor({f + 1}, {{gate_up.data_ptr(), b}}), 1);
    const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, upstream);
    auto elementwise = [](const torch::Tensor& x) { return FusedSwiGlu(Misaligned(x)); };
    const auto [y1, grad1] = ForwardBackward(elementwise, gate_up, Misaligned(upstream));
    EXPECT_TRUE(torch::equal(y, y1)) << (y - y1).abs().max();
    EXPECT_TRUE(torch::equal(grad, grad1)) << (grad - grad1).abs().max();

    LlamaConfig c;
    c.hidden_size = 64;
    c.num_attention_heads = 4;  // head dim 16: half of it is a whole number of packs of every type
    c.num_key_value_heads = 4;
    const RopeTables rope = MakeRopeTables(c, 8, torch::kCPU);
    const auto x = torch::randn({2, 3, 8, 16}).to(dtype);
    const auto up = torch::randn({2, 3, 8, 16}).to(dtype);
    fused::RopeShape shape;
    shape.heads = 3, shape.seq = 8, shape.dim = 16;
    shape.in = shape.out = {x.stride(0), x.stride(1), x.stride(2)};
    const auto table = dtype == torch::kDouble ? rope.cos.to(torch::kDouble) : rope.cos;
    ASSERT_EQ(fused::RopePack(shape, x.element_size(), x.data_ptr(), x.data_ptr(), table.element_size(),
                              table.data_ptr(), table.data_ptr()),
              pack);
    ASSERT_EQ(fused::RopePack(shape, x.element_size(), Misaligned(x).data_ptr(), x.data_ptr(), table.element_size(),
                              table.data_ptr(), table.data_ptr()),
              1);
    auto packed = [&](const torch::Tensor& in) { return FusedRope(in, rope.cos, rope.sin); };
    auto one_by_one = [&](const torch::Tensor& in) { return FusedRope(Misaligned(in), rope.cos, rope.sin); };
    const auto [r, rgrad] = ForwardBackward(packed, x, up);
    const auto [r1, rgrad1] = ForwardBackward(one_by_one, x, Misaligned(up));
    EXPECT_TRUE(torch::equal(r, r1)) << (r - r1).abs().max();
    EXPECT_TRUE(torch::equal(rgrad, rgrad1)) << (rgrad - rgrad1).abs().max();
  }
}

// The softmax gradient's lanes fold packs of columns where the vocabulary is whole packs and the
// logits aligned, single columns otherwise: other partitions of the sums, the same results to
// rounding.
TEST(FusedPackTest, PackedAndElementwiseSoftmaxGradientAgree) {
  for (const auto dtype : {torch::kBFloat16, torch::kFloat, torch::kDouble}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    const size_t b = c10::elementSize(dtype);
    const int pack = static_cast<int>(16 / b);
    torch::manual_seed(22);
    auto logits = (torch::randn({5, 4096}) * 8).to(dtype);
    auto misaligned = Misaligned(logits);
    const auto targets = torch::randint(0, 4096, {5}, torch::kLong);
    ASSERT_EQ(fused::PackFor({4096}, {{logits.data_ptr(), b}}), pack);
    ASSERT_EQ(fused::PackFor({4096}, {{misaligned.data_ptr(), b}}), 1);
    ASSERT_EQ(fused::PackFor({4097}, {{logits.data_ptr(), b}}), 1);
    const SoftmaxGradientStats got = SoftmaxGradientInPlace(logits, targets);
    const SoftmaxGradientStats want = SoftmaxGradientInPlace(misaligned, targets);
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-6;
    EXPECT_TRUE(torch::allclose(got.lse, want.lse, tol, tol)) << (got.lse - want.lse).abs().max();
    EXPECT_TRUE(torch::equal(got.target_logit, want.target_logit));
    const double grad_tol = dtype == torch::kBFloat16 ? 1.0 / 128 : tol;
    EXPECT_TRUE(torch::allclose(logits.to(torch::kFloat), misaligned.to(torch::kFloat), grad_tol, 1e-7))
        << (logits - misaligned).abs().max();
  }
}

// The norms' lanes take packs of the narrowest dtype's 16 bytes where dim is whole packs and
// every array aligned, single columns otherwise: h = x + delta the same bits, the rest the same
// to rounding (other partitions of the row's sums).
TEST(FusedPackTest, PackedAndElementwiseAddRmsNormAgree) {
  torch::manual_seed(23);
  const int64_t dim = 2048;
  const auto x = torch::randn({16, dim});
  const auto delta = torch::randn({16, dim}).to(torch::kBFloat16);
  const auto weight = torch::rand({dim}) + 0.5;
  const auto up_h = torch::randn({16, dim}), up_y = torch::randn({16, dim}).to(torch::kBFloat16);
  const auto misaligned = Misaligned(x);
  ASSERT_EQ(fused::PackFor({dim}, {{x.data_ptr(), 4}, {delta.data_ptr(), 2}, {weight.data_ptr(), 4}}), 8);
  ASSERT_EQ(fused::PackFor({dim}, {{x.data_ptr(), 4}, {weight.data_ptr(), 4}}), 4);
  ASSERT_EQ(fused::PackFor({dim}, {{misaligned.data_ptr(), 4}, {delta.data_ptr(), 2}}), 1);
  ASSERT_EQ(fused::PackFor({dim + 4}, {{x.data_ptr(), 4}, {delta.data_ptr(), 2}}), 1);
  auto run = [&](bool aligned) {
    auto xi = (aligned ? x.clone() : Misaligned(x)).detach().requires_grad_(true);
    auto di = delta.clone().requires_grad_(true);
    auto w = weight.clone().requires_grad_(true);
    const auto [h, y] = FusedAddRmsNorm(xi, di, w, 1e-5, torch::kBFloat16);
    torch::autograd::backward({h, y}, {up_h, aligned ? up_y : Misaligned(up_y)});
    return std::vector<torch::Tensor>{h.detach(), y.detach(), xi.grad(), di.grad(), w.grad()};
  };
  const auto packed = run(true), one_by_one = run(false);
  EXPECT_TRUE(torch::equal(packed[0], one_by_one[0])) << "h";
  const char* names[] = {"h", "y", "dx", "ddelta", "dweight"};
  for (size_t i = 1; i < packed.size(); ++i) {
    const double rtol = packed[i].scalar_type() == torch::kBFloat16 ? 1.0 / 128 : 1e-5;
    EXPECT_TRUE(torch::allclose(packed[i].to(torch::kFloat), one_by_one[i].to(torch::kFloat), rtol, 1e-5))
        << names[i] << " " << (packed[i].to(torch::kFloat) - one_by_one[i].to(torch::kFloat)).abs().max();
  }
}

// The kernels' index division by multiply-high and shift equals plain division for every
// dividend below 2^31: divisors 1, 2, powers of two and their neighbours, odd ones, the model's
// sizes, large ones; dividends at the edges and random. Beyond 2^31 it divides plainly.
TEST(DividerTest, EqualsPlainDivisionBelowTwoToThe31) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  std::vector<int64_t> divisors = {1, 2, 3, 5, 7, 12, 37, 64, 100, 2048, 8192, 128256, 1000003, kLimit - 1};
  for (int k = 1; k < 31; ++k) {
    divisors.push_back((int64_t{1} << k) - 1);
    divisors.push_back(int64_t{1} << k);
    divisors.push_back((int64_t{1} << k) + 1);
  }
  std::mt19937_64 random(7);
  for (const int64_t d : divisors) {
    const fused::Divider div(d, kLimit - 1);
    ASSERT_TRUE(div.fast) << d;
    std::vector<int64_t> dividends = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, kLimit - 1, kLimit - 2, kLimit - d};
    for (int i = 0; i < 2000; ++i) dividends.push_back(static_cast<int64_t>(random() % static_cast<uint64_t>(kLimit)));
    for (int64_t q = 1; q < kLimit / d && q < (int64_t{1} << 20); q = q * 3 + 1) {
      dividends.push_back(q * d - 1);
      dividends.push_back(q * d);
    }
    for (const int64_t n : dividends) {
      if (n < 0 || n >= kLimit) continue;
      ASSERT_EQ(div.Div(n), n / d) << n << " / " << d;
    }
  }
  const fused::Divider big(3, kLimit);  // a dividend may reach 2^31: plain division
  EXPECT_FALSE(big.fast);
  EXPECT_EQ(big.Div(int64_t{1} << 40), (int64_t{1} << 40) / 3);
}

// The first element where arrays sharing their offset within a 16-byte line are all aligned,
// and no packs where they differ, an address is not a whole element, or no whole pack is left.
TEST(FusedPackTest, CommonPackStartFindsTheSharedBoundary) {
  const auto a = torch::zeros({64}), b = torch::zeros({64});
  const auto at = [](const torch::Tensor& t, int64_t k) { return fused::PackArray{t.data_ptr<float>() + k, 4}; };
  ASSERT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16, 0u);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % 16, 0u);
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_EQ(fused::CommonPackStart(40, {at(a, k), at(b, k)}), (4 - k) % 4) << k;
    EXPECT_EQ(fused::CommonPackStart(40, {at(a, k), at(b, (k + 1) % 4)}), -1) << k;
  }
  EXPECT_EQ(fused::CommonPackStart(7, {at(a, 1), at(b, 1)}), 3);  // elements 3-6: one pack
  EXPECT_EQ(fused::CommonPackStart(6, {at(a, 1), at(b, 1)}), -1);
  EXPECT_EQ(fused::CommonPackStart(3, {at(a, 0)}), -1);
  const auto* bytes = static_cast<const char*>(a.data_ptr());
  EXPECT_EQ(fused::CommonPackStart(40, {{bytes + 2, 4}}), -1);
  EXPECT_EQ(fused::CommonPackStart(40, {at(a, 0), {b.data_ptr(), 2}}), -1);  // mixed element sizes
  EXPECT_EQ(fused::CommonPackStart(40, {}), -1);
}

// Zeros at a tensor's offset within a 16-byte line, whatever the allocator's own alignment.
TEST(FusedPackTest, ZerosInLineWithSharesTheTensorsOffset) {
  const auto flat = torch::randn({67});
  for (int64_t k = 0; k < 4; ++k) {
    const auto shard = flat.narrow(0, k, 60).view({12, 5});
    const auto z = ZerosInLineWith(shard);
    EXPECT_EQ(z.sizes(), shard.sizes());
    EXPECT_TRUE(z.is_contiguous());
    EXPECT_EQ(z.scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(z, torch::zeros({12, 5}))) << k;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data_ptr()) % 16, reinterpret_cast<uintptr_t>(shard.data_ptr()) % 16) << k;
  }
  // Not contiguous: zeros_like, strides and all (libtorch's fused AdamW wants them equal).
  const auto transposed = torch::randn({4, 6}).t();
  EXPECT_EQ(ZerosInLineWith(transposed).strides(), transposed.strides());
}

}  // namespace
}  // namespace meshwork::model
