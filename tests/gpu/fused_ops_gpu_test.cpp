// The fused ops on a CUDA device against the plain composition they replace (ctest label gpu):
// RMSNorm (at::rms_norm from libtorch 2.4), grouped-query SDPA (enable_gqa from 2.5) and the
// fused output head + loss under bf16 autocast (its logits' gradient stored and recomputed); and the fused AdamW against libtorch's. Without a CUDA device it exits 77 (ctest:
// Skipped) after saying why.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>
#include <optional>

#include "trainer/model/compat.h"
#include "trainer/model/linear_cross_entropy.h"
#include "trainer/model/llama.h"
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

TEST(FusedOpsGpu, LinearCrossEntropyUnderAutocastEqualsComposition) {
  torch::manual_seed(3);
  const auto hidden = torch::randn({2, 1024, 512}, kCuda);
  const auto weight = torch::randn({32000, 512}, kCuda) * 0.05;
  const auto targets = torch::randint(0, 32000, {2, 1024}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  // fused: nullopt = the plain composition.
  auto run = [&](std::optional<HeadGradient> fused, bool autocast) {
    auto h = hidden.clone().requires_grad_(true);
    auto w = weight.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
      loss = fused ? LinearCrossEntropy(h, w, targets, 300, *fused) : CausalLmLoss(torch::matmul(h, w.t()), targets);
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
  for (const HeadGradient gradient : {HeadGradient::kRecompute, HeadGradient::kStored}) {
    SCOPED_TRACE(gradient == HeadGradient::kStored ? "stored" : "recompute");
    const auto [fused_loss, fused_h, fused_w] = run(gradient, true);
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

}  // namespace
}  // namespace meshwork::model

namespace meshwork::train {
namespace {

TEST(FusedOpsGpu, FusedAdamWEqualsLibtorchAdamW) {
  ASSERT_EQ(AdamW::KernelFor(model::kCuda), "fused");
  torch::manual_seed(4);
  std::vector<torch::Tensor> mine, theirs;
  for (auto shape : std::vector<std::vector<int64_t>>{{256, 128}, {1000}, {3, 7}}) {
    auto p = torch::randn(shape, model::kCuda);
    mine.push_back(p.clone().requires_grad_(true));
    theirs.push_back(p.clone().requires_grad_(true));
  }
  AdamW opt({{{mine[0], mine[2]}, 0.1}, {{mine[1]}, 0.0}}, AdamWOptions{1e-3, 0.9, 0.95, 1e-8});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{theirs[0], theirs[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{theirs[1]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 6; ++step) {
    const double scale = step == 2 ? 0.5 : 1.0;  // a clipped step
    for (size_t i = 0; i < mine.size(); ++i) {
      auto g = torch::randn(mine[i].sizes(), model::kCuda);
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g * scale;
    }
    opt.Step(torch::full({1}, scale, torch::TensorOptions(model::kCuda).dtype(torch::kDouble)));
    reference.step();
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(torch::allclose(mine[i], theirs[i], 1e-5, 1e-6)) << i << ": "
        << (mine[i] - theirs[i]).abs().max().item<float>();
    EXPECT_EQ(opt.State(mine[i])->step, 6);
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
