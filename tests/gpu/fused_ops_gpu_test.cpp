// The fused ops on a CUDA device against the plain composition they replace (ctest label gpu):
// RMSNorm (at::rms_norm from libtorch 2.4), grouped-query SDPA (enable_gqa from 2.5) and each
// SDPA kernel restricted to alone (training.attention_backend) against math in fp32, the fused
// output head + loss under bf16 autocast (its logits' gradient stored and recomputed), Meshwork's
// own SwiGLU and RoPE kernels (fused_kernels.cu: against the composition and the CPU's host loop
// over the same arithmetic, and a whole model step under autocast); MixedLinear's projections
// over fp32 weights under autocast (fp32 weight gradients); a bf16 residual stream; and the two
// AdamW kernels (libtorch's fused one, Meshwork's) against libtorch's AdamW. Without a CUDA device
// it exits 77 (ctest: Skipped) after saying why.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/trainer/model/fused_reference.h"
#include "trainer/model/compat.h"
#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_norm.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/fused_softmax.h"
#include "trainer/model/linear_cross_entropy.h"
#include "trainer/model/llama.h"
#include "trainer/model/mixed_linear.h"
#include "trainer/model/weight_copies.h"
#include "trainer/train/adamw.h"

namespace meshwork::model {
namespace {

inline const torch::Device kCuda(torch::kCUDA, 0);

TEST(FusedOpsGpu, RmsNormEqualsComposition) {
  torch::manual_seed(1);
  const auto x = torch::randn({4, 512, 2048}, kCuda) * 3;
  const auto weight = torch::rand({2048}, kCuda) + 0.5;
  const auto xf = x.to(torch::kFloat);
  const auto reference = weight * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + 1e-5));
  const auto y = compat::RmsNorm(x, weight, 1e-5);
  EXPECT_TRUE(torch::allclose(y, reference, 1e-5, 1e-5)) << (y - reference).abs().max().item<float>();
}

TEST(FusedOpsGpu, GroupedQueryAttentionEqualsWidenedHeads) {
  torch::manual_seed(2);
  const auto q = torch::randn({2, 32, 256, 64}, kCuda).to(torch::kBFloat16);
  const auto k = torch::randn({2, 8, 256, 64}, kCuda).to(torch::kBFloat16);
  const auto v = torch::randn({2, 8, 256, 64}, kCuda).to(torch::kBFloat16);
  const auto y = compat::CausalAttention(q, k, v);
  const auto wide = compat::CausalAttention(q, compat::RepeatKv(k, 32), compat::RepeatKv(v, 32));
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), wide.to(torch::kFloat), 1e-2, 1e-2))
      << (y.to(torch::kFloat) - wide.to(torch::kFloat)).abs().max().item<float>();
}

// training.attention_backend: every SDPA kernel this GPU has, restricted to alone, runs the
// model's attention in bf16 (q and k laid out as the RoPE kernel writes them, v a strided view
// of the q/k/v GEMM's output, grouped-query) and agrees with the math kernel in fp32, forward and
// backward, within bf16's error. A kernel the GPU lacks is said, not failed, except flash
// (sm_80 and later have it).
TEST(FusedOpsGpu, EveryAttentionKernelAgreesWithMathInFp32) {
  if (!compat::RestrictAttentionKernel("math") || !compat::kTorch2) {
    GTEST_SKIP() << "this libtorch cannot choose the attention kernel (2.5 and later can)";
  }
  torch::manual_seed(21);
  const int64_t b = 2, heads = 32, kv = 8, seq = 512, d = 64;
  // q and k laid out as the RoPE kernel writes them: [batch, seq, heads, dim] in memory.
  const auto q0 = torch::randn({b, seq, heads, d}, kCuda).transpose(1, 2);
  const auto k0 = torch::randn({b, seq, kv, d}, kCuda).transpose(1, 2);
  const auto qkv = torch::randn({b, seq, (heads + 2 * kv) * d}, kCuda);
  const auto v0 = qkv.narrow(2, (heads + kv) * d, kv * d).view({b, seq, kv, d}).transpose(1, 2);
  const auto dy = torch::randn({b, heads, seq, d}, kCuda);
  auto run = [&](torch::ScalarType dtype) {
    // Copies (to() of a tensor already in dtype would be that tensor, and the next run would
    // find it requiring grad), in the same layouts.
    auto q = q0.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
    auto k = k0.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
    auto v_base = qkv.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
    auto v = v_base.narrow(2, (heads + kv) * d, kv * d).view({b, seq, kv, d}).transpose(1, 2);
    auto y = compat::CausalAttention(q, k, v);
    (y.to(torch::kFloat) * dy).sum().backward();
    return std::vector<torch::Tensor>{y.to(torch::kFloat), q.grad().to(torch::kFloat), k.grad().to(torch::kFloat),
                                      v_base.grad().to(torch::kFloat)};
  };
  auto rel = [](const torch::Tensor& a, const torch::Tensor& ref) {
    return ((a - ref).norm() / ref.norm()).item<double>();
  };
  ASSERT_TRUE(compat::RestrictAttentionKernel("math"));
  const auto exact = run(torch::kFloat);
  const auto math_bf16 = run(torch::kBFloat16);
  for (const std::string kernel : {"flash_attention", "cudnn_attention", "efficient_attention"}) {
    ASSERT_TRUE(compat::RestrictAttentionKernel(kernel));
    const auto probe = q0.to(torch::kBFloat16);
    std::string got;
    try {
      got = compat::AttentionKernel(probe, probe.narrow(1, 0, kv), probe.narrow(1, 0, kv));
    } catch (const c10::Error& e) {
      got = std::string("none: ") + e.what_without_backtrace();
    }
    if (got != kernel) {
      EXPECT_NE(kernel, "flash_attention") << "flash must run on sm_80 and later: " << got;
      std::cout << "[ NOTE     ] " << kernel << " does not run here (" << got.substr(0, got.find('\n'))
                << "): not compared\n";
      continue;
    }
    const auto fused = run(torch::kBFloat16);
    const char* names[] = {"output", "q grad", "k grad", "v grad"};
    for (size_t i = 0; i < fused.size(); ++i) {
      const double err = rel(fused[i], exact[i]), math_err = rel(math_bf16[i], exact[i]);
      std::cout << "[ NOTE     ] " << kernel << " " << names[i] << ": relative error " << err << " (math in bf16: "
                << math_err << ")\n";
      EXPECT_LT(err, 2 * math_err + 1e-2) << kernel << " " << names[i];
    }
  }
  ASSERT_TRUE(compat::RestrictAttentionKernel(""));
}

