#include "trainer/train/pipeline_engine.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/enum_names.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/pipeline/simulate.h"
#include "trainer/compiler/pipeline/steps.h"
#include "trainer/config/hardware.h"
#include "trainer/fsdp/unit.h"
#include "trainer/model/recompute.h"
#include "trainer/pp/executor.h"
#include "trainer/pp/llama_stages.h"
#include "trainer/tp/tensor_parallel.h"
#include "trainer/train/adamw.h"
#include "trainer/train/report.h"
#include "trainer/train/schedule.h"

namespace meshwork::train {
namespace {

namespace pipeline = compiler::pipeline;

std::string CutText(const std::vector<int>& first_layer) {
  std::string text;
  for (size_t s = 0; s + 1 < first_layer.size(); ++s) {
    text += (s ? " " : "") + std::string("[") + std::to_string(first_layer[s]) + "," + std::to_string(first_layer[s + 1]) + ")";
  }
  return text;
}

// The residual stream a stage passes on for a micro-batch of batch x seq tokens: [batch, seq,
// hidden], or under sequence parallelism (where the tokens divide by tp, as BeginForward decides)
// each tp rank's run of the flattened tokens, [1, batch x seq / tp, hidden]. Without it every tp
// rank holds the whole stream: the tp group is the activations' replicas, each sending a share.
void SetStream(pp::PipelineStepOptions& o, const model::LlamaConfig& c, tp::TensorParallelLlama* split,
               int64_t batch, int64_t seq) {
  const int64_t tp = split ? split->group().size() : 1;
  o.replicas = nullptr;
  if (split && split->sequence_parallel() && (batch * seq) % tp == 0) {
    o.activation_sizes = {1, batch * seq / tp, c.hidden_size};
    return;
  }
  o.activation_sizes = {batch, seq, c.hidden_size};
  if (split) o.replicas = &split->group();
}

// Calls `on` after autograd accumulated into a parameter (a post-hook on its AccumulateGrad node).
class OnAccumulated final : public torch::autograd::FunctionPostHook {
 public:
  explicit OnAccumulated(std::function<void()> on) : on_(std::move(on)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_();
    return outputs;
  }

 private:
  std::function<void()> on_;
};

// Each pipeline rank's FSDP units as PipelineEngine::ShardUnits makes them, in its order: the
// embedding's on the rank of the first stage, each decoder layer's, then the final norm's and the
// head's on the rank of the last (with the tied table: the table is there too, and its unit is
// reduce-scattered after the program, as is the embedding's).
std::vector<std::vector<pipeline::FsdpUnit>> FsdpUnitsOf(const pipeline::Shape& shape, const std::vector<int>& first_layer,
                                                         bool tied) {
  std::vector<std::vector<pipeline::FsdpUnit>> units(static_cast<size_t>(shape.pp));
  const int last = shape.stages() - 1;
  for (int r = 0; r < shape.pp; ++r) {
    std::vector<pipeline::FsdpUnit>& u = units[static_cast<size_t>(r)];
    if (shape.RankOf(0) == r) u.push_back({0, !tied});
    for (int stage = r; stage <= last; stage += shape.pp) {
      for (int layer = first_layer[static_cast<size_t>(stage)]; layer < first_layer[static_cast<size_t>(stage) + 1]; ++layer) {
        u.push_back({stage, true});
      }
    }
    if (shape.RankOf(last) == r) u.push_back({last, !(tied && shape.RankOf(0) != r)});
  }
  return units;
}

// PipeMare's settings (pipeline.*) and what its updates need of the run's optimizer settings.
struct AsyncOptions {
  config::ScheduleConfig schedule;
  double base_lr = 0;
  double grad_clip = 0;
  int64_t lr_reschedule_steps = 0;  // resolved: 0 off
  bool correction = true;
  double correction_decay = 0.5;
};

class PipelineEngine final : public Engine {
 public:
  PipelineEngine(const dist::DistEnv& env, PipelineGroups groups, std::unique_ptr<tp::TensorParallelLlama> split,
                 model::LlamaForCausalLM model, pp::LlamaStages stages, pipeline::Program program,
                 pp::PipelineStepOptions options, std::string schedule, double schedule_bubble,
                 std::optional<pipeline::AsyncSteps> async, AsyncOptions async_options, bool compiled)
      : env_(env),
        world_(std::move(groups.world)),
        comm_(std::move(groups.pipeline)),
        shard_(std::move(groups.shard)),
        replicate_(std::move(groups.replicate)),
        tp_(std::move(groups.tp)),
        split_(std::move(split)),
        model_(std::move(model)),
        stages_(std::move(stages)),
        program_(std::move(program)),
        options_(std::move(options)),
        schedule_(std::move(schedule)),
        schedule_bubble_(schedule_bubble),
        async_(std::move(async)),
        async_options_(std::move(async_options)),
        async_runner_(*this),
        compiled_(compiled),
        fsdp_ops_(*this) {
    // Who holds each parameter (the lowest stage rank, for the tied table held twice), and its whole
    // shape, before the parameters this rank does not hold are released.
    std::map<const void*, std::string> names;
    for (const auto& item : model_->named_parameters()) {
      names[item.value().unsafeGetTensorImpl()] = item.key();
      shapes_[item.key()] = item.value().sizes().vec();
    }
    for (int s = 0; s < program_.shape.stages(); ++s) {
      for (const auto& p : stages_.Parameters(s)) {
        const std::string& name = names[p.unsafeGetTensorImpl()];
        const int r = program_.shape.RankOf(s);
        auto it = holder_.find(name);
        if (it == holder_.end() || r < it->second) holder_[name] = r;
      }
    }
    stages_.ReleaseUnheld();
    if (split_) {
      // Tensor parallelism sliced the model already: the whole shapes are its record.
      for (const tp::LocalParam& p : split_->params()) {
        tp_params_[p.name] = &p;
        shapes_[p.name] = p.full_shape;
      }
    }
    for (const auto& item : model_->named_parameters()) {
      if (item.value().numel() == 0) continue;
      held_.emplace_back(item.key(), item.value());
    }
    if (shard_) {
      ShardUnits();
      if (compiled_) options_.fsdp = &fsdp_ops_;
      for (const fsdp::ShardedParam& sp : sharded_) {
        if (sp.shard.numel() == 0) continue;
        (sp.full_shape.size() >= 2 ? decay_ : no_decay_).push_back(sp.shard);
      }
    } else if (async_) {
      // PipeMare: the optimizer steps views of the parameters' storage with a version counter of
      // their own (update_views_), so that an update does not invalidate the graphs of the
      // micro-batches in flight: their backwards read the weights as they are then (PipeMare's
      // rule: no copy of the weights a forward used is kept).
      // The velocity and the corrected backward's copy of the weights only where a backward can
      // follow an update of its forward's stage (not the last stage's: delay 0).
      torch::NoGradGuard no_grad;
      const bool corrects = async_options_.correction && StageDelay() > 0;
      for (const auto& [name, p] : held_) {
        torch::Tensor view = torch::from_blob(p.data_ptr(), p.sizes(), p.strides(), p.options()).requires_grad_(true);
        update_views_.push_back(view);
        if (corrects) {
          velocity_.push_back(torch::zeros_like(p));
          saved_weights_.push_back(torch::empty_like(p));
        }
        (p.dim() >= 2 ? decay_ : no_decay_).push_back(view);
      }
    } else {
      for (const auto& [name, p] : held_) (p.dim() >= 2 ? decay_ : no_decay_).push_back(p);
    }
  }

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  // Each pipeline (a replica's, or a dp_shard rank's) reads its own rows: replica x dp_shard + shard.
  int dp_rank() const override { return Replica() * Shards() + (shard_ ? shard_->rank() : 0); }
  int dp_size() const override { return Replicas() * Shards(); }
  std::string Describe() const override {
    const auto& shape = program_.shape;
    const int per_step = async_ ? shape.per_update : shape.microbatches;
    return "pipeline: pp=" + std::to_string(shape.pp) + ", " + schedule_ + AsyncText() + ", " + std::to_string(per_step) +
           (per_step == 1 ? " micro-batch a step, " : " micro-batches a step, ") + std::to_string(shape.stages()) +
           " stages of layers " + CutText(stages_.first_layer()) + " (stage s on rank s % pp); the schedule's own bubble " +
           Format("%.3f", schedule_bubble_) + " (stages alike, free transfers" +
           (async_ ? ", a steady step between the steps' barriers)" : ")") +
           (dp_size() > 1 ? "; " + std::to_string(dp_size()) + " data parallel pipelines (rank = stage rank x " +
                                std::to_string(dp_size() * Tp()) + " + (replica x dp_shard + shard) x tp + tp rank), " +
                                (shard_ ? "FSDP inside each stage over dp_shard " + std::to_string(Shards()) + " (" +
                                              OverlapText() + ")" + (replicate_ ? " and replicated over dp_replicate " +
                                                                                std::to_string(Replicas())
                                                                          : std::string())
                                        : "each stage's gradients averaged over dp_replicate " +
                                              std::to_string(Replicas()))
                          : "") +
           (split_ ? "; tensor parallel over tp " + std::to_string(Tp()) +
                         (split_->sequence_parallel() ? " with sequence parallelism" : "") + " inside each stage"
                   : "");
  }
  dist::MeshShape mesh_shape() const override { return {Replicas(), Shards(), Tp()}; }

