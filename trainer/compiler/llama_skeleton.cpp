// LlamaSkeleton: the module table of a Llama decoder under FSDP with compute and activation
// memory modelled from the dimensions, for the simulator and for planning before a trace.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "trainer/compiler/frontend.h"

namespace meshwork::compiler {
namespace {

// One FSDP parameter: a [rows, row_numel] tensor (norm weights are [hidden], row_numel 1).
struct ParamShape {
  std::string name;
  int64_t rows = 0;
  int64_t row_numel = 1;
};

ParamInfo Describe(const ParamShape& s, const LlamaShape& shape) {
  const int64_t numel = s.rows * s.row_numel;
  const int64_t shard = static_cast<int64_t>(shape.dp_shard);
  ParamInfo p;
  p.name = s.name;
  p.gathered_bytes = numel * shape.param_bytes;
  p.grad_bytes = numel * shape.reduce_bytes;
  // The fp32 master shard: the runtime shards each flat group (GroupByOwner) as one vector,
  // padded to a multiple of dp_shard; a parameter's share of it.
  p.shard_bytes = (numel + shard - 1) / shard * 4;
  return p;
}

}  // namespace

Graph LlamaSkeleton(const LlamaShape& shape) {
  const model::LlamaConfig& c = shape.config;
  const int64_t h = c.hidden_size;
  const int64_t kv = c.num_key_value_heads * c.head_dim();
  const int64_t inter = c.intermediate_size;
  const int64_t vocab = c.vocab_size;
  const double tokens = static_cast<double>(shape.batch) * static_cast<double>(shape.seq_len);
  const double seq = static_cast<double>(shape.seq_len);
  // Tensor parallelism: a rank's share of what is split (heads, MLP width, vocabulary), and of
  // the residual stream (its tokens, under sequence parallelism).
  const int64_t tp = std::max(1, shape.tp);
  const double split = 1.0 / static_cast<double>(tp);
  const double stream = tp > 1 && shape.sequence_parallel ? split : 1.0;

  Graph g;
  g.dp_shard = shape.dp_shard;
  g.dp_replicate = shape.dp_replicate;
  g.tp = static_cast<int>(tp);
  auto add_param = [&](const ParamShape& s) {
    g.params.push_back(Describe(s, shape));
    return static_cast<int>(g.params.size()) - 1;
  };
  auto add_module = [&](std::string name, std::vector<int> params, double fwd_flops, double activation_bytes) {
    ModuleInfo m;
    m.name = std::move(name);
    m.params = std::move(params);
    m.fwd_seconds = fwd_flops / shape.flops_per_second;
    m.bwd_seconds = 2 * m.fwd_seconds;  // gradients for inputs and for weights: two matmuls per forward one
    m.activation_bytes = static_cast<int64_t>(activation_bytes);
    g.modules.push_back(std::move(m));
  };

  const double residual_bytes = shape.residual_bytes > 0 ? shape.residual_bytes : shape.activation_bytes;
  const double a = shape.activation_bytes;
  // A region's exchange of the stream [tokens, h] in `bytes` per element: under sequence
  // parallelism an all-gather entering it and a reduce-scatter leaving it (each the whole
  // stream), without an all-reduce leaving it (counted twice: TpExchange); backward mirrors it.
  const bool sp = shape.sequence_parallel;
  auto stream_bytes = [&](double bytes) { return static_cast<int64_t>(tokens * h * bytes); };
  // Embedding: a gather, no FLOPs worth counting. What it keeps is its output, the residual
  // stream entering layer 0. Split by vocabulary over tp: each rank's partial rows are summed
  // into the stream (a reduce-scatter under sequence parallelism, else an all-reduce); backward
  // all-gathers the stream's gradient under sequence parallelism.
  const int embed = add_param({"model.embed_tokens.weight", vocab / tp, h});
  // Its rows for this rank's tokens, fp32 (what a row_gather fetches, a row_reduce sums); a
  // tp-split table is read through tensor parallelism's own lookup instead.
  if (tp == 1) g.params[embed].row_bytes = static_cast<int64_t>(tokens) * h * 4;
  add_module("embed", {embed}, 0.0, tokens * h * residual_bytes * stream);
  if (tp > 1) {
    g.modules.back().tp_fwd = {stream_bytes(residual_bytes) * (sp ? 1 : 2), 1};
    if (sp) g.modules.back().tp_bwd = {stream_bytes(residual_bytes), 1};
  }

  // Decoder layers. Forward FLOPs are 2 per multiply-add of each matmul: the seven projections
  // (2 · tokens · in · out each), plus attention scores (Q·Kᵀ) and values (P·V), 2 · batch ·
  // seq² · hidden each. The causal mask is not halved here (as PaLM's 6N + 12·L·h·s count
  // and LlamaConfig::TrainingFlopsPerToken do), so MFU figures stay comparable.
  const double linear_flops = 2.0 * tokens * (2.0 * h * h + 2.0 * h * kv + 3.0 * h * inter) * split;
  const double attention_flops = 4.0 * tokens * seq * h * split;
  // Activations kept for backward, counted tensor by tensor as Korthikanti et al. ("Reducing
  // Activation Recomputation in Large Transformer Models", 2022, section 4.1) do for GPT,
  // without any recompute, but for this model's layer as the GPU build runs it: no dropout
  // (so no masks), RMSNorm, SwiGLU MLP, and attention through scaled_dot_product_attention,
  // whose fused (flash) kernel keeps no seq² score or probability tensor — the paper's 5·a·s²·b
  // term is absent. Per token, in the residual stream's dtype:
  //   2h  inputs of the two RMSNorms (the layer's input and the attention block's sum)
  // and in activation dtype:
  //   h   input of q/k/v projections (one tensor, shared)
  //   2h + 2kv  SDPA's saved q, k, v and output (k and v at kv width: libtorch >= 2.5 reads
  //       grouped-query heads as they are, compat::CausalAttention)
  //   h   input of o_proj (the output made contiguous: a second copy)
  //   h   input of gate/up projections (shared)
  //   4i  gate output (SiLU input), SiLU output, up output, down_proj input
  // (5h + 2kv + 4i)
  // plus SDPA's logsumexp, fp32 per head. RMSNorm's internal fp32 tensors, rotary tables and
  // residual adds (which keep nothing) are not counted.
  // Under tensor parallelism a rank keeps 1/tp of the heads' and the MLP's tensors, the whole
  // inputs of q/k/v and of gate/up (gathered, when the stream is split: the matmuls save them),
  // and of the norms' inputs its tokens (sequence parallelism) or all of them.
  // Attention spelled out (libtorch 1.13 on the CPU: compat::CausalAttention) keeps instead the
  // fp32 probabilities, batch x heads x seq², and k and v widened to every head.
  const double heads = static_cast<double>(c.num_attention_heads) * split;
  const double attention_extra =
      shape.attention_keeps_probabilities
          ? static_cast<double>(shape.batch) * heads * seq * seq * 4.0 + tokens * 2.0 * (h - kv) * split * a -
                tokens * 4.0 * heads
          : 0.0;
  const double layer_activation =
      tokens * (2.0 * h * residual_bytes * stream + 2.0 * h * a + (3.0 * h + 2.0 * kv + 4.0 * inter) * split * a +
                4.0 * heads) +
      attention_extra;
  // Two regions (attention, MLP), each exchanging the stream once each way (in the matmuls'
  // dtype); the matmuls next to them are the layer's linear compute.
  const TpExchange layer_exchange = {2 * stream_bytes(a) * 2, sp ? 4 : 2};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    std::vector<int> params = {
        // A tp rank's slices: q/k/v and gate/up by rows, o and down by input columns.
        add_param({p + "input_layernorm.weight", h, 1}),
        add_param({p + "self_attn.q_proj.weight", h / tp, h}),
        add_param({p + "self_attn.k_proj.weight", kv / tp, h}),
        add_param({p + "self_attn.v_proj.weight", kv / tp, h}),
        add_param({p + "self_attn.o_proj.weight", h, h / tp}),
        add_param({p + "post_attention_layernorm.weight", h, 1}),
        add_param({p + "mlp.gate_proj.weight", inter / tp, h}),
        add_param({p + "mlp.up_proj.weight", inter / tp, h}),
        add_param({p + "mlp.down_proj.weight", h, inter / tp}),
    };
    add_module("layers." + std::to_string(i), std::move(params), linear_flops + attention_flops, layer_activation);
    ModuleInfo& m = g.modules.back();
    m.checkpoint_input_bytes = static_cast<int64_t>(tokens * h * residual_bytes * stream);  // the layer's input
    if (tp > 1) {
      m.tp_fwd = m.tp_bwd = layer_exchange;
      m.tp_gemm_share = linear_flops / (linear_flops + attention_flops);
    }
    // Unfused attention's backward holds the gradients of the probabilities and of the scores
    // (fp32, batch x heads x seq² each) for a moment.
    if (shape.attention_keeps_probabilities)
      m.backward_temp_bytes = static_cast<int64_t>(2.0 * static_cast<double>(shape.batch) * heads * seq * seq * 4.0);
    if (shape.activation_checkpointing) Checkpoint(m);
  }

