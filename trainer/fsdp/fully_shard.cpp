#include "trainer/fsdp/fully_shard.h"

#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "trainer/compiler/frontend.h"
#include "trainer/dist/host_collectives.h"

namespace meshwork::fsdp {
namespace {

using Clock = std::chrono::steady_clock;

double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

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
  ChromeTrace* const* tracer = nullptr;  // the model's tracer_: null unless tracing a step
  int64_t* gathered_bytes = nullptr;     // the model's count of allocated parameter storage

  bool gathered = false;
  torch::Tensor gather_out;
  std::unique_ptr<dist::Work> gather_work;
  double gather_issued = 0;

  std::vector<torch::Tensor> grad_accum;  // full gradients held back while sync is off
  torch::Tensor reduce_out;
  std::unique_ptr<dist::Work> reduce_work;
  const char* reduce_kind = "";  // what reduce_work is: "reduce_scatter" or "all_reduce"
  double reduce_issued = 0;
  int64_t reduce_bytes = 0;      // its logical size (a reduce-scatter's input)
  const dist::Communicator* reduce_group = nullptr;  // the group it runs on

  // Waits for `work` (issued at `issued`), counting the time blocked as exposed communication.
  // When tracing: the collective from issue to completion, and the time blocked.
  void Await(std::unique_ptr<dist::Work>& work, const char* collective, double issued, int64_t bytes,
             const dist::Communicator& on) {
    const double t0 = Now();
    ThrowIfError(work->Wait());
    const double t1 = Now();
    stats->exposed_comm_seconds += t1 - t0;
    if (ChromeTrace* trace = *tracer) {
      const double done = std::min(t1, work->CompletedAt().value_or(t1));
      const std::string what = std::string(collective) + " " + name;
      trace->Span("communication", what, issued, std::max(issued, done),
                  {{"bytes", std::to_string(bytes)}, {"group", on.group_name()}});
      if (t1 - t0 > 1e-6) trace->Span("blocked on communication", "wait " + what, t0, t1);
    }
    work.reset();
  }

  void CountGathered(int64_t delta) {
    *gathered_bytes += delta;
    if (ChromeTrace* trace = *tracer) trace->Counter("gathered parameters (MiB)", Now(), *gathered_bytes / 1048576.0);
  }

  int64_t GatheredBytes() const {
    int64_t bytes = 0;
    for (const ShardedParam* p : params) bytes += dist::TensorBytes(p->full);
    return bytes;
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
    gather_issued = Now();
    auto work = group->AllGatherInto(gather_out, flat);
    ThrowIfError(work.status());
    gather_work = std::move(work).value();
  }

  // Waits for the all-gather and copies every rank's rows into the parameters' own storage
  // (re-allocated if freed), so tensors autograd saved from an earlier forward see them again.
  void WaitGather() {
    if (gathered) return;
    StartGather();
    Await(gather_work, "all_gather", gather_issued, dist::TensorBytes(gather_out), *group);
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
    CountGathered(GatheredBytes());
  }

