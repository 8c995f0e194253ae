#include "trainer/fsdp/fully_shard.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "trainer/compiler/frontend.h"
#include "trainer/dist/host_collectives.h"
#include "trainer/fsdp/eager_schedule.h"
#include "trainer/fsdp/plan_executor.h"
#include "trainer/fsdp/step_schedule.h"

namespace meshwork::fsdp {
namespace {

// The plan was compiled for this model: the same parameters (HF order), modules and mesh.
Status CheckPlanMatches(const compiler::Graph& plan, const compiler::Graph& mine) {
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
  return Status::Ok();
}

// Shards one parameter over `world` ranks: this rank's rows of Shard(0), zero-padded, as an fp32
// master; the module parameter's storage becomes FSDP's (param_dtype, allocated only while
// gathered).
ShardedParam ShardParam(const std::string& name, const torch::Tensor& full, int world, int rank,
                        torch::ScalarType param_dtype) {
  ShardedParam p;
  p.name = name;
  p.full = full;
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
  p.full.set_data(torch::empty(p.full_shape, p.full.options().dtype(param_dtype)));
  ReleaseStorage(p.full);
  return p;
}

}  // namespace

FullyShardedLlama::FullyShardedLlama(std::unique_ptr<ShardedState> state)
    : state_(std::move(state)), schedule_(std::make_unique<EagerSchedule>(*state_)) {}

FullyShardedLlama::~FullyShardedLlama() = default;

Result<std::unique_ptr<FullyShardedLlama>> FullyShardedLlama::Create(model::LlamaForCausalLM model,
                                                                     const FsdpGroups& groups,
                                                                     const FsdpOptions& options) {
  dist::Communicator* shard_group = groups.shard;
  if (shard_group == nullptr) return Internal("fully_shard: no dp_shard communicator");
  dist::Communicator* reduce_group = groups.reduce_scatter != nullptr ? groups.reduce_scatter : shard_group;
  if (reduce_group->size() != shard_group->size() || reduce_group->rank() != shard_group->rank())
    return Internal("fully_shard: the reduce-scatter communicator is not over dp_shard's ranks");
  auto state = std::make_unique<ShardedState>(std::move(model), shard_group, reduce_group, groups.replicate, options);
  const int64_t layers = state->model->config().num_hidden_layers;
  for (int64_t u = 0; u <= layers; ++u) {
    const std::string name = u == 0 ? "root" : "model.layers." + std::to_string(u - 1);
    state->units.push_back(std::make_unique<Unit>(name, state->unit_context(), torch::kCPU));
  }
  state->trace.fwd.assign(layers + 2, StepTrace::Span());
  state->trace.bwd.assign(layers + 2, StepTrace::Span());
  const int world = shard_group->size();
  const int rank = shard_group->rank();
  torch::NoGradGuard no_grad;
  for (auto& item : state->model->named_parameters()) {
    const std::string& name = item.key();
    int64_t u = 0;
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) == 0) u = std::stoll(name.substr(prefix.size())) + 1;
    Unit& unit = *state->units[u];
    unit.device = item.value().device();
    state->params.push_back(ShardParam(name, item.value(), world, rank, options.param_dtype));
    unit.AddParam(&state->params.back());
  }
  state->trace.clock = ComputeClock(state->units[0]->device);
  return std::unique_ptr<FullyShardedLlama>(new FullyShardedLlama(std::move(state)));
}

torch::Tensor FullyShardedLlama::Forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
  state_->trace.batch = tokens.size(0);
  state_->trace.seq = tokens.size(1);
  return schedule_->Forward(tokens, targets);
}

void FullyShardedLlama::SetGradientSync(bool sync) { state_->sync = sync; }

torch::Tensor FullyShardedLlama::ForwardNoGrad(const torch::Tensor& tokens, const torch::Tensor& targets) {
  torch::NoGradGuard no_grad;
  std::vector<std::unique_ptr<Unit>>& units = state_->units;
  units[0]->WaitGather();
  torch::Tensor logits = state_->model->ForwardWithLayerRunner(
      tokens, [this, &units](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h,
                             const model::RopeTables& rope) {
        Unit& unit = *units[i + 1];
        unit.WaitGather();
        if (state_->options.prefetch && i + 2 < static_cast<int64_t>(units.size())) units[i + 2]->StartGather();
        torch::Tensor out = layer.forward(h, rope);
        unit.Free();
        return out;
      },
      targets);
  units[0]->Free();
  return logits;
}

Status FullyShardedLlama::FinishBackward() {
  try {
    schedule_->FinishBackward();
    return Status::Ok();
  } catch (const StatusError& e) {
    return e.status();
  }
}

std::vector<torch::Tensor> FullyShardedLlama::DecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : state_->params)
    if (p.full_shape.size() >= 2) out.push_back(p.shard);
  return out;
}

std::vector<torch::Tensor> FullyShardedLlama::NoDecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : state_->params)
    if (p.full_shape.size() < 2) out.push_back(p.shard);
  return out;
}

