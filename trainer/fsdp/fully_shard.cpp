#include "trainer/fsdp/fully_shard.h"

#include <torch/torch.h>

#include <chrono>
#include <map>

namespace meshwork::fsdp {
namespace {

using Clock = std::chrono::steady_clock;

// Inside autograd a failure can only travel as an exception; Train() turns it back into a Status.
void ThrowIfError(const Status& s) { TORCH_CHECK(s.ok(), s.message()); }

}  // namespace

struct FullyShardedLlama::Unit {
  std::string name;
  std::vector<ShardedParam> params;
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
    for (const auto& p : params) {
      flat.narrow(0, p.offset, p.shard_numel()).copy_(p.shard.detach().reshape({-1}));
    }
    gather_out = torch::empty({world * shard_numel}, opts);
    auto work = group->AllGatherInto(gather_out, flat);
    ThrowIfError(work.status());
    gather_work = std::move(work).value();
  }

  // Waits for the all-gather and points every module parameter at its full value.
  void WaitGather() {
    if (gathered) return;
    StartGather();
    Timed([&] { return gather_work->Wait(); });
    gather_work.reset();
    torch::NoGradGuard no_grad;
    const int world = group->size();
    for (auto& p : params) {
      std::vector<torch::Tensor> pieces;
      pieces.reserve(world);
      for (int r = 0; r < world; ++r) {
        pieces.push_back(gather_out.narrow(0, r * shard_numel + p.offset, p.shard_numel()));
      }
      std::vector<int64_t> padded = p.full_shape;
      padded[0] = p.rows_per_rank * world;
      torch::Tensor full = torch::cat(pieces).view(padded).narrow(0, 0, p.full_shape[0]);
      p.full.set_data(full);
    }
    gather_out = torch::Tensor();
    gathered = true;
  }

  void Free() {
    if (!gathered) return;
    for (auto& p : params) {
      p.full.set_data(torch::empty({0}, torch::TensorOptions().dtype(options->param_dtype).device(device)));
    }
    gathered = false;
  }

  // Full gradients (one per param, full shape) of this unit for one micro-batch: held back
  // without sync, else laid out rank-major and reduce-scattered (async).
  void ReduceGrads(std::vector<torch::Tensor> grads, bool sync) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) grads[i] = torch::zeros(params[i].full_shape, torch::TensorOptions().device(device));
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
      const auto& p = params[i];
      const int64_t rows = p.full_shape[0];
      for (int r = 0; r < world; ++r) {
        const int64_t begin = r * p.rows_per_rank;
        const int64_t n = std::min(p.rows_per_rank, rows - begin);
        if (n <= 0) continue;  // only padding on this rank
        input.narrow(0, r * shard_numel + p.offset, n * p.row_numel)
            .copy_(grads[i].narrow(0, begin, n).reshape({-1}));
      }
    }
    reduce_out = torch::empty({shard_numel}, input.options());
    auto work = group->ReduceScatter(reduce_out, input, dist::ReduceOp::kAvg);
    ThrowIfError(work.status());
    reduce_work = std::move(work).value();
  }

  // Waits for the reduce-scatter and adds the result to the shards' gradients.
  void FinishReduce() {
    if (!reduce_work) return;
    Timed([&] { return reduce_work->Wait(); });
    reduce_work.reset();
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      torch::Tensor g = reduce_out.narrow(0, p.offset, p.shard_numel()).view(p.shard.sizes()).to(torch::kFloat);
      auto& grad = p.shard.mutable_grad();
      grad = grad.defined() ? grad + g : g.clone();
    }
    reduce_out = torch::Tensor();
  }
};

namespace {

// One decoder layer under FSDP. Forward gathers the layer (prefetching the next), computes
// without recording a graph, and frees; backward gathers again (prefetching the previous),
// recomputes the layer with gradients and hands the weight gradients to the reduce-scatter.
struct ShardedLayerFunction : public torch::autograd::Function<ShardedLayerFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor h, torch::Tensor cos,
                               torch::Tensor sin, int64_t layer_ptr, int64_t unit_ptr, int64_t next_ptr,
                               int64_t prev_ptr, bool reshard, bool sync) {
    auto* unit = reinterpret_cast<FullyShardedLlama::Unit*>(unit_ptr);
    auto* layer = reinterpret_cast<model::DecoderLayerImpl*>(layer_ptr);
    unit->WaitGather();
    if (next_ptr != 0) reinterpret_cast<FullyShardedLlama::Unit*>(next_ptr)->StartGather();
    torch::Tensor out = layer->forward(h, model::RopeTables{cos, sin});
    if (reshard) unit->Free();
    ctx->save_for_backward({h, cos, sin});
    ctx->saved_data["layer"] = layer_ptr;
    ctx->saved_data["unit"] = unit_ptr;
    ctx->saved_data["prev"] = prev_ptr;
    ctx->saved_data["sync"] = sync;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    auto* unit = reinterpret_cast<FullyShardedLlama::Unit*>(ctx->saved_data["unit"].toInt());
    auto* layer = reinterpret_cast<model::DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const int64_t prev_ptr = ctx->saved_data["prev"].toInt();
    unit->WaitGather();
    if (prev_ptr != 0) reinterpret_cast<FullyShardedLlama::Unit*>(prev_ptr)->StartGather();

    torch::autograd::variable_list inputs;
    torch::Tensor h = saved[0].detach().requires_grad_(true);
    inputs.push_back(h);
    for (auto& p : unit->params) inputs.push_back(p.full);
    torch::autograd::variable_list grads;
    {
      torch::AutoGradMode enable(true);
      torch::Tensor out = layer->forward(h, model::RopeTables{saved[1], saved[2]});
      grads = torch::autograd::grad({out}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    std::vector<torch::Tensor> weight_grads(grads.begin() + 1, grads.end());
    unit->ReduceGrads(std::move(weight_grads), ctx->saved_data["sync"].toBool());
    unit->Free();
    torch::autograd::variable_list result(9);  // one per forward argument; only h has a gradient
    result[0] = grads[0];
    return result;
  }
};

}  // namespace

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
    p.offset = unit.shard_numel;
    // This rank's rows, zero-padded: Shard(0) with the last ranks holding padding.
    auto shard_shape = p.full_shape;
    shard_shape[0] = p.rows_per_rank;
    torch::Tensor shard = torch::zeros(shard_shape, p.full.options().dtype(torch::kFloat));
    const int64_t begin = rank * p.rows_per_rank;
    const int64_t n = std::min(p.rows_per_rank, rows - begin);
    if (n > 0) shard.narrow(0, 0, n).copy_(p.full.narrow(0, begin, n));
    p.shard = shard.requires_grad_(true);
    unit.shard_numel += p.shard_numel();
    unit.params.push_back(std::move(p));
  }
  for (auto& unit : f->units_) {
    unit->gathered = true;  // the module holds the full initial values: release them
    unit->Free();
  }
  return f;
}

