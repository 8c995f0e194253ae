#include "trainer/parallel/parallelize.h"

#include <torch/torch.h>

namespace meshwork::parallel {

Result<std::unique_ptr<ParallelLlama>> ParallelLlama::Create(model::LlamaForCausalLM model, const ParallelGroups& groups,
                                                             const ParallelOptions& options) {
  std::unique_ptr<ParallelLlama> p(new ParallelLlama());
  if (groups.tp != nullptr && groups.tp->size() > 1) {
    // Slices the model's parameters in place: FSDP below sees only this rank's slices.
    MW_ASSIGN_OR_RETURN(p->tp_, tp::TensorParallelLlama::Create(model, *groups.tp, options.tp));
  }
  MW_ASSIGN_OR_RETURN(p->fsdp_, fsdp::FullyShardedLlama::Create(std::move(model), groups.fsdp, options.fsdp));
  if (p->tp_ != nullptr) {
    tp::TensorParallelLlama* split = p->tp_.get();
    fsdp::FullyShardedLlama::TensorParallel tp;
    tp.embed = split->Embedding();
    tp.loss = split->LossHead();
    tp.tp = groups.tp->size();
    tp.sequence_parallel = options.tp.sequence_parallel;
    tp.blocked_seconds = [split] { return split->BlockedSecondsSoFar(); };
    tp.layer_chunks = [split] { return split->layer_chunks(); };
    tp.tokens_per_rank = [split] { return split->tokens_per_rank(); };
    // mesh.async_tp_chunks 1 (not fixed by the config): a compiled plan chooses each layer's
    // chunks (the async_tp pass), with sequence parallelism, which overlapping needs.
    if (options.tp.async_chunks == 1 && options.tp.sequence_parallel) {
      tp.set_layer_chunks = [split](const std::vector<int>& chunks) { return split->SetLayerChunks(chunks); };
    }
    p->fsdp_->SetTensorParallel(std::move(tp));
  }
  p->shard_group_ = groups.fsdp.shard;
  for (const auto& param : p->fsdp_->sharded_params()) {
    p->split_.push_back(tp::TensorParallelLlama::SplitOf(param.name) != tp::Split::kReplicated);
  }
  return p;
}

void ParallelLlama::SetGradientSync(bool sync) {
  sync_ = sync;
  fsdp_->SetGradientSync(sync);
}

torch::Tensor ParallelLlama::Forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
  if (tp_ != nullptr) {
    if (!targets.defined()) {
      ThrowIfError(InvalidInput("tensor parallel forward computes the loss over each rank's vocabulary slice: "
                                "targets are needed (no rank holds the whole vocabulary's logits)"));
    }
    tp_->BeginForward(tokens);
  }
  return fsdp_->Forward(tokens, targets);
}

Status ParallelLlama::FinishBackward() {
  MW_RETURN_IF_ERROR(fsdp_->FinishBackward());
  // Reduced over dp by FSDP, then over tp: both linear, so the order is free.
  if (sync_ && tp_ != nullptr) MW_RETURN_IF_ERROR(tp_->ReduceReplicatedGrads(ShardGrads(/*split=*/false)));
  return Status::Ok();
}

torch::Tensor ParallelLlama::ForwardNoGrad(const torch::Tensor& tokens, const torch::Tensor& targets) {
  torch::NoGradGuard no_grad;
  if (tp_ != nullptr) {
    if (!targets.defined()) {
      ThrowIfError(InvalidInput("tensor parallel evaluation computes the loss over each rank's vocabulary slice: "
                                "targets are needed"));
    }
    tp_->BeginForward(tokens);
  }
  return fsdp_->ForwardNoGrad(tokens, targets);
}

Result<torch::Tensor> ParallelLlama::GradNormSquared() {
  if (tp_ == nullptr) return fsdp_->GradNormSquared();
  MW_ASSIGN_OR_RETURN(torch::Tensor norm2, tp_->GradNormSquared(ShardGrads(true), ShardGrads(false)));
  MW_ASSIGN_OR_RETURN(auto work, shard_group_->AllReduce(norm2, dist::ReduceOp::kSum));
  MW_RETURN_IF_ERROR(work->Wait());
  return norm2;
}

Result<std::map<std::string, torch::Tensor>> ParallelLlama::GatherFullState() {
  MW_ASSIGN_OR_RETURN(auto state, fsdp_->GatherFullState());
  if (tp_ == nullptr) return state;
  return tp_->GatherFullState(state);
}

double ParallelLlama::TakeTpBlockedSeconds() { return tp_ != nullptr ? tp_->TakeBlockedSeconds() : 0.0; }

std::vector<torch::Tensor> ParallelLlama::ShardGrads(bool split) const {
  std::vector<torch::Tensor> out;
  const auto& params = fsdp_->sharded_params();
  for (size_t i = 0; i < params.size(); ++i) {
    const fsdp::ShardedParam& p = params[i];
    // A rank holding none of a parameter has nothing to add.
    if (split_[i] == split && p.shard.numel() > 0 && p.shard.grad().defined()) out.push_back(p.shard.mutable_grad());
  }
  return out;
}

}  // namespace meshwork::parallel
