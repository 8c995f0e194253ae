// Zero-bubble's split backward (trainer/pp/split_backward.h) against one backward of the same
// graph: I gives the input's gradient and accumulates no parameter's; W then gives every
// parameter's gradient, and the two together run each part of the backward once (the gradient
// flowing between the layers is not computed again in W). A weight used on both sides of a
// boundary, a custom autograd function (a norm computing its weight's gradient in its own
// backward), a first stage's cut-off embedding and a node that cannot split are covered.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "trainer/pp/split_backward.h"

namespace meshwork::pp {
namespace {

// y = x * g / rms(x), a custom function as the fused norms are: both gradients in one backward.
struct Norm : torch::autograd::Function<Norm> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& g) {
    const torch::Tensor inv = torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
    ctx->save_for_backward({x, g, inv});
    return x * inv * g;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const torch::Tensor &x = s[0], &g = s[1], &inv = s[2];
    const torch::Tensor n = x * inv;
    const torch::Tensor dn = grad[0] * g;
    const torch::Tensor dx = inv * (dn - n * (dn * n).mean(-1, true));
    const torch::Tensor dg = (grad[0] * n).reshape({-1, g.size(0)}).sum(0);
    return {dx, dg};
  }
};

struct Weights {
  torch::Tensor w1, w2, g, shared;
  std::vector<torch::Tensor> all() const { return {w1, w2, g, shared}; }
};

Weights MakeWeights() {
  torch::manual_seed(3);
  return {torch::randn({6, 5}).requires_grad_(), torch::randn({5, 6}).requires_grad_(),
          (torch::rand({6}) + 0.5).requires_grad_(), torch::randn({5, 5}).requires_grad_()};
}

// A stage: `shared` enters before and after the layers; `hidden` sees the gradient that flows
// between them each time one passes it.
torch::Tensor Stage(const Weights& w, const torch::Tensor& x, int* passes) {
  torch::Tensor h = torch::matmul(x, w.shared.t());
  h = torch::relu(torch::matmul(h, w.w1.t()));
  h.register_hook([passes](const torch::Tensor& g) {
    ++*passes;
    return g;
  });
  h = Norm::apply(h, w.g);
  h = torch::matmul(h, w.w2.t());
  return torch::tanh(torch::matmul(h, w.shared.t()));
}

struct Reference {
  torch::Tensor input_grad;
  std::vector<torch::Tensor> grads;
};

Reference OneBackward(const torch::Tensor& x0, const torch::Tensor& dy) {
  Weights w = MakeWeights();
  torch::Tensor x = x0.clone().requires_grad_();
  int passes = 0;
  Stage(w, x, &passes).backward(dy);
  Reference r{x.grad()};
  for (const auto& p : w.all()) r.grads.push_back(p.grad());
  return r;
}

TEST(SplitBackward, IThenWEqualOneBackwardAndRunEachPartOnce) {
  torch::manual_seed(5);
  const torch::Tensor x0 = torch::randn({2, 3, 5});
  const torch::Tensor dy = torch::randn({2, 3, 5});
  const Reference want = OneBackward(x0, dy);

  Weights w = MakeWeights();
  torch::Tensor x = x0.clone().requires_grad_();
  int passes = 0;
  torch::Tensor y = Stage(w, x, &passes);
  WeightBackward weight;
  torch::Tensor input_grad = BackwardInput(y, dy, x, w.all(), &weight);
  EXPECT_TRUE(torch::allclose(input_grad, want.input_grad, 1e-6, 1e-6));
  EXPECT_FALSE(x.grad().defined()) << "I accumulated into the input";
  for (const auto& p : w.all()) EXPECT_FALSE(p.grad().defined()) << "I accumulated a parameter's gradient";
  EXPECT_EQ(passes, 1);
  EXPECT_FALSE(weight.roots.empty());

  BackwardWeight(weight);
  EXPECT_EQ(passes, 1) << "W ran the backward between the layers again";
  const auto got = w.all();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(got[i].grad(), want.grads[i], 1e-5, 1e-6))
        << "parameter " << i << ": " << (got[i].grad() - want.grads[i]).abs().max().item<double>();
  }
}

