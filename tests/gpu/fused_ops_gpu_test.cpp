// The fused ops on a CUDA device against the plain composition they replace (ctest label gpu):
// RMSNorm (at::rms_norm from libtorch 2.4), grouped-query SDPA (enable_gqa from 2.5) and the
// fused output head + loss under bf16 autocast. Without a CUDA device it exits 77 (ctest:
// Skipped) after saying why.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>

#include "trainer/model/compat.h"
#include "trainer/model/linear_cross_entropy.h"
#include "trainer/model/llama.h"

namespace meshwork::model {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

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

TEST(FusedOpsGpu, LinearCrossEntropyUnderAutocastEqualsComposition) {
  torch::manual_seed(3);
  const auto hidden = torch::randn({2, 1024, 512}, kCuda);
  const auto weight = torch::randn({32000, 512}, kCuda) * 0.05;
  const auto targets = torch::randint(0, 32000, {2, 1024}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  auto run = [&](bool fused) {
    auto h = hidden.clone().requires_grad_(true);
    auto w = weight.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      compat::CudaAutocastGuard amp(true, torch::kBFloat16);
      loss = fused ? LinearCrossEntropy(h, w, targets, 300) : CausalLmLoss(torch::matmul(h, w.t()), targets);
    }
    loss.backward();
    return std::make_tuple(loss.item<double>(), h.grad(), w.grad());
  };
  const auto [fused_loss, fused_h, fused_w] = run(true);
  const auto [plain_loss, plain_h, plain_w] = run(false);
  EXPECT_NEAR(fused_loss, plain_loss, 1e-4 * plain_loss);
  EXPECT_EQ(fused_h.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(fused_h, plain_h, 2e-2, 1e-6)) << (fused_h - plain_h).abs().max().item<float>();
  EXPECT_TRUE(torch::allclose(fused_w, plain_w, 2e-2, 1e-6)) << (fused_w - plain_w).abs().max().item<float>();
}

}  // namespace
}  // namespace meshwork::model

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA device (libtorch sees " << torch::cuda::device_count() << ")\n";
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
