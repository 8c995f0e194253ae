// train::AdamW against libtorch's torch::optim::AdamW: bit-for-bit on the CPU over several steps
// with two weight-decay groups, parameters that miss a step, and a clip factor; its state round
// trip; the fused kernel where libtorch has one is in tests/gpu/fused_ops_gpu_test.cpp.
#include "trainer/train/adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace meshwork::train {
namespace {

struct Params {
  std::vector<torch::Tensor> decay, no_decay;
  std::vector<torch::Tensor> all() const {
    auto out = decay;
    out.insert(out.end(), no_decay.begin(), no_decay.end());
    return out;
  }
};

Params MakeParams(uint64_t seed) {
  torch::manual_seed(seed);
  Params p;
  p.decay = {torch::randn({8, 4}).requires_grad_(true), torch::randn({3, 5}).requires_grad_(true)};
  p.no_decay = {torch::randn({4}).requires_grad_(true), torch::randn({7}).requires_grad_(true)};
  return p;
}

// Gradients for step `step`: parameter 3 gets none on step 1 (its step count falls behind).
void SetGrads(const Params& p, int step) {
  torch::manual_seed(100 + step);
  const auto all = p.all();
  for (size_t i = 0; i < all.size(); ++i) {
    torch::Tensor g = torch::randn(all[i].sizes()) * (1.0 + static_cast<double>(i));
    all[i].mutable_grad() = (i == 3 && step == 1) ? torch::Tensor() : g;
  }
}

constexpr double kLr = 3e-3, kWd = 0.1;

TEST(AdamWTest, EqualsLibtorchAdamWBitForBitOnTheCpu) {
  Params mine = MakeParams(1), theirs = MakeParams(1);
  AdamW opt({{mine.decay, kWd}, {mine.no_decay, 0.0}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(theirs.decay, std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(1e-8).weight_decay(kWd)));
  groups.emplace_back(theirs.no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                           torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(kLr));
  for (int step = 0; step < 5; ++step) {
    const double lr = kLr * (step + 1) / 5;  // the schedule changes lr between steps
    opt.set_lr(lr);
    for (auto& g : reference.param_groups()) g.options().set_lr(lr);
    SetGrads(mine, step);
    SetGrads(theirs, step);
    // Step 3 clips: the factor multiplies every gradient first, as clip_grad_norm_ does.
    if (step == 3) {
      torch::NoGradGuard no_grad;
      for (auto& p : theirs.all()) p.mutable_grad().mul_(0.25);
      opt.Step(torch::full({1}, 0.25, torch::kDouble));
    } else {
      opt.Step(torch::ones({1}, torch::kDouble));
    }
    reference.step();
    const auto a = mine.all(), b = theirs.all();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << step << " param " << i;
  }
  EXPECT_EQ(opt.State(mine.all()[0])->step, 5);
  EXPECT_EQ(opt.State(mine.all()[3])->step, 4);  // no gradient on step 1
}

TEST(AdamWTest, NoStateBeforeTheFirstUpdateAndStateRoundTrips) {
  Params a = MakeParams(2), b = MakeParams(2);
  AdamW opt_a({{a.decay, kWd}, {a.no_decay, 0.0}}, AdamWOptions{kLr});
  AdamW opt_b({{b.decay, kWd}, {b.no_decay, 0.0}}, AdamWOptions{kLr});
  EXPECT_FALSE(opt_a.HasState());
  EXPECT_EQ(opt_a.State(a.decay[0]), nullptr);
  for (int step = 0; step < 3; ++step) {
    SetGrads(a, step);
    opt_a.Step();
  }
  ASSERT_TRUE(opt_a.HasState());
  // b takes a's values and state; from then on both step identically.
  {
    torch::NoGradGuard no_grad;
    const auto pa = a.all(), pb = b.all();
    for (size_t i = 0; i < pa.size(); ++i) {
      pb[i].copy_(pa[i]);
      const AdamWParamState* s = opt_a.State(pa[i]);
      opt_b.SetState(pb[i], s ? std::optional<AdamWParamState>(*s) : std::nullopt);
      if (s != nullptr) EXPECT_NE(opt_b.State(pb[i])->exp_avg.data_ptr(), s->exp_avg.data_ptr());  // copied
    }
  }
  for (int step = 3; step < 5; ++step) {
    SetGrads(a, step);
    SetGrads(b, step);
    opt_a.Step();
    opt_b.Step();
  }
  const auto pa = a.all(), pb = b.all();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
  opt_b.SetState(pb[0], std::nullopt);
  EXPECT_EQ(opt_b.State(pb[0]), nullptr);
}

TEST(AdamWTest, RefusesAParameterInTwoGroupsAndForeignTensors) {
  Params p = MakeParams(3);
  EXPECT_THROW(AdamW({{p.decay, kWd}, {p.decay, 0.0}}, AdamWOptions{}), c10::Error);
  AdamW opt({{p.decay, kWd}}, AdamWOptions{});
  EXPECT_EQ(opt.State(torch::zeros({2})), nullptr);
  EXPECT_THROW(opt.SetState(torch::zeros({2}), std::nullopt), c10::Error);
}

TEST(AdamWTest, KernelIsFusedOnlyForCudaOnLibtorchTwo) {
  EXPECT_EQ(AdamW::KernelFor(torch::kCPU), "foreach");
  EXPECT_EQ(AdamW::KernelFor(torch::Device(torch::kCUDA, 0)), TORCH_VERSION_MAJOR >= 2 ? "fused" : "foreach");
}

}  // namespace
}  // namespace meshwork::train
