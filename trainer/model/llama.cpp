#include "trainer/model/llama.h"

#include <torch/torch.h>

#include <cmath>

#include "trainer/model/compat.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/linear_cross_entropy.h"
#include "trainer/model/mixed_linear.h"
#include "trainer/model/weight_copies.h"

namespace meshwork::model {

namespace F = torch::nn::functional;

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Normalise in fp32 whatever the activation dtype, as HF's LlamaRMSNorm does.
  return compat::RmsNorm(x, weight, eps_);
}

torch::Tensor RopeInverseFrequencies(const LlamaConfig& c) {
  const int64_t d = c.head_dim();
  auto exponents = torch::arange(0, d, 2, torch::kDouble) / static_cast<double>(d);
  auto inv_freq = 1.0 / torch::pow(c.rope_theta, exponents);
  if (c.rope_scaling.enabled()) {
    // Llama 3's frequency-dependent scaling: long wavelengths are divided by `factor`, short
    // ones kept, and the band between is interpolated smoothly.
    const auto& s = c.rope_scaling;
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_len / s.low_freq_factor;
    const double high_wavelen = old_len / s.high_freq_factor;
    auto wavelen = 2.0 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
    auto smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = torch::where(medium, smoothed, scaled);
  }
  return inv_freq.to(torch::kFloat);
}

RopeTables MakeRopeTables(const LlamaConfig& c, int64_t seq_len, const torch::Device& device) {
  auto inv_freq = RopeInverseFrequencies(c).to(torch::kDouble);
  auto pos = torch::arange(seq_len, torch::kDouble);
  auto freqs = torch::outer(pos, inv_freq);  // [seq, head_dim/2]
  auto emb = torch::cat({freqs, freqs}, -1);  // [seq, head_dim]
  RopeTables t{emb.cos().to(torch::kFloat).to(device), emb.sin().to(torch::kFloat).to(device), {}, {}, {}};
  t.cos_bf16 = t.cos.to(torch::kBFloat16);
  t.sin_bf16 = t.sin.to(torch::kBFloat16);
  return t;
}

namespace {
// One split, not two narrows: the split's backward is one cat of the halves' gradients, where
// each narrow's backward zero-fills a whole-size tensor and the two are then added (a CPU
// profile of a step counted 16 such slice backwards against PyTorch's 8 split backwards).
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}
}  // namespace

torch::Tensor ApplyRope(const torch::Tensor& x, const RopeTables& rope) {
  const int64_t seq = x.size(-2);
  // The tables in x's dtype: cast when they were made, not at every call.
  const bool bf16 = x.scalar_type() == torch::kBFloat16 && rope.cos_bf16.defined();
  auto cos = (bf16 ? rope.cos_bf16 : rope.cos).narrow(0, 0, seq).to(x.scalar_type());
  auto sin = (bf16 ? rope.sin_bf16 : rope.sin).narrow(0, 0, seq).to(x.scalar_type());
  return x * cos + RotateHalf(x) * sin;
}

AttentionImpl::AttentionImpl(const LlamaConfig& c) : head_dim_(c.head_dim()) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  q_proj = register_module("q_proj", linear(c.hidden_size, c.num_attention_heads * head_dim_));
  k_proj = register_module("k_proj", linear(c.hidden_size, c.num_key_value_heads * head_dim_));
  v_proj = register_module("v_proj", linear(c.hidden_size, c.num_key_value_heads * head_dim_));
  o_proj = register_module("o_proj", linear(c.num_attention_heads * head_dim_, c.hidden_size));
}

torch::Tensor MergedWeight(std::initializer_list<torch::Tensor> weights, const torch::Tensor& x) {
  const auto dtype = compat::MatmulDtype(x);
  std::vector<torch::Tensor> parts;
  parts.reserve(weights.size());
  for (const torch::Tensor& w : weights) parts.push_back(w.to(dtype));
  return torch::cat(parts, 0);
}