  // The loop calls StepLoss instead (RunsWholeSteps).
  torch::Tensor Loss(const torch::Tensor&, const torch::Tensor&, bool) override { return {}; }
  Status AfterBackward(bool) override { return Status::Ok(); }
  bool RunsWholeSteps() const override { return true; }

  bool UpdatesInsideStep() const override { return async_.has_value(); }
  void AttachOptimizer(AdamW* optimizer) override { optimizer_ = optimizer; }

  Result<torch::Tensor> StepLoss(int64_t step,
                                 const std::vector<std::pair<torch::Tensor, torch::Tensor>>& microbatches) override {
    std::vector<pp::MicroBatch> mbs;
    for (const auto& [tokens, targets] : microbatches) mbs.push_back({tokens, targets});
    if (async_) return AsyncStep(step, mbs);
    if (shard_) {
      // Every unit's gather in the order the stages use them, each waited for at its first use
      // (compiled: where the program's ag ops start them).
      if (!compiled_) MW_RETURN_IF_ERROR(StartGathers());
      if (compiled_) MW_RETURN_IF_ERROR(CheckProgramUnits());
      // Autograd adds every micro-batch's gradients into views of each unit's flat buffer: its
      // reduce-scatter's input.
      for (StageUnit& u : units_) {
        u.group.EnsureGrad();
        u.accumulated = 0;
        u.armed = false;
      }
    }
    MW_ASSIGN_OR_RETURN(pp::PipelineStepResult result, pp::RunPipelineStep(program_, stages_, *comm_, mbs, options_));
    // Tensor parallelism: the replicated parameters' (norms') gradients over the tp ranks (with
    // FSDP their shards', after the reduce-scatters: FinishReduceScatters).
    if (split_ && !shard_) MW_RETURN_IF_ERROR(split_->FinishBackward());
    double loss = result.loss;
    if (shard_) {
      // The tied table's two copies (first and last stage) lie at other offsets of their ranks'
      // groups: their gradients are summed whole, then each stage reduce-scatters its own.
      MW_RETURN_IF_ERROR(stages_.SyncTiedGradients(*comm_));
      MW_RETURN_IF_ERROR(FinishReduceScatters());
      MW_ASSIGN_OR_RETURN(loss, AverageOverPipelines(result.loss));
    } else {
      // The replicas first: the last stage, done before the first, reduces while it still computes
      // (the tied table's exchange waits for the first stage). Both copies of the table get the same sum.
      if (replicate_) {
        MW_RETURN_IF_ERROR(AverageGradientsOverReplicas());
        MW_ASSIGN_OR_RETURN(loss, AverageOverPipelines(result.loss));
      }
      MW_RETURN_IF_ERROR(stages_.SyncTiedGradients(*comm_));
    }
    MW_RETURN_IF_ERROR(RecordTimes(result));
    return torch::tensor({loss}, torch::kDouble);
  }

  // PipeMare: the in-flight micro-batches' backwards and the updates still due (the drain after
  // the last step run), then nothing carried; the next step fills the pipeline again. The
  // velocity restarts from zero, as at a resume, so a run resumed from a checkpoint continues
  // as the uninterrupted one does.
  Status Drain() override {
    if (!async_ || since_start_ == 0) return Status::Ok();
    slice_step_ = last_step_ + 1;  // the drain is numbered as the step after the last
    auto result = pp::RunPipelineStep(async_->Drain(since_start_ - 1), async_runner_, *comm_, {}, options_, &carry_);
    MW_RETURN_IF_ERROR(result.status());
    since_start_ = 0;
    torch::NoGradGuard no_grad;
    for (torch::Tensor& v : velocity_) v.zero_();
    return Status::Ok();
  }

