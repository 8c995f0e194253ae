#include "trainer/fsdp/embedding_rows.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "trainer/model/fused_ops.h"

namespace meshwork::fsdp {

EmbeddingRows::EmbeddingRows(ShardedParam* param, const UnitContext& context)
    : param_(param), context_(context) {
  const int64_t w = width_ = param->full_shape.size() == 2 ? param->full_shape[1] : 1;
  // This rank's elements of the flattened parameter, [begin, end): whole rows [lo, hi), and at
  // most two rows of which it holds a part (a flat shard may start or end mid-row).
  const int64_t begin = param->shard_begin, end = begin + param->shard.numel();
  if (end <= begin) return;
  whole_lo_ = (begin + w - 1) / w;
  whole_hi_ = std::max(whole_lo_, end / w);
  whole_at_ = whole_lo_ * w - begin;
  for (const int64_t row : std::set<int64_t>{begin / w, (end - 1) / w}) {
    if (row >= whole_lo_ && row < whole_hi_) continue;
    const int64_t from = std::max(begin, row * w), to = std::min(end, (row + 1) * w);
    if (from < to) parts_.push_back({row, from - row * w, to - from, from - begin});
  }
}

torch::Tensor EmbeddingRows::OwnedParts(const torch::Tensor& ids) const {
  torch::NoGradGuard no_grad;
  torch::Tensor out = torch::zeros({ids.numel(), width_}, param_->shard.options().dtype(torch::kFloat));
  const torch::Tensor flat = param_->shard.detach().reshape({-1});
  if (whole_hi_ > whole_lo_) {
    const torch::Tensor at = ((ids >= whole_lo_) & (ids < whole_hi_)).nonzero().squeeze(1);
    if (at.numel() > 0) {
      const torch::Tensor whole = flat.narrow(0, whole_at_, (whole_hi_ - whole_lo_) * width_).view({-1, width_});
      out.index_copy_(0, at, whole.index_select(0, ids.index_select(0, at) - whole_lo_).to(torch::kFloat));
    }
  }
  for (const Part& p : parts_) {
    const torch::Tensor at = (ids == p.row).nonzero().squeeze(1);
    if (at.numel() == 0) continue;
    const torch::Tensor values = flat.narrow(0, p.at, p.len).to(torch::kFloat);
    out.narrow(1, p.col, p.len).index_copy_(0, at, values.unsqueeze(0).expand({at.numel(), p.len}).contiguous());
  }
  return out;
}

void EmbeddingRows::AddOwnedParts(const torch::Tensor& ids, const torch::Tensor& grads, double scale,
                                  torch::Tensor& shard_grad) const {
  torch::NoGradGuard no_grad;
  torch::Tensor flat = shard_grad.view({-1});
  if (whole_hi_ > whole_lo_) {
    const torch::Tensor at = ((ids >= whole_lo_) & (ids < whole_hi_)).nonzero().squeeze(1);
    if (at.numel() > 0) {
      torch::Tensor whole = flat.narrow(0, whole_at_, (whole_hi_ - whole_lo_) * width_).view({-1, width_});
      whole.index_add_(0, ids.index_select(0, at) - whole_lo_, grads.index_select(0, at).mul(scale).to(whole.scalar_type()));
    }
  }
  for (const Part& p : parts_) {
    const torch::Tensor at = (ids == p.row).nonzero().squeeze(1);
    if (at.numel() == 0) continue;
    const torch::Tensor sum = grads.index_select(0, at).narrow(1, p.col, p.len).sum(0).mul(scale);
    flat.narrow(0, p.at, p.len).add_(sum.to(flat.scalar_type()));
  }
}

void EmbeddingRows::StartGather(const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  rows_shape_ = tokens.sizes().vec();
  rows_shape_.push_back(width_);
  tokens_ = tokens.reshape({-1}).to(torch::kLong).contiguous();
  const int n = context_.group->size();
  all_ids_ = torch::empty({n * tokens_.numel()}, tokens_.options());
  gather_issued_ = Now();
  auto work = context_.group->AllGatherInto(all_ids_, tokens_);
  ThrowIfError(work.status());
  gather_works_.push_back(std::move(work).value());
}

void EmbeddingRows::WaitGather() {
  torch::NoGradGuard no_grad;
  // The host is blocked from here to the rows' arrival (the ids, filling in, the reduce-scatter):
  // one exposed span, and one collective on the trace, as the plan counts it.
  const double blocked_since = Now();
  for (auto& work : gather_works_) ThrowIfError(work->Wait());
  gather_works_.clear();
  const torch::Tensor parts = OwnedParts(all_ids_);
  torch::Tensor mine = torch::empty({tokens_.numel() * width_}, parts.options());
  auto work = context_.group->ReduceScatter(mine, parts.view({-1}), dist::ReduceOp::kSum);
  ThrowIfError(work.status());
  gather_works_.push_back(std::move(work).value());
  AwaitCollectives(context_, gather_works_, "row_gather " + param_->name, gather_issued_,
                   dist::TensorBytes(parts) + dist::TensorBytes(all_ids_), *context_.group, blocked_since);
  rows_ = mine.view(rows_shape_).to(context_.options->param_dtype).detach().requires_grad_(true);
}

void EmbeddingRows::StartReduce(bool sync) {
  torch::NoGradGuard no_grad;
  torch::Tensor grad = rows_.defined() && rows_.grad().defined()
                           ? rows_.grad().reshape({-1, width_}).to(torch::kFloat)
                           : torch::zeros({tokens_.numel(), width_}, param_->shard.options().dtype(torch::kFloat));
  held_ids_.push_back(tokens_);
  held_grads_.push_back(grad);
  rows_ = torch::Tensor();
  if (!sync) return;
  const torch::Tensor ids = torch::cat(held_ids_), grads = torch::cat(held_grads_).contiguous();
  held_ids_.clear();
  held_grads_.clear();
  const int n = context_.group->size();
  reduce_ids_ = torch::empty({n * ids.numel()}, ids.options());
  reduce_grads_ = torch::empty({n * grads.size(0), width_}, grads.options());
  reduce_issued_ = Now();
  for (auto [out, in] : {std::pair{reduce_ids_, ids}, std::pair{reduce_grads_.view({-1}), grads.view({-1})}}) {
    auto work = context_.group->AllGatherInto(out, in);
    ThrowIfError(work.status());
    reduce_works_.push_back(std::move(work).value());
  }
}

void EmbeddingRows::WaitReduce() {
  if (reduce_works_.empty()) return;  // gradient sync off: nothing was sent
  AwaitCollectives(context_, reduce_works_, "row_reduce " + param_->name, reduce_issued_,
                   dist::TensorBytes(reduce_grads_), *context_.group);
  if (param_->shard.numel() > 0) {
    torch::NoGradGuard no_grad;
    torch::Tensor& grad = param_->shard.mutable_grad();
    if (!grad.defined()) grad = model::ZerosInLineWith(param_->shard);  // AdamW's packs: see unit.cpp
    AddOwnedParts(reduce_ids_, reduce_grads_, 1.0 / context_.group->size(), grad);
  }
  reduce_ids_ = reduce_grads_ = torch::Tensor();
}

}  // namespace meshwork::fsdp
