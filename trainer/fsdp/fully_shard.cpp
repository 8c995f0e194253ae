#include "trainer/fsdp/fully_shard.h"

#include <torch/torch.h>

#include <chrono>
#include <map>

namespace meshwork::fsdp {
namespace {

using Clock = std::chrono::steady_clock;

// A gathered parameter keeps one TensorImpl and one StorageImpl for the whole run; freeing and
// re-gathering swap the memory under the storage (what FSDP2 does with storage resize). Tensors
// that autograd saved in forward (the weight, views of it) hold that storage, so after the
// re-gather in backward they read the right values without recomputing the layer.
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

// Writes through a second TensorImpl on the same storage: an in-place write to the parameter
// itself would bump its version counter and autograd would reject the tensors it saved.
torch::Tensor WriteAlias(const torch::Tensor& t) {
  return torch::empty({0}, t.options()).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

}  // namespace

struct FullyShardedLlama::Unit {
  std::string name;
  std::vector<ShardedParam*> params;  // owned by FullyShardedLlama
  std::vector<int64_t> offsets;       // of each parameter's shard in the unit's flat shard
  int64_t shard_numel = 0;  // this rank's flat shard length (the same on every rank)
  dist::Communicator* group = nullptr;
  torch::Device device = torch::kCPU;
  const FsdpOptions* options = nullptr;
  FsdpStats* stats = nullptr;

  bool gathered = false;
  torch::Tensor gather_out;
  std::unique_ptr<dist::Work> gather_work;

  std::vector<torch::Tensor> grad_accum;  // full gradients held back while sync is off
  torch::Tensor reduce_out;
  std::unique_ptr<dist::Work> reduce_work;

  void Timed(const std::function<Status()>& wait) {
    const auto t0 = Clock::now();
    ThrowIfError(wait());
    stats->exposed_comm_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Copy-in of the shards and an async all-gather into one flat buffer.
  void StartGather() {
    if (gathered || gather_work) return;
    torch::NoGradGuard no_grad;
    const int world = group->size();
    auto opts = torch::TensorOptions().dtype(options->param_dtype).device(device);
    torch::Tensor flat = torch::empty({shard_numel}, opts);
    for (size_t i = 0; i < params.size(); ++i) {
      const ShardedParam& p = *params[i];
      flat.narrow(0, offsets[i], p.shard_numel()).copy_(p.shard.detach().reshape({-1}));
    }
    gather_out = torch::empty({world * shard_numel}, opts);
    auto work = group->AllGatherInto(gather_out, flat);
    ThrowIfError(work.status());
    gather_work = std::move(work).value();
  }

  // Waits for the all-gather and copies every rank's rows into the parameters' own storage
  // (re-allocated if freed), so tensors autograd saved from an earlier forward see them again.
  void WaitGather() {
    if (gathered) return;
    StartGather();
    Timed([&] { return gather_work->Wait(); });
    gather_work.reset();
    torch::NoGradGuard no_grad;
    const int world = group->size();
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
  }

  void Free() {
    if (!gathered) return;
    for (ShardedParam* p : params) ReleaseStorage(p->full);
    gathered = false;
  }

  // After this unit's backward: its parameters' full gradients (accumulated by autograd) go to
  // the reduce-scatter, or are held back while sync is off; then the unit is freed.
  void PostBackward(bool sync) {
    ReduceGrads(sync);
    Free();
  }

  // Takes this unit's full gradients (accumulated by autograd) for one micro-batch: held back
  // without sync, else laid out rank-major and reduce-scattered (async).
  void ReduceGrads(bool sync) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    grads.reserve(params.size());
    for (ShardedParam* p : params) {
      grads.push_back(p->full.grad());
      p->full.mutable_grad() = torch::Tensor();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) grads[i] = torch::zeros(params[i]->full_shape, torch::TensorOptions().device(device));
      grads[i] = grads[i].to(options->reduce_dtype);
      if (grad_accum.size() == params.size()) grads[i] = grads[i] + grad_accum[i];
    }
    if (!sync) {
      grad_accum = std::move(grads);
      return;
    }
    grad_accum.clear();
    const int world = group->size();
    torch::Tensor input =
        torch::zeros({world * shard_numel}, torch::TensorOptions().dtype(options->reduce_dtype).device(device));
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
    auto work = group->ReduceScatter(reduce_out, input, dist::ReduceOp::kAvg);
    ThrowIfError(work.status());
    reduce_work = std::move(work).value();
  }

  bool PendingGrads() const {
    for (const ShardedParam* p : params)
      if (p->full.grad().defined()) return true;
    return false;
  }