TEST(FusedOpsGpu, LinearCrossEntropyUnderAutocastEqualsComposition) {
  torch::manual_seed(3);
  const auto hidden = torch::randn({2, 1024, 512}, kCuda);
  const auto weight = torch::randn({32000, 512}, kCuda) * 0.05;
  const auto targets = torch::randint(0, 32000, {2, 1024}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  // fused: nullopt = the plain composition.
  auto run = [&](std::optional<HeadGradient> fused, bool autocast, bool fused_softmax = false) {
    auto h = hidden.clone().requires_grad_(true);
    auto w = weight.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
      loss = fused ? LinearCrossEntropy(h, w, targets, 300, *fused, fused_softmax)
                   : CausalLmLoss(torch::matmul(h, w.t()), targets);
    }
    loss.backward();
    return std::make_tuple(loss.item<double>(), h.grad(), w.grad());
  };
  const auto [plain_loss, plain_h, plain_w] = run(std::nullopt, true);
  const auto [exact_loss, exact_h, exact_w] = run(std::nullopt, false);  // fp32 throughout
  // Both bf16 paths round differently (the plain one rounds whole logits and their gradient to
  // bf16, the fused one each chunk's): element by element they differ by bf16's relative
  // precision on gradients near 0. Each is held to the fp32 computation instead, by relative
  // norm: the fused one no further from it than twice the plain one's distance (plus 1e-3).
  auto distance = [](const torch::Tensor& a, const torch::Tensor& exact) {
    return ((a - exact).norm() / exact.norm()).item<double>();
  };
  for (const auto& [gradient, fused_softmax] :
       {std::pair{HeadGradient::kRecompute, false}, std::pair{HeadGradient::kStored, false},
        std::pair{HeadGradient::kStored, true}}) {
    if (fused_softmax && !FusedKernelsBuilt()) continue;  // SoftmaxGradientKernelEqualsTheCompositionAndTheHostLoop says why it skips
    SCOPED_TRACE(gradient == HeadGradient::kRecompute ? "recompute" : fused_softmax ? "stored, fused softmax" : "stored");
    const auto [fused_loss, fused_h, fused_w] = run(gradient, true, fused_softmax);
    EXPECT_NEAR(fused_loss, plain_loss, 1e-4 * plain_loss);
    EXPECT_EQ(fused_h.scalar_type(), torch::kFloat);
    EXPECT_EQ(fused_w.scalar_type(), torch::kFloat);
    EXPECT_LE(distance(fused_h, exact_h), 2 * distance(plain_h, exact_h) + 1e-3)
        << "plain bf16 " << distance(plain_h, exact_h);
    EXPECT_LE(distance(fused_w, exact_w), 2 * distance(plain_w, exact_w) + 1e-3)
        << "plain bf16 " << distance(plain_w, exact_w);
    EXPECT_LT(distance(fused_w, exact_w), 2e-2);
    EXPECT_LT(distance(fused_h, exact_h), 2e-2);
  }
}

// The SwiGLU and RoPE kernels: skipped, saying why, in a build without them (no nvcc).
#define MW_REQUIRE_FUSED_KERNELS()                                                            \
  if (!FusedKernelsBuilt()) GTEST_SKIP() << "this build has no CUDA kernels (nvcc was not found " \
                                            "when it was built: docs/gpu.md)"

using testing::ForwardBackward;
using testing::Misaligned;
using testing::SwiGluComposition;

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

TEST(FusedOpsGpu, SwiGluKernelEqualsCompositionInDoubleAndFp32) {
  MW_REQUIRE_FUSED_KERNELS();
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    torch::manual_seed(11);
    const auto gate_up = torch::randn({4, 333, 2 * 517}, torch::TensorOptions(kCuda).dtype(dtype)) * 3;
    const auto upstream = torch::randn({4, 333, 517}, torch::TensorOptions(kCuda).dtype(dtype));
    const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, upstream);
    const auto [y_ref, grad_ref] = ForwardBackward(SwiGluComposition, gate_up, upstream);
    EXPECT_TRUE(torch::allclose(y, y_ref, tol, tol)) << MaxDiff(y, y_ref);
    EXPECT_TRUE(torch::allclose(grad, grad_ref, tol, tol)) << MaxDiff(grad, grad_ref);
  }
}