  // Head: final norm and output projection (the embedding itself when tied), fused with the
  // loss (model/linear_cross_entropy.h). Keeps the inputs of the norm and of the projection and
  // one fp32 log-sum-exp per token, not the logits. Its backward either recomputes each chunk's
  // logits (bwd = 3 x fwd) or, with head_stores_logit_grad, uses the logits' gradient its
  // forward kept (tokens x vocab more memory; bwd = 2 x fwd). Inside its compute it holds one
  // chunk of fp32 logits for a moment (transient_bytes; chunks of at most 256 MiB, as
  // model::LossChunkRows makes them by default), or split by vocabulary, a chunk over this rank's
  // rows for every rank's tokens (vocab_transient_bytes).
  const int norm = add_param({"model.norm.weight", h, 1});
  const int output = c.tie_word_embeddings ? embed : add_param({"lm_head.weight", vocab / tp, h});
  constexpr double kChunkBytes = 256.0 * 1024 * 1024;
  // Tokens a chunk of kChunkBytes of fp32 logits over `vocab_rows` rows (model::LossChunkRows).
  auto chunk_rows = [&](double vocab_rows) { return std::max(1.0, std::floor(kChunkBytes / (vocab_rows * 4.0))); };
  // One chunk of fp32 logits over `vocab_rows` rows, `rows` tokens at most.
  auto chunk_bytes = [&](double rows_of_tokens, double vocab_rows, double rows) {
    return static_cast<int64_t>(std::min(rows_of_tokens, rows) * vocab_rows * 4.0);
  };
  if (tp > 1) {
    // Tensor parallelism's vocabulary-parallel loss (trainer/tp): the stream gathered whole (under
    // sequence parallelism), this rank's vocabulary's fp32 logits a chunk of tokens at a time
    // (tp times the one-process head's tokens, the same bytes), keeping one fp32 log-sum-exp per
    // token; backward recomputes each chunk (bwd = 3 x fwd). Forward exchanges the stream, every
    // rank's log-sum-exp (fp32 per token) and the target logit (an all-reduce), backward the
    // stream's gradient.
    add_module("head", {norm, output}, 2.0 * tokens * h * vocab * split,
               tokens * (h * residual_bytes * stream + h * a + 4.0));
    ModuleInfo& head = g.modules.back();
    head.bwd_seconds = 3 * head.fwd_seconds;
    head.transient_bytes = chunk_bytes(tokens, static_cast<double>(vocab) * split,
                                       chunk_rows(static_cast<double>(vocab)) * static_cast<double>(tp));
    const int64_t per_token = static_cast<int64_t>(tokens) * 4;
    head.tp_fwd = {(sp ? stream_bytes(a) : 0) + per_token * tp + 2 * per_token, sp ? 3 : 2};
    head.tp_bwd = {stream_bytes(a) * (sp ? 1 : 2), 1};
    // Its exchanges are not overlapped: the log-sum-exp and target-logit exchanges need the
    // matmul's result, and the trainer overlaps only the decoder layers' regions.
    head.tp_gemm_share = 0.0;
    GroupByOwner(g);
    return g;
  }
  double head_bytes = tokens * (h * residual_bytes + h * shape.activation_bytes + 4.0);
  if (shape.head_stores_logit_grad) head_bytes += tokens * vocab * shape.activation_bytes;
  add_module("head", {norm, output}, 2.0 * tokens * h * vocab, head_bytes);
  g.modules.back().bwd_seconds = (shape.head_stores_logit_grad ? 2 : 3) * g.modules.back().fwd_seconds;
  const double owned = std::ceil(static_cast<double>(vocab) / std::max(1, shape.dp_shard));
  g.modules.back().transient_bytes =
      chunk_bytes(tokens, static_cast<double>(vocab), chunk_rows(static_cast<double>(vocab)));
  g.modules.back().vocab_transient_bytes = chunk_bytes(tokens * std::max(1, shape.dp_shard), owned, chunk_rows(owned));
  GroupByOwner(g);
  return g;
}

}  // namespace meshwork::compiler