// x times the stacked rows of `weights`: with `fused` and fp32 weights under autocast, by
// MixedLinear (one cast into the stacked weight, fp32 weight gradients from the GEMM itself);
// otherwise the composition, F::linear over MergedWeight. MixedLinear reads `copies` (null: none).
torch::Tensor StackedLinear(const torch::Tensor& x, std::initializer_list<torch::Tensor> weights, bool fused,
                            WeightCopies* copies) {
  if (fused && MixedLinearApplies(x, *weights.begin())) return MixedLinear(x, weights, copies);
  if (weights.size() == 1) return F::linear(x, *weights.begin());
  return F::linear(x, MergedWeight(weights, x));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RopeTables& rope) {
  const int64_t heads = q_proj->weight.size(0) / head_dim_;
  const int64_t kv_heads = k_proj->weight.size(0) / head_dim_;
  // Overlapped tensor parallelism: x is this rank's part of the stream, entered by the q/k/v GEMM.
  const bool overlap = region != nullptr && region->Overlapped();
  auto stacked_qkv = [&] {
    return overlap ? region->enter_project(x, torch::cat({q_proj->weight, k_proj->weight, v_proj->weight}))
                   : StackedLinear(x, {q_proj->weight, k_proj->weight, v_proj->weight}, fused, weight_copies);
  };
  torch::Tensor q, k, v;
  int64_t b = x.size(0), t = x.size(1);
  if ((merged || overlap) && fused) {
    // One op from the GEMM output to attention's inputs and back (FusedQkvRope).
    const auto projected = stacked_qkv();
    b = projected.size(0), t = projected.size(1);
    const auto qkv = FusedQkvRope(projected, heads, kv_heads, rope.cos, rope.sin);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    if (merged || overlap) {
      const auto projected = stacked_qkv();
      b = projected.size(0), t = projected.size(1);
      const auto qkv = projected.split_with_sizes({heads * head_dim_, kv_heads * head_dim_, kv_heads * head_dim_}, -1);
      q = qkv[0], k = qkv[1], v = qkv[2];
    } else {
      q = q_proj(x), k = k_proj(x), v = v_proj(x);
    }
    q = q.view({b, t, heads, head_dim_}).transpose(1, 2);
    k = k.view({b, t, kv_heads, head_dim_}).transpose(1, 2);
    v = v.view({b, t, kv_heads, head_dim_}).transpose(1, 2);
    q = fused ? FusedRope(q, rope.cos, rope.sin) : ApplyRope(q, rope);
    k = fused ? FusedRope(k, rope.cos, rope.sin) : ApplyRope(k, rope);
  }
  // Grouped-query attention: each kv head serves num_heads / num_kv_heads query heads.
  auto y = rope.attention_mask.defined() ? compat::MaskedAttention(q, k, v, rope.attention_mask)
                                         : compat::CausalAttention(q, k, v);  // [b, heads, t, head_dim]
  y = y.transpose(1, 2).contiguous().view({b, t, heads * head_dim_});
  if (overlap) return region->project_exit(y, o_proj->weight);
  return merged ? StackedLinear(y, {o_proj->weight}, fused, weight_copies) : o_proj(y);
}

