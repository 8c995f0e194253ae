// train::AdamW against libtorch's torch::optim::AdamW: bit-for-bit on the CPU over several steps
// with two weight-decay groups, parameters that miss a step, and a clip factor; its state round
// trip; Meshwork's kernel (its host loop) to rounding, and its fallback; the CUDA kernels (libtorch's
// fused one and Meshwork's) are in tests/gpu/fused_ops_gpu_test.cpp.
#include "trainer/train/adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainer/model/compat.h"
#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/weight_copies.h"

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

// libtorch's AdamW over p: the matrices decayed, the vectors not; betas (0.9, 0.95).
std::unique_ptr<torch::optim::AdamW> LibtorchAdamW(const Params& p, double eps = 1e-8) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(p.decay, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(eps).weight_decay(kWd)));
  groups.emplace_back(p.no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(eps).weight_decay(0)));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(kLr));
}

TEST(AdamWTest, EqualsLibtorchAdamWBitForBitOnTheCpu) {
  Params mine = MakeParams(1), theirs = MakeParams(1);
  AdamW opt({{mine.decay, kWd}, {mine.no_decay, 0.0}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8, {}});
  auto reference_owner = LibtorchAdamW(theirs);
  torch::optim::AdamW& reference = *reference_owner;
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
  AdamW opt_a({{a.decay, kWd}, {a.no_decay, 0.0}}, AdamWOptions{kLr, 0.9, 0.999, 1e-8, {}});
  AdamW opt_b({{b.decay, kWd}, {b.no_decay, 0.0}}, AdamWOptions{kLr, 0.9, 0.999, 1e-8, {}});
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
      if (s != nullptr) {
        EXPECT_NE(opt_b.State(pb[i])->exp_avg.data_ptr(), s->exp_avg.data_ptr());  // copied
      }
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

// Meshwork's kernel (its host loop here: the arithmetic the CUDA kernel runs, fused_adamw.h)
// against libtorch's AdamW over the same steps as above: equal to fp32 rounding, parameters and
// moments, including the 15- and 7-element parameters whose last elements miss a whole pack of 4.
// Its gradients are read, not scaled in place. An eps of 0.5 against gradients of size 1-4 makes
// where eps enters the denominator matter (at 1e-8 it would not).
void CheckMeshworkAgainstLibtorch(double eps) {
  SCOPED_TRACE("eps " + std::to_string(eps));
  Params mine = MakeParams(5), theirs = MakeParams(5);
  AdamWOptions options{kLr, 0.9, 0.95, eps, AdamWKernel::kMeshwork};
  AdamW opt({{mine.decay, kWd}, {mine.no_decay, 0.0}}, options);
  EXPECT_EQ(opt.KernelFor(torch::kCPU), "meshwork");
  auto reference_owner = LibtorchAdamW(theirs, eps);
  torch::optim::AdamW& reference = *reference_owner;
  for (int step = 0; step < 6; ++step) {
    const double lr = kLr * (step + 1) / 6;
    opt.set_lr(lr);
    for (auto& g : reference.param_groups()) g.options().set_lr(lr);
    SetGrads(mine, step);
    SetGrads(theirs, step);
    const double scale = step == 3 ? 0.25 : 1.0;
    std::vector<torch::Tensor> grads_before;
    for (auto& p : mine.all()) grads_before.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    {
      torch::NoGradGuard no_grad;
      for (auto& p : theirs.all())
        if (p.grad().defined()) p.mutable_grad().mul_(scale);
    }
    opt.Step(torch::full({1}, scale, torch::kDouble));
    reference.step();
    const auto a = mine.all(), b = theirs.all();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7))
          << "step " << step << " param " << i << ": " << (a[i] - b[i]).abs().max().item<float>();
      if (grads_before[i].defined()) {
        EXPECT_TRUE(torch::equal(a[i].grad(), grads_before[i])) << i;
      }
    }
  }
  const auto a = mine.all(), b = theirs.all();
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& theirs_state =
        static_cast<const torch::optim::AdamWParamState&>(
            *reference.state().at(compat::OptimizerStateKey(reference.state(), b[i])));
    // Moments of gradients of size 1-4: fp32 rounding, a few units in the last place of 1.
    EXPECT_TRUE(torch::allclose(opt.State(a[i])->exp_avg, theirs_state.exp_avg(), 1e-5, 1e-6))
        << i << ": " << (opt.State(a[i])->exp_avg - theirs_state.exp_avg()).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(opt.State(a[i])->exp_avg_sq, theirs_state.exp_avg_sq(), 1e-5, 1e-6))
        << i << ": " << (opt.State(a[i])->exp_avg_sq - theirs_state.exp_avg_sq()).abs().max().item<float>();
    EXPECT_EQ(opt.State(a[i])->step, theirs_state.step()) << i;
  }
}

