#include "trainer/train/pipeline_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/enum_names.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/pipeline/simulate.h"
#include "trainer/config/hardware.h"
#include "trainer/pp/executor.h"
#include "trainer/pp/llama_stages.h"
#include "trainer/train/report.h"

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

class PipelineEngine final : public Engine {
 public:
  PipelineEngine(const dist::DistEnv& env, PipelineGroups groups, model::LlamaForCausalLM model,
                 pp::LlamaStages stages, pipeline::Program program, pp::PipelineStepOptions options,
                 std::string schedule, double schedule_bubble)
      : env_(env),
        world_(std::move(groups.world)),
        comm_(std::move(groups.pipeline)),
        replicate_(std::move(groups.replicate)),
        model_(std::move(model)),
        stages_(std::move(stages)),
        program_(std::move(program)),
        options_(std::move(options)),
        schedule_(std::move(schedule)),
        schedule_bubble_(schedule_bubble) {
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
    for (const auto& item : model_->named_parameters()) {
      if (item.value().numel() == 0) continue;
      held_.emplace_back(item.key(), item.value());
      (item.value().dim() >= 2 ? decay_ : no_decay_).push_back(item.value());
    }
  }

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  // Each replica of the pipeline reads its own rows.
  int dp_rank() const override { return replicate_ ? replicate_->rank() : 0; }
  int dp_size() const override { return replicate_ ? replicate_->size() : 1; }
  std::string Describe() const override {
    const auto& shape = program_.shape;
    return "pipeline: pp=" + std::to_string(shape.pp) + ", " + schedule_ + ", " + std::to_string(shape.microbatches) +
           " micro-batches a step, " + std::to_string(shape.stages()) + " stages of layers " +
           CutText(stages_.first_layer()) + " (stage s on rank s % pp); the schedule's own bubble " +
           Format("%.3f", schedule_bubble_) + " (stages alike, free transfers)" +
           (replicate_ ? "; " + std::to_string(dp_size()) +
                             " replicas of the pipeline (rank = stage rank x " + std::to_string(dp_size()) +
                             " + replica), each stage's gradients averaged over dp_replicate"
                       : "");
  }
  dist::MeshShape mesh_shape() const override { return {dp_size(), 1, 1}; }

  // The loop calls StepLoss instead (RunsWholeSteps).
  torch::Tensor Loss(const torch::Tensor&, const torch::Tensor&, bool) override { return {}; }
  Status AfterBackward(bool) override { return Status::Ok(); }
  bool RunsWholeSteps() const override { return true; }

