#include "trainer/train/engine.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <ostream>
#include <vector>

#include "trainer/dist/device_mesh.h"
#include "trainer/dist/env.h"
#include "trainer/dist/gloo_communicator.h"
#include "trainer/dist/host_collectives.h"
#include "trainer/dist/rendezvous.h"
#include "common/chrome_trace.h"
#include "common/file.h"
#include "trainer/fsdp/compile.h"
#include "trainer/fsdp/fully_shard.h"
#include "trainer/model/recompute.h"
#include "trainer/parallel/parallelize.h"
#include "trainer/tp/tensor_parallel.h"
#include "trainer/train/device.h"
#include "trainer/train/mesh_auto.h"
#include "trainer/train/pipeline_engine.h"
#ifdef MESHWORK_HAVE_NCCL
#include "trainer/dist/nccl_communicator.h"
#endif

namespace meshwork::train {
namespace {


class LocalEngine : public Engine {
 public:
  LocalEngine(model::LlamaForCausalLM model, int64_t checkpoint_every)
      : model_(std::move(model)), checkpoint_every_(checkpoint_every) {
    for (auto& p : model_->parameters()) (p.dim() >= 2 ? decay_ : no_decay_).push_back(p);
  }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int dp_rank() const override { return 0; }
  int dp_size() const override { return 1; }
  std::string Describe() const override { return "1 process"; }
  dist::MeshShape mesh_shape() const override { return {}; }

  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets, bool) override {
    if (checkpoint_every_ <= 0) return model_->Loss(tokens, targets);
    const int64_t every = checkpoint_every_;
    return model_->ForwardWithLayerRunner(
        tokens,
        [every](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
          return i % every == 0 ? model::CheckpointedLayer(layer, h, rope) : layer.forward(h, rope);
        },
        targets);
  }
  Status AfterBackward(bool) override { return Status::Ok(); }
  bool AttachWeightCopies(const std::shared_ptr<model::WeightCopies>& copies) override {
    model_->set_weight_copies(copies);
    return true;
  }
  Result<torch::Tensor> GradNorm() override {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (const auto& p : model_->parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
    if (grads.empty()) return torch::zeros({1}, torch::kDouble);
    // One norm per parameter in one multi-tensor call, combined in fp64.
    return torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).pow(2).sum().sqrt().reshape({1});
  }
  void ZeroGrad() override {
    for (auto& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> DecayParams() const override { return decay_; }
  std::vector<torch::Tensor> NoDecayParams() const override { return no_decay_; }
  std::vector<std::pair<std::string, torch::Tensor>> LocalParams() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : model_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  std::vector<ShardPiece> LocalShards() const override {
    std::vector<ShardPiece> out;
    for (const auto& item : model_->named_parameters()) {
      out.push_back(ShardPiece{item.key(), item.value().sizes().vec(), 0, item.value()});
    }
    return out;
  }
  int64_t ParamBytes() const override {
    int64_t b = 0;
    for (const auto& p : model_->parameters()) b += dist::TensorBytes(p);
    return b;
  }
  torch::Tensor EvalBatchLoss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    torch::NoGradGuard no_grad;
    return model_->Loss(tokens, targets);
  }
  Result<double> AverageAcrossRanks(double local) override { return local; }
  Result<std::map<std::string, torch::Tensor>> FullState() override {
    std::map<std::string, torch::Tensor> state;
    for (auto& item : model_->named_parameters()) state[item.key()] = item.value().detach();
    return state;
  }
  EngineStats TakeStats() override { return {}; }

 private:
  model::LlamaForCausalLM model_;
  int64_t checkpoint_every_;  // layers 0, N, 2N, ... run checkpointed; 0: none, 1: all
  std::vector<torch::Tensor> decay_, no_decay_;
};

// FSDP (and HSDP) over the data parallel dims, of a model that tensor parallelism may have split
// first (parallel/parallelize.h).
class FsdpEngine : public Engine {
 public:
  FsdpEngine(dist::DistEnv env, std::unique_ptr<dist::DeviceMesh> mesh, std::unique_ptr<parallel::ParallelLlama> model,
             config::FsdpConfig fsdp_config, bool cpu, int64_t device_memory_bytes, std::ostream& log)
      : env_(std::move(env)),
        mesh_(std::move(mesh)),
        parallel_(std::move(model)),
        fsdp_(&parallel_->fsdp()),
        cfg_(std::move(fsdp_config)),
        cpu_(cpu),
        device_memory_bytes_(device_memory_bytes),
        log_(log) {
    if (parallel_->tp() != nullptr) {
      for (const tp::LocalParam& p : parallel_->tp()->params()) tp_params_[p.name] = &p;
    }
  }

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  // The data index: the rank's place on the data parallel dims (a tp group reads one batch).
  int dp_rank() const override { return env_.rank / mesh_->shape().tp; }
  int dp_size() const override { return env_.world_size / mesh_->shape().tp; }
  dist::MeshShape mesh_shape() const override { return mesh_->shape(); }
  std::string Describe() const override {
    const auto s = mesh_->shape();
    std::string tp;
    if (const tp::TensorParallelLlama* split = parallel_->tp(); split != nullptr) {
      tp = " x tp " + std::to_string(s.tp) + (split->sequence_parallel() ? " with sequence parallelism" : "") +
           (split->async_chunks() > 1 ? " overlapped in " + std::to_string(split->async_chunks()) + " chunks" : "") +
           ", FSDP sharding each tensor parallel slice";
    }
    return std::to_string(env_.world_size) + " ranks, FSDP over mesh dp_replicate " +
           std::to_string(s.dp_replicate) + " x dp_shard " + std::to_string(s.dp_shard) + tp + " (" +
           mesh_->group("dp_shard").backend() + ")";
  }