TEST(AdamWTest, MeshworkKernelEqualsLibtorchAdamWToRounding) { CheckMeshworkAgainstLibtorch(1e-8); }
TEST(AdamWTest, MeshworkKernelPutsEpsWhereLibtorchDoes) { CheckMeshworkAgainstLibtorch(0.5); }

// A parameter Meshwork's kernel cannot take (not contiguous) gets foreach instead: bit-for-bit
// libtorch's.
TEST(AdamWTest, MeshworkKernelLeavesANonContiguousParameterToForeach) {
  torch::manual_seed(6);
  const auto base = torch::randn({6, 4});
  auto mine = base.clone().t().requires_grad_(true);
  auto theirs = base.clone().t().requires_grad_(true);
  ASSERT_FALSE(mine.is_contiguous());
  AdamW opt({{{mine}, kWd}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8, AdamWKernel::kMeshwork});
  torch::optim::AdamW reference(std::vector<torch::Tensor>{theirs},
                                torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(1e-8).weight_decay(kWd));
  for (int step = 0; step < 3; ++step) {
    const auto g = torch::randn({4, 6});
    mine.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    opt.Step();
    reference.step();
    EXPECT_TRUE(torch::equal(mine, theirs)) << step;
  }
}

// An FSDP shard is a view of its flat group at any element, its gradient a view of the reduced
// flat gradient at the same element. Meshwork's kernel gives the moments the shard's offset within
// a 16-byte line and takes 16-byte packs from the first common boundary (the elements before it
// and past the last pack one at a time): libtorch's AdamW to rounding, for each of the 4 offsets.
TEST(AdamWTest, MeshworkKernelTakesPacksOfAShardAtAnyOffset) {
  for (int64_t k = 0; k < 4; ++k) {
    SCOPED_TRACE("offset " + std::to_string(k));
    torch::manual_seed(7);
    const auto flat = torch::randn({64});
    auto mine = flat.clone().narrow(0, k, 37).detach().requires_grad_(true);
    auto theirs = flat.clone().narrow(0, k, 37).detach().requires_grad_(true);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(mine.data_ptr()) % 16, static_cast<uintptr_t>(4 * k));
    AdamW opt({{{mine}, kWd}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8, AdamWKernel::kMeshwork});
    torch::optim::AdamW reference(std::vector<torch::Tensor>{theirs},
                                  torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(1e-8).weight_decay(kWd));
    for (int step = 0; step < 3; ++step) {
      const auto reduced = torch::randn({64});
      mine.mutable_grad() = reduced.narrow(0, k, 37);
      theirs.mutable_grad() = reduced.narrow(0, k, 37).clone();
      const auto version = mine._version();
      opt.Step();
      reference.step();
      EXPECT_GT(mine._version(), version) << "the update bumps the parameter's version counter";
      EXPECT_TRUE(torch::allclose(mine, theirs, 1e-6, 1e-7)) << step << ": " << (mine - theirs).abs().max().item<float>();
    }
    const AdamWParamState state = *opt.State(mine);
    const auto arrays = {model::fused::PackArray{mine.data_ptr(), 4}, {mine.grad().data_ptr(), 4},
                         {state.exp_avg.data_ptr(), 4}, {state.exp_avg_sq.data_ptr(), 4}};
    EXPECT_EQ(model::fused::CommonPackStart(37, arrays), (4 - k) % 4);
    // A restored state keeps the offset.
    opt.SetState(mine, state);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(opt.State(mine)->exp_avg.data_ptr()) % 16, static_cast<uintptr_t>(4 * k));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(opt.State(mine)->exp_avg_sq.data_ptr()) % 16, static_cast<uintptr_t>(4 * k));
  }
}