// bf16: the kernel and the CPU's host loop run the same arithmetic on the same inputs; they may
// differ only where expf's last bit tips a bf16 rounding (one bf16 step, 2^-7 relative).
TEST(FusedOpsGpu, SwiGluAndRopeKernelsMatchTheHostLoopInBf16) {
  MW_REQUIRE_FUSED_KERNELS();
  torch::manual_seed(12);
  const auto gate_up = (torch::randn({2, 1000, 2 * 1024}, kCuda) * 3).to(torch::kBFloat16);
  const auto upstream = torch::randn({2, 1000, 1024}, kCuda).to(torch::kBFloat16);
  const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, upstream);
  const auto [y_cpu, grad_cpu] = ForwardBackward(FusedSwiGlu, gate_up.cpu(), upstream.cpu());
  EXPECT_TRUE(torch::allclose(y.cpu().to(torch::kFloat), y_cpu.to(torch::kFloat), 1.0 / 128, 1e-6)) << MaxDiff(y.cpu(), y_cpu);
  EXPECT_TRUE(torch::allclose(grad.cpu().to(torch::kFloat), grad_cpu.to(torch::kFloat), 1.0 / 128, 1e-6))
      << MaxDiff(grad.cpu(), grad_cpu);
  EXPECT_LT((y.cpu() != y_cpu).sum().item<int64_t>(), y.numel() / 100) << "more than 1% of the elements differ";

  LlamaConfig c;
  c.hidden_size = 2048;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  const RopeTables rope = MakeRopeTables(c, 2048, kCuda);
  const auto qkv = torch::randn({2, 2048, 48 * 64}, kCuda).to(torch::kBFloat16);
  const auto q = qkv.narrow(-1, 0, 32 * 64).view({2, 2048, 32, 64}).transpose(1, 2);
  const auto g = torch::randn({2, 32, 2048, 64}, kCuda).to(torch::kBFloat16);
  auto fused = [&](const torch::Tensor& x) { return FusedRope(x, x.is_cuda() ? rope.cos : rope.cos.cpu(), x.is_cuda() ? rope.sin : rope.sin.cpu()); };
  const auto [r, rgrad] = ForwardBackward(fused, q, g);
  const auto [r_cpu, rgrad_cpu] = ForwardBackward(fused, q.cpu(), g.cpu());
  EXPECT_TRUE(torch::allclose(r.cpu().to(torch::kFloat), r_cpu.to(torch::kFloat), 1.0 / 128, 1e-6)) << MaxDiff(r.cpu(), r_cpu);
  EXPECT_TRUE(torch::allclose(rgrad.cpu().to(torch::kFloat), rgrad_cpu.to(torch::kFloat), 1.0 / 128, 1e-6))
      << MaxDiff(rgrad.cpu(), rgrad_cpu);
  // And against the composition in fp32 on the same bf16 inputs: one rounding.
  const auto [r32, rgrad32] = ForwardBackward([&](const torch::Tensor& x) { return ApplyRope(x, rope); },
                                              q.to(torch::kFloat), g.to(torch::kFloat));
  EXPECT_TRUE(torch::allclose(r.to(torch::kFloat), r32, 1.0 / 256, 1e-6)) << MaxDiff(r, r32);
  EXPECT_TRUE(torch::allclose(rgrad.to(torch::kFloat), rgrad32, 1.0 / 256, 1e-6)) << MaxDiff(rgrad, rgrad32);
}

TEST(FusedOpsGpu, RopeKernelEqualsApplyRopeOnStridedViewsInDoubleAndFp32) {
  MW_REQUIRE_FUSED_KERNELS();
  LlamaConfig c;
  c.hidden_size = 512;
  c.num_attention_heads = 8;  // head dim 64
  c.num_key_value_heads = 2;
  const RopeTables rope = MakeRopeTables(c, 300, kCuda);
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    torch::manual_seed(13);
    // k taken inside the function, so the kernel reads the GEMM output's strided view itself.
    const auto qkv = torch::randn({3, 257, 12 * 64}, torch::TensorOptions(kCuda).dtype(dtype));
    auto k = [](const torch::Tensor& all) { return all.narrow(-1, 8 * 64, 2 * 64).view({3, 257, 2, 64}).transpose(1, 2); };
    const auto g = torch::randn({3, 257, 2, 64}, torch::TensorOptions(kCuda).dtype(dtype)).transpose(1, 2);
    const auto [y, grad] =
        ForwardBackward([&](const torch::Tensor& all) { return FusedRope(k(all), rope.cos, rope.sin); }, qkv, g);
    const auto [y_ref, grad_ref] = ForwardBackward([&](const torch::Tensor& all) { return ApplyRope(k(all), rope); }, qkv, g);
    EXPECT_TRUE(torch::allclose(y, y_ref, tol, tol)) << MaxDiff(y, y_ref);
    EXPECT_TRUE(torch::allclose(grad, grad_ref, tol, tol)) << MaxDiff(grad, grad_ref);
  }
}