  Status BeginStep() override {
    // Compiled: the first steps run eager; the plan is made from the last one's trace (a
    // steady-state step: step 1's times include warm-up) and runs from the next step on.
    if (cfg_.mode == config::FsdpMode::kCompiled && !fsdp_->compiled() && steps_done_ >= kEagerStepsBeforePlan) {
      MW_ASSIGN_OR_RETURN(compilation_, fsdp::CompileFsdp(*fsdp_, *mesh_, cfg_, cpu_,
                                                          fsdp::SteadyEagerStep(eager_steps_),
                                                          device_memory_bytes_, log_));
    } else if (compilation_ && cfg_.replan && !replanned_ &&
               steps_done_ >= kEagerStepsBeforePlan + kCompiledStepsBeforeReplan) {
      // The last compiled step's time (the first one pays for new buffers) refits the plan.
      MW_RETURN_IF_ERROR(fsdp::Replan(*fsdp_, *mesh_, *compilation_, last_step_seconds_, log_));
      replanned_ = true;
    }
    if (!cfg_.trace_out.empty() && steps_done_ == kTracedStep - 1 && !trace_) {
      trace_origin_ = NowSeconds();
      trace_ = std::make_unique<ChromeTrace>(env_.rank, "rank " + std::to_string(env_.rank), trace_origin_);
      fsdp_->TraceInto(trace_.get());
    }
    return Status::Ok();
  }
  void EndStep(double step_seconds) override {
    // The eager steps before the plan, whole and outside forward-to-reduction (the norm, the
    // optimizer, the loss's average, the batch): the plan is fitted to their steady mean
    // (fsdp::SteadyEagerStep). Only while a plan is still to be made: eager FSDP never plans.
    if (cfg_.mode == config::FsdpMode::kCompiled && !fsdp_->compiled()) {
      eager_steps_.push_back({step_seconds, std::max(0.0, step_seconds - last_sync_seconds_)});
    }
    last_step_seconds_ = step_seconds;
  }
  int64_t SteadyFromStep() const override {
    if (cfg_.mode != config::FsdpMode::kCompiled) return 1;
    return kEagerStepsBeforePlan + (cfg_.replan ? kCompiledStepsBeforeReplan : 0);
  }
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets, bool sync) override {
    if (sync) sync_started_ = NowSeconds();
    parallel_->SetGradientSync(sync);
    return parallel_->Forward(tokens, targets);
  }
  Status AfterBackward(bool sync) override {
    MW_RETURN_IF_ERROR(parallel_->FinishBackward());
    if (sync) last_sync_seconds_ = NowSeconds() - sync_started_;
    if (sync) ++steps_done_;
    if (sync && trace_ && steps_done_ == kTracedStep) MW_RETURN_IF_ERROR(WriteTrace());
    return Status::Ok();
  }
  Result<torch::Tensor> GradNorm() override {
    MW_ASSIGN_OR_RETURN(torch::Tensor norm2, parallel_->GradNormSquared());
    return norm2.sqrt();
  }
  void ZeroGrad() override { fsdp_->ZeroGrad(); }
  std::vector<torch::Tensor> DecayParams() const override { return fsdp_->DecayShards(); }
  std::vector<torch::Tensor> NoDecayParams() const override { return fsdp_->NoDecayShards(); }
  std::vector<std::pair<std::string, torch::Tensor>> LocalParams() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    // A rank that holds none of a parameter (flat groups split where they fall) has nothing
    // of it to save.
    for (const auto& p : fsdp_->sharded_params())
      if (p.shard.numel() > 0) out.emplace_back(p.name, p.shard);
    return out;
  }
  std::vector<ShardPiece> LocalShards() const override {
    std::vector<ShardPiece> out;
    for (const auto& p : fsdp_->sharded_params()) {
      if (p.shard.numel() == 0) continue;
      // With tensor parallelism FSDP shards a tp rank's slice: placed in the whole parameter.
      const auto split = tp_params_.find(p.name);
      out.push_back(split == tp_params_.end()
                        ? ShardPiece{p.name, p.full_shape, p.shard_begin, p.shard}
                        : TensorParallelPiece(*split->second, mesh_->shape().tp, p.shard_begin, p.shard));
    }
    return out;
  }
  int64_t ParamBytes() const override { return fsdp_->ShardBytes(); }
  torch::Tensor EvalBatchLoss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    return parallel_->ForwardNoGrad(tokens, targets);
  }
  Result<double> AverageAcrossRanks(double local) override {
    MW_ASSIGN_OR_RETURN(const std::vector<double> mean,
                        dist::AllReduceValues(mesh_->group("world"), {local}, dist::ReduceOp::kAvg));
    return mean[0];
  }
  Result<std::map<std::string, torch::Tensor>> FullState() override {
    return parallel_->GatherFullState();
  }
  EngineStats TakeStats() override {
    EngineStats s;
    // Gloo: the time the host blocked in waits; NCCL: the time the compute stream stood waiting.
    const fsdp::FsdpStats fs = fsdp_->TakeStats();
    s.exposed_comm_seconds = fs.exposed_comm_seconds + parallel_->TakeTpBlockedSeconds();
    if (fs.gradient_copies > 0 && !warned_gradient_copies_) {
      warned_gradient_copies_ = true;
      log_ << "warning: fsdp: " << fs.gradient_copies
           << " parameter gradients were accumulated outside their flat group's buffer and copied in before the "
              "reduce-scatter (the accumulation hook did not run); results are right, the copies cost time\n";
    }
    AddGroupStats(mesh_->groups(), &s);
    return s;
  }

 private:
  static double NowSeconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }



  // Ends the trace of step kTracedStep: rank 0 collects every rank's events and writes one file
  // (each rank a process; times from each rank's own start of the step).
  Status WriteTrace() {
    fsdp_->TraceInto(nullptr);
    trace_->Span("step", "step " + std::to_string(kTracedStep) + " (" + NameOf(config::kFsdpModeNames, cfg_.mode) + "): forward, backward, reduction",
                 trace_origin_, NowSeconds());
    MW_ASSIGN_OR_RETURN(std::vector<std::string> ranks, dist::AllGatherText(mesh_->group("world"), trace_->EventsJson()));
    if (env_.rank != 0) return Status::Ok();
    const std::string doc = ChromeTrace::Document(ranks);
    MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(cfg_.trace_out));
    MW_RETURN_IF_ERROR(out.Write(doc.data(), doc.size()));
    MW_RETURN_IF_ERROR(out.Commit());
    log_ << "trace: step " << kTracedStep << " (" << NameOf(config::kFsdpModeNames, cfg_.mode) << ", " << ranks.size() << " ranks) written to "
         << cfg_.trace_out << "\n";
    return Status::Ok();
  }

  static constexpr int64_t kEagerStepsBeforePlan = 2;  // step 1 warms up, step 2 is traced to plan
  static constexpr int64_t kTracedStep = kEagerStepsBeforePlan + 1;  // compiled: the first planned step
  static constexpr int64_t kCompiledStepsBeforeReplan = 2;
  dist::DistEnv env_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::unique_ptr<parallel::ParallelLlama> parallel_;
  fsdp::FullyShardedLlama* fsdp_;  // parallel_'s
  std::map<std::string, const tp::LocalParam*> tp_params_;  // by name, with tensor parallelism
  config::FsdpConfig cfg_;
  bool cpu_;  // CPU ranks (Gloo): the cost model charges copies and core sharing
  int64_t device_memory_bytes_;  // what this rank's device holds for it (0: unknown)
  std::ostream& log_;
  int64_t steps_done_ = 0;
  std::optional<fsdp::Compilation> compilation_;  // compiled mode, once planned
  bool replanned_ = false;
  bool warned_gradient_copies_ = false;
  // The last micro-batch with gradient reduction, forward to the end of FinishBackward: what a
  // simulated step covers, measured (CompileFsdp fits the traced compute to it).
  double sync_started_ = 0;
  double last_sync_seconds_ = 0;
  double last_step_seconds_ = 0;           // the whole step (EndStep)
  // Means over the eager steps before the plan: the whole step, and its time outside its last
  // micro-batch's forward-to-reduction.
  std::vector<fsdp::EagerStepTimes> eager_steps_;
  std::unique_ptr<ChromeTrace> trace_;
  double trace_origin_ = 0;
};

