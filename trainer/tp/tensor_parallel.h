// Tensor parallelism for the Llama model, Megatron-style, over one communicator (the mesh's tp
// group): each rank keeps a slice of every decoder layer's weights and of the vocabulary, and the
// layer's regions exchange activations instead of weights.
//
//   attention  q, k, v split by heads (rows; a rank's query heads and the key/value heads they
//              read: heads and kv-heads both divide by tp), o by its input columns;
//   MLP        gate and up split by rows, down by its input columns;
//   embedding  split by vocabulary rows: a rank looks up the tokens it owns, zeros for the rest,
//              and the partial rows are summed across ranks;
//   head       the same rows (tied) or lm_head's rows: each rank computes its vocabulary's logits,
//              and the loss combines every rank's log-sum-exp and the owner's target logit
//              (VocabParallelLoss): no rank ever holds the logits of the whole vocabulary, nor
//              its own slice's for every token at once (chunks of rows, recomputed in backward);
//   norms      whole on every rank.
//
// Each split region (attention, MLP) is entered and left through ParallelRegion (llama.h):
//   without sequence parallelism  enter = identity (backward: all-reduce of the input's gradient),
//                                 exit  = all-reduce of the partial output (backward: identity);
//   with it (the default)         the residual stream between regions is split over the ranks by
//                                 tokens (rank r holds tokens [r·n/tp, (r+1)·n/tp) of the batch
//                                 flattened), so the norms run on 1/tp of the tokens:
//                                 enter = all-gather of the tokens (backward: reduce-scatter),
//                                 exit  = reduce-scatter of the partial output (backward: all-gather).
//                                 The norms' weights then get a partial gradient on each rank,
//                                 all-reduced by FinishBackward.
// The same bytes cross the wire either way (an all-reduce is a reduce-scatter then an all-gather);
// sequence parallelism saves the norms' compute and the stream's activations by tp.
//
// Every collective is blocking on the tp communicator, issued by the calling thread in the same
// order on every rank (activation checkpointing recomputes a layer's forward, collectives
// included, in the same order everywhere).
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/dist/communicator.h"
#include "trainer/model/llama.h"

namespace meshwork::tp {

struct TensorParallelOptions {
  bool sequence_parallel = true;
  // Overlapped (async) TP, with sequence parallelism: each region's all-gather fused with its
  // first matmul and its last matmul with the reduce-scatter, both split into this many chunks of
  // every rank's tokens, so that one chunk's exchange runs while the previous one's matmul
  // computes (backward alike). 1: not overlapped. A forward whose tokens per rank do not divide
  // into the chunks runs the plain regions.
  int async_chunks = 1;
};

// How a parameter is split over the tp ranks.
enum class Split { kRows, kColumns, kReplicated };

// One parameter as this rank holds it.
struct LocalParam {
  std::string name;                 // HF name
  std::vector<int64_t> full_shape;  // the whole parameter's
  Split split = Split::kReplicated;
  int64_t begin = 0;                // first row (kRows) or column (kColumns) this rank holds
  torch::Tensor value;              // the module's parameter itself, now this rank's slice
};

struct TpGroup;  // tensor_parallel.cpp: the communicator as the autograd functions hold it

using model::WhyNotSplittable;  // llama_config.h

class TensorParallelLlama {
 public:
  // Slices `model`'s parameters in place (every rank built the same whole model, e.g. from one
  // seed or checkpoint) and sets every decoder layer's region. kInvalidConfig when the model does
  // not split over the group's size (WhyNotSplittable).
  static Result<std::unique_ptr<TensorParallelLlama>> Create(model::LlamaForCausalLM model, dist::Communicator& group,
                                                             TensorParallelOptions options);
  ~TensorParallelLlama();

  // The mean loss of one micro-batch (every rank of the group passes the same tokens and
  // targets, int64 [batch, seq]), with decoder layer i run by `run_layer` (activation
  // checkpointing) or plainly when it is empty. Throws (c10::Error) when a collective fails.
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets, const model::LayerRunner& run_layer = {});

