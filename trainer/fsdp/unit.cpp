#include "trainer/fsdp/unit.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace meshwork::fsdp {
namespace {

// Writes through a second TensorImpl on the same storage: an in-place write to the parameter
// itself would bump its version counter and autograd would reject the tensors it saved.
torch::Tensor WriteAlias(const torch::Tensor& t) {
  return torch::empty({0}, t.options()).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

}  // namespace

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ReleaseStorage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void AllocateStorage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() == bytes && s->data() != nullptr) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

Unit::Unit(std::string name, const UnitContext& context, torch::Device device)
    : name(std::move(name)), context(context), device(device) {}

void Unit::AddParam(ShardedParam* p) {
  params.push_back(p);
  offsets.push_back(shard_numel);
  shard_numel += p->shard_numel();
}

void Unit::Await(std::unique_ptr<dist::Work>& work, const char* collective, double issued, int64_t bytes,
                 const dist::Communicator& on) {
  const double t0 = Now();
  ThrowIfError(work->Wait());
  const double t1 = Now();
  context.stats->exposed_comm_seconds += t1 - t0;
  if (ChromeTrace* trace = *context.tracer) {
    const double done = std::min(t1, work->CompletedAt().value_or(t1));
    const std::string what = std::string(collective) + " " + name;
    trace->Span("communication", what, issued, std::max(issued, done),
                {{"bytes", std::to_string(bytes)}, {"group", on.group_name()}});
    if (t1 - t0 > 1e-6) trace->Span("blocked on communication", "wait " + what, t0, t1);
  }
  work.reset();
}

void Unit::CountGathered(int64_t delta) {
  *context.gathered_bytes += delta;
  if (ChromeTrace* trace = *context.tracer)
    trace->Counter("gathered parameters (MiB)", Now(), *context.gathered_bytes / 1048576.0);
}

int64_t Unit::GatheredBytes() const {
  int64_t bytes = 0;
  for (const ShardedParam* p : params) bytes += dist::TensorBytes(p->full);
  return bytes;
}

void Unit::StartGather() {
  if (gathered || gather_work) return;
  torch::NoGradGuard no_grad;
  const int world = context.group->size();
  auto opts = torch::TensorOptions().dtype(context.options->param_dtype).device(device);
  torch::Tensor flat = torch::empty({shard_numel}, opts);
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardedParam& p = *params[i];
    flat.narrow(0, offsets[i], p.shard_numel()).copy_(p.shard.detach().reshape({-1}));
  }
  gather_out = torch::empty({world * shard_numel}, opts);
  gather_issued = Now();
  auto work = context.group->AllGatherInto(gather_out, flat);
  ThrowIfError(work.status());
  gather_work = std::move(work).value();
}

void Unit::WaitGather() {
  if (gathered) return;
  StartGather();
  Await(gather_work, "all_gather", gather_issued, dist::TensorBytes(gather_out), *context.group);
  torch::NoGradGuard no_grad;
  const int world = context.group->size();
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardedParam& p = *params[i];
    AllocateStorage(p.full);
    torch::Tensor dst = WriteAlias(p.full).view({-1});
    for (int r = 0; r < world; ++r) {
      const int64_t rows = std::min(p.rows_per_rank, p.full_shape[0] - r * p.rows_per_rank);
      if (rows <= 0) continue;  // only padding on this rank
      dst.narrow(0, r * p.rows_per_rank * p.row_numel, rows * p.row_numel)
          .copy_(gather_out.narrow(0, r * shard_numel + offsets[i], rows * p.row_numel));
    }
  }
  gather_out = torch::Tensor();
  gathered = true;
  CountGathered(GatheredBytes());
}

void Unit::Free() {
  if (!gathered) return;
  for (ShardedParam* p : params) ReleaseStorage(p->full);
  gathered = false;
  CountGathered(-GatheredBytes());
}

void Unit::PostBackward(bool sync) {
  ReduceGrads(sync);
  Free();
}

void Unit::ReduceGrads(bool sync) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (ShardedParam* p : params) {
    grads.push_back(p->full.grad());
    p->full.mutable_grad() = torch::Tensor();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) grads[i] = torch::zeros(params[i]->full_shape, torch::TensorOptions().device(device));
    grads[i] = grads[i].to(context.options->reduce_dtype);
    if (grad_accum.size() == params.size()) grads[i] = grads[i] + grad_accum[i];
  }
  if (!sync) {
    grad_accum = std::move(grads);
    return;
  }
  grad_accum.clear();
  const int world = context.group->size();
  torch::Tensor input =
      torch::zeros({world * shard_numel}, torch::TensorOptions().dtype(context.options->reduce_dtype).device(device));
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardedParam& p = *params[i];
    const int64_t rows = p.full_shape[0];
    for (int r = 0; r < world; ++r) {
      const int64_t begin = r * p.rows_per_rank;
      const int64_t n = std::min(p.rows_per_rank, rows - begin);
      if (n <= 0) continue;  // only padding on this rank
      input.narrow(0, r * shard_numel + offsets[i], n * p.row_numel)
          .copy_(grads[i].narrow(0, begin, n).reshape({-1}));
    }
  }
  reduce_out = torch::empty({shard_numel}, input.options());
  reduce_issued = Now();
  auto work = context.reduce_group->ReduceScatter(reduce_out, input, dist::ReduceOp::kAvg);
  ThrowIfError(work.status());
  reduce_work = std::move(work).value();
  reduce_kind = "reduce_scatter";
  reduce_group = context.reduce_group;
  reduce_bytes = dist::TensorBytes(input);
}

bool Unit::PendingGrads() const {
  for (const ShardedParam* p : params)
    if (p->full.grad().defined()) return true;
  return false;
}

void Unit::FinishReduce(dist::Communicator* replicate) {
  if (!reduce_work) return;
  Await(reduce_work, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
  if (replicate != nullptr && replicate->size() > 1) {
    StartReplicaReduce(replicate);
    return;
  }
  AddReducedGrads();
}

void Unit::WaitReduce(bool all_reduce_follows) {
  if (!reduce_work) return;  // gradient sync off: nothing was sent
  Await(reduce_work, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
  if (!all_reduce_follows) AddReducedGrads();
}

void Unit::StartReplicaReduce(dist::Communicator* replicate) {
  if (!reduce_out.defined()) return;  // gradient sync off
  reduce_issued = Now();
  auto work = replicate->AllReduce(reduce_out, dist::ReduceOp::kAvg);
  ThrowIfError(work.status());
  reduce_work = std::move(work).value();
  reduce_kind = "all_reduce";
  reduce_group = replicate;
  reduce_bytes = dist::TensorBytes(reduce_out);
}

void Unit::FinishReplicaReduce() {
  if (!reduce_work) return;
  Await(reduce_work, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
  AddReducedGrads();
}

void Unit::AddReducedGrads() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    ShardedParam& p = *params[i];
    torch::Tensor g = reduce_out.narrow(0, offsets[i], p.shard_numel()).view(p.shard.sizes()).to(torch::kFloat);
    auto& grad = p.shard.mutable_grad();
    grad = grad.defined() ? grad + g : g.clone();
  }
  reduce_out = torch::Tensor();
}

}  // namespace meshwork::fsdp