  // Waits for the reduce-scatter; with HSDP, starts averaging the reduced shard across replicas
  // (one all-reduce per unit), else adds it to the shards' gradients.
  void FinishReduce(dist::Communicator* replicate) {
    if (!reduce_work) return;
    Timed([&] { return reduce_work->Wait(); });
    reduce_work.reset();
    if (replicate != nullptr && replicate->size() > 1) {
      auto work = replicate->AllReduce(reduce_out, dist::ReduceOp::kAvg);
      ThrowIfError(work.status());
      reduce_work = std::move(work).value();
      return;
    }
    AddReducedGrads();
  }

  void FinishReplicaReduce() {
    if (!reduce_work) return;
    Timed([&] { return reduce_work->Wait(); });
    reduce_work.reset();
    AddReducedGrads();
  }

  void AddReducedGrads() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      ShardedParam& p = *params[i];
      torch::Tensor g = reduce_out.narrow(0, offsets[i], p.shard_numel()).view(p.shard.sizes()).to(torch::kFloat);
      auto& grad = p.shard.mutable_grad();
      grad = grad.defined() ? grad + g : g.clone();
    }
    reduce_out = torch::Tensor();
  }
};

FullyShardedLlama::FullyShardedLlama(model::LlamaForCausalLM model, dist::Communicator* shard_group,
                                     dist::Communicator* replicate_group, const FsdpOptions& options)
    : model_(std::move(model)), shard_group_(shard_group), replicate_group_(replicate_group), options_(options) {}

FullyShardedLlama::~FullyShardedLlama() = default;

Result<std::unique_ptr<FullyShardedLlama>> FullyShardedLlama::Create(model::LlamaForCausalLM model,
                                                                     dist::Communicator* shard_group,
                                                                     dist::Communicator* replicate_group,
                                                                     const FsdpOptions& options) {
  if (shard_group == nullptr) return Internal("fully_shard: no dp_shard communicator");
  std::unique_ptr<FullyShardedLlama> f(new FullyShardedLlama(std::move(model), shard_group, replicate_group, options));
  const int64_t layers = f->model_->config().num_hidden_layers;
  for (int64_t u = 0; u <= layers; ++u) {
    auto unit = std::make_unique<Unit>();
    unit->name = u == 0 ? "root" : "model.layers." + std::to_string(u - 1);
    unit->group = shard_group;
    unit->options = &f->options_;
    unit->stats = &f->stats_;
    f->units_.push_back(std::move(unit));
  }
  const int world = shard_group->size();
  const int rank = shard_group->rank();
  torch::NoGradGuard no_grad;
  for (auto& item : f->model_->named_parameters()) {
    const std::string& name = item.key();
    int64_t u = 0;
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) == 0) u = std::stoll(name.substr(prefix.size())) + 1;
    Unit& unit = *f->units_[u];
    unit.device = item.value().device();
    ShardedParam p;
    p.name = name;
    p.full = item.value();
    p.full_shape = p.full.sizes().vec();
    const int64_t rows = p.full_shape[0];
    p.rows_per_rank = (rows + world - 1) / world;
    p.row_numel = p.full.numel() / rows;
    // This rank's rows, zero-padded: Shard(0) with the last ranks holding padding.
    auto shard_shape = p.full_shape;
    shard_shape[0] = p.rows_per_rank;
    torch::Tensor shard = torch::zeros(shard_shape, p.full.options().dtype(torch::kFloat));
    const int64_t begin = rank * p.rows_per_rank;
    const int64_t n = std::min(p.rows_per_rank, rows - begin);
    if (n > 0) shard.narrow(0, 0, n).copy_(p.full.narrow(0, begin, n));
    p.shard = shard.requires_grad_(true);
    // From here on the parameter's storage is FSDP's: param_dtype, allocated only while gathered.
    p.full.set_data(torch::empty(p.full_shape, p.full.options().dtype(options.param_dtype)));
    ReleaseStorage(p.full);
    f->params_.push_back(std::move(p));
    unit.params.push_back(&f->params_.back());
    unit.offsets.push_back(unit.shard_numel);
    unit.shard_numel += f->params_.back().shard_numel();
  }
  return f;
}

