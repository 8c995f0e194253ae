// The parallel plans of the Llama model applied in one place, in the order torchtitan's
// parallelize applies them: tensor parallelism splits the weights over the mesh's tp group
// (trainer/tp), activation checkpointing wraps the decoder layers (FSDP's layer runner, by
// FsdpOptions::checkpointing), and FSDP shards what each rank then holds over dp_shard, with
// HSDP's all-reduce over dp_replicate (trainer/fsdp). A mesh dp_replicate x dp_shard x tp.
//
// What composing them takes:
//   - forward: FSDP gathers each unit around the model's layers as always; the embedding and the
//     loss are tensor parallelism's (its vocabulary slice), and the decoder layers' regions
//     exchange activations over tp. Every rank of a tp group reads the same batch.
//   - backward: FSDP reduce-scatters each rank's slices' gradients over dp_shard; then the
//     parameters tensor parallelism keeps whole (the norms) have their shard gradients reduced
//     over tp (summed under sequence parallelism: each rank's is its tokens' part). FSDP's flat
//     groups line up across a tp group (every rank's slices have the same shapes), so a shard
//     of one tp rank holds the same elements of the same parameters as its peers'.
//   - the gradient norm: split slices summed over tp, whole parameters counted once, then summed
//     over dp_shard (disjoint shards); replicas hold the same values.
// Without tp (groups.tp null or of one rank) this is FSDP alone, as before.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/dist/communicator.h"
#include "trainer/fsdp/fully_shard.h"
#include "trainer/model/llama.h"
#include "trainer/tp/tensor_parallel.h"

namespace meshwork::parallel {

struct ParallelGroups {
  dist::Communicator* tp = nullptr;  // the mesh's tp group; null or one rank: no tensor parallelism
  fsdp::FsdpGroups fsdp;
};

struct ParallelOptions {
  tp::TensorParallelOptions tp;
  fsdp::FsdpOptions fsdp;
};

class ParallelLlama {
 public:
  // `model` holds the whole initial weights, the same on every rank. kInvalidConfig when it does
  // not split over tp (tp::WhyNotSplittable).
  static Result<std::unique_ptr<ParallelLlama>> Create(model::LlamaForCausalLM model, const ParallelGroups& groups,
                                                       const ParallelOptions& options);

  // One micro-batch: whether its backward reduces gradients (the last of gradient accumulation),
  // then its forward (the mean loss; with tensor parallelism `targets` are required: no rank holds
  // the whole vocabulary's logits), then after loss.backward() FinishBackward.
  void SetGradientSync(bool sync);
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& targets);
  Status FinishBackward();
  // Evaluation: the mean loss without gradients.
  torch::Tensor ForwardNoGrad(const torch::Tensor& tokens, const torch::Tensor& targets);

  // Squared global gradient norm (fp64, one element, on the device), the same on every rank.
  Result<torch::Tensor> GradNormSquared();
  // Full parameters by HF name on every rank (collective).
  Result<std::map<std::string, torch::Tensor>> GatherFullState();

  fsdp::FullyShardedLlama& fsdp() { return *fsdp_; }
  const fsdp::FullyShardedLlama& fsdp() const { return *fsdp_; }
  tp::TensorParallelLlama* tp() { return tp_.get(); }  // null without tensor parallelism
  // Seconds blocked in tensor parallelism's collectives since the last call (0 without).
  double TakeTpBlockedSeconds();

 private:
  ParallelLlama() = default;
  // The master shards' gradients of the parameters tensor parallelism splits (`split`) or keeps
  // whole on every tp rank.
  std::vector<torch::Tensor> ShardGrads(bool split) const;

  std::unique_ptr<tp::TensorParallelLlama> tp_;  // declared first: destroyed after FSDP
  std::unique_ptr<fsdp::FullyShardedLlama> fsdp_;
  dist::Communicator* shard_group_ = nullptr;
  bool sync_ = true;
  // Per FSDP parameter (sharded_params() order): whether tensor parallelism splits it. Fixed at
  // Create, read every step.
  std::vector<bool> split_;
};

}  // namespace meshwork::parallel