// The first stage: its input leaf is cut from the embedding's output, whose backward (to the
// table) is W's.
TEST(SplitBackward, WRunsTheCutOffEmbeddingFromTheInputsGradient) {
  torch::manual_seed(6);
  const torch::Tensor table0 = torch::randn({10, 5});
  const torch::Tensor tokens = torch::randint(10, {2, 3});
  const torch::Tensor dy = torch::randn({2, 3, 5});
  int passes = 0;

  Weights ref = MakeWeights();
  torch::Tensor ref_table = table0.clone().requires_grad_();
  Stage(ref, torch::embedding(ref_table, tokens), &passes).backward(dy);

  Weights w = MakeWeights();
  torch::Tensor table = table0.clone().requires_grad_();
  torch::Tensor embedded = torch::embedding(table, tokens);
  torch::Tensor input = embedded.detach().requires_grad_();
  std::vector<torch::Tensor> params = w.all();
  params.push_back(table);
  WeightBackward weight;
  torch::Tensor input_grad = BackwardInput(Stage(w, input, &passes), dy, input, params, &weight);
  EXPECT_FALSE(table.grad().defined());
  BackwardWeight(weight, embedded, input_grad);
  ASSERT_TRUE(table.grad().defined());
  EXPECT_TRUE(torch::allclose(table.grad(), ref_table.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(w.w1.grad(), ref.w1.grad(), 1e-5, 1e-6));
}

// A node that makes its parameters' gradients inside its own backward, with no edge to them
// (activation checkpointing's recompute), cannot split: I runs it whole, and W still adds the
// rest, so the sum is right.
struct Held : torch::CustomClassHolder {
  torch::Tensor w;  // not an input of the function: no edge to it
};

struct Opaque : torch::autograd::Function<Opaque> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, c10::intrusive_ptr<Held> held) {
    const torch::Tensor w = held->w;
    ctx->saved_data["held"] = c10::IValue::make_capsule(std::move(held));
    ctx->save_for_backward({x});
    return torch::matmul(x, w.detach().t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    torch::Tensor w = c10::static_intrusive_pointer_cast<Held>(ctx->saved_data["held"].toCapsule())->w;
    const torch::Tensor x = ctx->get_saved_variables()[0];
    torch::Tensor dw = torch::matmul(grad[0].reshape({-1, w.size(0)}).t(), x.reshape({-1, w.size(1)}));
    if (w.grad().defined()) {
      w.mutable_grad().add_(dw);
    } else {
      w.mutable_grad() = dw;
    }
    return {torch::matmul(grad[0], w.detach()), torch::Tensor()};
  }
};

TEST(SplitBackward, ANodeThatCannotSplitRunsWholeInI) {
  torch::manual_seed(7);
  torch::Tensor inner0 = torch::randn({5, 5});
  const torch::Tensor x0 = torch::randn({2, 3, 5});
  const torch::Tensor dy = torch::randn({2, 3, 5});
  Weights ref = MakeWeights();
  torch::Tensor ref_inner = inner0.clone().requires_grad_();
  torch::Tensor ref_x = x0.clone().requires_grad_();
  int passes = 0;
  auto ref_held = c10::make_intrusive<Held>();
  ref_held->w = ref_inner;
  Stage(ref, Opaque::apply(ref_x, ref_held), &passes).backward(dy);

  Weights w = MakeWeights();
  torch::Tensor inner = inner0.clone().requires_grad_();
  torch::Tensor x = x0.clone().requires_grad_();
  std::vector<torch::Tensor> params = w.all();
  params.push_back(inner);
  WeightBackward weight;
  auto held = c10::make_intrusive<Held>();
  held->w = inner;
  torch::Tensor input_grad = BackwardInput(Stage(w, Opaque::apply(x, held), &passes), dy, x, params, &weight);
  ASSERT_TRUE(inner.grad().defined()) << "the opaque node's gradient is I's";
  BackwardWeight(weight);
  EXPECT_TRUE(torch::allclose(input_grad, ref_x.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(inner.grad(), ref_inner.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(w.shared.grad(), ref.shared.grad(), 1e-5, 1e-6));
}

}  // namespace
}  // namespace meshwork::pp
