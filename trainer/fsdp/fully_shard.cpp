#include "trainer/fsdp/fully_shard.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <optional>

#include "trainer/compiler/frontend.h"
#include "trainer/dist/host_collectives.h"
#include "trainer/fsdp/eager_schedule.h"
#include "trainer/fsdp/plan_executor.h"
#include "trainer/fsdp/step_schedule.h"
#include "trainer/model/compat.h"

namespace meshwork::fsdp {
namespace {

// The plan was compiled for this model: the same parameters (HF order), modules and mesh.
Status CheckPlanMatches(const compiler::Graph& plan, const compiler::Graph& mine) {
  if (plan.params.size() != mine.params.size())
    return Internal("plan has " + std::to_string(plan.params.size()) + " parameters, the model " +
                    std::to_string(mine.params.size()));
  for (size_t i = 0; i < mine.params.size(); ++i)
    if (plan.params[i].name != mine.params[i].name || plan.params[i].group != mine.params[i].group)
      return Internal("plan parameter " + std::to_string(i) + " is '" + plan.params[i].name + "' in flat group " +
                      std::to_string(plan.params[i].group) + ", the model's '" + mine.params[i].name + "' in group " +
                      std::to_string(mine.params[i].group));
  if (plan.modules.size() != mine.modules.size()) return Internal("plan modules do not match the model");
  for (size_t m = 0; m < mine.modules.size(); ++m) {
    // A module may read some of its parameters by rows in the plan (compiler::ReadByRows).
    std::vector<int> uses = plan.modules[m].params;
    uses.insert(uses.end(), plan.modules[m].rows.begin(), plan.modules[m].rows.end());
    uses.insert(uses.end(), plan.modules[m].vocab.begin(), plan.modules[m].vocab.end());
    std::sort(uses.begin(), uses.end());
    std::vector<int> own = mine.modules[m].params;
    std::sort(own.begin(), own.end());
    if (plan.modules[m].name != mine.modules[m].name || uses != own)
      return Internal("plan module '" + plan.modules[m].name + "' does not match the model's '" +
                      mine.modules[m].name + "'");
    // The runtime reads only the token embedding by rows, in the embedding's forward.
    for (int p : plan.modules[m].rows)
      if (plan.modules[m].name != "embed" || mine.params[p].name != "model.embed_tokens.weight")
        return Internal("plan reads '" + mine.params[p].name + "' by rows in module '" + plan.modules[m].name +
                        "': only the embedding's table can be read by rows");
    // ... and splits only the tied table by vocabulary, in the head.
    for (int p : plan.modules[m].vocab)
      if (plan.modules[m].name != "head" || mine.params[p].name != "model.embed_tokens.weight")
        return Internal("plan splits '" + mine.params[p].name + "' by vocabulary in module '" + plan.modules[m].name +
                        "': only a tied output head can split the embedding's table");
  }
  if (plan.dp_shard != mine.dp_shard || plan.dp_replicate != mine.dp_replicate)
    return Internal("plan mesh does not match this run's");
  return Status::Ok();
}

// The flat group a parameter belongs to, by its name: the embedding (0), decoder layer i
// (i + 1), or the final norm with an untied output head (layers + 1). The same grouping as
// compiler::GroupByOwner over Skeleton()'s modules.
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
  for (int64_t g = 0; g <= layers + 1; ++g) {
    state->groups.emplace_back();
    state->groups.back().name = g == 0 ? "embed" : g <= layers ? "model.layers." + std::to_string(g - 1) : "head";
  }
  for (auto& item : state->model->named_parameters()) {
    state->params.push_back(ShardedParam{});
    ShardedParam& p = state->params.back();
    p.name = item.key();
    p.full = item.value();
    state->groups[GroupOf(p.name, layers)].params.push_back(&p);
  }
  const int world = shard_group->size();
  const int rank = shard_group->rank();
  {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < state->groups.size(); ++g) {
      FlatGroup& group = state->groups[g];
      if (group.params.empty()) return Internal("fully_shard: no parameters in group " + group.name);
      ShardGroup(group, static_cast<int>(g), world, rank, options.param_dtype);
    }
  }
  // Gradients accumulate into the group's flat buffer: before autograd adds one, the buffer
  // exists and the parameter's .grad is a view of it.
  for (FlatGroup& group : state->groups) {
    FlatGroup* g = &group;
    for (ShardedParam* p : g->params) p->full.register_hook([g](const torch::Tensor&) { g->OnGradient(); });
  }
  // Units: the root (embedding and head groups), then one per decoder layer.
  for (int64_t u = 0; u <= layers; ++u) {
    state->units.push_back(std::make_unique<Unit>(u == 0 ? "root" : state->groups[u].name, state->unit_context()));
    if (u == 0) {
      state->units[0]->AddGroup(&state->groups.front());
      state->units[0]->AddGroup(&state->groups.back());
    } else {
      state->units[u]->AddGroup(&state->groups[u]);
    }
  }
  state->trace.fwd.assign(layers + 2, StepTrace::Span());
  state->trace.bwd.assign(layers + 2, StepTrace::Span());
  state->trace.clock = ComputeClock(state->groups.front().master.device());
  return std::unique_ptr<FullyShardedLlama>(new FullyShardedLlama(std::move(state)));
}