// The head's softmax gradient kernel: against the composition in double and fp32, and against
// the CPU's host loop (the same lanes and tree) on Llama 3's vocabulary in bf16.
TEST(FusedOpsGpu, SoftmaxGradientKernelEqualsTheCompositionAndTheHostLoop) {
  MW_REQUIRE_FUSED_KERNELS();
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    torch::manual_seed(16);
    const auto options = torch::TensorOptions(kCuda).dtype(dtype);
    auto logits = torch::randn({300, 5001}, options) * 20;
    const auto targets = torch::randint(0, 5001, {300}, options.dtype(torch::kLong));
    const auto lse = torch::logsumexp(logits, -1);
    auto want = (logits - lse.unsqueeze(1)).exp();
    want.scatter_add_(1, targets.unsqueeze(1), torch::full({300, 1}, -1.0, options));
    const auto target_logit = logits.gather(1, targets.unsqueeze(1)).squeeze(1);
    // fp32: a row's log-sum-exp summed in another order may round to the neighbouring fp32 value
    // (one step is 7.6e-6 at logits near 64), which moves the largest probabilities by as much.
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    const SoftmaxGradientStats got = SoftmaxGradientInPlace(logits, targets);
    EXPECT_TRUE(torch::allclose(logits, want, tol, tol)) << MaxDiff(logits, want);
    EXPECT_TRUE(torch::allclose(got.lse, lse, tol, tol)) << MaxDiff(got.lse, lse);
    EXPECT_TRUE(torch::equal(got.target_logit, target_logit));
  }
  torch::manual_seed(17);
  auto logits = (torch::randn({64, 128256}, kCuda) * 4).to(torch::kBFloat16);
  const auto targets = torch::randint(0, 128256, {64}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  auto on_cpu = logits.cpu();
  const SoftmaxGradientStats gpu = SoftmaxGradientInPlace(logits, targets);
  const SoftmaxGradientStats cpu = SoftmaxGradientInPlace(on_cpu, targets.cpu());
  EXPECT_TRUE(torch::allclose(gpu.lse.cpu(), cpu.lse, 1e-5, 1e-5)) << MaxDiff(gpu.lse.cpu(), cpu.lse);
  EXPECT_TRUE(torch::equal(gpu.target_logit.cpu(), cpu.target_logit));
  EXPECT_TRUE(torch::allclose(logits.cpu().to(torch::kFloat), on_cpu.to(torch::kFloat), 1.0 / 128, 1e-7))
      << MaxDiff(logits.cpu(), on_cpu);
}

// The RMSNorm kernels: forward and backward against the composition in double and fp32 (more
// rows than the backward's 1024 blocks, Llama 3 1B's and 70B's widths), and the add + norm under
// autocast's dtypes (fp32 x, bf16 delta and output) against the CPU's host loop.
TEST(FusedOpsGpu, RmsNormKernelsEqualTheCompositionAndTheHostLoop) {
  MW_REQUIRE_FUSED_KERNELS();
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    for (const int64_t dim : {int64_t{2048}, int64_t{8192}, int64_t{300}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " dim " + std::to_string(dim));
      torch::manual_seed(18);
      const auto options = torch::TensorOptions(kCuda).dtype(dtype);
      const auto x = torch::randn({2500, dim}, options) * 3;
      const auto weight = torch::rand({dim}, options) + 0.5;
      const auto upstream = torch::randn({2500, dim}, options);
      auto run = [&](bool fused) {
        auto xi = x.clone().requires_grad_(true);
        auto w = weight.clone().requires_grad_(true);
        auto y = fused ? FusedRmsNorm(xi, w, 1e-5, dtype) : compat::RmsNorm(xi, w, 1e-5);
        y.backward(upstream);
        return std::make_tuple(y.detach(), xi.grad(), w.grad());
      };
      const auto [y, dx, dw] = run(true);
      const auto [y_ref, dx_ref, dw_ref] = run(false);
      const double tol = dtype == torch::kDouble ? 1e-11 : 1e-4;
      EXPECT_TRUE(torch::allclose(y, y_ref, tol, tol)) << MaxDiff(y, y_ref);
      EXPECT_TRUE(torch::allclose(dx, dx_ref, tol, tol)) << MaxDiff(dx, dx_ref);
      EXPECT_TRUE(torch::allclose(dw, dw_ref, tol, tol * 10)) << MaxDiff(dw, dw_ref);
    }
  }
  torch::manual_seed(19);
  const auto x = torch::randn({4096, 2048}, kCuda);
  const auto delta = torch::randn({4096, 2048}, kCuda).to(torch::kBFloat16);
  const auto weight = torch::rand({2048}, kCuda) + 0.5;
  const auto up_h = torch::randn({4096, 2048}, kCuda), up_y = torch::randn({4096, 2048}, kCuda).to(torch::kBFloat16);
  auto run = [&](const torch::Device& device) {
    // detach(): to() of a tensor already on the device returns that tensor, whose requires_grad
    // the first run would otherwise leave set, and the second run's copies would not be leaves.
    auto xi = x.to(device).detach().requires_grad_(true), di = delta.to(device).detach().requires_grad_(true);
    auto w = weight.to(device).detach().requires_grad_(true);
    const auto [h, y] = FusedAddRmsNorm(xi, di, w, 1e-5, torch::kBFloat16);
    torch::autograd::backward({h, y}, {up_h.to(device), up_y.to(device)});
    return std::vector<torch::Tensor>{h.detach().cpu(), y.detach().cpu(), xi.grad().cpu(), di.grad().cpu(), w.grad().cpu()};
  };
  const auto gpu = run(kCuda);
  const auto cpu = run(torch::kCPU);
  const char* names[] = {"h", "y", "dx", "ddelta", "dweight"};
  EXPECT_TRUE(torch::equal(gpu[0], cpu[0])) << "h = x + delta is one fp32 add either way";
  for (size_t i = 1; i < gpu.size(); ++i) {
    const double rtol = gpu[i].scalar_type() == torch::kBFloat16 ? 1.0 / 128 : 1e-4;
    EXPECT_TRUE(torch::allclose(gpu[i].to(torch::kFloat), cpu[i].to(torch::kFloat), rtol, 1e-4))
        << names[i] << " " << MaxDiff(gpu[i], cpu[i]);
  }
}

