#include "trainer/fsdp/unit.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace meshwork::fsdp {
namespace {

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(shape[d], 1);
  return strides;
}

}  // namespace

torch::Tensor WriteAlias(const torch::Tensor& t) {
  return torch::empty({0}, t.options()).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

size_t GroupOf(const std::string& name, int64_t layers) {
  const std::string prefix = "model.layers.";
  if (name == "model.embed_tokens.weight") return 0;
  if (name.rfind(prefix, 0) == 0) return static_cast<size_t>(std::stoll(name.substr(prefix.size())) + 1);
  return static_cast<size_t>(layers + 1);
}

void ShardGroup(FlatGroup& g, int group_index, int world, int rank, torch::ScalarType param_dtype) {
  int64_t numel = 0;
  for (ShardedParam* p : g.params) {
    p->group = group_index;
    p->full_shape = p->full.sizes().vec();
    p->numel = p->full.numel();
    p->flat_offset = numel;
    numel += p->numel;
  }
  g.shard_numel = (numel + world - 1) / world;
  const int64_t begin = rank * g.shard_numel, end = begin + g.shard_numel;
  const torch::TensorOptions options = g.params.front()->full.options();
  g.master = torch::zeros({g.shard_numel}, options.dtype(torch::kFloat));  // padding stays zero
  g.storage = torch::empty({world * g.shard_numel}, options.dtype(param_dtype));
  for (ShardedParam* p : g.params) {
    const int64_t from = std::max(begin, p->flat_offset), to = std::min(end, p->flat_offset + p->numel);
    const int64_t n = std::max<int64_t>(0, to - from);
    p->shard_begin = n > 0 ? from - p->flat_offset : 0;
    p->shard_offset = n > 0 ? from - begin : 0;
    if (n > 0) g.master.narrow(0, p->shard_offset, n).copy_(p->full.reshape({-1}).narrow(0, p->shard_begin, n));
    // A leaf of its own over the master's storage: the optimizer updates it in place.
    const std::vector<int64_t> shape = n == p->numel ? p->full_shape : std::vector<int64_t>{n};
    p->shard = torch::empty({0}, g.master.options())
                   .set_(g.master.storage(), g.master.storage_offset() + p->shard_offset, shape,
                         ContiguousStrides(shape))
                   .requires_grad_(true);
    // From here on the parameter is a view of the group's storage.
    p->full.set_data(g.storage.narrow(0, p->flat_offset, p->numel).view(p->full_shape));
  }
  ReleaseStorage(g.storage);
}

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

void FlatGroup::OnGradient() {
  received = true;
  EnsureGrad();
}

int FlatGroup::EnsureGrad() {
  if (grad.defined()) return 0;
  torch::NoGradGuard no_grad;
  grad = torch::zeros({storage.numel()}, storage.options());
  int copies = 0;
  for (ShardedParam* p : params) {
    torch::Tensor view = grad.narrow(0, p->flat_offset, p->numel).view(p->full_shape);
    if (p->full.grad().defined()) {  // accumulated elsewhere (no hook ran): copied in
      view.copy_(p->full.grad());
      ++copies;
    }
    p->full.mutable_grad() = view;
  }
  return copies;
}

int64_t FlatGroup::StorageBytes() const { return storage.numel() * storage.element_size(); }

Unit::Unit(std::string name, const UnitContext& context) : name(std::move(name)), context(context) {}

void Unit::AddGroup(FlatGroup* g) { groups.push_back(g); }

void AwaitCollectives(const UnitContext& context, std::vector<std::unique_ptr<dist::Work>>& works,
                      const std::string& what, double issued, int64_t bytes, const dist::Communicator& on,
                      double blocked_since) {
  const double t0 = blocked_since >= 0 ? blocked_since : Now();
  for (auto& work : works) ThrowIfError(work->Wait());
  const double t1 = Now();
  context.stats->exposed_comm_seconds += t1 - t0;
  if (ChromeTrace* trace = *context.tracer) {
    double done = issued;
    for (auto& work : works) done = std::max(done, std::min(t1, work->CompletedAt().value_or(t1)));
    trace->Span("communication", what, issued, done, {{"bytes", std::to_string(bytes)}, {"group", on.group_name()}});
    if (t1 - t0 > 1e-6) trace->Span("blocked on communication", "wait " + what, t0, t1);
  }
  works.clear();
}

void Unit::CountGathered(int64_t delta) {
  *context.gathered_bytes += delta;
  if (ChromeTrace* trace = *context.tracer)
    trace->Counter("gathered parameters (MiB)", Now(), *context.gathered_bytes / 1048576.0);
}

int64_t Unit::GatheredBytes() const {
  int64_t bytes = 0;
  for (const FlatGroup* g : groups) bytes += g->StorageBytes();
  return bytes;
}

void Unit::StartGather() {
  if (gathered || !gather_works.empty()) return;
  torch::NoGradGuard no_grad;
  gather_issued = Now();
  for (FlatGroup* g : groups) {
    AllocateStorage(g->storage);
    // The master shard itself when the parameters are fp32; else its one cast.
    torch::Tensor send = g->master.to(context.options->param_dtype);
    auto work = context.group->AllGatherInto(WriteAlias(g->storage), send);
    ThrowIfError(work.status());
    gather_works.push_back(std::move(work).value());
  }
  CountGathered(GatheredBytes());
}

void Unit::WaitGather() {
  if (gathered) return;
  StartGather();
  Await(gather_works, "all_gather", gather_issued, GatheredBytes(), *context.group);
  gathered = true;
}

void Unit::Free() {
  if (!gathered) return;
  for (FlatGroup* g : groups) ReleaseStorage(g->storage);
  gathered = false;
  CountGathered(-GatheredBytes());
}

void Unit::PostBackward(bool sync) {
  ReduceGrads(sync);
  Free();
}

void Unit::ReduceGrads(bool sync) {
  torch::NoGradGuard no_grad;
  const torch::ScalarType reduce_dtype = context.options->reduce_dtype;
  std::vector<torch::Tensor> inputs;
  for (FlatGroup* g : groups) {
    // A group no gradient reached this micro-batch reduces zeros: every rank issues the same
    // collectives.
    int copies = g->EnsureGrad();
    g->received = false;
    for (ShardedParam* p : g->params) {
      // Autograd added into the views unless something replaced a parameter's .grad: then
      // that gradient is copied in (not expected, and counted; the result stays right).
      const torch::Tensor& pg = p->full.grad();
      torch::Tensor view = g->grad.narrow(0, p->flat_offset, p->numel);
      if (pg.defined() && pg.data_ptr() != view.data_ptr()) {
        view.copy_(pg.reshape({-1}));
        p->full.mutable_grad() = view.view(p->full_shape);
        ++copies;
      }
    }
    context.stats->gradient_copies += copies;
    const bool cast = g->grad.scalar_type() != reduce_dtype;
    if (!sync) {
      // Same dtype: the next micro-batch adds into the same buffer. Else sum in the reduce
      // dtype, as one reduction of every micro-batch would.
      if (cast) {
        g->grad_accum = g->grad_accum.defined() ? g->grad_accum.add_(g->grad) : g->grad.to(reduce_dtype);
        g->grad.zero_();
      }
      continue;
    }
    torch::Tensor input = g->grad;
    if (cast) input = g->grad_accum.defined() ? g->grad_accum.add_(g->grad) : g->grad.to(reduce_dtype);
    for (ShardedParam* p : g->params) p->full.mutable_grad() = torch::Tensor();
    g->grad = torch::Tensor();
    g->grad_accum = torch::Tensor();
    inputs.push_back(std::move(input));
  }
  if (!sync) return;
  reduce_out.clear();
  reduce_issued = Now();
  reduce_bytes = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    reduce_out.push_back(torch::empty({groups[i]->shard_numel}, inputs[i].options()));
    auto work = context.reduce_group->ReduceScatter(reduce_out.back(), inputs[i], dist::ReduceOp::kAvg);
    ThrowIfError(work.status());
    reduce_works.push_back(std::move(work).value());
    reduce_bytes += dist::TensorBytes(inputs[i]);
  }
  reduce_kind = "reduce_scatter";
  reduce_group = context.reduce_group;
}