  Result<torch::Tensor> GradNorm() override {
    // PipeMare: the norm of the last updates of every stage, gathered with the step's times.
    if (async_) return torch::tensor({std::sqrt(update_norm_squares_)}, torch::kDouble);
    torch::NoGradGuard no_grad;
    // The tied table's gradient is on two ranks (the same after SyncTiedGradients): counted once,
    // on the lower.
    // With FSDP each rank adds its shards' squares, then the shards' sums are added; with tensor
    // parallelism the split parameters' slices are added over tp, the replicated ones counted once.
    double split = 0, whole = 0;
    for (const auto& [name, p] : LocalParams()) {
      if (!p.grad().defined() || holder_[name] != comm_->rank()) continue;
      const double squares = p.grad().to(torch::kDouble).pow(2).sum().item<double>();
      (split_ && tp::TensorParallelLlama::SplitOf(name) != tp::Split::kReplicated ? split : whole) += squares;
    }
    torch::Tensor split_sum = torch::tensor({split}, torch::kDouble);
    if (tp_) {
      MW_ASSIGN_OR_RETURN(auto reduce, tp_->AllReduce(split_sum, dist::ReduceOp::kSum));
      MW_RETURN_IF_ERROR(reduce->Wait());
    }
    torch::Tensor sum = split_sum + whole;
    for (dist::Communicator* group : {shard_.get(), comm_.get()}) {
      if (group == nullptr) continue;
      MW_ASSIGN_OR_RETURN(auto reduce, group->AllReduce(sum, dist::ReduceOp::kSum));
      MW_RETURN_IF_ERROR(reduce->Wait());
    }
    return sum.sqrt();
  }
  void ZeroGrad() override {
    for (auto& [name, p] : LocalParams()) p.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> DecayParams() const override { return decay_; }
  std::vector<torch::Tensor> NoDecayParams() const override { return no_decay_; }
  // The tensors the optimizer steps: the parameters this rank holds, or with FSDP their master
  // shards' non-empty views.
  std::vector<std::pair<std::string, torch::Tensor>> LocalParams() const override {
    if (async_) {
      std::vector<std::pair<std::string, torch::Tensor>> out;
      for (size_t i = 0; i < held_.size(); ++i) out.emplace_back(held_[i].first, update_views_[i]);
      return out;
    }
    if (!shard_) return held_;
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const fsdp::ShardedParam& sp : sharded_) {
      if (sp.shard.numel() > 0) out.emplace_back(sp.name, sp.shard);
    }
    return out;
  }
  // Every parameter this rank holds (whole, or its dp_shard rank's run of it): the tied table too
  // on both of its ranks, so an import or a resume fills both copies (a checkpoint then holds it
  // twice, as HSDP's replicas do).
  // With tensor parallelism a piece lies in the rank's slice (TensorParallelPiece).
  std::vector<ShardPiece> LocalShards() const override {
    std::vector<ShardPiece> out;
    auto piece = [&](const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                     const torch::Tensor& value) {
      return split_ ? TensorParallelPiece(*tp_params_.at(name), Tp(), begin, value) : ShardPiece{name, shape, begin, value};
    };
    if (shard_) {
      for (const fsdp::ShardedParam& sp : sharded_) {
        if (sp.shard.numel() > 0) out.push_back(piece(sp.name, sp.full_shape, sp.shard_begin, sp.shard));
      }
      return out;
    }
    for (const auto& [name, p] : LocalParams()) out.push_back(piece(name, p.sizes().vec(), 0, p));
    return out;
  }
  int64_t ParamBytes() const override {
    int64_t b = 0;
    for (const auto& [name, p] : LocalParams()) b += dist::TensorBytes(p);
    return b;
  }
  torch::Tensor EvalBatchLoss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    pp::PipelineStepOptions options = options_;
    SetStream(options, model_->config(), split_.get(), tokens.size(0), tokens.size(1));
    Result<double> loss = [&]() -> Result<double> {
      MW_RETURN_IF_ERROR(Gather());
      auto forward = pp::RunPipelineForward(program_.shape, stages_, *comm_, {tokens, targets}, options);
      Release();
      return forward;
    }();
    if (loss.ok()) return torch::tensor({loss.value()}, torch::kDouble);
    // The interface returns a tensor: the error goes to the log and the loss is NaN, which the
    // evaluation reports; the next step's transfers fail with the same cause and stop the run.
    std::cerr << "meshwork-train: evaluation: " << loss.status().message() << std::endl;
    return torch::tensor({std::numeric_limits<double>::quiet_NaN()}, torch::kDouble);
  }
  Result<double> AverageAcrossRanks(double local) override {
    torch::Tensor t = torch::tensor({local}, torch::kDouble);
    MW_ASSIGN_OR_RETURN(auto reduce, world_->AllReduce(t, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    return t.item<double>() / env_.world_size;
  }
  // Every parameter whole on rank 0 (SendFullStateToRankZero), gathered first where FSDP shards it.
  Result<std::map<std::string, torch::Tensor>> FullState() override {
    MW_RETURN_IF_ERROR(Gather());
    auto state = [&]() -> Result<std::map<std::string, torch::Tensor>> {
      // This rank's parameters whole: its tensor parallel slices gathered over tp first.
      std::map<std::string, torch::Tensor> whole(held_.begin(), held_.end());
      if (split_) {
        MW_ASSIGN_OR_RETURN(whole, split_->GatherFullState(whole));
      }
      return SendFullStateToRankZero(whole);
    }();
    Release();
    return state;
  }
  EngineStats TakeStats() override {
    EngineStats s;
    s.exposed_comm_seconds = blocked_seconds_;
    if (split_) s.exposed_comm_seconds += split_->TakeBlockedSeconds();
    AddGroupStats({world_.get(), comm_.get(), shard_.get(), replicate_.get(), tp_.get()}, &s);
    s.pipeline_busy_seconds = busy_;
    s.pipeline_seconds = program_seconds_;
    if (shard_) s.pipeline_overlapped_reduce_scatters = overlapped_;
    blocked_seconds_ = 0;
    return s;
  }

 private:
  // With FSDP: a unit's flat group, its collectives in flight, and its count of accumulations.
  struct StageUnit {
    fsdp::FlatGroup group;
    std::unique_ptr<dist::Work> gather;   // from the step's start to the unit's first use
    std::unique_ptr<dist::Work> scatter;  // from its last accumulation to the step's end
    torch::Tensor reduced;                // the reduce-scatter's output
    int64_t accumulated = 0;              // this step's accumulations into its parameters
    int64_t expected = -1;                // the first step's (-1: no step finished yet)
    // Compiled: inside the compute the program says makes its gradients final, and how many of
    // its parameters that compute has accumulated into so far.
    bool armed = false;
    size_t in_action = 0;
  };
  // Compiled: the program's FSDP ops on this engine's units (by index in units_).
  class FsdpOpsRunner final : public pp::FsdpOps {
   public:
    explicit FsdpOpsRunner(PipelineEngine& e) : e_(e) {}
    Status StartGather(int unit) override {
      MW_ASSIGN_OR_RETURN(StageUnit * u, e_.UnitAt(unit));
      if (u->gather) return Internal("FSDP inside pipeline stages: unit " + u->group.name + " gathered twice in a step");
      fsdp::AllocateStorage(u->group.storage);
      MW_ASSIGN_OR_RETURN(u->gather, e_.shard_->AllGatherInto(fsdp::WriteAlias(u->group.storage), u->group.master));
      return Status::Ok();
    }
    void FinalDuring(const std::vector<int>& units) override {
      for (int unit : units) {
        if (unit < 0 || static_cast<size_t>(unit) >= e_.unit_at_.size()) continue;  // StartReduceScatter says so
        e_.unit_at_[static_cast<size_t>(unit)]->armed = true;
        e_.unit_at_[static_cast<size_t>(unit)]->in_action = 0;
      }
    }
    Status StartReduceScatter(int unit) override {
      MW_ASSIGN_OR_RETURN(StageUnit * u, e_.UnitAt(unit));
      u->armed = false;
      MW_RETURN_IF_ERROR(std::exchange(e_.hook_error_, Status::Ok()));
      return u->scatter ? Status::Ok() : e_.StartReduceScatter(*u);
    }

   private:
    PipelineEngine& e_;
  };
  // The program gathers each of this rank's units once (FsdpUnitsOf made them as ShardUnits did).
  Status CheckProgramUnits() const {
    size_t gathers = 0;
    for (const pipeline::Action& a : program_.ranks[static_cast<size_t>(comm_->rank())]) {
      gathers += a.kind == pipeline::ActionKind::kGather ? 1 : 0;
    }
    if (gathers == unit_at_.size()) return Status::Ok();
    return Internal("FSDP inside pipeline stages: rank " + std::to_string(comm_->rank()) + "'s program gathers " +
                    std::to_string(gathers) + " units, the rank has " + std::to_string(unit_at_.size()));
  }
  Result<StageUnit*> UnitAt(int unit) {
    if (unit < 0 || static_cast<size_t>(unit) >= unit_at_.size()) {
      return InvalidInput("FSDP inside pipeline stages: the program names unit " + std::to_string(unit) + ", but rank " +
                          std::to_string(comm_->rank()) + " has " + std::to_string(unit_at_.size()));
    }
    return unit_at_[static_cast<size_t>(unit)];
  }
  // PipeMare's hooks into the executor, on this engine's stages.
  class AsyncRunner final : public pp::StageRunner {
   public:
    explicit AsyncRunner(PipelineEngine& e) : e_(e) {}
    torch::Tensor Forward(int stage, const pp::MicroBatch& mb, const torch::Tensor& input) override {
      return e_.stages_.Forward(stage, mb, input);
    }
    std::vector<torch::Tensor> Parameters(int stage) override { return e_.stages_.Parameters(stage); }
    Status BeforeBackward(int stage, int delay) override { return e_.CorrectWeights(stage, delay); }
    Status AfterBackward(int) override { return e_.RestoreWeights(); }
    Status Update(int stage, int minibatch) override { return e_.UpdateStage(stage, minibatch); }

   private:
    PipelineEngine& e_;
  };

  // The most updates between a forward and its backward on this rank's stage (one stage a rank).
  int StageDelay() const { return async_ ? async_->max_delay[static_cast<size_t>(comm_->rank())] : 0; }

  std::string AsyncText() const {
    if (!async_) return "";
    std::string delays;
    for (int d : async_->max_delay) delays += (delays.empty() ? "" : ", ") + std::to_string(d);
    return " (asynchronous, no flush: each stage updates after its backwards of a step's micro-batches; delays in "
           "updates per stage [" + delays + "]; learning rate " +
           (async_options_.lr_reschedule_steps > 0
                ? "rescheduled by delay over " + std::to_string(async_options_.lr_reschedule_steps) + " steps"
                : std::string("not rescheduled")) +
           "; discrepancy correction " +
           (async_options_.correction ? "on, decay " + Format("%g", async_options_.correction_decay) : std::string("off")) +
           ")";
  }

  Result<torch::Tensor> AsyncStep(int64_t step, const std::vector<pp::MicroBatch>& mbs) {
    if (optimizer_ == nullptr) return Internal("pipemare: the engine has no optimizer (AttachOptimizer)");
    slice_step_ = last_step_ = step;
    update_norm_squares_ = 0;
    MW_ASSIGN_OR_RETURN(pp::PipelineStepResult result,
                        pp::RunPipelineStep(async_->Step(since_start_), async_runner_, *comm_, mbs, options_, &carry_));
    ++since_start_;
    double loss = result.loss;
    if (replicate_) {
      MW_ASSIGN_OR_RETURN(loss, AverageOverPipelines(result.loss));
    }
    MW_RETURN_IF_ERROR(RecordTimes(result));
    return torch::tensor({loss}, torch::kDouble);
  }

  // Every pipeline rank's busy and program seconds, at its index (the others add 0), and with
  // PipeMare the squares of its last update's gradient norm. A rank's updates inside its program
  // (PipeMare's U) are neither: a synchronous step's update runs after its program.
  Status RecordTimes(const pp::PipelineStepResult& result) {
    const int pp_size = program_.shape.pp;
    const int stage_rank = comm_->rank();
    torch::Tensor times = torch::zeros({2 * pp_size + 1}, torch::kDouble);
    double busy = 0, updating = 0;
    for (const pp::ActionSpan& span : result.spans) {
      if (pipeline::IsCompute(span.action.kind)) {
        busy += span.end - span.start;
      } else if (span.action.kind == pipeline::ActionKind::kUpdate) {
        updating += span.end - span.start;
      } else if (span.action.kind == pipeline::ActionKind::kRecvActivation ||
                 span.action.kind == pipeline::ActionKind::kRecvGrad) {
        blocked_seconds_ += span.end - span.start;
      }
    }
    times[stage_rank] = busy;
    times[pp_size + stage_rank] = result.seconds - updating;
    times[2 * pp_size] = update_norm_squares_;
    MW_ASSIGN_OR_RETURN(auto reduce, comm_->AllReduce(times, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    busy_.assign(times.data_ptr<double>(), times.data_ptr<double>() + pp_size);
    program_seconds_.assign(times.data_ptr<double>() + pp_size, times.data_ptr<double>() + 2 * pp_size);
    update_norm_squares_ = times[2 * pp_size].item<double>();
    return Status::Ok();
  }

  // PipeMare's discrepancy correction: a backward whose forward ran `delay` updates ago reads
  // weights moved back by delay x the velocity (the recent updates' moving average), closer to
  // those its forward used; RestoreWeights puts the current ones back after it.
  Status CorrectWeights(int /*stage*/, int delay) {
    if (velocity_.empty() || delay <= 0) return Status::Ok();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < update_views_.size(); ++i) {
      saved_weights_[i].copy_(update_views_[i]);
      update_views_[i].sub_(velocity_[i], static_cast<double>(delay));
    }
    corrected_ = true;
    return Status::Ok();
  }
  Status RestoreWeights() {
    if (!corrected_) return Status::Ok();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < update_views_.size(); ++i) update_views_[i].copy_(saved_weights_[i]);
    corrected_ = false;
    return Status::Ok();
  }

  // PipeMare's update of this rank's stage with its gradients of one minibatch (`minibatch`,
  // relative to the step being run): averaged over the replicas, clipped to optimizer.grad_clip /
  // sqrt(pp) by the stage's own norm (the stages update at different times, so there is no global
  // norm to clip by; pp stages each within that bound keep the whole within grad_clip), at the
  // minibatch's learning rate scaled by delay^-(1 - t / K) over the first K steps (PipeMare's
  // rescheduling: the most delayed stages start slowest), and the velocity updated.
  Status UpdateStage(int stage, int minibatch) {
    torch::NoGradGuard no_grad;
    const int64_t k = std::max<int64_t>(0, slice_step_ + minibatch);
    if (replicate_) MW_RETURN_IF_ERROR(AverageGradientsOverReplicas());
    torch::Tensor sum = torch::zeros({}, torch::kDouble);
    for (auto& [name, p] : held_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      sum += p.grad().to(torch::kDouble).pow(2).sum();
    }
    const double squares = sum.item<double>();  // the update's one read of the gradients on the host
    update_norm_squares_ = squares;
    const double limit = async_options_.grad_clip > 0 ? async_options_.grad_clip / std::sqrt(program_.shape.pp)
                                                      : std::numeric_limits<double>::infinity();
    const double scale = std::min(1.0, limit / (std::sqrt(squares) + 1e-6));
    const int delay = async_->max_delay[static_cast<size_t>(stage)];  // this rank's stage: StageDelay()
    double lr = LearningRate(async_options_.schedule, async_options_.base_lr, k);
    const int64_t K = async_options_.lr_reschedule_steps;
    if (K > 0 && delay > 1) lr *= std::pow(static_cast<double>(delay), -(1.0 - std::min(1.0, static_cast<double>(k) / K)));
    // The velocity v <- g v + (1 - g)(w_new - w_old), g = D^(1 / delay) (forgetting over about the
    // delay's updates: PipeMare's choice). The old weights go to the corrected backward's buffer,
    // free while no backward runs, rather than a copy made for each update; their difference from
    // the new ones is taken in place (exact where they are close, as an update leaves them).
    const double gamma = std::pow(async_options_.correction_decay, 1.0 / std::max(1, delay));
    for (size_t i = 0; i < velocity_.size(); ++i) saved_weights_[i].copy_(update_views_[i]);
    for (size_t i = 0; i < held_.size(); ++i) update_views_[i].mutable_grad() = held_[i].second.grad();
    optimizer_->set_lr(lr);
    optimizer_->Step(torch::tensor({scale}, torch::kFloat));
    for (size_t i = 0; i < velocity_.size(); ++i) {
      velocity_[i].mul_(gamma).sub_(saved_weights_[i].sub_(update_views_[i]), 1.0 - gamma);  // w_old - w_new
    }
    for (size_t i = 0; i < held_.size(); ++i) {
      held_[i].second.mutable_grad() = torch::Tensor();
      update_views_[i].mutable_grad() = torch::Tensor();
    }
    return Status::Ok();
  }

  // The time since `start` as exposed communication (a wait on this rank's collectives).
  void CountBlockedSince(std::chrono::steady_clock::time_point start) {
    blocked_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  int Shards() const { return shard_ ? shard_->size() : 1; }
  int Tp() const { return tp_ ? tp_->size() : 1; }
  int Replicas() const { return replicate_ ? replicate_->size() : 1; }
  int Replica() const { return replicate_ ? replicate_->rank() : 0; }

  // FSDP inside the stages: one flat group (a unit) per decoder layer this rank holds, one for
  // the embedding and one for the rest (the final norm and the head; the tied table there where
  // the rank does not hold the first stage), in the order a step uses them, each sharded over
  // dp_shard; the optimizer steps the fp32 master shards, and the parameters are views of their
  // unit's storage, allocated only while gathered (a step, an evaluation, an export).
  // A unit's reduce-scatter starts as soon as its gradients are final: autograd's accumulations
  // into its parameters are counted (a post-hook on each AccumulateGrad), and once a step has
  // made as many as the first step did, no later action of the step adds to them, whichever
  // schedule runs (B, or I and W, activation checkpointing's recompute in I). The first step
  // only counts: its reduce-scatters all run after the program. The tied table's unit waits for
  // the stages' exchange of its gradient (SyncTiedGradients), which adds to it first. With tensor
  // parallelism the replicated norms' gradients are reduced over tp after the reduce-scatters, on
  // the shards (they line up on every tp rank, as under FSDP without pipelines: sums and means
  // commute with the reduce-scatter's sum).
  void ShardUnits() {
    const bool holds_first = program_.shape.RankOf(0) == comm_->rank();
    const bool tied = model_->config().tie_word_embeddings;
    const int64_t layers = model_->config().num_hidden_layers;
    const size_t rest = static_cast<size_t>(layers) + 1;
    // FSDP's groups (fsdp::GroupOf), but the table on a rank without the first stage is the head's.
    std::map<size_t, std::vector<size_t>> members;
    for (size_t i = 0; i < held_.size(); ++i) {
      const size_t key = fsdp::GroupOf(held_[i].first, layers);
      members[key == 0 && !holds_first ? rest : key].push_back(i);
    }
    for (const auto& [key, indices] : members) {
      units_.emplace_back();
      StageUnit& u = units_.back();
      unit_at_.push_back(&u);
      u.group.name = key == 0 ? "embed" : key == rest ? "head" : "model.layers." + std::to_string(key - 1);
      // The tied table's unit is reduce-scattered after the stages exchange its gradient: no hooks.
      bool deferred = false;
      for (size_t i : indices) {
        sharded_.push_back(fsdp::ShardedParam{});
        sharded_.back().name = held_[i].first;
        sharded_.back().full = held_[i].second;
        u.group.params.push_back(&sharded_.back());
        deferred = deferred || (tied && fsdp::GroupOf(held_[i].first, layers) == 0);
      }
      fsdp::ShardGroup(u.group, static_cast<int>(units_.size()) - 1, shard_->size(), shard_->rank(), torch::kFloat);
      if (key == 0) embed_unit_ = &u;
      if (key == rest) head_unit_ = &u;
      if (key != 0 && key != rest) layer_unit_[static_cast<int64_t>(key) - 1] = &u;
      if (deferred) continue;
      StageUnit* unit = &u;
      for (fsdp::ShardedParam* sp : u.group.params) {
        std::shared_ptr<torch::autograd::Node> accumulate = torch::autograd::impl::grad_accumulator(sp->full);
        accumulate->add_post_hook(std::make_unique<OnAccumulated>([this, unit] { Accumulated(*unit); }));
        // Autograd keeps a leaf's accumulator only while a graph uses it; held here, the hook stays.
        accumulators_.push_back(std::move(accumulate));
      }
    }
    // Each unit waited for at its first use: the embedding before the first stage, a layer before
    // it runs, the head after the last layer.
    pp::LlamaStages::Runners runners = stages_.runners();
    const int64_t last_layer = layers - 1;
    runners.layer = [this, inner = runners.layer, last_layer](int64_t i, model::DecoderLayerImpl& layer,
                                                              const torch::Tensor& h, const model::RopeTables& rope) {
      auto unit = layer_unit_.find(i);
      if (unit != layer_unit_.end()) ThrowIfError(AwaitGather(*unit->second));
      torch::Tensor out = inner ? inner(i, layer, h, rope) : layer.forward(h, rope);
      if (i == last_layer && head_unit_ != nullptr) ThrowIfError(AwaitGather(*head_unit_));
      return out;
    };
    runners.before_stage = [this, inner = runners.before_stage](int stage) {
      if (inner) inner(stage);
      if (stage == 0 && embed_unit_ != nullptr) ThrowIfError(AwaitGather(*embed_unit_));
    };
    stages_.set_runners(std::move(runners));
  }

  std::string OverlapText() const {
    return std::string(compiled_ ? "compiled: the program's ag and rs ops (fsdp.dump_plan prints it); " : "") +
           "a group per decoder layer, gathered for the step in the order the stages use them; each group's "
           "gradients reduce-scattered as soon as the step's last backward through it has run" +
           std::string(model_->config().tie_word_embeddings ? ", the tied table's after the stages exchange it" : "") +
           (split_ ? "; the replicated norms' shards then reduced over tp" : "");
  }

  // A unit's gradient accumulation, from autograd (OnAccumulated). Errors wait for the step's end.
  void Accumulated(StageUnit& u) {
    ++u.accumulated;
    if (compiled_) {
      // The program says which compute makes the unit final: its reduce-scatter starts once that
      // compute has accumulated into every one of the unit's parameters.
      if (u.scatter) {
        if (overrun_.empty()) overrun_ = u.group.name;
        return;
      }
      if (!u.armed || ++u.in_action < u.group.params.size()) return;
      u.armed = false;
      if (Status s = StartReduceScatter(u); !s.ok() && hook_error_.ok()) hook_error_ = s;
      return;
    }
    if (u.expected <= 0 || u.accumulated < u.expected) return;
    if (u.accumulated > u.expected || u.scatter) {
      if (overrun_.empty()) overrun_ = u.group.name;
      return;
    }
    if (Status s = StartReduceScatter(u); !s.ok() && hook_error_.ok()) hook_error_ = s;
  }

  Status StartGathers() {
    for (StageUnit& u : units_) {
      if (u.gather) continue;
      fsdp::AllocateStorage(u.group.storage);
      MW_ASSIGN_OR_RETURN(u.gather, shard_->AllGatherInto(fsdp::WriteAlias(u.group.storage), u.group.master));
    }
    return Status::Ok();
  }
  Status AwaitGather(StageUnit& u) {
    if (!u.gather) return Status::Ok();
    const auto start = std::chrono::steady_clock::now();
    Status done = u.gather->Wait();
    u.gather.reset();
    CountBlockedSince(start);
    return done;
  }
  // Every unit gathered (an evaluation, an export). Nothing to do without FSDP.
  Status Gather() {
    if (!shard_) return Status::Ok();
    MW_RETURN_IF_ERROR(StartGathers());
    for (StageUnit& u : units_) MW_RETURN_IF_ERROR(AwaitGather(u));
    return Status::Ok();
  }
  void Release() {
    for (StageUnit& u : units_) fsdp::ReleaseStorage(u.group.storage);
  }

  Status StartReduceScatter(StageUnit& u) {
    torch::NoGradGuard no_grad;
    u.reduced = torch::empty({u.group.shard_numel}, u.group.grad.options());
    MW_ASSIGN_OR_RETURN(u.scatter, shard_->ReduceScatter(u.reduced, u.group.grad, dist::ReduceOp::kSum));
    return Status::Ok();
  }

  // FSDP, after the step's program: the units whose reduce-scatter has not started (deferred, the
  // first step's, any whose count fell short) start in unit order, the same on every dp_shard rank;
  // each flat gradient is summed over dp_shard, all-reduced over dp_replicate and divided by the
  // pipelines (each took the mean over its rows); the master shards' gradients are views of the
  // result. The whole gradients and the gathered parameters are then freed.
  Status FinishReduceScatters() {
    torch::NoGradGuard no_grad;
    if (!hook_error_.ok()) return std::exchange(hook_error_, Status::Ok());
    if (!overrun_.empty()) {
      return Internal("FSDP inside pipeline stages: unit " + std::exchange(overrun_, std::string()) +
                      (compiled_ ? " took a gradient accumulation after the compute its program's rs op follows"
                                 : " took more gradient accumulations in a step than in the first step") +
                      ", after its reduce-scatter had started");
    }
    for (StageUnit& u : units_) MW_RETURN_IF_ERROR(AwaitGather(u));
    overlapped_ = 0;
    for (StageUnit& u : units_) {
      if (u.scatter) {
        ++overlapped_;
      } else {
        MW_RETURN_IF_ERROR(StartReduceScatter(u));
      }
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::unique_ptr<dist::Work>> reduces;
    for (StageUnit& u : units_) {
      MW_RETURN_IF_ERROR(u.scatter->Wait());
      u.scatter.reset();
      if (replicate_) {
        MW_ASSIGN_OR_RETURN(auto reduce, replicate_->AllReduce(u.reduced, dist::ReduceOp::kSum));
        reduces.push_back(std::move(reduce));
      }
    }
    for (auto& reduce : reduces) MW_RETURN_IF_ERROR(reduce->Wait());
    CountBlockedSince(start);
    for (StageUnit& u : units_) {
      u.reduced.div_(dp_size());
      for (fsdp::ShardedParam* sp : u.group.params) {
        sp->full.mutable_grad() = torch::Tensor();
        if (sp->shard.numel() == 0) continue;
        sp->shard.mutable_grad() = u.reduced.narrow(0, sp->shard_offset, sp->shard.numel()).view(sp->shard.sizes());
      }
      u.group.grad = torch::Tensor();
      u.reduced = torch::Tensor();
      if (u.expected < 0) u.expected = u.accumulated;  // the first step's count
    }
    Release();
    if (!split_) return Status::Ok();
    std::vector<torch::Tensor> replicated;
    for (fsdp::ShardedParam& sp : sharded_) {
      if (sp.shard.numel() > 0 && tp::TensorParallelLlama::SplitOf(sp.name) == tp::Split::kReplicated) {
        replicated.push_back(sp.shard.mutable_grad());
      }
    }
    const auto reducing = std::chrono::steady_clock::now();
    MW_RETURN_IF_ERROR(split_->ReduceReplicatedGrads(replicated));
    CountBlockedSince(reducing);
    return Status::Ok();
  }

  // Every parameter to rank 0 (from `held`, this rank's parameters whole) from the rank of the
  // first pipeline that holds it, in name order on every rank, so the k-th send between two ranks
  // meets the k-th receive; the other pipelines, which hold the same values, send nothing.
  Result<std::map<std::string, torch::Tensor>> SendFullStateToRankZero(const std::map<std::string, torch::Tensor>& held) {
    if (dp_rank() != 0 || (tp_ && tp_->rank() != 0)) return std::map<std::string, torch::Tensor>();
    std::map<std::string, torch::Tensor> state;
    std::vector<std::unique_ptr<dist::Work>> sends;
    for (const auto& [name, holder] : holder_) {
      if (comm_->rank() == 0) {
        if (holder == 0) {
          // A copy with FSDP: the gathered storage is freed once the state is sent.
          state[name] = shard_ ? held.at(name).detach().clone() : held.at(name).detach();
          continue;
        }
        torch::Tensor whole = torch::empty(shapes_.at(name), torch::kFloat32);
        MW_ASSIGN_OR_RETURN(auto recv, comm_->Recv(whole, holder));
        MW_RETURN_IF_ERROR(recv->Wait());
        state[name] = whole;
      } else if (holder == comm_->rank()) {
        MW_ASSIGN_OR_RETURN(auto send, comm_->Send(held.at(name).detach().contiguous(), 0));
        sends.push_back(std::move(send));
      }
    }
    for (auto& send : sends) MW_RETURN_IF_ERROR(send->Wait());
    return state;
  }

  // Every replica's gradients summed over dp_replicate in one flat buffer and divided by the
  // replicas: the mean over the global batch, each replica having taken the mean over its rows.
  // Each stage rank's replicas form their own group, so a stage that finished its program
  // reduces while the stages before it still compute.
  Status AverageGradientsOverReplicas() {
    std::vector<torch::Tensor> grads;
    for (auto& [name, p] : held_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad().reshape({-1}));
    }
    torch::Tensor flat = torch::cat(grads);
    const auto start = std::chrono::steady_clock::now();
    MW_ASSIGN_OR_RETURN(auto reduce, replicate_->AllReduce(flat, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    CountBlockedSince(start);
    flat.div_(replicate_->size());
    int64_t offset = 0;
    for (auto& [name, p] : held_) {
      const int64_t n = p.numel();
      p.mutable_grad().copy_(flat.narrow(0, offset, n).view_as(p));
      offset += n;
    }
    return Status::Ok();
  }
  // The mean of a value over the pipelines (dp_shard and dp_replicate ranks of one stage rank).
  Result<double> AverageOverPipelines(double local) {
    torch::Tensor t = torch::tensor({local}, torch::kDouble);
    for (dist::Communicator* group : {shard_.get(), replicate_.get()}) {
      if (group == nullptr) continue;
      MW_ASSIGN_OR_RETURN(auto reduce, group->AllReduce(t, dist::ReduceOp::kSum));
      MW_RETURN_IF_ERROR(reduce->Wait());
    }
    return t.item<double>() / dp_size();
  }

  dist::DistEnv env_;
  std::unique_ptr<dist::Communicator> world_;
  std::unique_ptr<dist::Communicator> comm_;       // this pipeline: rank = stage rank
  std::unique_ptr<dist::Communicator> shard_;      // this stage rank's dp_shard ranks; null without FSDP
  std::unique_ptr<dist::Communicator> replicate_;  // this stage rank's replicas; null with one
  std::unique_ptr<dist::Communicator> tp_;         // this stage rank's tp ranks; null without TP
  std::unique_ptr<tp::TensorParallelLlama> split_;  // tensor parallelism over tp_: slices the model
  std::map<std::string, const tp::LocalParam*> tp_params_;  // with TP: how each parameter is split
  model::LlamaForCausalLM model_;
  pp::LlamaStages stages_;
  pipeline::Program program_;
  pp::PipelineStepOptions options_;
  std::string schedule_;
  double schedule_bubble_ = 0;  // pipeline::SimulateEqualStages's
  std::map<std::string, int> holder_;                  // parameter -> the lowest rank holding it
  std::map<std::string, std::vector<int64_t>> shapes_;  // parameter -> its whole shape
  std::vector<std::pair<std::string, torch::Tensor>> held_;
  std::vector<torch::Tensor> decay_, no_decay_;  // what the optimizer steps
  std::deque<fsdp::ShardedParam> sharded_;  // with FSDP: held_'s parameters, in their units' order
  std::deque<StageUnit> units_;             // with FSDP: in the order a step uses them
  std::vector<StageUnit*> unit_at_;         // units_ by index: the program's unit numbers
  StageUnit* embed_unit_ = nullptr;         // units_'s embedding (the rank holding the first stage)
  StageUnit* head_unit_ = nullptr;          // units_'s final norm and head
  std::map<int64_t, StageUnit*> layer_unit_;  // decoder layer -> its unit
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept: they carry the hooks
  Status hook_error_;                       // a reduce-scatter a hook could not start
  std::string overrun_;                     // a unit accumulated into after its reduce-scatter started
  int overlapped_ = 0;                      // the last step's units reduce-scattered inside its program
  double blocked_seconds_ = 0;  // in receives, since the last TakeStats
  std::vector<double> busy_, program_seconds_;  // the last step's, per pipeline rank
  // PipeMare (pipeline.schedule: pipemare); unset for the synchronous schedules.
  std::optional<pipeline::AsyncSteps> async_;
  AsyncOptions async_options_;
  AsyncRunner async_runner_;
  AdamW* optimizer_ = nullptr;
  pp::PipelineCarry carry_;             // the micro-batches in flight between steps
  int64_t since_start_ = 0;             // steps since the pipeline last started filling
  int64_t slice_step_ = 0, last_step_ = 0;  // the step being run (a drain: the last + 1), the last run
  std::vector<torch::Tensor> update_views_;  // held_'s storage, the optimizer's
  std::vector<torch::Tensor> velocity_;       // per held_ parameter: the updates' moving average (empty: no correction)
  std::vector<torch::Tensor> saved_weights_;  // per held_ parameter: the weights during a corrected backward
  bool corrected_ = false;                    // a corrected backward runs
  double update_norm_squares_ = 0;  // this rank's last update's gradient; after a step, every stage's
  // fsdp.mode compiled: the program carries FSDP's ops (pipeline::PlaceFsdp), run by fsdp_ops_.
  bool compiled_ = false;
  FsdpOpsRunner fsdp_ops_;
};

}  // namespace

Result<std::unique_ptr<Engine>> MakePipelineEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                                   const dist::DistEnv& env, PipelineGroups groups,
                                                   const torch::Device& device, std::ostream& log) {
  const int pp_size = static_cast<int>(cfg.mesh.pp);
  const int pipelines = (groups.replicate ? groups.replicate->size() : 1) * (groups.shard ? groups.shard->size() : 1) *
                        (groups.tp ? groups.tp->size() : 1);
  if (groups.world == nullptr || groups.pipeline == nullptr || groups.pipeline->size() != pp_size ||
      groups.world->size() != pp_size * pipelines) {
    return InvalidConfig("key 'mesh.pp': " + std::to_string(pp_size) + " pipeline ranks x " + std::to_string(pipelines) +
                         " pipelines, but the groups do not make that mesh (world " +
                         std::to_string(groups.world ? groups.world->size() : 0) + ", pipeline " +
                         std::to_string(groups.pipeline ? groups.pipeline->size() : 0) + ")");
  }
  if (device.is_cuda()) {
    return Unavailable("key 'mesh.pp': pipeline stages on CUDA need NCCL's point-to-point transfers, which the NCCL "
                       "communicator does not have yet (docs/compiler.md, \"The executor\"); pipelines run on CPU ranks");
  }
  const std::string schedule = NameOf(config::kPipelineScheduleNames, cfg.pipeline.schedule);
  MW_ASSIGN_OR_RETURN(pipeline::Program compute, config::PipelineProgram(cfg));
  const pipeline::Shape shape = compute.shape;
  MW_ASSIGN_OR_RETURN(const double bubble, pipeline::ScheduleBubble(compute));
  std::optional<pipeline::AsyncSteps> async;
  AsyncOptions async_options;
  if (shape.per_update > 0) {
    // PipeMare: each stage steps its own parameters at its own time (docs/config.md, pipeline.*).
    if (groups.shard || groups.tp) {
      return InvalidConfig("key 'pipeline.schedule': pipemare updates each stage at its own time within a step, which "
                           "FSDP and tensor parallelism inside the stages do not allow (mesh.dp_shard " +
                           std::to_string(groups.shard ? groups.shard->size() : 1) + ", mesh.tp " +
                           std::to_string(groups.tp ? groups.tp->size() : 1) + "); use 1f1b, or mesh.dp_replicate");
    }
    if (model->config().tie_word_embeddings) {
      return InvalidConfig("key 'model.tie_word_embeddings': true, but under pipeline.schedule: pipemare the first and "
                           "last stages would update the table's two copies at different times; set it false (the "
                           "presets that tie it: tiny, llama-100m, llama3-1b)");
    }
    MW_ASSIGN_OR_RETURN(pipeline::AsyncSteps steps, pipeline::SplitIntoSteps(shape));
    async = std::move(steps);
    async_options.schedule = cfg.schedule;
    async_options.base_lr = cfg.optimizer.lr;
    async_options.grad_clip = cfg.optimizer.grad_clip;
    async_options.lr_reschedule_steps =
        cfg.pipeline.lr_reschedule_steps < 0 ? cfg.schedule.warmup_steps : cfg.pipeline.lr_reschedule_steps;
    async_options.correction = cfg.pipeline.discrepancy_correction;
    async_options.correction_decay = cfg.pipeline.correction_decay;
  }
  MW_ASSIGN_OR_RETURN(pipeline::Program program, pipeline::Lower(compute));
  if (Status valid = pipeline::Validate(program); !valid.ok()) {
    return Internal("the " + schedule + " program does not validate: " + valid.message());
  }
  MW_ASSIGN_OR_RETURN(std::vector<int> cut,
                      pp::FlopBalancedCut(model->config(), cfg.data.seq_len, shape.stages(),
                                          model->loss_gradient() == model::HeadGradient::kRecompute));
  // Tensor parallelism slices the whole model first (every rank built the same one); the stages
  // then keep their slices.
  std::unique_ptr<tp::TensorParallelLlama> split;
  if (groups.tp) {
    tp::TensorParallelOptions to;
    to.sequence_parallel = cfg.mesh.sequence_parallel;
    to.async_chunks = static_cast<int>(cfg.mesh.async_tp_chunks);
    MW_ASSIGN_OR_RETURN(split, tp::TensorParallelLlama::Create(model, *groups.tp, to));
  }
  MW_ASSIGN_OR_RETURN(pp::LlamaStages stages, pp::LlamaStages::Create(model, shape, cut, groups.pipeline->rank()));
  // Compiled: FSDP's collectives become ops of the program (config validation allows it only with
  // FSDP inside the stages and a synchronous schedule).
  const bool compiled = cfg.fsdp.mode == config::FsdpMode::kCompiled;
  if (compiled) {
    if (!groups.shard || shape.per_update > 0) {
      return InvalidConfig("key 'fsdp.mode': compiled places FSDP's collectives in a synchronous pipeline program, and "
                           "this one has " + std::string(groups.shard ? "pipeline.schedule " + schedule
                                                                      : "no FSDP inside its stages (mesh.dp_shard 1)"));
    }
    MW_ASSIGN_OR_RETURN(program, pipeline::PlaceFsdp(program, FsdpUnitsOf(shape, cut, model->config().tie_word_embeddings)));
    if (Status valid = pipeline::Validate(program); !valid.ok()) {
      return Internal("the " + schedule + " program with FSDP's ops does not validate: " + valid.message());
    }
    if (env.rank == 0 && cfg.fsdp.dump_plan) log << "== pipeline program (compiled) ==\n" << pipeline::Print(program);
  }
  pp::LlamaStages::Runners runners;
  if (split) {
    tp::TensorParallelLlama* t = split.get();
    runners.begin_forward = [t](const torch::Tensor& tokens) { t->BeginForward(tokens); };
    runners.embed = t->Embedding();
    runners.loss = t->LossHead();
  }
  // Activation checkpointing: decoder layers 0, N, 2N, ... recomputed in their micro-batch's
  // backward (under zero-bubble in its I, which then computes their weights' gradients too).
  if (const int64_t every = CheckpointEvery(cfg); every > 0) {
    runners.layer = [every](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h,
                            const model::RopeTables& rope) {
      return i % every == 0 ? model::CheckpointedLayer(layer, h, rope) : layer.forward(h, rope);
    };
  }
  stages.set_runners(std::move(runners));
  pp::PipelineStepOptions options;
  SetStream(options, model->config(), split.get(), cfg.data.batch_size, cfg.data.seq_len);
  options.activation_dtype = torch::kFloat32;
  auto engine = std::make_unique<PipelineEngine>(env, std::move(groups), std::move(split), std::move(model), std::move(stages),
                                                 std::move(program), std::move(options), schedule, bubble,
                                                 std::move(async), std::move(async_options), compiled);
  if (env.rank == 0) log << engine->Describe() << "\n";
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace meshwork::train