// Tensor parallelism over the whole world (mesh tp = world size): every rank reads the same
// batch and holds a slice of every layer (trainer/tp/tensor_parallel.h).
class TensorParallelEngine : public Engine {
 public:
  TensorParallelEngine(dist::DistEnv env, std::unique_ptr<dist::DeviceMesh> mesh, std::unique_ptr<tp::TensorParallelLlama> tp,
                       int64_t checkpoint_every)
      : env_(std::move(env)), mesh_(std::move(mesh)), tp_(std::move(tp)), checkpoint_every_(checkpoint_every) {
    for (const tp::LocalParam& p : tp_->params()) (p.value.dim() >= 2 ? decay_ : no_decay_).push_back(p.value);
  }
  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  int dp_rank() const override { return 0; }  // one data parallel rank: the whole tp group
  int dp_size() const override { return 1; }
  dist::MeshShape mesh_shape() const override { return mesh_->shape(); }
  std::string Describe() const override {
    return std::to_string(env_.world_size) + " ranks, tensor parallel over mesh tp " + std::to_string(mesh_->shape().tp) +
           (tp_->sequence_parallel() ? " with sequence parallelism" : "") +
           (tp_->async_chunks() > 1 ? " overlapped in " + std::to_string(tp_->async_chunks()) + " chunks" : "") + " (" +
           mesh_->group("tp").backend() + ")";
  }
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets, bool) override {
    if (checkpoint_every_ <= 0) return tp_->Loss(tokens, targets);
    const int64_t every = checkpoint_every_;
    return tp_->Loss(tokens, targets,
                     [every](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
                       return i % every == 0 ? model::CheckpointedLayer(layer, h, rope) : layer.forward(h, rope);
                     });
  }
  Status AfterBackward(bool sync) override { return sync ? tp_->FinishBackward() : Status::Ok(); }
  bool AttachWeightCopies(const std::shared_ptr<model::WeightCopies>& copies) override {
    tp_->model()->set_weight_copies(copies);
    return true;
  }
  Result<torch::Tensor> GradNorm() override {
    MW_ASSIGN_OR_RETURN(torch::Tensor norm2, tp_->GradNormSquared());
    return norm2.sqrt();
  }
  void ZeroGrad() override {
    for (const tp::LocalParam& p : tp_->params()) p.value.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> DecayParams() const override { return decay_; }
  std::vector<torch::Tensor> NoDecayParams() const override { return no_decay_; }
  std::vector<std::pair<std::string, torch::Tensor>> LocalParams() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const tp::LocalParam& p : tp_->params()) out.emplace_back(p.name, p.value);
    return out;
  }
  std::vector<ShardPiece> LocalShards() const override {
    std::vector<ShardPiece> out;
    for (const tp::LocalParam& p : tp_->params()) out.push_back(TensorParallelPiece(p, mesh_->shape().tp, 0, p.value));
    return out;
  }
  int64_t ParamBytes() const override { return tp_->LocalBytes(); }
  torch::Tensor EvalBatchLoss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    torch::NoGradGuard no_grad;
    return tp_->Loss(tokens, targets);
  }
  Result<double> AverageAcrossRanks(double local) override {
    MW_ASSIGN_OR_RETURN(const std::vector<double> mean,
                        dist::AllReduceValues(mesh_->group("world"), {local}, dist::ReduceOp::kAvg));
    return mean[0];
  }
  Result<std::map<std::string, torch::Tensor>> FullState() override { return tp_->GatherFullState(); }
  EngineStats TakeStats() override {
    EngineStats s;
    s.exposed_comm_seconds = tp_->TakeBlockedSeconds();
    AddGroupStats(mesh_->groups(), &s);
    return s;
  }

 private:
  dist::DistEnv env_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::unique_ptr<tp::TensorParallelLlama> tp_;
  int64_t checkpoint_every_;  // layers 0, N, 2N, ... run checkpointed; 0: none
  std::vector<torch::Tensor> decay_, no_decay_;
};


