// Activation checkpointing (Recompute): gradients of a checkpointed decoder layer and of a whole
// checkpointed model equal plain autograd's; the block runs again in backward and not at all
// more without gradients; what forward keeps is the input alone.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "trainer/model/llama.h"
#include "trainer/model/recompute.h"

namespace meshwork::model {
namespace {

LlamaConfig TinyConfig() {
  LlamaConfig c;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  return c;
}

std::map<std::string, torch::Tensor> Grads(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : m.named_parameters()) {
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor();
  }
  return out;
}

TEST(RecomputeTest, DecoderLayerGradientsEqualPlainAutograd) {
  torch::manual_seed(3);
  const LlamaConfig c = TinyConfig();
  DecoderLayer layer(c);
  const RopeTables rope = MakeRopeTables(c, 8, torch::kCPU);
  const torch::Tensor x0 = torch::randn({2, 8, c.hidden_size});
  const torch::Tensor weight = torch::randn({2, 8, c.hidden_size});

  torch::Tensor x = x0.clone().requires_grad_(true);
  (layer->forward(x, rope) * weight).sum().backward();
  const auto plain = Grads(*layer);
  const torch::Tensor plain_x = x.grad().clone();
  layer->zero_grad();

  torch::Tensor y = x0.clone().requires_grad_(true);
  int runs = 0;
  torch::Tensor out = Recompute(
      [&](const torch::Tensor& h) {
        ++runs;
        return layer->forward(h, rope);
      },
      y);
  EXPECT_EQ(runs, 1);
  ASSERT_TRUE(out.requires_grad());
  (out * weight).sum().backward();
  EXPECT_EQ(runs, 2) << "backward runs the block again";
  EXPECT_TRUE(torch::allclose(y.grad(), plain_x, 1e-5, 1e-6));
  for (const auto& [name, g] : Grads(*layer)) {
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_TRUE(torch::allclose(g, plain.at(name), 1e-5, 1e-6)) << name;
  }
}

TEST(RecomputeTest, ForwardKeepsOnlyTheInput) {
  // The graph holds one node for the whole block, whose only edge is the input: none of the
  // block's operations (and so none of the activations they would save) were recorded.
  const LlamaConfig c = TinyConfig();
  DecoderLayer layer(c);
  const RopeTables rope = MakeRopeTables(c, 8, torch::kCPU);
  torch::Tensor x = torch::randn({1, 8, c.hidden_size}).requires_grad_(true);
  torch::Tensor out = Recompute([&](const torch::Tensor& h) { return layer->forward(h, rope); }, x);
  ASSERT_NE(out.grad_fn(), nullptr);
  ASSERT_EQ(out.grad_fn()->next_edges().size(), 1u);
  EXPECT_EQ(out.grad_fn()->next_edges()[0].function.get(), torch::autograd::impl::gradient_edge(x).function.get());
}

TEST(RecomputeTest, WithoutGradientsTheBlockRunsOnce) {
  const LlamaConfig c = TinyConfig();
  DecoderLayer layer(c);
  const RopeTables rope = MakeRopeTables(c, 8, torch::kCPU);
  int runs = 0;
  auto block = [&](const torch::Tensor& h) {
    ++runs;
    return layer->forward(h, rope);
  };
  torch::Tensor x = torch::randn({1, 8, c.hidden_size}).requires_grad_(true);
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(Recompute(block, x).requires_grad());
  }
  // An input that needs no gradient: checkpointing would lose the parameters' gradients, so the
  // block runs plainly and they still arrive.
  torch::Tensor out = Recompute(block, torch::randn({1, 8, c.hidden_size}));
  out.sum().backward();
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(layer->mlp->down_proj->weight.grad().defined());
}

TEST(RecomputeTest, CheckpointedModelMatchesPlainModel) {
  torch::manual_seed(5);
  const LlamaConfig c = TinyConfig();
  LlamaForCausalLM model(c);
  model->InitWeights(0.02);
  const torch::Tensor tokens = torch::randint(c.vocab_size, {2, 8});
  const torch::Tensor targets = torch::randint(c.vocab_size, {2, 8});

  const torch::Tensor plain_loss = CausalLmLoss(model->forward(tokens), targets);
  plain_loss.backward();
  const auto plain = Grads(*model);
  model->zero_grad();

  // Every other layer checkpointed: plain and recomputed layers mixed in one graph.
  const torch::Tensor logits = model->ForwardWithLayerRunner(
      tokens, [](int64_t i, DecoderLayerImpl& layer, const torch::Tensor& h, const RopeTables& rope) {
        if (i % 2 == 1) return layer.forward(h, rope);
        return CheckpointedLayer(layer, h, rope);
      });
  const torch::Tensor loss = CausalLmLoss(logits, targets);
  EXPECT_NEAR(loss.item<double>(), plain_loss.item<double>(), 1e-6);
  loss.backward();
  for (const auto& [name, g] : Grads(*model)) {
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_TRUE(torch::allclose(g, plain.at(name), 1e-5, 1e-7)) << name;
  }
}

}  // namespace
}  // namespace meshwork::model