torch::Tensor FullyShardedLlama::Forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
  state_->trace.batch = tokens.size(0);
  state_->trace.seq = tokens.size(1);
  return schedule_->Forward(tokens, targets);
}

void FullyShardedLlama::SetGradientSync(bool sync) { state_->sync = sync; }

void FullyShardedLlama::SetTensorParallel(TensorParallel tp) {
  state_->embed = std::move(tp.embed);
  state_->loss = std::move(tp.loss);
  state_->tp = tp.tp;
  state_->sequence_parallel = tp.sequence_parallel;
  state_->tp_layer_chunks = std::move(tp.layer_chunks);
  state_->tp_tokens_per_rank = std::move(tp.tokens_per_rank);
  state_->tp_blocked_counted = state_->trace.clock.host() && tp.blocked_seconds != nullptr;
  if (state_->tp_blocked_counted) {
    state_->trace.clock.SetWaitCounter(std::move(tp.blocked_seconds));
    state_->set_tp_layer_chunks = std::move(tp.set_layer_chunks);
  }
}

bool FullyShardedLlama::PlansTensorParallelExchanges() const { return state_->tp > 1 && state_->tp_blocked_counted; }

int64_t FullyShardedLlama::TensorParallelTokensPerRank() const {
  return state_->tp_tokens_per_rank ? state_->tp_tokens_per_rank() : 0;
}

bool FullyShardedLlama::PlansTensorParallelChunks() const {
  return PlansTensorParallelExchanges() && state_->set_tp_layer_chunks != nullptr;
}

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
      targets, state_->embed, state_->loss);
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
    if (p.full_shape.size() >= 2 && p.shard.numel() > 0) out.push_back(p.shard);
  return out;
}

std::vector<torch::Tensor> FullyShardedLlama::NoDecayShards() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : state_->params)
    if (p.full_shape.size() < 2 && p.shard.numel() > 0) out.push_back(p.shard);
  return out;
}

Result<torch::Tensor> FullyShardedLlama::GradNormSquared() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : state_->params)
    if (p.shard.grad().defined()) grads.push_back(p.shard.grad());
  torch::Tensor sum =
      torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(state_->groups.front().master.device()));
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
      for (FlatGroup* g : unit->groups)
        for (ShardedParam* p : g->params) state[p->name] = p->full.detach().to(torch::kFloat).clone();
      unit->Free();
    }
  } catch (const StatusError& e) {
    return e.status();
  }
  return state;
}

const std::deque<ShardedParam>& FullyShardedLlama::sharded_params() const { return state_->params; }

const model::LlamaConfig& FullyShardedLlama::config() const { return state_->model->config(); }

bool FullyShardedLlama::tensor_parallel() const { return state_->tp > 1; }