bool IsLoopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

}  // namespace

std::unique_ptr<Engine> MakeLocalEngine(model::LlamaForCausalLM model, int64_t checkpoint_every) {
  return std::make_unique<LocalEngine>(std::move(model), checkpoint_every);
}

Result<std::unique_ptr<Engine>> MakeEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                           const torch::Device& device, std::ostream& log) {
  MW_ASSIGN_OR_RETURN(dist::DistEnv env, dist::ReadDistEnv());
  if (env.world_size == 1 && !cfg.fsdp.single_process) {
    if (!cfg.fsdp.trace_out.empty()) log << "trace: fsdp.trace_out ignored: one process runs no FSDP\n";
    if (cfg.mesh.tp > 1) {
      return InvalidConfig("key 'mesh.tp': " + std::to_string(cfg.mesh.tp) + " tensor parallel ranks, but the world is 1 process");
    }
    if (cfg.mesh.pp > 1) {
      return InvalidConfig("key 'mesh.pp': " + std::to_string(cfg.mesh.pp) + " pipeline ranks, but the world is 1 process");
    }
    return MakeLocalEngine(std::move(model), CheckpointEvery(cfg));
  }
  dist::MeshShape shape;
  if (cfg.dist.mesh == config::MeshPolicy::kExplicit && cfg.mesh.pp == 1) {
    MW_ASSIGN_OR_RETURN(shape, dist::ResolveMeshShape(env.world_size, static_cast<int>(cfg.mesh.dp_replicate),
                                                      static_cast<int>(cfg.mesh.dp_shard), static_cast<int>(cfg.mesh.tp)));
  }
  const std::chrono::milliseconds timeout(cfg.dist.timeout_seconds * 1000);
  MW_ASSIGN_OR_RETURN(auto store, dist::Rendezvous(env, timeout));
  if (cfg.dist.mesh == config::MeshPolicy::kAuto) {
    MW_ASSIGN_OR_RETURN(shape, AgreeOnAutoMesh(*store, env, cfg, device.is_cuda(), log));
  }

  dist::CommunicatorOptions options;
  options.timeout = timeout;
  dist::CommunicatorFactory factory;
  if (device.is_cuda()) {
#ifdef MESHWORK_HAVE_NCCL
    const int cuda_device = device.index();
    factory = [cuda_device](c10::intrusive_ptr<c10d::Store> s, int r, int n, const dist::CommunicatorOptions& o) {
      return dist::MakeNcclCommunicator(s, r, n, cuda_device, o);
    };
#else
    return Unavailable("distributed training on CUDA needs the NCCL backend, "
                                            "which this build does not have (CUDA/NCCL not found at configure time)");
#endif
  } else {
    // Gloo binds to the address peers reach this rank at: loopback for a local launch, the
    // host's own name (a pod's IP on Kubernetes) otherwise, unless dist.gloo_hostname says.
    const std::string host = !cfg.dist.gloo_hostname.empty() ? cfg.dist.gloo_hostname
                             : IsLoopback(env.master_addr)   ? "127.0.0.1"
                                                             : "";
    factory = [host](c10::intrusive_ptr<c10d::Store> s, int r, int n, const dist::CommunicatorOptions& o) {
      return dist::MakeGlooCommunicator(s, r, n, o, host);
    };
  }
  auto log_start = [&] {
    if (env.rank == 0) {
      log << "distributed: rank " << env.rank << " of " << env.world_size << ", master " << env.master_addr << ":"
          << env.master_port << ", restart generation " << env.restart_generation << "\n";
    }
  };
  if (cfg.mesh.pp > 1) {
    // pp outermost (PipelineGroups): a stage's data parallel ranks are consecutive (one node's)
    // and the pipeline crosses nodes.
    const int pp = static_cast<int>(cfg.mesh.pp);
    const int replicas = static_cast<int>(cfg.mesh.dp_replicate);
    const int tp = static_cast<int>(cfg.mesh.tp);
    const int shards = cfg.mesh.dp_shard > 0 ? static_cast<int>(cfg.mesh.dp_shard)
                                             : std::max(1, env.world_size / std::max(1, pp * replicas * tp));
    if (env.world_size != pp * replicas * shards * tp) {
      return InvalidConfig("key 'mesh.pp': " + std::to_string(pp) + " pipeline ranks x mesh.dp_replicate=" +
                           std::to_string(replicas) + " x mesh.dp_shard=" + std::to_string(shards) +
                           " x mesh.tp=" + std::to_string(tp) + " = " + std::to_string(pp * replicas * shards * tp) +
                           " ranks, but the world is " + std::to_string(env.world_size) + " processes");
    }
    PipelineGroups groups;
    auto group = [&](const std::string& name, const std::string& prefix, int rank, int size)
        -> Result<std::unique_ptr<dist::Communicator>> {
      dist::CommunicatorOptions o = options;
      o.group_name = name;
      return factory(c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, size, o);
    };
    // rank = stage rank x (pipelines x tp) + (replica x dp_shard + shard) x tp + tp rank.
    const int per_stage = replicas * shards * tp;
    const int stage_rank = env.rank / per_stage, within = env.rank % per_stage;
    const int data = within / tp, tp_rank = within % tp;
    const int replica = data / shards, shard = data % shards;
    const std::string at = std::to_string(stage_rank) + "/";
    MW_ASSIGN_OR_RETURN(groups.world, group("world", "mesh/world", env.rank, env.world_size));
    MW_ASSIGN_OR_RETURN(groups.pipeline, group("pp", "mesh/pp/" + std::to_string(within), stage_rank, pp));
    if (shards > 1) {
      MW_ASSIGN_OR_RETURN(groups.shard, group("dp_shard", "mesh/dp_shard/" + at + std::to_string(replica) + "/" +
                                                               std::to_string(tp_rank),
                                              shard, shards));
    }
    if (replicas > 1) {
      MW_ASSIGN_OR_RETURN(groups.replicate, group("dp_replicate", "mesh/dp_replicate/" + at + std::to_string(shard) +
                                                                       "/" + std::to_string(tp_rank),
                                                  replica, replicas));
    }
    if (tp > 1) {
      MW_ASSIGN_OR_RETURN(groups.tp, group("tp", "mesh/tp/" + at + std::to_string(data), tp_rank, tp));
    }
    log_start();
    return MakePipelineEngine(cfg, std::move(model), env, std::move(groups), device, log);
  }
  MW_ASSIGN_OR_RETURN(auto mesh, dist::DeviceMesh::Create(store, env.rank, shape, factory, options));
  log_start();
  tp::TensorParallelOptions to;
  to.sequence_parallel = cfg.mesh.sequence_parallel;
  to.async_chunks = static_cast<int>(cfg.mesh.async_tp_chunks);
  if (shape.tp > 1 && shape.tp == env.world_size) {
    // Tensor parallelism alone: no data parallel dim, nothing to shard, and no FSDP copies around
    // every layer.
    if (cfg.fsdp.mode == config::FsdpMode::kCompiled) {
        return InvalidConfig("key 'fsdp.mode': compiled plans FSDP's schedule, and mesh.tp=" + std::to_string(shape.tp) +
                             " spans the whole world of " + std::to_string(env.world_size) +
                             " ranks: there is no FSDP to plan; use fsdp.mode: eager, or a mesh with dp_shard > 1");
      }
    MW_ASSIGN_OR_RETURN(auto split, tp::TensorParallelLlama::Create(std::move(model), mesh->group("tp"), to));
    return std::unique_ptr<Engine>(new TensorParallelEngine(env, std::move(mesh), std::move(split), CheckpointEvery(cfg)));
  }

  fsdp::FsdpOptions fo;
  fo.reshard_after_forward = cfg.fsdp.reshard_after_forward;
  fo.prefetch = cfg.fsdp.prefetch;
  switch (cfg.training.activation_checkpointing) {
    case config::ActivationCheckpointing::kAuto:
      // Under a memory limit the eager steps before the plan checkpoint every layer, so that
      // they fit where the plan will.
      fo.checkpointing = cfg.fsdp.mode == config::FsdpMode::kCompiled && TensorMemoryLimit() > 0
                             ? fsdp::LayerCheckpointing::kAllUntilPlanned
                             : fsdp::LayerCheckpointing::kPlanned;
      break;
    case config::ActivationCheckpointing::kNone: fo.checkpointing = fsdp::LayerCheckpointing::kNone; break;
    case config::ActivationCheckpointing::kAll: fo.checkpointing = fsdp::LayerCheckpointing::kAll; break;
    case config::ActivationCheckpointing::kSelective:
      // The same layers in eager steps and in a compiled plan, which checkpoints no other.
      fo.checkpointing = fsdp::LayerCheckpointing::kSelective;
      fo.checkpoint_every = cfg.training.checkpoint_every;
      break;
  }
  if (device.is_cuda() && cfg.training.dtype != config::Dtype::kFp32) fo.param_dtype = torch::kBFloat16;
  // The parallel plans in their order (parallel/parallelize.h): tensor parallelism splits the
  // weights, activation checkpointing wraps the layers (FSDP's layer runner, `fo`), FSDP shards
  // what each rank holds.
  parallel::ParallelGroups groups;
  groups.tp = shape.tp > 1 ? &mesh->group("tp") : nullptr;
  groups.fsdp.shard = &mesh->group("dp_shard");
  groups.fsdp.reduce_scatter = &mesh->group("dp_shard_reduce");
  groups.fsdp.replicate = shape.dp_replicate > 1 ? &mesh->group("dp_replicate") : nullptr;
  MW_ASSIGN_OR_RETURN(auto sharded, parallel::ParallelLlama::Create(std::move(model), groups, {to, fo}));
  // The compiled plan's default budget: training.memory_limit_mib, else the device's memory, or
  // on the CPU the machine's (or the container's) shared by this machine's ranks.
  const int64_t limit = SampleMemory(device).limit_bytes;
  const int64_t device_memory = TensorMemoryLimit() > 0 ? TensorMemoryLimit()
                                : device.is_cuda()      ? limit
                                                        : limit / std::max(1, env.local_world_size);
  return std::unique_ptr<Engine>(new FsdpEngine(env, std::move(mesh), std::move(sharded), cfg.fsdp,
                                                !device.is_cuda(), device_memory, log));
}

Status AgreeAcrossRanks(Engine& engine, const Status& local, StatusCode code, const std::string& what) {
  MW_ASSIGN_OR_RETURN(const double failed, engine.AverageAcrossRanks(local.ok() ? 0.0 : 1.0));
  if (!local.ok()) return local;
  if (failed > 0) return Status(code, what + " failed on another rank (see that rank's error)");
  return Status::Ok();
}

}  // namespace meshwork::train