MlpImpl::MlpImpl(const LlamaConfig& c) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  // Overlapped tensor parallelism: x is this rank's part of the stream, entered by the gate/up
  // GEMM, and down's GEMM leaves.
  if (region != nullptr && region->Overlapped()) {
    const auto gate_up = region->enter_project(x, torch::cat({gate_proj->weight, up_proj->weight}));
    torch::Tensor hidden;
    if (fused) {
      hidden = FusedSwiGlu(gate_up);
    } else {
      const auto halves = gate_up.chunk(2, -1);
      hidden = F::silu(halves[0]) * halves[1];
    }
    return region->project_exit(hidden, down_proj->weight);
  }
  if (!merged) return down_proj(F::silu(gate_proj(x)) * up_proj(x));
  const auto gate_up = StackedLinear(x, {gate_proj->weight, up_proj->weight}, fused, weight_copies);
  if (fused) return StackedLinear(FusedSwiGlu(gate_up), {down_proj->weight}, fused, weight_copies);
  const auto halves = gate_up.chunk(2, -1);
  return down_proj(F::silu(halves[0]) * halves[1]);
}

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", Attention(c));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", Mlp(c));
  self_attn->region = &region;
  mlp->region = &region;
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const RopeTables& rope) {
  const auto out_dtype = compat::MatmulDtype(x);
  // Overlapped, the modules enter and leave the region themselves (ParallelRegion).
  const bool overlap = region.Overlapped();
  auto attend = [&](const torch::Tensor& normed) {
    return overlap ? self_attn(normed, rope) : region.Exit(self_attn(region.Enter(normed), rope));
  };
  auto mlp_of = [&](const torch::Tensor& normed) { return overlap ? mlp(normed) : region.Exit(mlp(region.Enter(normed))); };
  if (fused && FusedRmsNormSupports(x, torch::Tensor(), out_dtype)) {
    // x goes on through the first norm, so that its gradient from the residual add arrives in
    // that norm's backward kernel rather than in an add of autograd's.
    const auto [through, normed_x] = FusedRmsNormPassingX(x, input_layernorm->weight, input_layernorm->eps(), out_dtype);
    const auto attention = attend(normed_x);
    if (FusedRmsNormSupports(through, attention, out_dtype)) {
      const auto [h, normed] = FusedAddRmsNorm(through, attention, post_attention_layernorm->weight,
                                               post_attention_layernorm->eps(), out_dtype);
      return h + mlp_of(normed);
    }
    const auto h = through + attention;
    return h + mlp_of(post_attention_layernorm(h));
  }
  auto h = x + attend(input_layernorm(x));
  return h + mlp_of(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c) : config_(c) {
  model = register_module("model", LlamaModel(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
  }
}

torch::Tensor LlamaForCausalLMImpl::OutputWeight() {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

void LlamaForCausalLMImpl::set_merged_projections(bool merged) {
  for (size_t i = 0; i < model->layers->size(); ++i) {
    auto& layer = *model->layers[i]->as<DecoderLayer>();
    layer.self_attn->merged = merged;
    layer.mlp->merged = merged;
  }
}

void LlamaForCausalLMImpl::set_fused_kernels(bool fused) {
  for (size_t i = 0; i < model->layers->size(); ++i) {
    auto& layer = *model->layers[i]->as<DecoderLayer>();
    layer.fused = fused;
    layer.self_attn->fused = fused;
    layer.mlp->fused = fused;
  }
  fused_ = fused;
}

void LlamaForCausalLMImpl::set_weight_copies(std::shared_ptr<WeightCopies> copies) {
  weight_copies_ = std::move(copies);
  for (size_t i = 0; i < model->layers->size(); ++i) {
    auto& layer = *model->layers[i]->as<DecoderLayer>();
    layer.self_attn->weight_copies = weight_copies_.get();
    layer.mlp->weight_copies = weight_copies_.get();
  }
}

const RopeTables& LlamaForCausalLMImpl::Rope(int64_t seq_len, const torch::Device& device) {
  // Tables are cached per (length, device): recomputing them every step costs time for nothing.
  if (rope_len_ < seq_len || rope_.cos.device() != device) {
    rope_ = MakeRopeTables(config_, seq_len, device);
    rope_len_ = seq_len;
  }
  return rope_;
}

torch::Tensor LlamaForCausalLMImpl::Embed(const torch::Tensor& tokens, bool head_is_ours) {
  const torch::Tensor& table = model->embed_tokens->weight;
  if (fused_ && head_is_ours && config_.tie_word_embeddings && table.scalar_type() == torch::kFloat &&
      torch::GradMode::is_enabled()) {
    return EmbeddingWithSparseGradient(table, tokens);
  }
  return model->embed_tokens(tokens);
}

torch::Tensor LlamaForCausalLMImpl::OutputWeightIn(const torch::Tensor& hidden) {
  return MatmulWeights(weight_copies_.get(), {OutputWeight()}, compat::MatmulDtype(hidden));
}

torch::Tensor LlamaForCausalLMImpl::ToResidualDtype(const torch::Tensor& embedded) const {
  if (!residual_dtype_ || embedded.scalar_type() == *residual_dtype_) return embedded;
  if (!embedded.is_cuda() || !compat::CurrentCudaAutocast().enabled) return embedded;
  return embedded.to(*residual_dtype_);
}

torch::Tensor LlamaForCausalLMImpl::FinalNorm(const torch::Tensor& h) {
  const auto out_dtype = compat::MatmulDtype(h);
  if (fused_ && FusedRmsNormSupports(h, torch::Tensor(), out_dtype)) {
    return FusedRmsNorm(h, model->norm->weight, model->norm->eps(), out_dtype);
  }
  return model->norm(h);
}

namespace {
torch::Tensor PlainLayer(int64_t, DecoderLayerImpl& layer, const torch::Tensor& h, const RopeTables& rope) {
  return layer.forward(h, rope);
}
}  // namespace

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens) {
  return ForwardWithLayerRunner(tokens, PlainLayer);
}

torch::Tensor LlamaForCausalLMImpl::Loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  return ForwardWithLayerRunner(tokens, PlainLayer, targets);
}

torch::Tensor LlamaForCausalLMImpl::ForwardWithLayerRunner(const torch::Tensor& tokens, const LayerRunner& run_layer,
                                                           const torch::Tensor& targets, const EmbedRunner& embed,
                                                           const LossRunner& loss) {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  TORCH_CHECK(tokens.size(1) <= config_.max_position_embeddings, "sequence length ",
              tokens.size(1), " exceeds max_position_embeddings ", config_.max_position_embeddings);
  RopeTables rope = Rope(tokens.size(1), tokens.device());  // tensors shared with the cache
  if (document_separator_) rope.attention_mask = DocumentMask(tokens, *document_separator_);
  // A sparse lookup gradient only where this model's own head adds the table's dense one.
  auto h = ToResidualDtype(embed ? embed(tokens) : Embed(tokens, /*head_is_ours=*/!(targets.defined() && loss)));
  for (size_t i = 0; i < model->layers->size(); ++i) {
    h = run_layer(static_cast<int64_t>(i), *model->layers[i]->as<DecoderLayer>(), h, rope);
  }
  h = FinalNorm(h);
  if (targets.defined() && loss) return loss(h, targets);
  if (targets.defined()) {
    return LinearCrossEntropy(h, OutputWeight(), targets, loss_chunk_rows_, loss_gradient_, fused_,
                              OutputWeightIn(h));
  }
  return torch::matmul(h, OutputWeight().t());
}

torch::Tensor LlamaForCausalLMImpl::EmbedForStage(const torch::Tensor& tokens, const EmbedRunner& embed) {
  return ToResidualDtype(embed ? embed(tokens) : Embed(tokens, /*head_is_ours=*/false));
}

torch::Tensor LlamaForCausalLMImpl::ForwardStage(const torch::Tensor& tokens, const torch::Tensor& input, int64_t begin,
                                                int64_t end, const torch::Tensor& targets, const EmbedRunner& embed,
                                                const LossRunner& loss, const LayerRunner& run_layer) {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  TORCH_CHECK(0 <= begin && begin <= end && end <= static_cast<int64_t>(model->layers->size()), "layers [", begin, ", ",
              end, ") are not within the model's ", model->layers->size());
  RopeTables rope = Rope(tokens.size(1), tokens.device());
  if (document_separator_) rope.attention_mask = DocumentMask(tokens, *document_separator_);
  // The table's lookup gradient stays dense: the head that would absorb a sparse one is on another
  // stage, usually another rank.
  torch::Tensor h = input.defined() ? input : EmbedForStage(tokens, embed);
  for (int64_t i = begin; i < end; ++i) {
    DecoderLayerImpl& layer = *model->layers[static_cast<size_t>(i)]->as<DecoderLayer>();
    h = run_layer ? run_layer(i, layer, h, rope) : layer.forward(h, rope);
  }
  if (!targets.defined()) return h;
  h = FinalNorm(h);
  if (loss) return loss(h, targets);
  return LinearCrossEntropy(h, OutputWeight(), targets, loss_chunk_rows_, loss_gradient_, fused_, OutputWeightIn(h));
}

void LlamaForCausalLMImpl::InitWeights(double std) {
  torch::NoGradGuard no_grad;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(config_.num_hidden_layers));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (p.dim() == 1) {
      p.fill_(1.0);  // RMSNorm gains
    } else if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos) {
      p.normal_(0.0, residual_std);
    } else {
      p.normal_(0.0, std);
    }
  }
}

torch::Tensor DocumentMask(const torch::Tensor& tokens, int64_t separator) {
  torch::NoGradGuard no_grad;
  const int64_t t = tokens.size(1);
  const auto ends = tokens.eq(separator);
  const auto document = ends.cumsum(1) - ends.to(torch::kLong);  // separators strictly before
  const auto same = document.unsqueeze(2).eq(document.unsqueeze(1));
  const auto causal = torch::ones({t, t}, tokens.options().dtype(torch::kBool)).tril();
  return same.logical_and(causal).unsqueeze(1);
}

torch::Tensor CausalLmLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t vocab = logits.size(-1);
  return F::cross_entropy(logits.reshape({-1, vocab}).to(torch::kFloat), targets.reshape({-1}));
}

}  // namespace meshwork::model