  Result<torch::Tensor> StepLoss(const std::vector<std::pair<torch::Tensor, torch::Tensor>>& microbatches) override {
    std::vector<pp::MicroBatch> mbs;
    for (const auto& [tokens, targets] : microbatches) mbs.push_back({tokens, targets});
    MW_ASSIGN_OR_RETURN(pp::PipelineStepResult result, pp::RunPipelineStep(program_, stages_, *comm_, mbs, options_));
    // The replicas first: the last stage, done before the first, reduces while it still computes
    // (the tied table's exchange waits for the first stage). Both copies of the table get the same sum.
    double loss = result.loss;
    if (replicate_) {
      MW_RETURN_IF_ERROR(AverageGradientsOverReplicas());
      MW_ASSIGN_OR_RETURN(loss, AverageOverReplicas(result.loss));
    }
    MW_RETURN_IF_ERROR(stages_.SyncTiedGradients(*comm_));
    // Every pipeline rank's busy and program seconds, at its index (the others add 0).
    const int pp_size = program_.shape.pp;
    const int stage_rank = comm_->rank();
    torch::Tensor times = torch::zeros({2 * pp_size}, torch::kDouble);
    double busy = 0;
    for (const pp::ActionSpan& span : result.spans) {
      if (pipeline::IsCompute(span.action.kind)) {
        busy += span.end - span.start;
      } else if (span.action.kind == pipeline::ActionKind::kRecvActivation ||
                 span.action.kind == pipeline::ActionKind::kRecvGrad) {
        blocked_seconds_ += span.end - span.start;
      }
    }
    times[stage_rank] = busy;
    times[pp_size + stage_rank] = result.seconds;
    MW_ASSIGN_OR_RETURN(auto reduce, comm_->AllReduce(times, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    busy_.assign(times.data_ptr<double>(), times.data_ptr<double>() + pp_size);
    program_seconds_.assign(times.data_ptr<double>() + pp_size, times.data_ptr<double>() + 2 * pp_size);
    return torch::tensor({loss}, torch::kDouble);
  }

  Result<torch::Tensor> GradNorm() override {
    torch::NoGradGuard no_grad;
    // The tied table's gradient is on two ranks (the same after SyncTiedGradients): counted once,
    // on the lower.
    double local = 0;
    for (const auto& [name, p] : held_) {
      if (!p.grad().defined() || holder_[name] != comm_->rank()) continue;
      local += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    }
    torch::Tensor sum = torch::tensor({local}, torch::kDouble);
    MW_ASSIGN_OR_RETURN(auto reduce, comm_->AllReduce(sum, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    return sum.sqrt();
  }
  void ZeroGrad() override {
    for (auto& [name, p] : held_) p.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> DecayParams() const override { return decay_; }
  std::vector<torch::Tensor> NoDecayParams() const override { return no_decay_; }
  std::vector<std::pair<std::string, torch::Tensor>> LocalParams() const override { return held_; }
  // Every parameter this rank holds, whole: the tied table too on both of its ranks, so an import
  // or a resume fills both copies (a checkpoint then holds it twice, as HSDP's replicas do).
  std::vector<ShardPiece> LocalShards() const override {
    std::vector<ShardPiece> out;
    for (const auto& [name, p] : held_) out.push_back(ShardPiece{name, p.sizes().vec(), 0, p});
    return out;
  }
  int64_t ParamBytes() const override {
    int64_t b = 0;
    for (const auto& [name, p] : held_) b += dist::TensorBytes(p);
    return b;
  }
  torch::Tensor EvalBatchLoss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    pp::PipelineStepOptions options = options_;
    options.activation_sizes[0] = tokens.size(0);
    options.activation_sizes[1] = tokens.size(1);
    auto loss = pp::RunPipelineForward(program_.shape, stages_, *comm_, {tokens, targets}, options);
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
  // Every parameter to rank 0 from the rank of replica 0 that holds it, in name order on every
  // rank, so the k-th send between two ranks meets the k-th receive; the other replicas, which
  // hold the same values, send nothing.
  Result<std::map<std::string, torch::Tensor>> FullState() override {
    if (dp_rank() != 0) return std::map<std::string, torch::Tensor>();
    std::map<std::string, torch::Tensor> state;
    std::map<std::string, torch::Tensor> held(held_.begin(), held_.end());
    std::vector<std::unique_ptr<dist::Work>> sends;
    for (const auto& [name, holder] : holder_) {
      if (comm_->rank() == 0) {
        if (holder == 0) {
          state[name] = held.at(name).detach();
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
  EngineStats TakeStats() override {
    EngineStats s;
    s.exposed_comm_seconds = blocked_seconds_;
    for (dist::Communicator* group : {world_.get(), comm_.get(), replicate_.get()}) {
      if (group == nullptr) continue;
      const dist::CommStats c = group->stats();
      for (int i = 0; i < dist::kNumCollectives; ++i) {
        s.comm.calls[i] += c.calls[i];
        s.comm.bytes_sent[i] += c.bytes_sent[i];
      }
    }
    s.pipeline_busy_seconds = busy_;
    s.pipeline_seconds = program_seconds_;
    blocked_seconds_ = 0;
    return s;
  }

 private:
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
    blocked_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    flat.div_(replicate_->size());
    int64_t offset = 0;
    for (auto& [name, p] : held_) {
      const int64_t n = p.numel();
      p.mutable_grad().copy_(flat.narrow(0, offset, n).view_as(p));
      offset += n;
    }
    return Status::Ok();
  }
  Result<double> AverageOverReplicas(double local) {
    torch::Tensor t = torch::tensor({local}, torch::kDouble);
    MW_ASSIGN_OR_RETURN(auto reduce, replicate_->AllReduce(t, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    return t.item<double>() / replicate_->size();
  }

  dist::DistEnv env_;
  std::unique_ptr<dist::Communicator> world_;
  std::unique_ptr<dist::Communicator> comm_;       // this replica's pipeline: rank = stage rank
  std::unique_ptr<dist::Communicator> replicate_;  // this stage rank's replicas; null with one
  model::LlamaForCausalLM model_;
  pp::LlamaStages stages_;
  pipeline::Program program_;
  pp::PipelineStepOptions options_;
  std::string schedule_;
  double schedule_bubble_ = 0;  // pipeline::SimulateEqualStages's
  std::map<std::string, int> holder_;                  // parameter -> the lowest rank holding it
  std::map<std::string, std::vector<int64_t>> shapes_;  // parameter -> its whole shape
  std::vector<std::pair<std::string, torch::Tensor>> held_;
  std::vector<torch::Tensor> decay_, no_decay_;
  double blocked_seconds_ = 0;  // in receives, since the last TakeStats
  std::vector<double> busy_, program_seconds_;  // the last step's, per pipeline rank
};

}  // namespace

Result<std::unique_ptr<Engine>> MakePipelineEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                                   const dist::DistEnv& env, PipelineGroups groups,
                                                   const torch::Device& device, std::ostream& log) {
  const int pp_size = static_cast<int>(cfg.mesh.pp);
  const int replicas = groups.replicate ? groups.replicate->size() : 1;
  if (groups.world == nullptr || groups.pipeline == nullptr || groups.pipeline->size() != pp_size ||
      groups.world->size() != pp_size * replicas) {
    return InvalidConfig("key 'mesh.pp': " + std::to_string(pp_size) + " pipeline ranks x " + std::to_string(replicas) +
                         " replicas, but the groups do not make that mesh (world " +
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
  MW_ASSIGN_OR_RETURN(const pipeline::PipelineResult equal, pipeline::SimulateEqualStages(compute));
  MW_ASSIGN_OR_RETURN(pipeline::Program program, pipeline::Lower(compute));
  if (Status valid = pipeline::Validate(program); !valid.ok()) {
    return Internal("the " + schedule + " program does not validate: " + valid.message());
  }
  MW_ASSIGN_OR_RETURN(std::vector<int> cut,
                      pp::FlopBalancedCut(model->config(), cfg.data.seq_len, shape.stages(),
                                          model->loss_gradient() == model::HeadGradient::kRecompute));
  MW_ASSIGN_OR_RETURN(pp::LlamaStages stages, pp::LlamaStages::Create(model, shape, cut, groups.pipeline->rank()));
  pp::PipelineStepOptions options;
  options.activation_sizes = {cfg.data.batch_size, cfg.data.seq_len, model->config().hidden_size};
  options.activation_dtype = torch::kFloat32;
  auto engine = std::make_unique<PipelineEngine>(env, std::move(groups), std::move(model), std::move(stages),
                                                 std::move(program), std::move(options), schedule,
                                                 equal.bubble_fraction);
  if (env.rank == 0) log << engine->Describe() << "\n";
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace meshwork::train
