// Llama-style decoder-only transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU) for a
// single device. Module and parameter names are exactly Hugging Face's LlamaForCausalLM names
// ("model.layers.3.self_attn.q_proj.weight"), and rotary embeddings use HF's rotate_half layout,
// so HF checkpoints map one to one. Model code knows nothing of process groups or sharding.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>

#include "trainer/model/llama_config.h"
#include "trainer/model/linear_cross_entropy.h"
#include "trainer/model/weight_copies.h"

namespace meshwork::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  double eps() const { return eps_; }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Rotary position embedding tables (cos, sin) for positions [0, seq_len), [seq_len, head_dim],
// in HF's layout: the two halves of the head dim rotate together (rotate_half).
// What every decoder layer's attention reads besides the hidden states: the rotary tables and,
// where documents are masked, which keys each query may attend.
struct RopeTables {
  torch::Tensor cos;  // fp32
  torch::Tensor sin;
  torch::Tensor cos_bf16;  // the same, cast once: bf16 q and k (autocast) use these
  torch::Tensor sin_bf16;
  // Set for one forward when the model masks documents (set_document_separator): bool
  // [batch, 1, seq, seq], true where the query (row) may attend the key (column): causal and in
  // the same document. Undefined: plain causal attention.
  torch::Tensor attention_mask;
};
torch::Tensor RopeInverseFrequencies(const LlamaConfig& c);
RopeTables MakeRopeTables(const LlamaConfig& c, int64_t seq_len, const torch::Device& device);
// x: [batch, heads, seq, head_dim].
torch::Tensor ApplyRope(const torch::Tensor& x, const RopeTables& rope);

// Linear weights [out_i, in] stacked into one [sum out_i, in] for input x, each cast first to the
// dtype x's matmul runs in (compat::MatmulDtype: the copy autocast would make of each).
torch::Tensor MergedWeight(std::initializer_list<torch::Tensor> weights, const torch::Tensor& x);

// Where a tensor-parallel plan (trainer/tp/tensor_parallel.h) enters and leaves the parts of a
// decoder layer whose weights it splits over its ranks: `enter` takes the normed input of attention
// and of the MLP (as this rank holds it) to what their first projections read, `exit` takes
// their output projection's result (this rank's partial sum) back to the residual stream's form.
// Empty: identity (one process, FSDP). The model calls them without knowing what they exchange.
//
// Overlapped (async) tensor parallelism: while `overlapped()` says so for this forward, the region
// is entered fused with its first projection and left fused with its last, so that the plan can
// split each exchange and its matmul into chunks that overlap: `enter_project(x, w)` is the
// entered x (from this rank's part) times w^T, shaped [batch, seq, rows of w], and
// `project_exit(y, w)` is y times w^T, left. The attention and MLP modules call them in place of
// Enter + their first projection and their last projection + Exit.
struct ParallelRegion {
  std::function<torch::Tensor(const torch::Tensor&)> enter, exit;
  std::function<bool()> overlapped;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> enter_project, project_exit;
  torch::Tensor Enter(const torch::Tensor& x) const { return enter ? enter(x) : x; }
  torch::Tensor Exit(const torch::Tensor& y) const { return exit ? exit(y) : y; }
  bool Overlapped() const { return overlapped && overlapped(); }
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // q, k and v from one GEMM over their weights concatenated (MergedWeight), not three: the
  // input is cast to bf16 once under autocast, and backward gets its gradient from one GEMM
  // instead of three gradients summed. The parameters stay three (HF's names and layout).
  bool merged = true;
  // Rotary embedding of q and k by FusedRope (fused_ops.h) instead of ApplyRope's composition,
  // and, with merged, the split of the q/k/v GEMM's output and the rotation by FusedQkvRope,
  // and the q/k/v and output projections by MixedLinear (mixed_linear.h) where it applies (fp32
  // weights under autocast).
  bool fused = false;
  // With fused, the projections' persistent weight copies (weight_copies.h), or null.
  WeightCopies* weight_copies = nullptr;
  // Its decoder layer's region (DecoderLayerImpl::region), when overlapped: the q/k/v projection
  // enters it and the output projection leaves it.
  const ParallelRegion* region = nullptr;