torch::Tensor FullyShardedLlama::Forward(const torch::Tensor& tokens) {
  units_[0]->WaitGather();
  const bool prefetch = options_.prefetch;
  if (prefetch && units_.size() > 1) units_[1]->StartGather();
  const bool sync = sync_;
  const int64_t layers = static_cast<int64_t>(units_.size()) - 1;
  torch::Tensor logits = model_->ForwardWithLayerRunner(
      tokens, [&](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
        Unit* unit = units_[i + 1].get();
        unit->WaitGather();
        if (prefetch && i + 1 < layers) units_[i + 2]->StartGather();
        // Backward reaches the layer's input once the whole layer is done (its weights'
        // gradients are accumulated first: autograd runs AccumulateGrad nodes as soon as they
        // are ready). That is the layer's post-backward (reduce-scatter, free) and the previous
        // layer's pre-backward (wait for its gather, prefetch the one before it).
        if (h.requires_grad()) {
          Unit* prev = i > 0 ? units_[i].get() : nullptr;
          Unit* before_prev = prefetch && i > 1 ? units_[i - 1].get() : nullptr;
          h.register_hook([unit, prev, before_prev, sync](const torch::Tensor&) {
            unit->PostBackward(sync);
            if (prev != nullptr) prev->WaitGather();
            if (before_prev != nullptr) before_prev->StartGather();
          });
        }
        torch::Tensor out = layer.forward(h, rope);
        if (options_.reshard_after_forward) unit->Free();
        if (i + 1 == layers && out.requires_grad()) {
          // Pre-backward of the last layer (the others get theirs from the next layer's hook).
          Unit* before = prefetch && i > 0 ? units_[i].get() : nullptr;
          out.register_hook([unit, before](const torch::Tensor&) {
            unit->WaitGather();
            if (before != nullptr) before->StartGather();
          });
        }
        return out;
      });
  // The last layer is the first one backward needs: gather it while the loss is computed.
  if (prefetch && layers > 0) units_.back()->StartGather();
  return logits;
}

torch::Tensor FullyShardedLlama::ForwardNoGrad(const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  units_[0]->WaitGather();
  torch::Tensor logits = model_->ForwardWithLayerRunner(tokens, [this](int64_t i, model::DecoderLayerImpl& layer,
                                                        const torch::Tensor& h, const model::RopeTables& rope) {
    Unit& unit = *units_[i + 1];
    unit.WaitGather();
    if (options_.prefetch && i + 2 < static_cast<int64_t>(units_.size())) units_[i + 2]->StartGather();
    torch::Tensor out = layer.forward(h, rope);
    unit.Free();
    return out;
  });
  units_[0]->Free();
  return logits;
}

Status FullyShardedLlama::FinishBackward() {
  try {
    // The root's post-backward (its parameters were used at both ends of the model). A layer
    // whose hook did not run (its output did not reach the loss) is reduced here too, so every
    // rank issues the same collectives.
    for (size_t u = 1; u < units_.size(); ++u) {
      if (units_[u]->PendingGrads()) units_[u]->PostBackward(sync_);
    }
    units_[0]->PostBackward(sync_);
    if (!sync_) return Status::Ok();
    for (auto& unit : units_) unit->FinishReduce(replicate_group_);
    for (auto& unit : units_) unit->FinishReplicaReduce();
    return Status::Ok();
  } catch (const StatusError& e) {
    return e.status();
  }
}

std::vector<torch::Tensor> FullyShardedLlama::DecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : params_)
    if (p.full_shape.size() >= 2) out.push_back(p.shard);
  return out;
}

std::vector<torch::Tensor> FullyShardedLlama::NoDecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : params_)
    if (p.full_shape.size() < 2) out.push_back(p.shard);
  return out;
}

Result<double> FullyShardedLlama::GradNormSquared() {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(units_[0]->device));
  for (const auto& p : params_)
    if (p.shard.grad().defined()) sum += p.shard.grad().to(torch::kDouble).pow(2).sum();
  // Shards are disjoint within dp_shard (padding is zero); replicas hold the same values.
  MW_ASSIGN_OR_RETURN(auto work, shard_group_->AllReduce(sum, dist::ReduceOp::kSum));
  MW_RETURN_IF_ERROR(work->Wait());
  return sum.item<double>();
}

void FullyShardedLlama::ScaleGrads(double factor) {
  torch::NoGradGuard no_grad;
  for (auto& p : params_)
    if (p.shard.grad().defined()) p.shard.mutable_grad().mul_(factor);
}

void FullyShardedLlama::ZeroGrad() {
  for (auto& p : params_) p.shard.mutable_grad() = torch::Tensor();
}

Result<std::map<std::string, torch::Tensor>> FullyShardedLlama::GatherFullState() {
  std::map<std::string, torch::Tensor> state;
  try {
    for (auto& unit : units_) {
      unit->WaitGather();
      for (ShardedParam* p : unit->params) state[p->name] = p->full.detach().to(torch::kFloat).clone();
      unit->Free();
    }
  } catch (const StatusError& e) {
    return e.status();
  }
  return state;
}

FsdpStats FullyShardedLlama::TakeStats() {
  FsdpStats s = stats_;
  stats_ = FsdpStats();
  return s;
}

int64_t FullyShardedLlama::ShardBytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_) bytes += dist::TensorBytes(p.shard);
  return bytes;
}

}  // namespace meshwork::fsdp
