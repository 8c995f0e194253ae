// The modelled Llama module table: parameters match the model's, modules come in forward
// order, byte sizes follow the dtypes and the shard padding, compute follows the FLOP count.
#include <gtest/gtest.h>

#include <string>

#include "trainer/compiler/frontend.h"

namespace meshwork::compiler {
namespace {

model::LlamaConfig Preset(const std::string& name) {
  auto c = model::PresetConfig(name);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

LlamaShape ShapeOf(const model::LlamaConfig& config) {
  LlamaShape s;
  s.config = config;
  s.batch = 2;
  s.seq_len = 64;
  return s;
}

// Elements over all parameters, each counted once (a tied output projection is param 0).
int64_t Elements(const Graph& g, int param_bytes) {
  int64_t n = 0;
  for (const auto& p : g.params) n += p.gathered_bytes / param_bytes;
  return n;
}

TEST(LlamaSkeletonTest, ParameterCountMatchesTheModel) {
  for (bool tied : {false, true}) {
    model::LlamaConfig c = Preset("llama3-8b");
    c.tie_word_embeddings = tied;
    const Graph g = LlamaSkeleton(ShapeOf(c));
    EXPECT_EQ(Elements(g, 2), c.NumParameters()) << "tied " << tied;
    EXPECT_EQ(g.params.size(), static_cast<size_t>(1 + 9 * c.num_hidden_layers + 1 + (tied ? 0 : 1)));
  }
}

TEST(LlamaSkeletonTest, ModulesComeInForwardOrderWithHfParameterNames) {
  const model::LlamaConfig c = Preset("tiny");  // 4 layers, tied
  const Graph g = LlamaSkeleton(ShapeOf(c));
  ASSERT_EQ(g.modules.size(), 6u);
  EXPECT_EQ(g.modules[0].name, "embed");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.modules[1 + i].name, "layers." + std::to_string(i));
  EXPECT_EQ(g.modules[5].name, "head");
  EXPECT_TRUE(g.ops.empty());

  ASSERT_EQ(g.modules[0].params, std::vector<int>{0});
  EXPECT_EQ(g.params[0].name, "model.embed_tokens.weight");
  const char* layer_params[] = {"input_layernorm.weight",   "self_attn.q_proj.weight",
                                "self_attn.k_proj.weight",  "self_attn.v_proj.weight",
                                "self_attn.o_proj.weight",  "post_attention_layernorm.weight",
                                "mlp.gate_proj.weight",     "mlp.up_proj.weight",
                                "mlp.down_proj.weight"};
  for (int i = 0; i < 4; ++i) {
    const ModuleInfo& m = g.modules[1 + i];
    ASSERT_EQ(m.params.size(), 9u);
    for (int j = 0; j < 9; ++j) {
      EXPECT_EQ(m.params[j], 1 + 9 * i + j);
      EXPECT_EQ(g.params[m.params[j]].name, "model.layers." + std::to_string(i) + "." + layer_params[j]);
    }
  }
  // Tied: the head's output projection is the embedding.
  const ModuleInfo& head = g.modules[5];
  ASSERT_EQ(head.params.size(), 2u);
  EXPECT_EQ(g.params[head.params[0]].name, "model.norm.weight");
  EXPECT_EQ(head.params[1], 0);
  EXPECT_EQ(g.FindModule("layers.3"), 4);
}

TEST(LlamaSkeletonTest, UntiedHeadHasItsOwnOutputProjection) {
  model::LlamaConfig c = Preset("tiny");
  c.tie_word_embeddings = false;
  const Graph g = LlamaSkeleton(ShapeOf(c));
  const ModuleInfo& head = g.modules.back();
  ASSERT_EQ(head.params.size(), 2u);
  EXPECT_EQ(g.params[head.params[0]].name, "model.norm.weight");
  EXPECT_EQ(g.params[head.params[1]].name, "lm_head.weight");
  EXPECT_EQ(head.params[1], static_cast<int>(g.params.size()) - 1);
}

TEST(LlamaSkeletonTest, BytesFollowTheDtypes) {
  const model::LlamaConfig c = Preset("tiny");
  LlamaShape s = ShapeOf(c);
  s.param_bytes = 2;
  s.reduce_bytes = 4;
  const Graph bf16 = LlamaSkeleton(s);
  s.param_bytes = 4;
  s.reduce_bytes = 2;
  const Graph fp32 = LlamaSkeleton(s);
  ASSERT_EQ(bf16.params.size(), fp32.params.size());
  for (size_t i = 0; i < bf16.params.size(); ++i) {
    EXPECT_EQ(fp32.params[i].gathered_bytes, 2 * bf16.params[i].gathered_bytes) << bf16.params[i].name;
    EXPECT_EQ(bf16.params[i].grad_bytes, 2 * fp32.params[i].grad_bytes) << bf16.params[i].name;
    EXPECT_EQ(fp32.params[i].shard_bytes, bf16.params[i].shard_bytes) << "the master shard is fp32 either way";
  }
  // q_proj of tiny: 128 x 128.
  EXPECT_EQ(bf16.params[2].gathered_bytes, 128 * 128 * 2);
  EXPECT_EQ(bf16.params[2].grad_bytes, 128 * 128 * 4);
}

TEST(LlamaSkeletonTest, ShardsAreFp32FlatGroupsByOwner) {
  const model::LlamaConfig c = Preset("tiny");  // vocab 320, hidden 128, kv dim 64
  LlamaShape s = ShapeOf(c);
  s.dp_shard = 3;
  s.dp_replicate = 2;
  const Graph g = LlamaSkeleton(s);
  EXPECT_EQ(g.dp_shard, 3);
  EXPECT_EQ(g.dp_replicate, 2);
  // A parameter's share of its flat group, sharded as one vector over dp_shard.
  EXPECT_EQ(g.params[0].shard_bytes, (320 * 128 + 2) / 3 * 4);
  EXPECT_EQ(g.params[1].shard_bytes, (128 + 2) / 3 * 4);      // input_layernorm
  EXPECT_EQ(g.params[3].shard_bytes, (64 * 128 + 2) / 3 * 4);  // k_proj
  // Flat groups by owner: the embedding, each layer, the final norm and the untied head.
  EXPECT_EQ(g.params[0].group, 0);
  for (size_t i = 1; i < g.params.size(); ++i) {
    const std::string& name = g.params[i].name;
    if (name.rfind("model.layers.", 0) == 0) {
      EXPECT_EQ(g.params[i].group, 1 + std::stoi(name.substr(13))) << name;
    } else {
      EXPECT_EQ(g.params[i].group, g.FindModule("head")) << name;
    }
  }
  s.dp_shard = 1;
  const Graph whole = LlamaSkeleton(s);
  for (const auto& p : whole.params) EXPECT_EQ(p.shard_bytes, p.gathered_bytes * 2) << p.name;  // bf16 -> fp32
}

TEST(LlamaSkeletonTest, ComputeFollowsTheFlopCount) {
  const model::LlamaConfig c = Preset("llama3-8b");
  LlamaShape s = ShapeOf(c);
  s.seq_len = 8192;
  s.batch = 1;
  s.flops_per_second = 4e14;
  const Graph g = LlamaSkeleton(s);
  double fwd = 0;
  for (const auto& m : g.modules) {
    // The head's backward recomputes its logits chunk by chunk (the loss is fused with it).
    EXPECT_DOUBLE_EQ(m.bwd_seconds, (m.name == "head" ? 3 : 2) * m.fwd_seconds) << m.name;
    fwd += m.fwd_seconds;
  }
  ASSERT_EQ(g.modules.back().name, "head");
  EXPECT_EQ(g.modules.front().fwd_seconds, 0.0);  // the embedding is a lookup
  // Forward + backward is the model's training FLOPs, less the norms' elementwise work, which
  // LlamaConfig counts as 6 FLOPs per norm weight and the skeleton leaves out.
  const double tokens = 8192;
  const double norm_params = static_cast<double>(2 * c.hidden_size * c.num_hidden_layers + c.hidden_size);
  const double expected = c.TrainingFlopsPerToken(8192) * tokens - 6 * norm_params * tokens;
  // The model's FLOPs leave the recompute out (as MFU does): the head's third matmul is extra.
  const double head_recompute = g.modules.back().fwd_seconds;
  EXPECT_NEAR((3 * fwd) * s.flops_per_second / expected, 1.0, 1e-9);
  EXPECT_NEAR(head_recompute * s.flops_per_second, 2.0 * tokens * c.hidden_size * c.vocab_size, 1.0);
}

TEST(LlamaSkeletonTest, AStoredLogitGradientTradesTheRecomputeForTokensTimesVocab) {
  const model::LlamaConfig c = Preset("llama3-8b");
  LlamaShape s = ShapeOf(c);
  s.seq_len = 8192;
  s.batch = 1;
  const Graph recomputed = LlamaSkeleton(s);
  s.head_stores_logit_grad = true;
  const Graph stored = LlamaSkeleton(s);
  const ModuleInfo& a = recomputed.modules.back();
  const ModuleInfo& b = stored.modules.back();
  ASSERT_EQ(b.name, "head");
  EXPECT_DOUBLE_EQ(b.fwd_seconds, a.fwd_seconds);
  EXPECT_DOUBLE_EQ(b.bwd_seconds, 2 * b.fwd_seconds);
  EXPECT_EQ(b.activation_bytes - a.activation_bytes, int64_t{8192} * c.vocab_size * s.activation_bytes);
  for (size_t i = 0; i + 1 < stored.modules.size(); ++i) {
    EXPECT_EQ(stored.modules[i].activation_bytes, recomputed.modules[i].activation_bytes) << stored.modules[i].name;
  }
}

TEST(LlamaSkeletonTest, ActivationsScaleWithTokensAndDtype) {
  const model::LlamaConfig c = Preset("llama3-8b");
  LlamaShape s = ShapeOf(c);
  s.batch = 1;
  s.seq_len = 1024;
  const Graph one = LlamaSkeleton(s);
  s.batch = 2;
  const Graph two = LlamaSkeleton(s);
  for (size_t m = 0; m < one.modules.size(); ++m) {
    EXPECT_GT(one.modules[m].activation_bytes, 0) << one.modules[m].name;
    EXPECT_EQ(two.modules[m].activation_bytes, 2 * one.modules[m].activation_bytes) << one.modules[m].name;
  }
  const int64_t tokens = 1024;
  // embed: the residual stream it outputs, in bf16.
  EXPECT_EQ(one.modules.front().activation_bytes, tokens * c.hidden_size * 2);
  // head: the inputs of the final norm and of the projection, and one fp32 log-sum-exp per
  // token; never the logits (the loss is fused with the projection).
  EXPECT_EQ(one.modules.back().activation_bytes, tokens * (2 * c.hidden_size * 2 + 4));
  // A layer: (7 h + 2 kv + 4 i) elements per token in bf16, plus an fp32 logsumexp per head.
  const int64_t kv = c.num_key_value_heads * c.head_dim();
  EXPECT_EQ(one.modules[1].activation_bytes,
            tokens * ((7 * c.hidden_size + 2 * kv + 4 * c.intermediate_size) * 2 + 4 * c.num_attention_heads));
  // An fp32 residual stream under bf16 (training.residual_dtype: fp32): the two norms' inputs,
  // the embedding's output, the head's norm input and a checkpointed layer's input in fp32.
  LlamaShape wide = s;
  wide.batch = 1;
  wide.residual_bytes = 4;
  const Graph fp32_stream = LlamaSkeleton(wide);
  EXPECT_EQ(fp32_stream.modules[1].activation_bytes - one.modules[1].activation_bytes, tokens * 2 * c.hidden_size * 2);
  EXPECT_EQ(fp32_stream.modules.front().activation_bytes, tokens * c.hidden_size * 4);
  EXPECT_EQ(fp32_stream.modules.back().activation_bytes - one.modules.back().activation_bytes, tokens * c.hidden_size * 2);
  EXPECT_EQ(fp32_stream.modules[1].checkpoint_input_bytes, 2 * one.modules[1].checkpoint_input_bytes);
  s.batch = 1;
  s.activation_bytes = 4;
  const Graph fp32 = LlamaSkeleton(s);
  EXPECT_GT(fp32.modules[1].activation_bytes, one.modules[1].activation_bytes);
}

}  // namespace
}  // namespace meshwork::compiler