 private:
  // The heads are counted from the projections' rows at each forward: a tensor-parallel plan
  // leaves each rank a run of whole query heads and the key/value heads they read.
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  bool merged = true;  // gate and up from one GEMM, as AttentionImpl::merged
  // silu(gate) * up by FusedSwiGlu (fused_ops.h) over the merged GEMM's output, and the
  // gate/up and down projections by MixedLinear where it applies; separate projections (merged
  // false) always take the composition.
  bool fused = false;
  WeightCopies* weight_copies = nullptr;  // as AttentionImpl::weight_copies
  const ParallelRegion* region = nullptr;  // as AttentionImpl::region
};
TORCH_MODULE(Mlp);


class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope);
  // Around attention and the MLP: identity unless a tensor-parallel plan set it.
  ParallelRegion region;

  RMSNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Mlp mlp{nullptr};
  // The two norms by FusedRmsNorm and FusedAddRmsNorm (fused_ops.h): the attention block's
  // residual add joins the second norm, and both write the dtype their matmuls run in. Where
  // the dtypes or the width do not qualify (FusedRmsNormSupports), the composition.
  bool fused = false;
};
TORCH_MODULE(DecoderLayer);

// HF's LlamaModel: embeddings, layers, final norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& c);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

// Runs decoder layer `index` on hidden states `h`. The default calls the layer; a parallel plan
// (FSDP) substitutes its own to gather the layer's parameters around the call, so the model
// itself never mentions process groups.
using LayerRunner = std::function<torch::Tensor(int64_t index, DecoderLayerImpl& layer,
                                                const torch::Tensor& h, const RopeTables& rope)>;

// The hidden states for `tokens` [batch, seq]: [batch, seq, hidden].
using EmbedRunner = std::function<torch::Tensor(const torch::Tensor& tokens)>;

