#include "trainer/fsdp/vocab_head.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "trainer/model/compat.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/linear_cross_entropy.h"

namespace meshwork::fsdp {

struct VocabParallelHead::Saved {
  torch::Tensor hidden;   // every rank's, [world T, width], in the matmul's dtype
  torch::Tensor targets;  // every rank's, [world T]
  torch::Tensor lse;      // the log-sum-exp over the whole vocabulary per token, [world T]
  torch::Tensor rows;     // this rank's rows, [hi - lo, width], in the matmul's dtype
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelLoss : torch::autograd::Function<VocabParallelLoss> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor hidden, torch::Tensor targets,
                               VocabParallelHead* head) {
    VocabParallelHead::Saved saved;
    torch::Tensor loss = head->Forward(hidden, targets, &saved);
    ctx->save_for_backward({saved.hidden, saved.targets, saved.lse, saved.rows});
    ctx->saved_data["head"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(head));
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* head = reinterpret_cast<VocabParallelHead*>(static_cast<intptr_t>(ctx->saved_data["head"].toInt()));
    const auto v = ctx->get_saved_variables();
    VocabParallelHead::Saved saved{v[0], v[1], v[2], v[3]};
    return {head->Backward(grad_out[0], saved), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

VocabParallelHead::VocabParallelHead(ShardedParam* table, const FlatGroup& group, const UnitContext& context)
    : table_(table), context_(context), comm_(context.reduce_group != nullptr ? context.reduce_group : context.group) {
  rank_ = context.group->rank();
  world_ = context.group->size();
  rows_ = table->full_shape.at(0);
  width_ = table->full_shape.size() == 2 ? table->full_shape[1] : 1;
  // The flat layout (FlatGroup): rank q holds elements [q S, (q + 1) S) of the group, the table
  // starts at flat_offset; a row is owned by the rank holding its first element.
  const int64_t s = group.shard_numel, off = table->flat_offset, n = table->numel;
  for (int q = 0; q < world_; ++q) {
    Range r;
    r.begin = std::clamp<int64_t>(q * s - off, 0, n);
    r.end = std::clamp<int64_t>((q + 1) * s - off, 0, n);
    r.lo = (r.begin + width_ - 1) / width_;
    r.hi = std::max(r.lo, (r.end + width_ - 1) / width_);
    range_.push_back(r);
  }
}

void VocabParallelHead::Exchange(Result<std::unique_ptr<dist::Work>> work, const std::string& what, int64_t bytes) {
  ThrowIfError(work.status());
  std::vector<std::unique_ptr<dist::Work>> works;
  works.push_back(std::move(work).value());
  const double issued = Now();
  AwaitCollectives(context_, works, what + " " + table_->name, issued, bytes, *comm_, issued);
}

torch::Tensor VocabParallelHead::OwnedRows() {
  torch::NoGradGuard no_grad;
  // Every rank's first `width` elements (fewer where its part is shorter, zero-padded): the
  // tails of the rows that start in the ranks before it.
  const torch::Tensor flat = table_->shard.detach().reshape({-1}).to(torch::kFloat);
  const Range& me = range_[rank_];
  torch::Tensor first = torch::zeros({width_}, flat.options());
  const int64_t mine = me.end - me.begin;
  if (mine > 0) first.narrow(0, 0, std::min(width_, mine)).copy_(flat.narrow(0, 0, std::min(width_, mine)));
  torch::Tensor firsts = torch::empty({world_, width_}, flat.options());
  Exchange(comm_->AllGatherInto(firsts.view({-1}), first), "vocab_head first_elements", dist::TensorBytes(firsts));
  torch::Tensor rows = torch::empty({me.hi - me.lo, width_}, flat.options());
  if (me.hi == me.lo) return rows;
  torch::Tensor out = rows.view({-1});
  const int64_t own = me.end - me.lo * width_;  // this shard's elements of its rows
  out.narrow(0, 0, own).copy_(flat.narrow(0, me.lo * width_ - me.begin, own));
  // The tail, [end, hi width), from the next ranks' first elements in turn.
  int64_t at = own;
  for (int q = rank_ + 1; q < world_ && at < out.numel(); ++q) {
    const int64_t take = std::min(out.numel() - at, std::min(width_, range_[q].end - range_[q].begin));
    if (take <= 0) continue;
    out.narrow(0, at, take).copy_(firsts[q].narrow(0, 0, take));
    at += take;
  }
  TORCH_CHECK(at == out.numel(), "vocab-parallel head: rank ", rank_, " could not assemble its rows");
  return rows;
}

torch::Tensor VocabParallelHead::Forward(const torch::Tensor& hidden, const torch::Tensor& targets, Saved* saved) {
  torch::NoGradGuard no_grad;
  const Range& me = range_[rank_];
  const int64_t t = hidden.size(0);
  const auto stats = model::LossStatsDtype(hidden);
  saved->rows = OwnedRows().to(hidden.scalar_type());
  saved->hidden = torch::empty({world_ * t, width_}, hidden.options());
  Exchange(comm_->AllGatherInto(saved->hidden.view({-1}), hidden.contiguous().view({-1})), "vocab_head hidden",
           dist::TensorBytes(saved->hidden));
  saved->targets = torch::empty({world_ * t}, targets.options());
  Exchange(comm_->AllGatherInto(saved->targets, targets.contiguous()), "vocab_head targets",
           dist::TensorBytes(saved->targets));
  // Per token: the log-sum-exp over this rank's rows, and the target's logit where it owns it.
  const int64_t total = world_ * t, owned = me.hi - me.lo;
  torch::Tensor local = torch::zeros({2, total}, hidden.options().dtype(stats));
  if (owned == 0) local[0].fill_(-std::numeric_limits<double>::infinity());
  const int64_t chunk = model::LossChunkRows(std::max<int64_t>(owned, 1));
  for (int64_t r = 0; r < total && owned > 0; r += chunk) {
    const int64_t n = std::min(chunk, total - r);
    const torch::Tensor logits = torch::matmul(saved->hidden.narrow(0, r, n), saved->rows.t()).to(stats);
    local[0].narrow(0, r, n).copy_(torch::logsumexp(logits, -1));
    const torch::Tensor tg = saved->targets.narrow(0, r, n);
    const torch::Tensor mine = (tg >= me.lo) & (tg < me.hi);
    const torch::Tensor picked = logits.gather(1, (tg - me.lo).clamp(0, owned - 1).unsqueeze(1)).squeeze(1);
    local[1].narrow(0, r, n).copy_(torch::where(mine, picked, torch::zeros_like(picked)));
  }
  torch::Tensor all = torch::empty({world_, 2, total}, local.options());
  Exchange(comm_->AllGatherInto(all.view({-1}), local.view({-1})), "vocab_head softmax_stats",
           dist::TensorBytes(all));
  saved->lse = torch::logsumexp(all.select(1, 0), 0);
  const torch::Tensor target_logit = all.select(1, 1).sum(0);
  return (saved->lse - target_logit).narrow(0, rank_ * t, t).mean();
}

torch::Tensor VocabParallelHead::Backward(const torch::Tensor& grad_loss, Saved& saved) {
  torch::NoGradGuard no_grad;
  const Range& me = range_[rank_];
  const int64_t total = saved.hidden.size(0), t = total / world_, owned = me.hi - me.lo;
  const auto stats = saved.lse.scalar_type();
  // Every rank's loss scale: its tokens' rows of d(loss)/d(logit) are (softmax - onehot) x it / T.
  torch::Tensor scale = grad_loss.detach().to(stats).reshape({1}).contiguous();
  torch::Tensor scales = torch::empty({world_}, scale.options());
  Exchange(comm_->AllGatherInto(scales, scale), "vocab_head loss_scales", dist::TensorBytes(scales));
  const torch::Tensor per_token = scales.div(static_cast<double>(t)).repeat_interleave(t);
  torch::Tensor grad_hidden = torch::zeros({total, width_}, saved.hidden.options().dtype(stats));
  torch::Tensor grad_rows = torch::zeros({owned, width_}, saved.hidden.options().dtype(stats));
  const int64_t chunk = model::LossChunkRows(std::max<int64_t>(owned, 1));
  for (int64_t r = 0; r < total && owned > 0; r += chunk) {
    const int64_t n = std::min(chunk, total - r);
    const torch::Tensor h = saved.hidden.narrow(0, r, n);
    torch::Tensor probs = torch::matmul(h, saved.rows.t()).to(stats);
    probs.sub_(saved.lse.narrow(0, r, n).unsqueeze(1)).exp_();
    const torch::Tensor tg = saved.targets.narrow(0, r, n);
    const torch::Tensor mine = ((tg >= me.lo) & (tg < me.hi)).to(stats);
    probs.scatter_add_(1, (tg - me.lo).clamp(0, owned - 1).unsqueeze(1), mine.neg().unsqueeze(1));
    probs.mul_(per_token.narrow(0, r, n).unsqueeze(1));
    const torch::Tensor g = probs.to(saved.hidden.scalar_type());
    grad_hidden.narrow(0, r, n).copy_(torch::matmul(g, saved.rows));
    grad_rows.addmm_(g.t().to(stats), h.to(stats));
  }
  // This rank's tokens' gradient: the sum of every rank's part.
  torch::Tensor mine = torch::empty({t, width_}, grad_hidden.options());
  Exchange(comm_->ReduceScatter(mine.view({-1}), grad_hidden.view({-1}), dist::ReduceOp::kSum),
           "vocab_head hidden_grad", dist::TensorBytes(grad_hidden));
  // The rows' gradient into the shards, averaged over dp_shard: this shard's part now, the last
  // row's tail through the ranks that hold it.
  grad_rows.div_(static_cast<double>(world_));
  torch::Tensor& shard_grad = table_->shard.mutable_grad();
  // At the shard's offset within a 16-byte line, as unit.cpp keeps it: AdamW's 16-byte packs.
  if (!shard_grad.defined()) shard_grad = model::ZerosInLineWith(table_->shard);
  torch::Tensor flat_grad = shard_grad.view({-1});
  const torch::Tensor rows_flat = grad_rows.view({-1});
  const int64_t own = owned > 0 ? me.end - me.lo * width_ : 0;
  if (own > 0) flat_grad.narrow(0, me.lo * width_ - me.begin, own).add_(rows_flat.narrow(0, 0, own).to(flat_grad.scalar_type()));
  torch::Tensor tail = torch::zeros({width_}, rows_flat.options());
  if (owned > 0 && rows_flat.numel() > own) tail.narrow(0, 0, rows_flat.numel() - own).copy_(rows_flat.narrow(0, own, rows_flat.numel() - own));
  torch::Tensor tails = torch::empty({world_, width_}, tail.options());
  Exchange(comm_->AllGatherInto(tails.view({-1}), tail), "vocab_head tail_grads", dist::TensorBytes(tails));
  for (int q = 0; q < rank_; ++q) {
    const Range& from = range_[q];
    const int64_t len = from.hi > from.lo ? from.hi * width_ - from.end : 0;
    // Rank q's tail covers elements [from.end, from.end + len); this shard holds [begin, end).
    const int64_t a = std::max(from.end, me.begin), b = std::min(from.end + len, me.end);
    if (a < b) flat_grad.narrow(0, a - me.begin, b - a).add_(tails[q].narrow(0, a - from.end, b - a).to(flat_grad.scalar_type()));
  }
  return mine.to(saved.hidden.scalar_type());
}

torch::Tensor VocabParallelHead::Loss(const torch::Tensor& hidden, const torch::Tensor& targets) {
  TORCH_CHECK(hidden.size(-1) == width_, "vocab-parallel head: hidden ", hidden.sizes(), " does not match the table's width ",
              width_);
  const torch::Tensor h = hidden.reshape({-1, width_}).to(compat::MatmulDtype(hidden));
  const torch::Tensor tg = targets.reshape({-1}).to(torch::kLong);
  return VocabParallelLoss::apply(h, tg, this);
}

}  // namespace meshwork::fsdp