Result<torch::Tensor> FullyShardedLlama::GradNormSquared() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : state_->params)
    if (p.shard.grad().defined()) grads.push_back(p.shard.grad());
  torch::Tensor sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(state_->units[0]->device));
  // One norm per shard in one multi-tensor call, squared and summed in fp64.
  if (!grads.empty()) sum += torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).pow(2).sum();
  // Shards are disjoint within dp_shard (padding is zero); replicas hold the same values.
  MW_ASSIGN_OR_RETURN(auto work, state_->shard_group->AllReduce(sum, dist::ReduceOp::kSum));
  MW_RETURN_IF_ERROR(work->Wait());
  return sum;
}

void FullyShardedLlama::ScaleGrads(double factor) {
  torch::NoGradGuard no_grad;
  for (auto& p : state_->params)
    if (p.shard.grad().defined()) p.shard.mutable_grad().mul_(factor);
}

void FullyShardedLlama::ZeroGrad() {
  for (auto& p : state_->params) p.shard.mutable_grad() = torch::Tensor();
}

Result<std::map<std::string, torch::Tensor>> FullyShardedLlama::GatherFullState() {
  std::map<std::string, torch::Tensor> state;
  try {
    for (auto& unit : state_->units) {
      unit->WaitGather();
      for (ShardedParam* p : unit->params) state[p->name] = p->full.detach().to(torch::kFloat).clone();
      unit->Free();
    }
  } catch (const StatusError& e) {
    return e.status();
  }
  return state;
}

const std::deque<ShardedParam>& FullyShardedLlama::sharded_params() const { return state_->params; }

const model::LlamaConfig& FullyShardedLlama::config() const { return state_->model->config(); }

model::LlamaForCausalLM& FullyShardedLlama::module() { return state_->model; }

void FullyShardedLlama::TraceInto(ChromeTrace* trace) { state_->tracer = trace; }

FsdpStats FullyShardedLlama::TakeStats() {
  FsdpStats s = state_->stats;
  state_->stats = FsdpStats();
  return s;
}

int64_t FullyShardedLlama::ShardBytes() const {
  int64_t bytes = 0;
  for (const auto& p : state_->params) bytes += dist::TensorBytes(p.shard);
  return bytes;
}

compiler::Graph FullyShardedLlama::Skeleton() const {
  compiler::Graph g;
  g.dp_shard = state_->shard_group->size();
  g.dp_replicate = state_->replicate_group != nullptr ? state_->replicate_group->size() : 1;
  g.reduce_scatter_receives_input = std::string(state_->reduce_group->backend()) == "gloo";
  const int64_t param_bytes = c10::elementSize(state_->options.param_dtype);
  const int64_t reduce_bytes = c10::elementSize(state_->options.reduce_dtype);
  std::map<std::string, int> index;
  for (const auto& p : state_->params) {
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
  const auto& c = state_->model->config();
  const StepTrace& trace = state_->trace;
  // Activation estimate (the compiler's Llama model), at the traced batch and length.
  compiler::LlamaShape shape;
  shape.config = c;
  shape.batch = std::max<int64_t>(trace.batch, 1);
  shape.seq_len = std::max<int64_t>(trace.seq, 1);
  shape.activation_bytes = static_cast<int>(param_bytes);
  const compiler::Graph estimate = compiler::LlamaSkeleton(shape);
  auto add_module = [&](const std::string& name, std::vector<int> params, size_t t) {
    compiler::ModuleInfo m;
    m.name = name;
    m.params = std::move(params);
    m.fwd_seconds = trace.clock.Seconds(trace.fwd[t].from, trace.fwd[t].to) * trace.fwd[t].share;
    m.bwd_seconds = trace.clock.Seconds(trace.bwd[t].from, trace.bwd[t].to) * trace.bwd[t].share;
    const int e = estimate.FindModule(name);
    if (e >= 0) {
      m.activation_bytes = estimate.modules[e].activation_bytes;
      switch (state_->options.checkpointing) {
        case LayerCheckpointing::kNone: break;
        case LayerCheckpointing::kPlanned: m.checkpoint_input_bytes = estimate.modules[e].checkpoint_input_bytes; break;
        case LayerCheckpointing::kAll:
          // Checkpointed already: the traced backward has the recompute in it.
          if (estimate.modules[e].checkpoint_input_bytes > 0) {
            m.backward_workspace_bytes = m.activation_bytes;
            m.activation_bytes = estimate.modules[e].checkpoint_input_bytes;
          }
          break;
      }
    }
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
  MW_RETURN_IF_ERROR(CheckPlanMatches(plan, Skeleton()));
  MW_RETURN_IF_ERROR(compiler::Validate(plan));
  schedule_ = std::make_unique<PlanExecutor>(*state_, plan);
  compiled_ = true;
  return Status::Ok();
}

Result<compiler::Graph> AgreeOnPlan(dist::Communicator& group, const compiler::Graph& plan) {
  MW_ASSIGN_OR_RETURN(const std::string agreed,
                      dist::BroadcastText(group, group.rank() == 0 ? compiler::Print(plan) : std::string(), 0));
  return compiler::Parse(agreed);
}

}  // namespace meshwork::fsdp