LayerCheckpointing FullyShardedLlama::checkpointing() const { return state_->options.checkpointing; }

model::LlamaForCausalLM& FullyShardedLlama::module() { return state_->model; }

void FullyShardedLlama::TraceInto(ChromeTrace* trace) { state_->tracer = trace; }

FsdpStats FullyShardedLlama::TakeStats() {
  FsdpStats s = state_->stats;
  state_->stats = FsdpStats();
  return s;
}

int64_t FullyShardedLlama::ShardBytes() const {
  int64_t bytes = 0;
  for (const auto& g : state_->groups) bytes += dist::TensorBytes(g.master);
  return bytes;
}

compiler::Graph FullyShardedLlama::Skeleton() const {
  compiler::Graph g;
  g.dp_shard = state_->shard_group->size();
  g.dp_replicate = state_->replicate_group != nullptr ? state_->replicate_group->size() : 1;
  g.tp = state_->tp;
  g.reduce_scatter_receives_input = std::string(state_->reduce_group->backend()) == "gloo";
  const int64_t param_bytes = c10::elementSize(state_->options.param_dtype);
  const int64_t reduce_bytes = c10::elementSize(state_->options.reduce_dtype);
  std::map<std::string, int> index;
  for (const auto& p : state_->params) {
    compiler::ParamInfo info;
    info.name = p.name;
    info.gathered_bytes = p.numel * param_bytes;
    info.grad_bytes = p.numel * reduce_bytes;
    info.shard_bytes = p.shard.numel() * 4;
    info.group = p.group;
    index[p.name] = static_cast<int>(g.params.size());
    g.params.push_back(info);
  }
  const auto& c = state_->model->config();
  const StepTrace& trace = state_->trace;
  // The embedding's rows for one micro-batch, fp32 (what a plan reading it by rows moves).
  g.params[index.at("model.embed_tokens.weight")].row_bytes =
      std::max<int64_t>(trace.batch, 1) * std::max<int64_t>(trace.seq, 1) * c.hidden_size * 4;
  // Activation estimate (the compiler's Llama model), at the traced batch and length.
  compiler::LlamaShape shape;
  shape.config = c;
  shape.batch = std::max<int64_t>(trace.batch, 1);
  shape.seq_len = std::max<int64_t>(trace.seq, 1);
  shape.activation_bytes = static_cast<int>(param_bytes);
  // Gathered bf16 weights (autocast) give a bf16 stream unless the model casts it to fp32.
  const std::optional<torch::ScalarType> residual = state_->model->residual_dtype();
  shape.residual_bytes = param_bytes == 2 && residual && *residual == torch::kFloat ? 4 : static_cast<int>(param_bytes);
  shape.attention_keeps_probabilities = !compat::kTorch2;
  // As the traced eager steps ran it (a plan's vocabulary-split head stores nothing: conservative).
  shape.head_stores_logit_grad = state_->model->loss_gradient() == model::HeadGradient::kStored;
  shape.tp = state_->tp;
  shape.sequence_parallel = state_->sequence_parallel;
  const compiler::Graph estimate = compiler::LlamaSkeleton(shape);
  const std::vector<int> layer_chunks = state_->tp_layer_chunks ? state_->tp_layer_chunks() : std::vector<int>();
  // t: the module's index in the trace (embed 0, decoder layer i at i + 1, head last).
  auto add_module = [&](const std::string& name, std::vector<int> params, size_t t) {
    const int64_t layer = static_cast<int64_t>(t) - 1;
    compiler::ModuleInfo m;
    m.name = name;
    m.params = std::move(params);
    // Compute only: on the host clock, less the time blocked in TP's exchanges inside the module
    // (ComputeClock::ComputeSeconds), which the plan then carries as the module's tp= instead.
    m.fwd_seconds = trace.clock.ComputeSeconds(trace.fwd[t].from, trace.fwd[t].to) * trace.fwd[t].share;
    m.bwd_seconds = trace.clock.ComputeSeconds(trace.bwd[t].from, trace.bwd[t].to) * trace.bwd[t].share;
    const int e = estimate.FindModule(name);
    if (e >= 0 && PlansTensorParallelExchanges()) {
      m.tp_fwd = estimate.modules[e].tp_fwd;
      m.tp_bwd = estimate.modules[e].tp_bwd;
      m.tp_gemm_share = estimate.modules[e].tp_gemm_share;
      // The chunks the traced step ran with, so that the eager plan fitted to it overlaps alike.
      if (layer >= 0 && layer < static_cast<int64_t>(layer_chunks.size()))
        m.tp_chunks = layer_chunks[static_cast<size_t>(layer)];
    }
    if (e >= 0) {
      m.activation_bytes = estimate.modules[e].activation_bytes;
      m.backward_temp_bytes = estimate.modules[e].backward_temp_bytes;
      switch (state_->options.checkpointing) {
        case LayerCheckpointing::kNone: break;
        case LayerCheckpointing::kPlanned: m.checkpoint_input_bytes = estimate.modules[e].checkpoint_input_bytes; break;
        case LayerCheckpointing::kAllUntilPlanned:
          // A candidate, timed as if it had run plainly: its traced backward recomputed the
          // forward first.
          m.checkpoint_input_bytes = estimate.modules[e].checkpoint_input_bytes;
          if (m.checkpoint_input_bytes > 0) m.bwd_seconds = std::max(0.0, m.bwd_seconds - m.fwd_seconds);
          break;
        case LayerCheckpointing::kAll:
        case LayerCheckpointing::kSelective:
          // Checkpointed already (kSelective: its layers only, the others are no candidates):
          // the traced backward has the recompute in it.
          if (estimate.modules[e].checkpoint_input_bytes > 0 && AlwaysCheckpointed(state_->options, layer)) {
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
  // The head's chunk of fp32 logits, held for a moment inside its compute: this rank's tokens
  // over the whole vocabulary (model/linear_cross_entropy.h) or, split by vocabulary, every
  // rank's tokens over this rank's rows (vocab_head.h).
  const int64_t tokens = std::max<int64_t>(trace.batch, 1) * std::max<int64_t>(trace.seq, 1);
  if (state_->tp > 1) {
    // Tensor parallelism's loss: the same bytes of logits a chunk as the whole vocabulary's, over
    // this rank's slice of it (tp/tensor_parallel.cpp).
    const int64_t rows = c.vocab_size / state_->tp;
    g.modules.back().transient_bytes = std::min(tokens, state_->model->loss_chunk_rows() * state_->tp) * rows * 4;
    return g;
  }
  const int64_t owned = (c.vocab_size + g.dp_shard - 1) / g.dp_shard;
  g.modules.back().transient_bytes = std::min(tokens, state_->model->loss_chunk_rows()) * c.vocab_size * 4;
  g.modules.back().vocab_transient_bytes = std::min(tokens * g.dp_shard, model::LossChunkRows(owned)) * owned * 4;
  return g;
}

Status FullyShardedLlama::UsePlan(const compiler::Graph& plan) {
  MW_RETURN_IF_ERROR(CheckPlanMatches(plan, Skeleton()));
  MW_RETURN_IF_ERROR(compiler::Validate(plan));
  if (tensor_parallel()) {
    for (const auto& m : plan.modules)
      if (!m.rows.empty() || !m.vocab.empty())
        return Internal("plan reads module '" + m.name + "' by rows or splits it by vocabulary, but the model " +
                        "embeds and computes its loss through a plan applied before FSDP (tensor parallelism)");
  }
  if (PlansTensorParallelChunks()) {
    // The plan's overlapped TP, layer by layer (atp=; 1 where it keeps a layer's exchanges whole).
    std::vector<int> chunks(static_cast<size_t>(state_->model->config().num_hidden_layers), 1);
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int m = plan.FindModule("layers." + std::to_string(i));
      if (m >= 0) chunks[i] = std::max(1, plan.modules[m].tp_chunks);
    }
    MW_RETURN_IF_ERROR(state_->set_tp_layer_chunks(chunks));
  }
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
