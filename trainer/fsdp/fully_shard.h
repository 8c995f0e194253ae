// FSDP for the Llama model, eager schedule (FSDP2-like): every parameter is sharded on dim 0
// over the dp_shard group (padded to a multiple of the group size) and kept as an fp32 master
// shard; a unit (one decoder layer, or the root: embeddings, final norm, output head) is
// all-gathered before use and freed after; gradients are reduce-scattered per unit and
// all-reduced over dp_replicate (HSDP). The optimizer only ever sees the shards.
//
// The model runs with ordinary autograd, as in FSDP2: a layer's gathered weights live in one
// storage per parameter that is freed after the layer's forward (reshard_after_forward) and
// refilled before its backward, so autograd's saved tensors stay valid and nothing is
// recomputed. Hooks on each layer's input and output tensors drive backward: the pre-backward
// waits for the layer's all-gather and prefetches the previous layer's; the post-backward
// reduce-scatters the layer's gradients (async) and frees it. The root unit stays gathered for
// the whole step (its weights are used at both ends of the model, as FSDP2 keeps the root).
#pragma once

#include <torch/types.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trainer/common/status.h"
#include "trainer/dist/communicator.h"
#include "trainer/model/llama.h"

namespace meshwork::fsdp {

struct FsdpOptions {
  bool reshard_after_forward = true;       // free each layer's gathered weights after forward
  torch::ScalarType param_dtype = torch::kFloat32;   // gathered weights (bf16 on GPU)
  torch::ScalarType reduce_dtype = torch::kFloat32;  // gradient reduction
  bool prefetch = true;  // issue the next unit's all-gather before computing the current one
};

// One sharded parameter: the master shard the optimizer updates and the module parameter whose
// storage holds the gathered value.
struct ShardedParam {
  std::string name;          // HF name, e.g. "model.layers.0.mlp.up_proj.weight"
  torch::Tensor full;        // the module's parameter; data swapped in when gathered
  torch::Tensor shard;       // [rows_per_rank, ...] fp32 master, requires grad, zero padding rows
  std::vector<int64_t> full_shape;
  int64_t rows_per_rank = 0;
  int64_t row_numel = 0;
  int64_t shard_numel() const { return rows_per_rank * row_numel; }
};

struct FsdpStats {
  double exposed_comm_seconds = 0;  // time blocked in Wait(), summed since the last reset
};

class FullyShardedLlama {
 public:
  // Shards `model` (whose parameters hold the full, identical-on-every-rank initial values) over
  // `shard_group`; `replicate_group` may be null (no HSDP).
  static Result<std::unique_ptr<FullyShardedLlama>> Create(model::LlamaForCausalLM model,
                                                           dist::Communicator* shard_group,
                                                           dist::Communicator* replicate_group,
                                                           const FsdpOptions& options);
  ~FullyShardedLlama();

  // Forward of the whole model; keep the root unit gathered until FinishBackward().
  torch::Tensor Forward(const torch::Tensor& tokens);
  // Whether this micro-batch's backward reduces gradients (false until the last micro-batch of
  // gradient accumulation: full gradients accumulate locally instead).
  void SetGradientSync(bool sync) { sync_ = sync; }
  // After loss.backward(): reduce the root's gradients, wait for every reduction, write the
  // shard gradients (HSDP: averaged over replicas) and free the root.
  Status FinishBackward();
  // Forward without gradients (evaluation); frees everything after.
  torch::Tensor ForwardNoGrad(const torch::Tensor& tokens);

  // The master shards (optimizer parameters), split by whether weight decay applies.
  std::vector<torch::Tensor> DecayShards() const;
  std::vector<torch::Tensor> NoDecayShards() const;
  // Squared global gradient norm over the whole model (reduced across dp_shard), for exact
  // clipping; then ScaleGrads(clip factor).
  Result<double> GradNormSquared();
  void ScaleGrads(double factor);
  void ZeroGrad();

  // Full parameters by HF name, on every rank (collective: all ranks must call).
  Result<std::map<std::string, torch::Tensor>> GatherFullState();

  const model::LlamaConfig& config() const { return model_->config(); }
  model::LlamaForCausalLM& module() { return model_; }
  FsdpStats TakeStats();
  // Per-rank bytes of parameter shards, gradient shards (same) — optimizer state is 2x.
  int64_t ShardBytes() const;

  struct Unit;  // defined in the .cpp

 private:
  FullyShardedLlama(model::LlamaForCausalLM model, dist::Communicator* shard_group,
                    dist::Communicator* replicate_group, const FsdpOptions& options);

  model::LlamaForCausalLM model_;
  dist::Communicator* shard_group_;
  dist::Communicator* replicate_group_;
  FsdpOptions options_;
  bool sync_ = true;
  std::deque<ShardedParam> params_;            // every parameter, in the module's order
  std::vector<std::unique_ptr<Unit>> units_;  // [0] = root, then layer i at [i + 1]
  FsdpStats stats_;
};

}  // namespace meshwork::fsdp