// More packs than one grid covers (2^20 blocks x 256 threads): the grid-stride loop's later
// rounds give exactly what a small launch over the same rows gives. Packed (8 bf16 a thread:
// 302M packs, a 9.7 GB input) and one element at a time (the input one element off alignment:
// 302M elements).
TEST(FusedOpsGpu, SwiGluKernelCoversMoreElementsThanOneGrid) {
  MW_REQUIRE_FUSED_KERNELS();
  torch::manual_seed(14);
  torch::NoGradGuard no_grad;
  const int64_t f = 8192;
  for (const bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packs of 8" : "one element at a time");
    const int64_t rows = packed ? 8 * 36864 : 36864;
    torch::Tensor gate_up = torch::randn({rows, 2 * f}, torch::TensorOptions(kCuda).dtype(torch::kBFloat16));
    if (!packed) gate_up = Misaligned(gate_up);
    ASSERT_EQ(fused::PackFor({f}, {{gate_up.data_ptr(), 2}}), packed ? 8 : 1);
    const auto y = FusedSwiGlu(gate_up);
    const auto tail = FusedSwiGlu(gate_up.narrow(0, rows - 64, 64));
    const auto head = FusedSwiGlu(gate_up.narrow(0, 0, 64));
    EXPECT_TRUE(torch::equal(y.narrow(0, rows - 64, 64), tail));
    EXPECT_TRUE(torch::equal(y.narrow(0, 0, 64), head));
  }
}