  void Free() {
    if (!gathered) return;
    for (ShardedParam* p : params) ReleaseStorage(p->full);
    gathered = false;
    CountGathered(-GatheredBytes());
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
    reduce_issued = Now();
    auto work = group->ReduceScatter(reduce_out, input, dist::ReduceOp::kAvg);
    ThrowIfError(work.status());
    reduce_work = std::move(work).value();
    reduce_kind = "reduce_scatter";
    reduce_group = group;
    reduce_bytes = dist::TensorBytes(input);
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
    Await(reduce_work, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
    if (replicate != nullptr && replicate->size() > 1) {
      StartReplicaReduce(replicate);
      return;
    }
    AddReducedGrads();
  }

  // Plan mode: wait for the reduce-scatter; add the result now unless an all-reduce follows.
  void WaitReduce(bool all_reduce_follows) {
    if (!reduce_work) return;  // gradient sync off: nothing was sent
    Await(reduce_work, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
    if (!all_reduce_follows) AddReducedGrads();
  }

  void StartReplicaReduce(dist::Communicator* replicate) {
    if (!reduce_out.defined()) return;  // gradient sync off
    reduce_issued = Now();
    auto work = replicate->AllReduce(reduce_out, dist::ReduceOp::kAvg);
    ThrowIfError(work.status());
    reduce_work = std::move(work).value();
    reduce_kind = "all_reduce";
    reduce_group = replicate;
    reduce_bytes = dist::TensorBytes(reduce_out);
  }

  void FinishReplicaReduce() {
    if (!reduce_work) return;
    Await(reduce_work, reduce_kind, reduce_issued, reduce_bytes, *reduce_group);
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

// A compiled plan bound to this model: one Unit per all-gather and per reduce-scatter value.
struct FullyShardedLlama::Plan {
  compiler::Graph graph;
  std::map<std::string, std::unique_ptr<Unit>> buckets;  // %ag / %rs id -> its parameters
  // Per op, resolved once in UsePlan so the per-step replay does no lookups: the unit it acts
  // on (an all_reduce and its wait: the source reduce-scatter's), and what a wait waits for.
  enum class WaitFor { kNone, kGather, kReduce, kReduceThenAllReduce, kAllReduce };
  std::vector<Unit*> unit;
  std::vector<WaitFor> wait_for;
  std::vector<std::vector<ShardedParam*>> module_params;
  size_t pc = 0;
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
    unit->tracer = &f->tracer_;
    unit->gathered_bytes = &f->gathered_bytes_;
    f->units_.push_back(std::move(unit));
  }
  const int world = shard_group->size();
  const int rank = shard_group->rank();
  f->trace_.fwd.assign(layers + 2, Span());
  f->trace_.bwd.assign(layers + 2, Span());
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
  f->trace_.clock = ComputeClock(f->units_[0]->device);
  return f;
}

torch::Tensor FullyShardedLlama::Forward(const torch::Tensor& tokens) {
  trace_.batch = tokens.size(0);
  trace_.seq = tokens.size(1);
  if (plan_) return CompiledForward(tokens);
  units_[0]->WaitGather();
  Trace* trace = &trace_;
  trace->clock.Restart();
  trace->mark = trace->clock.Now();
  const bool prefetch = options_.prefetch;
  if (prefetch && units_.size() > 1) units_[1]->StartGather();
  const bool sync = sync_;
  const int64_t layers = static_cast<int64_t>(units_.size()) - 1;
  torch::Tensor logits = model_->ForwardWithLayerRunner(
      tokens, [&](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
        Unit* unit = units_[i + 1].get();
        if (i == 0) {
          trace->fwd[0] = {trace->mark, trace->clock.Now()};  // the embedding ran since
          TraceCompute("fwd embed", trace->fwd[0].from.host, trace->fwd[0].to.host);
        }
        unit->WaitGather();
        if (prefetch && i + 1 < layers) units_[i + 2]->StartGather();
        const ComputeClock::Mark start = trace->clock.Now();
        // Backward reaches the layer's input once the whole layer is done (its weights'
        // gradients are accumulated first: autograd runs AccumulateGrad nodes as soon as they
        // are ready). That is the layer's post-backward (reduce-scatter, free) and the previous
        // layer's pre-backward (wait for its gather, prefetch the one before it).
        if (h.requires_grad()) {
          Unit* prev = i > 0 ? units_[i].get() : nullptr;
          Unit* before_prev = prefetch && i > 1 ? units_[i - 1].get() : nullptr;
          h.register_hook([this, unit, prev, before_prev, sync, trace, i](const torch::Tensor&) {
            trace->bwd[i + 1] = {trace->mark, trace->clock.Now()};
            TraceCompute("bwd layers." + std::to_string(i), trace->bwd[i + 1].from.host, trace->bwd[i + 1].to.host);
            unit->PostBackward(sync);
            if (prev != nullptr) prev->WaitGather();
            if (before_prev != nullptr) before_prev->StartGather();
            trace->mark = trace->clock.Now();
          });
        }
        torch::Tensor out = layer.forward(h, rope);
        trace->fwd[i + 1] = {start, trace->clock.Now()};
        TraceCompute("fwd layers." + std::to_string(i), start.host, trace->fwd[i + 1].to.host);
        if (options_.reshard_after_forward) unit->Free();
        if (i + 1 == layers && out.requires_grad()) {
          // Pre-backward of the last layer (the others get theirs from the next layer's hook).
          Unit* before = prefetch && i > 0 ? units_[i].get() : nullptr;
          out.register_hook([this, unit, before, trace, layers](const torch::Tensor&) {
            // Head forward (with the loss) and head backward ran since the end of Forward.
            const ComputeClock::Mark now = trace->clock.Now();
            TraceCompute("fwd+bwd head (with the loss)", trace->mark.host, now.host);
            trace->fwd[layers + 1] = {trace->mark, now, 1.0 / 3};
            trace->bwd[layers + 1] = {trace->mark, now, 2.0 / 3};
            unit->WaitGather();
            if (before != nullptr) before->StartGather();
            trace->mark = trace->clock.Now();
          });
        }
        return out;
      });
  // The last layer is the first one backward needs: gather it while the loss is computed.
  if (prefetch && layers > 0) units_.back()->StartGather();
  trace->mark = trace->clock.Now();
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
    if (plan_) {
      RunPlanUntil(compiler::Phase::kBackward, "");
      return Status::Ok();
    }
    trace_.bwd[0] = {trace_.mark, trace_.clock.Now()};  // the embedding's backward
    TraceCompute("bwd embed", trace_.bwd[0].from.host, trace_.bwd[0].to.host);
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

void FullyShardedLlama::TraceCompute(const std::string& label, double start, double end) {
  if (tracer_ != nullptr) tracer_->Span("compute", label, start, end);
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

compiler::Graph FullyShardedLlama::Skeleton() const {
  compiler::Graph g;
  g.dp_shard = shard_group_->size();
  g.dp_replicate = replicate_group_ != nullptr ? replicate_group_->size() : 1;
  const int64_t param_bytes = c10::elementSize(options_.param_dtype);
  const int64_t reduce_bytes = c10::elementSize(options_.reduce_dtype);
  std::map<std::string, int> index;
  for (const auto& p : params_) {
    compiler::ParamInfo info;
    info.name = p.name;
    int64_t numel = 1;
    for (int64_t d : p.full_shape) numel *= d;
    info.gathered_bytes = numel * param_bytes;
    info.grad_bytes = numel * reduce_bytes;
    info.shard_bytes = p.shard_numel() * 4;
    index[p.name] = static_cast<int>(g.params.size());
    g.params.push_back(info);
  }
  const auto& c = model_->config();
  // Activation estimate (the compiler's Llama model), at the traced batch and length.
  compiler::LlamaShape shape;
  shape.config = c;
  shape.batch = std::max<int64_t>(trace_.batch, 1);
  shape.seq_len = std::max<int64_t>(trace_.seq, 1);
  shape.activation_bytes = static_cast<int>(param_bytes);
  const compiler::Graph estimate = compiler::LlamaSkeleton(shape);
  auto add_module = [&](const std::string& name, std::vector<int> params, size_t t) {
    compiler::ModuleInfo m;
    m.name = name;
    m.params = std::move(params);
    m.fwd_seconds = trace_.clock.Seconds(trace_.fwd[t].from, trace_.fwd[t].to) * trace_.fwd[t].share;
    m.bwd_seconds = trace_.clock.Seconds(trace_.bwd[t].from, trace_.bwd[t].to) * trace_.bwd[t].share;
    const int e = estimate.FindModule(name);
    if (e >= 0) m.activation_bytes = estimate.modules[e].activation_bytes;
    g.modules.push_back(std::move(m));
  };
  const int embed = index.at("model.embed_tokens.weight");
  add_module("embed", {embed}, 0);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::vector<int> ps;
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    for (size_t k = 0; k < g.params.size(); ++k)
      if (g.params[k].name.rfind(prefix, 0) == 0) ps.push_back(static_cast<int>(k));
    add_module("layers." + std::to_string(i), ps, static_cast<size_t>(i + 1));
  }
  std::vector<int> head{index.at("model.norm.weight")};
  head.push_back(index.count("lm_head.weight") ? index.at("lm_head.weight") : embed);
  add_module("head", head, static_cast<size_t>(c.num_hidden_layers + 1));
  return g;
}

Status FullyShardedLlama::UsePlan(const compiler::Graph& plan) {
  const compiler::Graph mine = Skeleton();
  if (plan.params.size() != mine.params.size())
    return Internal("plan has " + std::to_string(plan.params.size()) + " parameters, the model " +
                    std::to_string(mine.params.size()));
  for (size_t i = 0; i < mine.params.size(); ++i)
    if (plan.params[i].name != mine.params[i].name)
      return Internal("plan parameter " + std::to_string(i) + " is '" + plan.params[i].name + "', the model's '" +
                      mine.params[i].name + "'");
  if (plan.modules.size() != mine.modules.size()) return Internal("plan modules do not match the model");
  for (size_t m = 0; m < mine.modules.size(); ++m)
    if (plan.modules[m].name != mine.modules[m].name || plan.modules[m].params != mine.modules[m].params)
      return Internal("plan module '" + plan.modules[m].name + "' does not match the model's '" +
                      mine.modules[m].name + "'");
  if (plan.dp_shard != mine.dp_shard || plan.dp_replicate != mine.dp_replicate)
    return Internal("plan mesh does not match this run's");
  MW_RETURN_IF_ERROR(compiler::Validate(plan));
  auto p = std::make_unique<Plan>();
  p->graph = plan;
  std::vector<ShardedParam*> by_index;
  for (auto& sp : params_) by_index.push_back(&sp);
  for (const auto& m : plan.modules) {
    std::vector<ShardedParam*> ps;
    for (int i : m.params) ps.push_back(by_index[i]);
    p->module_params.push_back(std::move(ps));
  }
  std::map<std::string, std::string> all_reduce_source;  // %ar id -> %rs id
  for (const auto& op : plan.ops) {
    if (op.kind == compiler::OpKind::kAllReduce) all_reduce_source[op.id] = op.source;
    if (op.kind != compiler::OpKind::kAllGather && op.kind != compiler::OpKind::kReduceScatter) continue;
    auto unit = std::make_unique<Unit>();
    unit->name = op.id;
    unit->group = shard_group_;
    unit->options = &options_;
    unit->stats = &stats_;
    unit->tracer = &tracer_;
    unit->gathered_bytes = &gathered_bytes_;
    unit->device = units_[0]->device;
    for (int i : op.params) {
      unit->params.push_back(by_index[i]);
      unit->offsets.push_back(unit->shard_numel);
      unit->shard_numel += by_index[i]->shard_numel();
    }
    p->buckets[op.id] = std::move(unit);
  }
  using Wait = Plan::WaitFor;
  std::map<std::string, compiler::OpKind> kind_of;
  for (const auto& op : plan.ops)
    if (op.is_collective()) kind_of[op.id] = op.kind;
  std::set<std::string> reduced_again;
  for (const auto& [ar, rs] : all_reduce_source) reduced_again.insert(rs);
  for (const auto& op : plan.ops) {
    const auto ar = all_reduce_source.find(op.id);
    const std::string& bucket =
        op.kind == compiler::OpKind::kAllReduce ? op.source : ar != all_reduce_source.end() ? ar->second : op.id;
    auto it = p->buckets.find(bucket);
    p->unit.push_back(it != p->buckets.end() ? it->second.get() : nullptr);
    Wait w = Wait::kNone;
    if (op.kind == compiler::OpKind::kWait) {
      if (ar != all_reduce_source.end()) {
        w = Wait::kAllReduce;
      } else if (kind_of[op.id] == compiler::OpKind::kAllGather) {
        w = Wait::kGather;
      } else {
        w = reduced_again.count(op.id) ? Wait::kReduceThenAllReduce : Wait::kReduce;
      }
    }
    p->wait_for.push_back(w);
  }
  plan_ = std::move(p);
  return Status::Ok();
}

void FullyShardedLlama::RunPlanUntil(compiler::Phase phase, const std::string& module) {
  using compiler::OpKind;
  Plan& plan = *plan_;
  const auto& ops = plan.graph.ops;
  if (!open_compute_.empty()) {
    TraceCompute(open_compute_, open_compute_start_, Now());
    open_compute_.clear();
  }
  while (plan.pc < ops.size()) {
    const size_t at = plan.pc++;
    const compiler::Op& op = ops[at];
    switch (op.kind) {
      case OpKind::kCompute: {
        const std::string& name = plan.graph.modules[op.module].name;
        if (op.phase != phase || name != module) {
          ThrowIfError(Internal("compiled plan op " + std::to_string(at) + " is compute " +
                                (op.phase == compiler::Phase::kForward ? "fwd " : "bwd ") + name +
                                " but the model is at " + (phase == compiler::Phase::kForward ? "fwd " : "bwd ") +
                                (module.empty() ? "the end of the step" : module)));
        }
        for (ShardedParam* p : plan.module_params[op.module])
          if (p->full.storage().nbytes() == 0)
            ThrowIfError(Internal("compiled plan runs " + name + " with " + p->name + " not gathered"));
        if (tracer_ != nullptr) {
          open_compute_ = (phase == compiler::Phase::kForward ? "fwd " : "bwd ") + name;
          open_compute_start_ = Now();
        }
        return;
      }
      case OpKind::kAllGather: plan.unit[at]->StartGather(); break;
      case OpKind::kReduceScatter: plan.unit[at]->ReduceGrads(sync_); break;
      case OpKind::kAllReduce:
        if (replicate_group_ != nullptr) plan.unit[at]->StartReplicaReduce(replicate_group_);
        break;
      case OpKind::kFree: plan.unit[at]->Free(); break;
      case OpKind::kWait:
        switch (plan.wait_for[at]) {
          case Plan::WaitFor::kGather: plan.unit[at]->WaitGather(); break;
          case Plan::WaitFor::kReduce: plan.unit[at]->WaitReduce(false); break;
          case Plan::WaitFor::kReduceThenAllReduce: plan.unit[at]->WaitReduce(true); break;
          case Plan::WaitFor::kAllReduce: plan.unit[at]->FinishReplicaReduce(); break;
          case Plan::WaitFor::kNone: break;
        }
        break;
      case OpKind::kOptimizerStep: break;
    }
  }
  if (!module.empty()) ThrowIfError(Internal("compiled plan ended before compute of " + module));
  plan.pc = 0;
}

torch::Tensor FullyShardedLlama::CompiledForward(const torch::Tensor& tokens) {
  using compiler::Phase;
  plan_->pc = 0;
  RunPlanUntil(Phase::kForward, "embed");
  const int64_t layers = model_->config().num_hidden_layers;
  torch::Tensor logits = model_->ForwardWithLayerRunner(
      tokens, [&](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
        RunPlanUntil(Phase::kForward, "layers." + std::to_string(i));
        if (h.requires_grad()) {
          const std::string before = i > 0 ? "layers." + std::to_string(i - 1) : "embed";
          h.register_hook([this, before](const torch::Tensor&) { RunPlanUntil(Phase::kBackward, before); });
        }
        torch::Tensor out = layer.forward(h, rope);
        if (i + 1 == layers) {
          if (out.requires_grad()) {
            const std::string me = "layers." + std::to_string(i);
            out.register_hook([this, me](const torch::Tensor&) { RunPlanUntil(Phase::kBackward, me); });
          }
          RunPlanUntil(Phase::kForward, "head");  // the model runs the head next
        }
        return out;
      });
  // The head's backward runs before control comes back (at the last layer's backward hook):
  // what the plan schedules between the head's forward and backward is issued now.
  RunPlanUntil(Phase::kBackward, "head");
  return logits;
}

Result<compiler::Graph> AgreeOnPlan(dist::Communicator& group, const compiler::Graph& plan) {
  MW_ASSIGN_OR_RETURN(const std::string agreed,
                      dist::BroadcastText(group, group.rank() == 0 ? compiler::Print(plan) : std::string(), 0));
  return compiler::Parse(agreed);
}

}  // namespace meshwork::fsdp
