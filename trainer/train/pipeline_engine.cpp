#include "trainer/train/pipeline_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/enum_names.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/config/hardware.h"
#include "trainer/pp/executor.h"
#include "trainer/pp/llama_stages.h"

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
  PipelineEngine(const dist::DistEnv& env, std::unique_ptr<dist::Communicator> comm, model::LlamaForCausalLM model,
                 pp::LlamaStages stages, pipeline::Program program, pp::PipelineStepOptions options,
                 std::string schedule)
      : env_(env),
        comm_(std::move(comm)),
        model_(std::move(model)),
        stages_(std::move(stages)),
        program_(std::move(program)),
        options_(std::move(options)),
        schedule_(std::move(schedule)) {
    // Who holds each parameter (the lowest rank, for the tied table held twice), and its whole
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
  int dp_rank() const override { return 0; }
  int dp_size() const override { return 1; }
  std::string Describe() const override {
    const auto& shape = program_.shape;
    return "pipeline: pp=" + std::to_string(shape.pp) + ", " + schedule_ + ", " + std::to_string(shape.microbatches) +
           " micro-batches a step, " + std::to_string(shape.stages()) + " stages of layers " +
           CutText(stages_.first_layer()) + " (stage s on rank s % pp)";
  }
  dist::MeshShape mesh_shape() const override { return {}; }

  // The loop calls StepLoss instead (RunsWholeSteps).
  torch::Tensor Loss(const torch::Tensor&, const torch::Tensor&, bool) override { return {}; }
  Status AfterBackward(bool) override { return Status::Ok(); }
  bool RunsWholeSteps() const override { return true; }

  Result<torch::Tensor> StepLoss(const std::vector<std::pair<torch::Tensor, torch::Tensor>>& microbatches) override {
    std::vector<pp::MicroBatch> mbs;
    for (const auto& [tokens, targets] : microbatches) mbs.push_back({tokens, targets});
    MW_ASSIGN_OR_RETURN(pp::PipelineStepResult result, pp::RunPipelineStep(program_, stages_, *comm_, mbs, options_));
    MW_RETURN_IF_ERROR(stages_.SyncTiedGradients(*comm_));
    // Every rank's busy and program seconds, at its index (the others add 0).
    const int pp_size = program_.shape.pp;
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
    times[env_.rank] = busy;
    times[pp_size + env_.rank] = result.seconds;
    MW_ASSIGN_OR_RETURN(auto reduce, comm_->AllReduce(times, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    busy_.assign(times.data_ptr<double>(), times.data_ptr<double>() + pp_size);
    program_seconds_.assign(times.data_ptr<double>() + pp_size, times.data_ptr<double>() + 2 * pp_size);
    return torch::tensor({result.loss}, torch::kDouble);
  }

  Result<torch::Tensor> GradNorm() override {
    torch::NoGradGuard no_grad;
    // The tied table's gradient is on two ranks (the same after SyncTiedGradients): counted once,
    // on the lower.
    double local = 0;
    for (const auto& [name, p] : held_) {
      if (!p.grad().defined() || holder_[name] != env_.rank) continue;
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
  std::vector<ShardPiece> LocalShards() const override {
    std::vector<ShardPiece> out;
    for (const auto& [name, p] : held_) {
      if (holder_.at(name) == env_.rank) out.push_back(ShardPiece{name, p.sizes().vec(), 0, p});
    }
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
    MW_ASSIGN_OR_RETURN(auto reduce, comm_->AllReduce(t, dist::ReduceOp::kSum));
    MW_RETURN_IF_ERROR(reduce->Wait());
    return t.item<double>() / env_.world_size;
  }
  // Every parameter to rank 0 from the rank that holds it, in name order on every rank, so the
  // k-th send between two ranks meets the k-th receive.
  Result<std::map<std::string, torch::Tensor>> FullState() override {
    std::map<std::string, torch::Tensor> state;
    std::map<std::string, torch::Tensor> held(held_.begin(), held_.end());
    std::vector<std::unique_ptr<dist::Work>> sends;
    for (const auto& [name, holder] : holder_) {
      if (env_.rank == 0) {
        if (holder == 0) {
          state[name] = held.at(name).detach();
          continue;
        }
        torch::Tensor whole = torch::empty(shapes_.at(name), torch::kFloat32);
        MW_ASSIGN_OR_RETURN(auto recv, comm_->Recv(whole, holder));
        MW_RETURN_IF_ERROR(recv->Wait());
        state[name] = whole;
      } else if (holder == env_.rank) {
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
    s.comm = comm_->stats();
    s.pipeline_busy_seconds = busy_;
    s.pipeline_seconds = program_seconds_;
    blocked_seconds_ = 0;
    return s;
  }

 private:
  dist::DistEnv env_;
  std::unique_ptr<dist::Communicator> comm_;
  model::LlamaForCausalLM model_;
  pp::LlamaStages stages_;
  pipeline::Program program_;
  pp::PipelineStepOptions options_;
  std::string schedule_;
  std::map<std::string, int> holder_;                  // parameter -> the lowest rank holding it
  std::map<std::string, std::vector<int64_t>> shapes_;  // parameter -> its whole shape
  std::vector<std::pair<std::string, torch::Tensor>> held_;
  std::vector<torch::Tensor> decay_, no_decay_;
  double blocked_seconds_ = 0;  // in receives, since the last TakeStats
  std::vector<double> busy_, program_seconds_;  // the last step's, per pipeline rank
};

}  // namespace

Result<std::unique_ptr<Engine>> MakePipelineEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                                   const dist::DistEnv& env, std::unique_ptr<dist::Communicator> comm,
                                                   const torch::Device& device, std::ostream& log) {
  const int pp_size = static_cast<int>(cfg.mesh.pp);
  if (env.world_size != pp_size) {
    return InvalidConfig("key 'mesh.pp': " + std::to_string(pp_size) + " pipeline ranks, but the world is " +
                         std::to_string(env.world_size) + " processes (pipelines do not compose with data parallelism yet)");
  }
  if (device.is_cuda()) {
    return Unavailable("key 'mesh.pp': pipeline stages on CUDA need NCCL's point-to-point transfers, which the NCCL "
                       "communicator does not have yet (docs/compiler.md, \"The executor\"); pipelines run on CPU ranks");
  }
  const std::string schedule = NameOf(config::kPipelineScheduleNames, cfg.pipeline.schedule);
  MW_ASSIGN_OR_RETURN(pipeline::Program compute, config::PipelineProgram(cfg));
  const pipeline::Shape shape = compute.shape;
  MW_ASSIGN_OR_RETURN(pipeline::Program program, pipeline::Lower(compute));
  if (Status valid = pipeline::Validate(program); !valid.ok()) {
    return Internal("the " + schedule + " program does not validate: " + valid.message());
  }
  MW_ASSIGN_OR_RETURN(std::vector<int> cut,
                      pp::FlopBalancedCut(model->config(), cfg.data.seq_len, shape.stages(),
                                          model->loss_gradient() == model::HeadGradient::kRecompute));
  MW_ASSIGN_OR_RETURN(pp::LlamaStages stages, pp::LlamaStages::Create(model, shape, cut, env.rank));
  pp::PipelineStepOptions options;
  options.activation_sizes = {cfg.data.batch_size, cfg.data.seq_len, model->config().hidden_size};
  options.activation_dtype = torch::kFloat32;
  auto engine = std::make_unique<PipelineEngine>(env, std::move(comm), std::move(model), std::move(stages),
                                                 std::move(program), std::move(options), schedule);
  if (env.rank == 0) log << engine->Describe() << "\n";
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace meshwork::train