namespace meshwork::compiler {
namespace {

// Per-layer activation checkpointing: a layer keeps only its input, recomputes its forward in
// backward and holds its full activations while that backward runs; embed and head unchanged.
TEST(LlamaSkeletonTest, ActivationCheckpointingKeepsLayerInputsAndRecomputes) {
  LlamaShape shape = ShapeOf(Preset("llama3-8b"));
  const Graph plain = LlamaSkeleton(shape);
  shape.activation_checkpointing = true;
  const Graph ac = LlamaSkeleton(shape);
  ASSERT_EQ(plain.modules.size(), ac.modules.size());
  const int64_t input_bytes = shape.batch * shape.seq_len * shape.config.hidden_size * shape.activation_bytes;
  for (size_t m = 0; m < ac.modules.size(); ++m) {
    const ModuleInfo& a = ac.modules[m];
    const ModuleInfo& p = plain.modules[m];
    if (a.name.rfind("layers.", 0) != 0) {
      EXPECT_EQ(a.activation_bytes, p.activation_bytes) << a.name;
      EXPECT_EQ(a.backward_workspace_bytes, 0) << a.name;
      EXPECT_DOUBLE_EQ(a.bwd_seconds, p.bwd_seconds) << a.name;
      continue;
    }
    EXPECT_EQ(a.activation_bytes, input_bytes) << a.name;
    EXPECT_EQ(a.backward_workspace_bytes, p.activation_bytes) << a.name;
    EXPECT_DOUBLE_EQ(a.bwd_seconds, p.bwd_seconds + p.fwd_seconds) << a.name;
    EXPECT_DOUBLE_EQ(a.fwd_seconds, p.fwd_seconds) << a.name;
  }
  // The text form carries the workspace (ws=) and round-trips.
  auto back = Parse(Print(ac));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Print(*back), Print(ac));
  EXPECT_EQ(back->modules[1].backward_workspace_bytes, ac.modules[1].backward_workspace_bytes);
}

}  // namespace
}  // namespace meshwork::compiler