torch::Tensor FullyShardedLlama::Forward(const torch::Tensor& tokens) {
  units_[0]->WaitGather();
  if (options_.prefetch && units_.size() > 1) units_[1]->StartGather();
  const bool sync = sync_;
  const bool reshard = options_.reshard_after_forward;
  const bool prefetch = options_.prefetch;
  return model_->ForwardWithLayerRunner(tokens, [this, sync, reshard, prefetch](int64_t i, model::DecoderLayerImpl& layer,
                                                                const torch::Tensor& h, const model::RopeTables& rope) {
    Unit* unit = units_[i + 1].get();
    Unit* next = prefetch && i + 2 < static_cast<int64_t>(units_.size()) ? units_[i + 2].get() : nullptr;
    Unit* prev = prefetch && i > 0 ? units_[i].get() : nullptr;
    return ShardedLayerFunction::apply(h, rope.cos.narrow(0, 0, h.size(1)), rope.sin.narrow(0, 0, h.size(1)),
                                       reinterpret_cast<int64_t>(&layer), reinterpret_cast<int64_t>(unit),
                                       reinterpret_cast<int64_t>(next), reinterpret_cast<int64_t>(prev), reshard, sync);
  });
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
    Unit& root = *units_[0];
    // The root's parameters were ordinary leaves: autograd accumulated their full gradients.
    std::vector<torch::Tensor> grads;
    for (auto& p : root.params) grads.push_back(p.full.grad());
    if (sync_) {
      root.ReduceGrads(grads, true);
      for (auto& p : root.params) p.full.mutable_grad() = torch::Tensor();
    }
    root.Free();
    if (!sync_) return Status::Ok();
    for (auto& unit : units_) unit->FinishReduce();
    if (replicate_group_ != nullptr && replicate_group_->size() > 1) {
      // HSDP: shards are replicated across dp_replicate; average their gradients there.
      for (auto& unit : units_) {
        for (auto& p : unit->params) {
          auto work = replicate_group_->AllReduce(p.shard.mutable_grad(), dist::ReduceOp::kAvg);
          MW_RETURN_IF_ERROR(work.status());
          const auto t0 = Clock::now();
          MW_RETURN_IF_ERROR((*work)->Wait());
          stats_.exposed_comm_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        }
      }
    }
    return Status::Ok();
  } catch (const c10::Error& e) {
    return Unavailable(std::string("fsdp backward: ") + e.what_without_backtrace());
  }
}

std::vector<torch::Tensor> FullyShardedLlama::DecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& unit : units_)
    for (const auto& p : unit->params)
      if (p.full_shape.size() >= 2) out.push_back(p.shard);
  return out;
}

std::vector<torch::Tensor> FullyShardedLlama::NoDecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& unit : units_)
    for (const auto& p : unit->params)
      if (p.full_shape.size() < 2) out.push_back(p.shard);
  return out;
}

Result<double> FullyShardedLlama::GradNormSquared() {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(units_[0]->device));
  for (const auto& unit : units_)
    for (const auto& p : unit->params)
      if (p.shard.grad().defined()) sum += p.shard.grad().to(torch::kDouble).pow(2).sum();
  // Shards are disjoint within dp_shard (padding is zero); replicas hold the same values.
  MW_ASSIGN_OR_RETURN(auto work, shard_group_->AllReduce(sum, dist::ReduceOp::kSum));
  MW_RETURN_IF_ERROR(work->Wait());
  return sum.item<double>();
}

void FullyShardedLlama::ScaleGrads(double factor) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_)
    for (auto& p : unit->params)
      if (p.shard.grad().defined()) p.shard.mutable_grad().mul_(factor);
}

void FullyShardedLlama::ZeroGrad() {
  for (auto& unit : units_)
    for (auto& p : unit->params) p.shard.mutable_grad() = torch::Tensor();
}

Result<std::map<std::string, torch::Tensor>> FullyShardedLlama::GatherFullState() {
  std::map<std::string, torch::Tensor> state;
  try {
    for (auto& unit : units_) {
      unit->WaitGather();
      for (auto& p : unit->params) state[p.name] = p.full.detach().to(torch::kFloat).clone();
      unit->Free();
    }
  } catch (const c10::Error& e) {
    return Unavailable(std::string("fsdp gather: ") + e.what_without_backtrace());
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
  for (const auto& unit : units_)
    for (const auto& p : unit->params) bytes += dist::TensorBytes(p.shard);
  return bytes;
}

}  // namespace meshwork::fsdp