bool Unit::PendingGrads() const {
  for (const FlatGroup* g : groups)
    if (g->received) return true;
  return false;
}

void Unit::FinishReduce(dist::Communicator* replicate) {
  // Nothing in flight, or already at the replicas' all-reduce (FinishReplicaReduce's).
  if (reduce_works.empty() || std::string(reduce_kind) != "reduce_scatter") return;
  Await(reduce_works, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
  if (replicate != nullptr && replicate->size() > 1) {
    StartReplicaReduce(replicate);
    return;
  }
  AddReducedGrads();
}

void Unit::WaitReduce(bool all_reduce_follows) {
  if (reduce_works.empty()) return;  // gradient sync off: nothing was sent
  Await(reduce_works, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
  if (!all_reduce_follows) AddReducedGrads();
}

void Unit::StartReplicaReduce(dist::Communicator* replicate) {
  if (reduce_out.empty()) return;  // gradient sync off
  reduce_issued = Now();
  reduce_bytes = 0;
  for (torch::Tensor& out : reduce_out) {
    auto work = replicate->AllReduce(out, dist::ReduceOp::kAvg);
    ThrowIfError(work.status());
    reduce_works.push_back(std::move(work).value());
    reduce_bytes += dist::TensorBytes(out);
  }
  reduce_kind = "all_reduce";
  reduce_group = replicate;
}

void Unit::FinishReplicaReduce() {
  if (reduce_works.empty()) return;
  Await(reduce_works, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
  AddReducedGrads();
}

void Unit::AddReducedGrads() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < groups.size(); ++i) {
    // fp32 reduction: the gradients are views of the reduced shard, no copy.
    const torch::Tensor reduced = reduce_out[i].to(torch::kFloat);
    for (ShardedParam* p : groups[i]->params) {
      if (p->shard.numel() == 0) continue;  // none of this parameter is on this rank
      torch::Tensor g = reduced.narrow(0, p->shard_offset, p->shard.numel()).view(p->shard.sizes());
      // Accumulated in place: no second shard-sized gradient while the sum is made, and the
      // gradient stays at the shard's offset within a 16-byte line (the view's), where AdamW's
      // kernel takes 16-byte packs of the shard, its gradient and its moments together.
      auto& grad = p->shard.mutable_grad();
      if (grad.defined()) {
        grad.add_(g);
      } else {
        grad = g;
      }
    }
  }
  reduce_out.clear();
}

}  // namespace meshwork::fsdp