// The mean loss of the final norm's output `hidden` [batch, seq, hidden] against `targets`
// [batch, seq]: the output head and the cross-entropy together.
using LossRunner = std::function<torch::Tensor(const torch::Tensor& hidden, const torch::Tensor& targets)>;

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const LlamaConfig& c);

  // tokens: int64 [batch, seq] -> logits [batch, seq, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  // The same with each decoder layer run by `run_layer` (one name, not an overload of forward:
  // ModuleHolder's operator() needs forward to be unique). With `targets` (int64 [batch, seq]),
  // returns the mean loss instead of the logits, through LinearCrossEntropy: the logits never
  // exist whole (linear_cross_entropy.h).
  // With `embed`, the hidden states entering layer 0 are embed(tokens) instead of the embedding
  // table's rows (FSDP's compiled plan hands the rows it fetched for these tokens). With `loss`
  // and targets, the loss is loss(hidden, targets) instead of LinearCrossEntropy over the output
  // weight (FSDP's compiled plan splitting the head by vocabulary).
  torch::Tensor ForwardWithLayerRunner(const torch::Tensor& tokens, const LayerRunner& run_layer,
                                       const torch::Tensor& targets = {}, const EmbedRunner& embed = {},
                                       const LossRunner& loss = {});
  // Mean token cross-entropy of the model on (tokens, targets), the logits never whole.
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets);
  // One pipeline stage's part of the forward (trainer/pp): the embedding of `tokens` when `input`
  // is undefined (the first stage), else from the previous stage's hidden states `input`; then
  // decoder layers [begin, end); with `targets` (the last stage) the final norm and the mean loss,
  // as Loss computes them, else the hidden states to pass on. `tokens` is needed on every stage:
  // attention's rotary tables and document mask come from it. `embed` and `loss` replace the
  // embedding and the head + loss as in ForwardWithLayerRunner (tensor parallelism's), and
  // `run_layer` runs each decoder layer (activation checkpointing) when set.
  torch::Tensor ForwardStage(const torch::Tensor& tokens, const torch::Tensor& input, int64_t begin, int64_t end,
                             const torch::Tensor& targets, const EmbedRunner& embed = {},
                             const LossRunner& loss = {}, const LayerRunner& run_layer = {});
  // The first stage's input: the embedding of `tokens` in the residual stream's dtype, as
  // ForwardStage computes it without `input` (`embed` in place of the model's own).
  torch::Tensor EmbedForStage(const torch::Tensor& tokens, const EmbedRunner& embed = {});
  const LlamaConfig& config() const { return config_; }
  // Rows per chunk of the fused head + loss (<= 0: LossChunkRows(vocab)).
  void set_loss_chunk_rows(int64_t rows) { loss_chunk_rows_ = rows; }
  int64_t loss_chunk_rows() const { return loss_chunk_rows_ > 0 ? loss_chunk_rows_ : LossChunkRows(config_.vocab_size); }
  // How the fused head + loss gets the logits' gradient for backward (linear_cross_entropy.h).
  void set_loss_gradient(HeadGradient gradient) { loss_gradient_ = gradient; }
  // Every layer's AttentionImpl::merged and MlpImpl::merged (training.merge_projections).
  void set_merged_projections(bool merged);
  // Every layer's DecoderLayerImpl::fused, AttentionImpl::fused and MlpImpl::fused, and the
  // stored head gradient's fused softmax (LinearCrossEntropy's fused_softmax)
  // (training.fused_kernels).
  void set_fused_kernels(bool fused);
  // Persistent copies of the weights in the matmul's dtype that the fused projections and the
  // output head read instead of casting the fp32 weights each forward (weight_copies.h;
  // training.weight_copies); null: none. Shared with the optimizer, which writes them.
  void set_weight_copies(std::shared_ptr<WeightCopies> copies);
  // Under CUDA autocast, the residual stream (the embedding's output, so every decoder layer's
  // input and output) in `dtype` (training.residual_dtype): bf16 halves what the stream reads,
  // writes and keeps for backward; the fused norms still add and normalise in fp32, rounding
  // once. nullopt, and always without autocast: the embedding's own dtype (fp32 weights: fp32;
  // FSDP's gathered bf16 weights: bf16).
  void set_residual_dtype(std::optional<torch::ScalarType> dtype) { residual_dtype_ = dtype; }
  std::optional<torch::ScalarType> residual_dtype() const { return residual_dtype_; }
  HeadGradient loss_gradient() const { return loss_gradient_; }
  // Packed documents attend only within themselves (data.document_masking): a token's document
  // is the number of `separator` tokens before it (the separator ends its own document), and
  // attention is causal within a document. nullopt: causal over the whole window. Positions are
  // not reset: RoPE makes attention depend on distances only, so a masked document computes what
  // it would alone.
  void set_document_separator(std::optional<int64_t> separator) { document_separator_ = separator; }
  std::optional<int64_t> document_separator() const { return document_separator_; }

  // Initialises every weight from a normal(0, std) (residual output projections scaled by
  // 1/sqrt(2·layers), as GPT-2 does) and norms to one. Deterministic under torch::manual_seed.
  void InitWeights(double std);

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  torch::Tensor OutputWeight();
  // The output weight in the head's matmul dtype over `hidden`: its current copy where this
  // model keeps copies (set_weight_copies), else cast now (MatmulWeights).
  torch::Tensor OutputWeightIn(const torch::Tensor& hidden);
  const RopeTables& Rope(int64_t seq_len, const torch::Device& device);
  // The token embedding's rows for `tokens`. With the fused kernels and a tied fp32 table, the
  // table's gradient from the lookup is sparse (the batch's rows only, coalesced:
  // EmbeddingWithSparseGradient): autograd adds it in place into the head's dense gradient of
  // the same table, where a dense one is a whole zero-filled table (1 GB at llama3-1b) added
  // whole. Untied, the lookup's gradient would be the table's only one and must be dense (the
  // optimizer's), so it stays dense; so does a table whose head is not this model's own
  // (`head_is_ours` false: FSDP's vocabulary-split head keeps the table's head gradient apart),
  // and FSDP's gathered bf16 table keeps the dense path (the sparse one is checked in fp32 only).
  torch::Tensor Embed(const torch::Tensor& tokens, bool head_is_ours);
  // The embedding's output in the residual stream's dtype (set_residual_dtype).
  torch::Tensor ToResidualDtype(const torch::Tensor& embedded) const;
  // The final norm: with the fused kernels, one pass that also rounds to the head's matmul
  // dtype (FusedRmsNorm); otherwise the RMSNorm module.
  torch::Tensor FinalNorm(const torch::Tensor& h);

  LlamaConfig config_;
  RopeTables rope_;
  int64_t rope_len_ = 0;
  int64_t loss_chunk_rows_ = 0;
  HeadGradient loss_gradient_ = HeadGradient::kRecompute;
  bool fused_ = false;  // the final norm and the stored head gradient's softmax
  std::optional<torch::ScalarType> residual_dtype_;
  std::optional<int64_t> document_separator_;
  std::shared_ptr<WeightCopies> weight_copies_;
};
TORCH_MODULE(LlamaForCausalLM);

// The attention mask of set_document_separator for tokens [batch, seq]: bool [batch, 1, seq, seq].
torch::Tensor DocumentMask(const torch::Tensor& tokens, int64_t separator);

// Mean token cross-entropy of logits [batch, seq, vocab] against targets [batch, seq], in fp32.
torch::Tensor CausalLmLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace meshwork::model