// With the model's weight copies (weight_copies.h), Meshwork's kernel writes each weight's bf16
// copy in its update: current after every step and equal to the cast of the updated weight, the
// update itself unchanged. A copy the packs cannot write (its rows start off an 8-byte boundary)
// and copies under libtorch's kernels are left stale, and the next Stacked casts them again.
TEST(AdamWTest, MeshworkKernelWritesTheWeightCopies) {
  for (const AdamWKernel kernel : {AdamWKernel::kMeshwork, AdamWKernel::kForeach}) {
    SCOPED_TRACE(AdamWKernelName(kernel));
    torch::manual_seed(9);
    // a: 65 elements (packs and one loose element); b's rows start 130 bytes into the stack.
    const auto a0 = torch::randn({5, 13}), b0 = torch::randn({3, 13});
    auto a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    auto a_plain = a0.clone().requires_grad_(true), b_plain = b0.clone().requires_grad_(true);
    auto copies = std::make_shared<model::WeightCopies>(torch::kBFloat16);
    ASSERT_TRUE(copies->Stacked({a, b}).defined());
    AdamW opt({{{a, b}, kWd}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8, kernel});
    opt.SetWeightCopies(copies);
    AdamW plain({{{a_plain, b_plain}, kWd}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8, kernel});
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE(step);
      for (auto [mine, theirs] : {std::pair{a, a_plain}, std::pair{b, b_plain}}) {
        const auto g = torch::randn(mine.sizes());
        mine.mutable_grad() = g;
        theirs.mutable_grad() = g.clone();
      }
      opt.Step();
      plain.Step();
      EXPECT_TRUE(torch::equal(a, a_plain) && torch::equal(b, b_plain)) << "writing copies changes no update";
      EXPECT_EQ(copies->IsCurrent(a), kernel == AdamWKernel::kMeshwork);
      if (kernel == AdamWKernel::kMeshwork) {
        EXPECT_TRUE(torch::equal(copies->CopyOf(a), a.detach().to(torch::kBFloat16)));
      }
      EXPECT_FALSE(copies->IsCurrent(b));
      const auto stack = copies->Stacked({a, b});
      EXPECT_TRUE(torch::equal(stack, torch::cat({a.detach(), b.detach()}).to(torch::kBFloat16)));
      EXPECT_TRUE(copies->IsCurrent(a) && copies->IsCurrent(b));
    }
  }
}

// A weight one float into its buffer (its packs from element 3, as an FSDP shard's may be), its
// copy 13 elements into the stack, so that the copy's element 3 starts an 8-byte pack: the kernel
// writes the copy through the packs and the loose elements at both ends.
TEST(AdamWTest, MeshworkKernelWritesTheCopyOfAWeightOffItsLine) {
  torch::manual_seed(10);
  const auto flat = torch::randn({1 + 65});
  auto w = flat.clone().narrow(0, 1, 65).view({5, 13}).detach().requires_grad_(true);
  const auto pad = torch::randn({1, 13});
  auto copies = std::make_shared<model::WeightCopies>(torch::kBFloat16);
  ASSERT_TRUE(copies->Stacked({pad, w}).defined());
  AdamW opt({{{w}, kWd}}, AdamWOptions{kLr, 0.9, 0.95, 1e-8, AdamWKernel::kMeshwork});
  opt.SetWeightCopies(copies);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    w.mutable_grad() = torch::randn({1 + 65}).narrow(0, 1, 65).view({5, 13});
    opt.Step();
    const AdamWParamState& state = *opt.State(w);
    ASSERT_EQ(model::fused::CommonPackStart(65, {{w.data_ptr(), 4}, {w.grad().data_ptr(), 4},
                                                 {state.exp_avg.data_ptr(), 4}, {state.exp_avg_sq.data_ptr(), 4}}),
              3);
    EXPECT_TRUE(copies->IsCurrent(w));
    EXPECT_TRUE(torch::equal(copies->CopyOf(w), w.detach().to(torch::kBFloat16)));
  }
}

TEST(AdamWTest, KernelChoice) {
  EXPECT_EQ(AdamW::DefaultKernel(torch::kCPU), AdamWKernel::kForeach);
  const torch::Device cuda(torch::kCUDA, 0);
  const AdamWKernel on_cuda = model::FusedKernelsBuilt() ? AdamWKernel::kMeshwork
                              : TORCH_VERSION_MAJOR >= 2 ? AdamWKernel::kFused
                                                         : AdamWKernel::kForeach;
  EXPECT_EQ(AdamW::DefaultKernel(cuda), on_cuda);
  const AdamW plain({}, AdamWOptions{});
  EXPECT_EQ(plain.KernelFor(torch::kCPU), "foreach");
  EXPECT_EQ(plain.KernelFor(cuda), AdamWKernelName(on_cuda));
  // fused wherever libtorch has it, else the best that runs.
  const AdamW fused({}, AdamWOptions{1e-3, 0.9, 0.999, 1e-8, AdamWKernel::kFused});
  EXPECT_EQ(fused.KernelFor(torch::kCPU), "foreach");
  EXPECT_EQ(fused.KernelFor(cuda), TORCH_VERSION_MAJOR >= 2 ? "fused" : "foreach");
  const AdamW foreach_only({}, AdamWOptions{1e-3, 0.9, 0.999, 1e-8, AdamWKernel::kForeach});
  EXPECT_EQ(foreach_only.KernelFor(cuda), "foreach");
}

}  // namespace
}  // namespace meshwork::train
