// WeightCopies (trainer/model/weight_copies.h): a stack of bf16 copies is the cast of its weights,
// reused while they are unchanged and rewritten when they change in place or get new storage;
// a copy the optimizer marks written is reused as written; and a graph that saved a copy since
// rewritten fails in backward instead of using the new values; stacks of freed weights go.
#include "trainer/model/weight_copies.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "trainer/model/mixed_linear.h"

namespace meshwork::model {
namespace {

torch::Tensor Cast(const std::vector<torch::Tensor>& weights) {
  std::vector<torch::Tensor> parts;
  for (const auto& w : weights) parts.push_back(w.detach().to(torch::kBFloat16));
  return torch::cat(parts, 0);
}

TEST(WeightCopies, AStackIsTheCastWeightsReusedWhileTheyAreUnchanged) {
  torch::manual_seed(1);
  const auto q = torch::randn({8, 16}).requires_grad_(true);
  const auto k = torch::randn({4, 16}).requires_grad_(true);
  WeightCopies copies(torch::kBFloat16);
  const torch::Tensor first = copies.Stacked({q, k});
  ASSERT_TRUE(first.defined());
  EXPECT_EQ(first.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(first, Cast({q, k})));
  EXPECT_EQ(copies.bytes(), 12 * 16 * 2);
  EXPECT_TRUE(copies.IsCurrent(q) && copies.IsCurrent(k));
  const auto version = first._version();
  const torch::Tensor again = copies.Stacked({q, k});
  EXPECT_EQ(again.data_ptr(), first.data_ptr());
  EXPECT_EQ(again._version(), version) << "an unchanged stack is not written again";
  // Each weight's copy is its rows of the stack.
  EXPECT_EQ(copies.CopyOf(k).data_ptr(), first.narrow(0, 8, 4).data_ptr());
  EXPECT_TRUE(copies.CopyOf(k).is_contiguous());
}

TEST(WeightCopies, AWeightChangedInPlaceOrGivenNewStorageIsCopiedAgain) {
  torch::manual_seed(2);
  const auto q = torch::randn({8, 16}).requires_grad_(true);
  const auto k = torch::randn({4, 16}).requires_grad_(true);
  WeightCopies copies(torch::kBFloat16);
  copies.Stacked({q, k});
  {
    torch::NoGradGuard no_grad;
    k.add_(1.0);  // bumps k's version counter
  }
  EXPECT_TRUE(copies.IsCurrent(q));
  EXPECT_FALSE(copies.IsCurrent(k));
  EXPECT_TRUE(torch::equal(copies.Stacked({q, k}), Cast({q, k})));
  // New storage (a checkpoint load may swap it) with the same version count.
  q.set_data(torch::randn({8, 16}));
  EXPECT_FALSE(copies.IsCurrent(q));
  EXPECT_TRUE(torch::equal(copies.Stacked({q, k}), Cast({q, k})));
}

TEST(WeightCopies, ACopyMarkedWrittenIsReusedAsWritten) {
  const auto w = torch::randn({4, 8}).requires_grad_(true);
  WeightCopies copies(torch::kBFloat16);
  const torch::Tensor stack = copies.Stacked({w});
  // What the optimizer does: update the weight, write its copy, bump the weight's version.
  torch::Tensor copy = copies.CopyOf(w);
  {
    torch::NoGradGuard no_grad;
    copy.fill_(3.0);
  }
  w.unsafeGetTensorImpl()->bump_version();
  EXPECT_FALSE(copies.IsCurrent(w));
  const auto version = stack._version();
  copies.MarkWritten(w);
  EXPECT_TRUE(copies.IsCurrent(w));
  EXPECT_GT(stack._version(), version) << "marking a copy written advances its version counter";
  EXPECT_TRUE(torch::equal(copies.Stacked({w}), torch::full({4, 8}, 3.0, torch::kBFloat16)))
      << "a copy marked current is taken as written, not cast again";
}

TEST(WeightCopies, WeightsThatCannotHaveCopiesGetNone) {
  WeightCopies copies(torch::kBFloat16);
  EXPECT_FALSE(copies.Stacked({torch::randn({4, 8}, torch::kDouble)}).defined());
  EXPECT_FALSE(copies.Stacked({torch::randn({8})}).defined());
  EXPECT_FALSE(copies.Stacked({torch::randn({4, 8}), torch::randn({4, 6})}).defined());
  EXPECT_FALSE(copies.Stacked({}).defined());
  // A weight already in another stack.
  const auto a = torch::randn({4, 8}), b = torch::randn({2, 8});
  ASSERT_TRUE(copies.Stacked({a, b}).defined());
  EXPECT_FALSE(copies.Stacked({b}).defined());
  EXPECT_FALSE(copies.CopyOf(torch::randn({4, 8})).defined());
}

// Stacks of freed weights are dropped when the next stack is made: their buffers go, and a new
// weight never finds a freed one's copy.
TEST(WeightCopies, StacksOfFreedWeightsAreDropped) {
  WeightCopies copies(torch::kBFloat16);
  {
    const auto gone = torch::randn({64, 8});
    ASSERT_TRUE(copies.Stacked({gone}).defined());
    EXPECT_EQ(copies.bytes(), 64 * 8 * 2);
  }
  const auto kept = torch::randn({4, 8});
  ASSERT_TRUE(copies.Stacked({kept}).defined());
  EXPECT_EQ(copies.bytes(), 4 * 8 * 2);
  EXPECT_TRUE(copies.IsCurrent(kept));
}

// MixedLinear saves the stack for backward: rewriting it before that backward (the weight
// changed in between) is an error autograd reports, not a gradient from the new values.
TEST(WeightCopies, AGraphThatSavedACopySinceRewrittenFailsInBackward) {
  const auto w = torch::randn({4, 8}).requires_grad_(true);
  const auto x = torch::randn({3, 8}).to(torch::kBFloat16).requires_grad_(true);
  WeightCopies copies(torch::kBFloat16);
  const auto y = MixedLinear(x, {w}, &copies);
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);
  }
  MixedLinear(x, {w}, &copies);  // rewrites the copy
  EXPECT_THROW(y.sum().backward(), c10::Error);
}

}  // namespace
}  // namespace meshwork::model