  // The same forward run by another plan (FSDP composed with TP: FSDP gathers each layer's
  // weights around its layer runner): BeginForward(tokens) first, then the model's
  // ForwardWithLayerRunner with these as its embedding and its loss. The decoder layers' regions
  // are set on the modules already.
  void BeginForward(const torch::Tensor& tokens);
  model::EmbedRunner Embedding();
  model::LossRunner LossHead();
  // After the last micro-batch's backward: all-reduces the replicated parameters' gradients
  // (summed where the step's forwards split the tokens: each rank's holds its tokens' part).
  // A step mixing split and plain micro-batches is refused by Loss (the sums would be wrong).
  // A micro-batch's backward must follow its forward before the next forward: the regions read
  // that forward's split, and activation checkpointing re-runs them in backward.
  Status FinishBackward();
  // The same over gradients held elsewhere (FSDP's shards of the replicated parameters, which
  // line up on every tp rank: each rank's slices have the same shapes, so its flat groups the
  // same layout): summed or averaged over the group as FinishBackward does, in place.
  Status ReduceReplicatedGrads(const std::vector<torch::Tensor>& grads);
  // The squared norm of the whole model's gradient: each split parameter's slices once, the
  // replicated ones once. fp64, one element, on the parameters' device.
  Result<torch::Tensor> GradNormSquared();
  // The same from gradients held elsewhere (FSDP's shards): `split` of split parameters (summed
  // over the group), `replicated` of replicated ones (the same on every rank: counted once).
  Result<torch::Tensor> GradNormSquared(const std::vector<torch::Tensor>& split,
                                        const std::vector<torch::Tensor>& replicated);
  // The whole parameters by HF name, gathered from every rank (collective: every rank calls).
  Result<std::map<std::string, torch::Tensor>> GatherFullState();
  // The same from this rank's slices by HF name (FSDP's gathered state of a TP-split model);
  // the parameters this rank does not hold (a pipeline's other stages) are left out.
  Result<std::map<std::string, torch::Tensor>> GatherFullState(const std::map<std::string, torch::Tensor>& local);
  // How `name` (an HF parameter name) is split.
  static Split SplitOf(const std::string& name);

  const std::vector<LocalParam>& params() const { return params_; }
  model::LlamaForCausalLM& model() { return model_; }
  dist::Communicator& group() { return group_; }
  bool sequence_parallel() const { return options_.sequence_parallel; }
  int async_chunks() const { return options_.async_chunks; }
  int64_t LocalBytes() const;
  // Seconds the calling threads blocked in the regions' collectives since the last call (the
  // exposed communication where waits block the host: Gloo; NCCL's waits order the stream, and
  // its communicator measures the stream's stalls).
  double TakeBlockedSeconds();
  // The same since Create, never reset (a compiled plan's trace reads it at module boundaries).
  double BlockedSecondsSoFar() const;
  // Overlapped TP layer by layer (a compiled plan's atp=): decoder layer i's regions split into
  // chunks[i] chunks (1: not overlapped), in place of TensorParallelOptions::async_chunks for every
  // layer. InvalidInput for another number of layers or a count below 1.
  Status SetLayerChunks(const std::vector<int>& chunks);
  const std::vector<int>& layer_chunks() const { return layer_chunks_; }
  // The tokens each rank held between the regions in the last forward (0 before the first).
  int64_t tokens_per_rank() const { return tokens_per_rank_; }

 private:
  TensorParallelLlama(model::LlamaForCausalLM model, dist::Communicator& group, TensorParallelOptions options);
  void Shard();
  torch::Tensor EmbedTokens(const torch::Tensor& tokens);
  torch::Tensor VocabParallelLoss(const torch::Tensor& hidden, const torch::Tensor& targets);

  model::LlamaForCausalLM model_;
  dist::Communicator& group_;
  std::unique_ptr<TpGroup> tp_group_;
  TensorParallelOptions options_;
  std::vector<LocalParam> params_;
  int64_t vocab_begin_ = 0, vocab_rows_ = 0;  // this rank's vocabulary rows
  // Whether this forward splits the stream by tokens (sequence parallelism, and tokens that
  // divide by tp), and the whole stream's shape [batch, seq, hidden] its gathers restore.
  bool split_tokens_ = false;
  int64_t tokens_per_rank_ = 0;  // this forward's tokens a rank holds under sequence parallelism
  std::vector<int> layer_chunks_;  // each decoder layer's chunks (1: its regions not overlapped)
  std::vector<int64_t> stream_shape_;
  // Whether this step's forwards with gradients split the tokens (unset: none yet).
  std::optional<bool> step_split_tokens_;
};

}  // namespace meshwork::tp