// Each kernel's packed path (aligned model-sized bf16 tensors) against its one-element-at-a-time
// path (the same data one element off alignment) on the GPU: SwiGLU and RoPE the same bits both
// ways, the softmax gradient and add + RMSNorm the same to rounding (other partitions of their
// sums).
TEST(FusedOpsGpu, PackedAndElementwiseKernelsAgree) {
  MW_REQUIRE_FUSED_KERNELS();
  torch::manual_seed(24);
  const auto bf16 = torch::TensorOptions(kCuda).dtype(torch::kBFloat16);
  const auto gate_up = torch::randn({512, 2 * 1024}, bf16) * 3;
  const auto up = torch::randn({512, 1024}, bf16);
  const auto [y, grad] = ForwardBackward(FusedSwiGlu, gate_up, up);
  auto swiglu_one = [](const torch::Tensor& x) { return FusedSwiGlu(Misaligned(x)); };
  const auto [y1, grad1] = ForwardBackward(swiglu_one, gate_up, Misaligned(up));
  EXPECT_TRUE(torch::equal(y, y1));
  EXPECT_TRUE(torch::equal(grad, grad1));

  LlamaConfig c;
  c.hidden_size = 1024;
  c.num_attention_heads = 16;  // head dim 64, as Llama 3's
  c.num_key_value_heads = 16;
  const RopeTables rope = MakeRopeTables(c, 256, kCuda);
  const auto x = torch::randn({2, 16, 256, 64}, bf16), rup = torch::randn({2, 16, 256, 64}, bf16);
  auto rope_packed = [&](const torch::Tensor& in) { return FusedRope(in, rope.cos, rope.sin); };
  auto rope_one = [&](const torch::Tensor& in) { return FusedRope(Misaligned(in), rope.cos, rope.sin); };
  const auto [r, rgrad] = ForwardBackward(rope_packed, x, rup);
  const auto [r1, rgrad1] = ForwardBackward(rope_one, x, Misaligned(rup));
  EXPECT_TRUE(torch::equal(r, r1));
  EXPECT_TRUE(torch::equal(rgrad, rgrad1));

  auto logits = torch::randn({64, 8192}, bf16) * 8;
  auto logits1 = Misaligned(logits);
  const auto targets = torch::randint(0, 8192, {64}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  const auto stats = SoftmaxGradientInPlace(logits, targets);
  const auto stats1 = SoftmaxGradientInPlace(logits1, targets);
  EXPECT_TRUE(torch::allclose(stats.lse, stats1.lse, 1e-5, 1e-5)) << MaxDiff(stats.lse, stats1.lse);
  EXPECT_TRUE(torch::allclose(logits.to(torch::kFloat), logits1.to(torch::kFloat), 1.0 / 128, 1e-7))
      << MaxDiff(logits, logits1);

  const auto h0 = torch::randn({256, 2048}, kCuda), delta = torch::randn({256, 2048}, bf16);
  const auto weight = torch::rand({2048}, kCuda) + 0.5;
  auto norm = [&](bool aligned) {
    auto xi = (aligned ? h0.clone() : Misaligned(h0)).detach().requires_grad_(true);
    auto w = weight.clone().requires_grad_(true);
    const auto [h, n] = FusedAddRmsNorm(xi, delta, w, 1e-5, torch::kBFloat16);
    const auto dn = torch::ones_like(n);
    torch::autograd::backward({h, n}, {torch::ones_like(h), aligned ? dn : Misaligned(dn)});
    return std::vector<torch::Tensor>{h.detach(), n.detach().to(torch::kFloat), xi.grad(), w.grad()};
  };
  const auto packed = norm(true), one = norm(false);
  EXPECT_TRUE(torch::equal(packed[0], one[0]));
  for (size_t i = 1; i < packed.size(); ++i) {
    EXPECT_TRUE(torch::allclose(packed[i], one[i], 1.0 / 128, 1e-4)) << i << " " << MaxDiff(packed[i], one[i]);
  }
}

// MixedLinear over fp32 weights under bf16 autocast against the composition autocast makes of
// F::linear over the stacked bf16 weights: the same output and input gradient (the same bf16
// GEMMs), and weight gradients in fp32 no further from the fp32 reference than the
// composition's, which rounds them to bf16 first.
TEST(FusedOpsGpu, MixedLinearUnderAutocastMatchesTheCompositionWithFp32WeightGradients) {
  torch::manual_seed(16);
  const auto x0 = torch::randn({4, 256, 512}, kCuda);
  const std::vector<torch::Tensor> w0 = {torch::randn({1024, 512}, kCuda) * 0.05,
                                         torch::randn({256, 512}, kCuda) * 0.05};
  const auto probe = torch::randn({4, 256, 1280}, kCuda);
  auto run = [&](bool mixed, bool autocast) {
    const auto x = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> w;
    for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
    torch::Tensor y;
    {
      compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
      y = mixed ? MixedLinear(x, w) : torch::nn::functional::linear(x, MergedWeight({w[0], w[1]}, x));
    }
    (y.to(torch::kFloat) * probe).sum().backward();
    return std::make_tuple(y.detach().to(torch::kFloat), x.grad(), w[0].grad(), w[1].grad());
  };
  const auto [y_exact, dx_exact, da_exact, db_exact] = run(false, false);
  const auto [y_plain, dx_plain, da_plain, db_plain] = run(false, true);
  const auto [y_mixed, dx_mixed, da_mixed, db_mixed] = run(true, true);
  EXPECT_TRUE(torch::allclose(y_mixed, y_plain, 1e-2, 1e-2)) << (y_mixed - y_plain).abs().max().item<float>();
  EXPECT_TRUE(torch::allclose(dx_mixed, dx_plain, 1e-2, 1e-2)) << (dx_mixed - dx_plain).abs().max().item<float>();
  EXPECT_EQ(da_mixed.scalar_type(), torch::kFloat);
  for (const auto& [mixed, plain, exact] :
       {std::tuple{da_mixed, da_plain, da_exact}, std::tuple{db_mixed, db_plain, db_exact}}) {
    const double norm = exact.norm().item<double>();
    const double d_mixed = (mixed - exact).norm().item<double>() / norm;
    const double d_plain = (plain - exact).norm().item<double>() / norm;
    EXPECT_LE(d_mixed, d_plain * 1.05 + 1e-6) << "bf16 composition " << d_plain;
    EXPECT_LT(d_mixed, 1e-2);
  }
}

// A 2-layer model (grouped-query attention) on the GPU, initialised from `seed`.
LlamaForCausalLM TwoLayerModel(uint64_t seed) {
  LlamaConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  torch::manual_seed(seed);
  LlamaForCausalLM model(c);
  model->InitWeights(0.02);
  model->to(kCuda);
  return model;
}

// Each gradient of `got` no further from fp32's (`exact`, by relative norm) than `factor` times
// the bf16 composition's (`plain`) plus `slack`.
void ExpectGradientsNearFp32(LlamaForCausalLM& model, const std::vector<torch::Tensor>& exact,
                             const std::vector<torch::Tensor>& plain, const std::vector<torch::Tensor>& got,
                             double factor, double slack) {
  const auto names = model->named_parameters().keys();
  for (size_t i = 0; i < got.size(); ++i) {
    const double denominator = exact[i].norm().item<double>() + 1e-12;
    const double d_got = (got[i] - exact[i]).norm().item<double>() / denominator;
    const double d_plain = (plain[i] - exact[i]).norm().item<double>() / denominator;
    EXPECT_LE(d_got, factor * d_plain + slack) << names[i] << ": bf16 composition " << d_plain;
  }
}

// A whole model under bf16 autocast, fused (SwiGLU, RoPE, the norms, and with a stored head
// gradient the softmax kernel) against the composition: the same loss to bf16's
// precision, and every gradient near the fp32 composition's (no further than twice the bf16
// composition's distance, plus 1e-3).
TEST(FusedOpsGpu, ModelStepWithFusedKernelsFollowsTheComposition) {
  MW_REQUIRE_FUSED_KERNELS();
  LlamaForCausalLM model = TwoLayerModel(15);
  const auto tokens = torch::randint(0, 1000, {2, 129}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  const auto inputs = tokens.narrow(1, 0, 128), targets = tokens.narrow(1, 1, 128);
  bool stored_head = false;
  std::optional<torch::ScalarType> residual;
  auto run = [&](bool fused, bool autocast) {
    model->set_fused_kernels(fused);
    model->set_residual_dtype(residual);
    model->set_loss_gradient(stored_head ? HeadGradient::kStored : HeadGradient::kRecompute);
    model->zero_grad();
    torch::Tensor loss;
    {
      compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
      loss = model->Loss(inputs, targets);
    }
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(loss.item<double>(), grads);
  };
  // The head's logit gradient recomputed (no softmax kernel), then stored (the softmax kernel).
  for (const bool head_stored : {false, true}) {
    stored_head = head_stored;
    SCOPED_TRACE(head_stored ? "stored head gradient" : "recomputed head gradient");
    const auto [exact_loss, exact] = run(false, false);
    const auto [plain_loss, plain] = run(false, true);
    const auto [fused_loss, fused] = run(true, true);
    EXPECT_NEAR(fused_loss, exact_loss, 1e-2 * exact_loss);
    EXPECT_NEAR(fused_loss, plain_loss, 1e-2 * plain_loss);
    ExpectGradientsNearFp32(model, exact, plain, fused, 2, 1e-3);
  }
  // A bf16 residual stream (training.residual_dtype: auto under autocast) rounds the stream to
  // bf16 at every layer on top of the composition's rounding, so its bound is looser: the loss
  // within 1% of fp32's, each gradient no further from fp32's than 4x the bf16 composition's
  // distance plus 5e-3. Bounds chosen, not yet measured on a GPU.
  SCOPED_TRACE("bf16 residual stream");
  stored_head = true;
  const auto [exact_loss, exact] = run(false, false);
  const auto [plain_loss, plain] = run(false, true);
  residual = torch::kBFloat16;
  const auto [bf16_loss, bf16_stream] = run(true, true);
  EXPECT_NEAR(bf16_loss, exact_loss, 1e-2 * exact_loss);
  ExpectGradientsNearFp32(model, exact, plain, bf16_stream, 4, 5e-3);
}

// The residual stream is bf16 from the embedding to the final norm under autocast, left alone
// without it, and fp32 over bf16 weights when asked.
TEST(FusedOpsGpu, Bf16ResidualStreamRunsEveryLayerInBf16) {
  LlamaForCausalLM model = TwoLayerModel(16);
  model->set_fused_kernels(FusedKernelsBuilt());
  model->set_residual_dtype(torch::kBFloat16);
  const auto tokens = torch::randint(0, 1000, {2, 64}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  std::vector<torch::ScalarType> seen;
  const LayerRunner record = [&](int64_t, DecoderLayerImpl& layer, const torch::Tensor& h, const RopeTables& rope) {
    seen.push_back(h.scalar_type());
    auto out = layer.forward(h, rope);
    seen.push_back(out.scalar_type());
    return out;
  };
  {
    compat::CudaAutocastGuard amp(true, torch::kBFloat16);
    (void)model->ForwardWithLayerRunner(tokens, record);
  }
  ASSERT_EQ(seen.size(), 4u);
  for (const auto t : seen) EXPECT_EQ(t, torch::kBFloat16);
  seen.clear();
  (void)model->ForwardWithLayerRunner(tokens, record);  // no autocast: fp32 throughout
  ASSERT_EQ(seen.size(), 4u);
  for (const auto t : seen) EXPECT_EQ(t, torch::kFloat);
  // bf16 weights, as FSDP gathers them, with training.residual_dtype: fp32: the embedding's
  // bf16 rows cast up, the stream fp32 throughout.
  model->to(torch::kBFloat16);
  model->set_residual_dtype(torch::kFloat);
  seen.clear();
  {
    compat::CudaAutocastGuard amp(true, torch::kBFloat16);
    (void)model->ForwardWithLayerRunner(tokens, record);
  }
  ASSERT_EQ(seen.size(), 4u);
  for (const auto t : seen) EXPECT_EQ(t, torch::kFloat);
}

}  // namespace
}  // namespace meshwork::model

namespace meshwork::train {
namespace {

// libtorch's fused AdamW and Meshwork's kernel against torch::optim::AdamW (libtorch's
// one-parameter-at-a-time ops on the GPU), over six steps with a clipped one, two weight-decay
// groups, and a 21-element parameter (Meshwork's kernel: 5 packs of 4 and a tail of 1). Meshwork's
// kernel reads the gradients only; the fused one leaves them scaled.
void CheckAdamWKernel(AdamWKernel kernel, double eps) {
  SCOPED_TRACE(std::string(AdamWKernelName(kernel)) + ", eps " + std::to_string(eps));
  torch::manual_seed(4);
  std::vector<torch::Tensor> mine, theirs;
  for (auto shape : std::vector<std::vector<int64_t>>{{256, 128}, {1000}, {3, 7}}) {
    auto p = torch::randn(shape, model::kCuda);
    mine.push_back(p.clone().requires_grad_(true));
    theirs.push_back(p.clone().requires_grad_(true));
  }
  AdamW opt({{{mine[0], mine[2]}, 0.1}, {{mine[1]}, 0.0}}, AdamWOptions{1e-3, 0.9, 0.95, eps, kernel});
  ASSERT_EQ(opt.KernelFor(model::kCuda), AdamWKernelName(kernel));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{theirs[0], theirs[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(eps).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{theirs[1]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(eps).weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 6; ++step) {
    const double scale = step == 2 ? 0.5 : 1.0;  // a clipped step
    std::vector<torch::Tensor> given;
    for (size_t i = 0; i < mine.size(); ++i) {
      auto g = torch::randn(mine[i].sizes(), model::kCuda);
      given.push_back(g);
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g * scale;
    }
    opt.Step(torch::full({1}, scale, torch::TensorOptions(model::kCuda).dtype(torch::kDouble)));
    reference.step();
    if (kernel == AdamWKernel::kMeshwork) {
      for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(torch::equal(mine[i].grad(), given[i])) << i;
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(torch::allclose(mine[i], theirs[i], 1e-5, 1e-6)) << i << ": "
        << (mine[i] - theirs[i]).abs().max().item<float>();
    EXPECT_EQ(opt.State(mine[i])->step, 6);
  }
}

// eps 0.5 against unit gradients: where eps enters the denominator matters.
TEST(FusedOpsGpu, FusedAdamWEqualsLibtorchAdamW) {
  for (const double eps : {1e-8, 0.5}) CheckAdamWKernel(AdamWKernel::kFused, eps);
}
TEST(FusedOpsGpu, MeshworkAdamWEqualsLibtorchAdamW) {
  ASSERT_TRUE(model::FusedKernelsBuilt()) << "this build has no CUDA kernels";
  EXPECT_EQ(AdamW::DefaultKernel(model::kCuda), AdamWKernel::kMeshwork);
  for (const double eps : {1e-8, 0.5}) CheckAdamWKernel(AdamWKernel::kMeshwork, eps);
}

// A parameter of a size no 16-byte pack divides, at an address off the pack's alignment: same
// results whichever way Meshwork's kernel has to take it.
TEST(FusedOpsGpu, MeshworkAdamWHandlesUnalignedParameters) {
  // A parameter one element into its buffer; its gradient either a fresh tensor (offsets differ
  // within the 16-byte line: one element at a time) or a view at the same element, as FSDP's
  // shards and reduced gradients are: 16-byte packs from element 3 and 3 loose elements at each
  // end, the moments allocated at the parameter's offset.
  for (const bool same_offset : {false, true}) {
    SCOPED_TRACE(same_offset ? "gradient at the parameter's offset" : "gradient aligned");
    torch::manual_seed(5);
    const auto buffer = torch::randn({4097}, model::kCuda);
    auto mine = buffer.clone().narrow(0, 1, 4094).detach().requires_grad_(true);
    auto theirs = buffer.clone().narrow(0, 1, 4094).detach().requires_grad_(true);
    AdamW opt({{{mine}, 0.1}}, AdamWOptions{1e-3, 0.9, 0.95, 1e-8, AdamWKernel::kMeshwork});
    torch::optim::AdamW reference(std::vector<torch::Tensor>{theirs},
                                  torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
    for (int step = 0; step < 3; ++step) {
      const auto g = torch::randn({4097}, model::kCuda);
      mine.mutable_grad() = same_offset ? g.narrow(0, 1, 4094) : g.narrow(0, 1, 4094).clone();
      theirs.mutable_grad() = g.narrow(0, 1, 4094).clone();
      opt.Step();
      reference.step();
    }
    const AdamWParamState& state = *opt.State(mine);
    EXPECT_EQ(model::fused::CommonPackStart(
                  4094, {{mine.data_ptr(), 4}, {mine.grad().data_ptr(), 4}, {state.exp_avg.data_ptr(), 4},
                         {state.exp_avg_sq.data_ptr(), 4}}),
              same_offset ? 3 : -1);
    EXPECT_TRUE(torch::allclose(mine, theirs, 1e-5, 1e-6)) << (mine - theirs).abs().max().item<float>();
  }
}

// Persistent bf16 weight copies (weight_copies.h) written by Meshwork's AdamW kernel, as one
// process trains by default on CUDA: after every step each projection's and the head's copy is
// current and equal to the cast of the updated weight, and the run follows one that casts every
// forward (the same bf16 values: equal losses, up to the nondeterminism of the GPU's kernels;
// bound chosen, not yet measured).
TEST(FusedOpsGpu, WeightCopiesWrittenByAdamWTrainLikeCasting) {
  ASSERT_TRUE(model::FusedKernelsBuilt()) << "this build has no CUDA kernels";
  model::LlamaForCausalLM cast = model::TwoLayerModel(21), copied = model::TwoLayerModel(21);
  auto copies = std::make_shared<model::WeightCopies>(torch::kBFloat16);
  copied->set_weight_copies(copies);
  const auto tokens = torch::randint(0, 1000, {2, 129}, torch::TensorOptions(model::kCuda).dtype(torch::kLong));
  const auto inputs = tokens.narrow(1, 0, 128), targets = tokens.narrow(1, 1, 128);
  std::vector<AdamW> opts;
  for (model::LlamaForCausalLM* m : {&cast, &copied}) {
    (*m)->set_fused_kernels(true);
    (*m)->set_loss_gradient(model::HeadGradient::kStored);
    opts.emplace_back(std::vector<AdamWGroup>{{(*m)->parameters(), 0.1}},
                      AdamWOptions{1e-3, 0.9, 0.95, 1e-8, AdamWKernel::kMeshwork});
  }
  opts[1].SetWeightCopies(copies);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    double losses[2];
    for (int i = 0; i < 2; ++i) {
      model::LlamaForCausalLM& m = i == 0 ? cast : copied;
      m->zero_grad();
      torch::Tensor loss;
      {
        compat::CudaAutocastGuard amp(true, torch::kBFloat16);
        loss = m->Loss(inputs, targets);
      }
      loss.backward();
      opts[i].Step();
      losses[i] = loss.item<double>();
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-4 * losses[0]);
    int matrices = 0;
    for (const auto& p : copied->parameters()) {
      if (p.dim() != 2) continue;
      ++matrices;
      EXPECT_TRUE(copies->IsCurrent(p)) << p.sizes();
      EXPECT_TRUE(torch::equal(copies->CopyOf(p), p.detach().to(torch::kBFloat16))) << p.sizes();
    }
    EXPECT_EQ(matrices, 2 * 7 + 1);  // 7 projections a layer and the tied table
  }
}

}  // namespace
}  // namespace meshwork::train

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA device (libtorch sees " << torch::cuda::device_count() << ")\n";
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
