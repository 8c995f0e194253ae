#include "trainer/fsdp/plan_executor.h"

#include <torch/torch.h>

#include <set>

namespace meshwork::fsdp {
namespace {

const char* PhaseLabel(compiler::Phase phase) { return phase == compiler::Phase::kForward ? "fwd " : "bwd "; }

}  // namespace

PlanExecutor::PlanExecutor(ShardedState& state, const compiler::Graph& plan) : state_(state), graph_(plan) {
  std::vector<ShardedParam*> by_index;
  for (auto& sp : state_.params) by_index.push_back(&sp);
  for (const auto& m : plan.modules) {
    std::vector<ShardedParam*> ps;
    for (int i : m.params) ps.push_back(by_index[i]);
    module_params_.push_back(std::move(ps));
  }
  const int64_t layers = state_.model->config().num_hidden_layers;
  for (int64_t i = 0; i < layers; ++i) {
    const int m = plan.FindModule("layers." + std::to_string(i));
    recompute_.push_back(m >= 0 && compiler::IsCheckpointed(plan.modules[m]));
  }
  for (const auto& m : plan.modules) {
    if (!m.rows.empty() && embed_rows_ == nullptr)
      embed_rows_ = std::make_unique<EmbeddingRows>(by_index[m.rows.front()], state_.unit_context());
    if (!m.vocab.empty() && vocab_head_ == nullptr) {
      ShardedParam* table = by_index[m.vocab.front()];
      vocab_head_ = std::make_unique<VocabParallelHead>(table, state_.groups[table->group], state_.unit_context());
    }
  }
  std::map<std::string, std::string> all_reduce_source;  // %ar id -> %rs id
  for (const auto& op : plan.ops) {
    if (op.kind == compiler::OpKind::kAllReduce) all_reduce_source[op.id] = op.source;
    if (op.kind != compiler::OpKind::kAllGather && op.kind != compiler::OpKind::kReduceScatter) continue;
    // Whole flat groups (Validate checked it against the groups the plan was made with).
    auto unit = std::make_unique<Unit>(op.id, state_.unit_context());
    std::set<int> added;
    for (int i : op.params)
      if (added.insert(by_index[i]->group).second) unit->AddGroup(&state_.groups[by_index[i]->group]);
    buckets_[op.id] = std::move(unit);
  }
  std::map<std::string, compiler::OpKind> kind_of;
  for (const auto& op : plan.ops)
    if (op.is_collective()) kind_of[op.id] = op.kind;
  std::set<std::string> reduced_again;
  for (const auto& [ar, rs] : all_reduce_source) reduced_again.insert(rs);
  for (const auto& op : plan.ops) {
    const auto ar = all_reduce_source.find(op.id);
    const std::string& bucket =
        op.kind == compiler::OpKind::kAllReduce ? op.source : ar != all_reduce_source.end() ? ar->second : op.id;
    auto it = buckets_.find(bucket);
    unit_.push_back(it != buckets_.end() ? it->second.get() : nullptr);
    WaitFor w = WaitFor::kNone;
    if (op.kind == compiler::OpKind::kWait) {
      if (ar != all_reduce_source.end()) {
        w = WaitFor::kAllReduce;
      } else if (kind_of[op.id] == compiler::OpKind::kAllGather) {
        w = WaitFor::kGather;
      } else if (kind_of[op.id] == compiler::OpKind::kRowGather) {
        w = WaitFor::kRowGather;
      } else if (kind_of[op.id] == compiler::OpKind::kRowReduce) {
        w = WaitFor::kRowReduce;
      } else {
        w = reduced_again.count(op.id) ? WaitFor::kReduceThenAllReduce : WaitFor::kReduce;
      }
    }
    wait_for_.push_back(w);
  }
}

void PlanExecutor::RunUntil(compiler::Phase phase, const std::string& module) {
  const auto& ops = graph_.ops;
  if (!open_compute_.empty()) {
    state_.TraceCompute(open_compute_, open_compute_start_, Now());
    open_compute_.clear();
  }
  while (pc_ < ops.size()) {
    const size_t at = pc_++;
    const compiler::Op& op = ops[at];
    if (op.kind != compiler::OpKind::kCompute) {
      RunOp(at);
      continue;
    }
    const std::string& name = graph_.modules[op.module].name;
    if (op.phase != phase || name != module) {
      ThrowIfError(Internal("compiled plan op " + std::to_string(at) + " is compute " + PhaseLabel(op.phase) + name +
                            " but the model is at " + PhaseLabel(phase) +
                            (module.empty() ? "the end of the step" : module)));
    }
    for (ShardedParam* p : module_params_[op.module])
      if (p->full.storage().nbytes() == 0)
        ThrowIfError(Internal("compiled plan runs " + name + " with " + p->name + " not gathered"));
    if (state_.tracer != nullptr) {
      open_compute_ = PhaseLabel(phase) + name;
      open_compute_start_ = Now();
    }
    return;
  }
  if (!module.empty()) ThrowIfError(Internal("compiled plan ended before compute of " + module));
  pc_ = 0;
}

// One communication op (every kind but compute).
void PlanExecutor::RunOp(size_t at) {
  using compiler::OpKind;
  Unit* unit = unit_[at];
  switch (graph_.ops[at].kind) {
    case OpKind::kAllGather: unit->StartGather(); break;
    case OpKind::kReduceScatter: unit->ReduceGrads(state_.sync); break;
    case OpKind::kAllReduce:
      if (state_.replicate_group != nullptr) unit->StartReplicaReduce(state_.replicate_group);
      break;
    case OpKind::kFree: unit->Free(); break;
    case OpKind::kRowGather: embed_rows_->StartGather(tokens_); break;
    case OpKind::kRowReduce: embed_rows_->StartReduce(state_.sync); break;
    case OpKind::kWait:
      switch (wait_for_[at]) {
        case WaitFor::kGather: unit->WaitGather(); break;
        case WaitFor::kReduce: unit->WaitReduce(false); break;
        case WaitFor::kReduceThenAllReduce: unit->WaitReduce(true); break;
        case WaitFor::kAllReduce: unit->FinishReplicaReduce(); break;
        case WaitFor::kRowGather: embed_rows_->WaitGather(); break;
        case WaitFor::kRowReduce: embed_rows_->WaitReduce(); break;
        case WaitFor::kNone: break;
      }
      break;
    case OpKind::kCompute:
    case OpKind::kOptimizerStep: break;
  }
}

torch::Tensor PlanExecutor::Forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
  using compiler::Phase;
  if (vocab_head_ != nullptr && !targets.defined()) {
    ThrowIfError(InvalidInput("this compiled plan splits the output head by vocabulary, so each rank holds only its "
                              "rows' logits: Forward needs the targets (it returns the loss); or plan with "
                              "fsdp.vocab_parallel_head false"));
  }
  pc_ = 0;
  tokens_ = tokens;
  RunUntil(Phase::kForward, "embed");
  model::EmbedRunner embed = state_.embed;
  if (embed_rows_ != nullptr) embed = [this](const torch::Tensor&) { return embed_rows_->rows(); };
  const int64_t layers = state_.model->config().num_hidden_layers;
  torch::Tensor logits = state_.model->ForwardWithLayerRunner(
      tokens, [&](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
        RunUntil(Phase::kForward, "layers." + std::to_string(i));
        if (h.requires_grad()) {
          const std::string before = i > 0 ? "layers." + std::to_string(i - 1) : "embed";
          h.register_hook([this, before](const torch::Tensor&) { RunUntil(Phase::kBackward, before); });
        }
        torch::Tensor out = RunLayer(layer, h, rope, recompute_[i]);
        if (i + 1 == layers) {
          if (out.requires_grad()) {
            const std::string me = "layers." + std::to_string(i);
            out.register_hook([this, me](const torch::Tensor&) { RunUntil(Phase::kBackward, me); });
          }
          RunUntil(Phase::kForward, "head");  // the model runs the head next
        }
        return out;
      },
      targets, embed,
      vocab_head_ == nullptr ? state_.loss
                             : [this](const torch::Tensor& h, const torch::Tensor& t) { return vocab_head_->Loss(h, t); });
  // The head's backward runs before control comes back (at the last layer's backward hook):
  // what the plan schedules between the head's forward and backward is issued now.
  RunUntil(Phase::kBackward, "head");
  return logits;
}

void PlanExecutor::FinishBackward() { RunUntil(compiler::Phase::kBackward, ""); }

}  // namespace meshwork::fsdp
