// FSDP for the Llama model, eager schedule (FSDP2-like): every parameter is sharded on dim 0
// over the dp_shard group (padded to a multiple of the group size) and kept as an fp32 master
// shard; a unit (one decoder layer, or the root: embeddings, final norm, output head) is
// all-gathered before use and freed after; gradients are reduce-scattered per unit and
// all-reduced over dp_replicate (HSDP). The optimizer only ever sees the shards.
//
// The model runs with ordinary autograd, as in FSDP2: a layer's gathered weights live in one
// storage per parameter that is freed after the layer's forward (reshard_after_forward) and
// refilled before its backward, so autograd's saved tensors stay valid and nothing is
// recomputed. Hooks on each layer's input and output tensors drive backward: the pre-backward
// waits for the layer's all-gather and prefetches the previous layer's; the post-backward
// reduce-scatters the layer's gradients (async) and frees it. The root unit stays gathered for
// the whole step (its weights are used at both ends of the model, as FSDP2 keeps the root).
#pragma once

#include <torch/types.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/chrome_trace.h"
#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/dist/communicator.h"
#include "trainer/fsdp/compute_clock.h"
#include "trainer/model/llama.h"

namespace meshwork::fsdp {

struct FsdpOptions {
  bool reshard_after_forward = true;       // free each layer's gathered weights after forward
  torch::ScalarType param_dtype = torch::kFloat32;   // gathered weights (bf16 on GPU)
  torch::ScalarType reduce_dtype = torch::kFloat32;  // gradient reduction
  bool prefetch = true;  // issue the next unit's all-gather before computing the current one
};

// One sharded parameter: the master shard the optimizer updates and the module parameter whose
// storage holds the gathered value.
struct ShardedParam {
  std::string name;          // HF name, e.g. "model.layers.0.mlp.up_proj.weight"
  torch::Tensor full;        // the module's parameter; data swapped in when gathered
  torch::Tensor shard;       // [rows_per_rank, ...] fp32 master, requires grad, zero padding rows
  std::vector<int64_t> full_shape;
  int64_t rows_per_rank = 0;
  int64_t row_numel = 0;
  int64_t shard_numel() const { return rows_per_rank * row_numel; }
};

struct FsdpStats {
  double exposed_comm_seconds = 0;  // time blocked in Wait(), summed since the last reset
};

class FullyShardedLlama {
 public:
  // Shards `model` (whose parameters hold the full, identical-on-every-rank initial values) over
  // `shard_group`; `replicate_group` may be null (no HSDP).
  static Result<std::unique_ptr<FullyShardedLlama>> Create(model::LlamaForCausalLM model,
                                                           dist::Communicator* shard_group,
                                                           dist::Communicator* replicate_group,
                                                           const FsdpOptions& options);
  ~FullyShardedLlama();

  // Forward of the whole model; keep the root unit gathered until FinishBackward().
  torch::Tensor Forward(const torch::Tensor& tokens);
  // Whether this micro-batch's backward reduces gradients (false until the last micro-batch of
  // gradient accumulation: full gradients accumulate locally instead).
  void SetGradientSync(bool sync) { sync_ = sync; }
  // After loss.backward(): reduce the root's gradients, wait for every reduction, write the
  // shard gradients (HSDP: averaged over replicas) and free the root.
  Status FinishBackward();
  // Forward without gradients (evaluation); frees everything after.
  torch::Tensor ForwardNoGrad(const torch::Tensor& tokens);

  // The master shards (optimizer parameters), split by whether weight decay applies.
  std::vector<torch::Tensor> DecayShards() const;
  std::vector<torch::Tensor> NoDecayShards() const;
  // Squared global gradient norm over the whole model (reduced across dp_shard), for exact
  // clipping; then ScaleGrads(clip factor).
  Result<double> GradNormSquared();
  void ScaleGrads(double factor);
  void ZeroGrad();

  // Full parameters by HF name, on every rank (collective: all ranks must call).
  Result<std::map<std::string, torch::Tensor>> GatherFullState();

  // Every parameter with its master shard, in the module's order (checkpoints read and write
  // the shards in place, so the optimizer keeps holding the same tensors).
  const std::deque<ShardedParam>& sharded_params() const { return params_; }
  const model::LlamaConfig& config() const { return model_->config(); }
  model::LlamaForCausalLM& module() { return model_; }
  FsdpStats TakeStats();
  // Records into `trace` (null: stops) until told otherwise: compute per module, each collective
  // from issue to completion, the time blocked waiting for one, and the gathered bytes.
  void TraceInto(ChromeTrace* trace) { tracer_ = trace; }
  // Per-rank bytes of parameter shards, gradient shards (same) — optimizer state is 2x.
  int64_t ShardBytes() const;

  // --- Compiled mode (fsdp.mode: compiled) ---
  // The compiler's view of this model: parameters (HF order, bytes in param/reduce dtype, the
  // padded fp32 shard) and modules "embed", "layers.<i>", "head", with the compute seconds
  // traced in the last eager step (zero before one ran) and estimated activation bytes.
  compiler::Graph Skeleton() const;
  // From the next Forward on, every collective, wait and free follows `plan` (validated here
  // against this model); the eager hooks no longer schedule anything.
  Status UsePlan(const compiler::Graph& plan);
  bool compiled() const { return plan_ != nullptr; }

  struct Unit;  // defined in the .cpp
  struct Plan;

 private:
  FullyShardedLlama(model::LlamaForCausalLM model, dist::Communicator* shard_group,
                    dist::Communicator* replicate_group, const FsdpOptions& options);

  model::LlamaForCausalLM model_;
  dist::Communicator* shard_group_;
  dist::Communicator* replicate_group_;
  FsdpOptions options_;
  bool sync_ = true;
  std::deque<ShardedParam> params_;            // every parameter, in the module's order
  std::vector<std::unique_ptr<Unit>> units_;  // [0] = root, then layer i at [i + 1]
  FsdpStats stats_;
  ChromeTrace* tracer_ = nullptr;
  int64_t gathered_bytes_ = 0;  // parameter storage allocated now, over every unit
  // The compute the plan last let run (for the trace): its label and start time.
  std::string open_compute_;
  double open_compute_start_ = 0;
  void TraceCompute(const std::string& label, double start, double end);

  // Runs the plan's ops up to the compute of `module` in `phase` (an empty module: to the end)
  // and checks that compute's parameters are gathered. Throws StatusError on a mismatch.
  void RunPlanUntil(compiler::Phase phase, const std::string& module);
  torch::Tensor CompiledForward(const torch::Tensor& tokens);
  std::unique_ptr<Plan> plan_;

  // Trace of the last eager step: per-module compute, by module (embed, layers, head), as spans
  // of the compute clock (CUDA events on a GPU), read into seconds by Skeleton().
  struct Span {
    ComputeClock::Mark from, to;
    double share = 1;  // of the span this module gets (the head's forward and backward share one)
  };
  struct Trace {
    std::vector<Span> fwd, bwd;
    ComputeClock clock;
    ComputeClock::Mark mark;  // at the last hook
    int64_t batch = 0, seq = 0;
  };
  Trace trace_;
};

// Every rank must run the same plan: rank 0 of `group` sends its plan's text, the others parse
// it (their own timings, and so their own plans, may differ). `plan` is read on rank 0 only.
Result<compiler::Graph> AgreeOnPlan(dist::Communicator& group, const compiler::Graph& plan);

}  // namespace meshwork::fsdp
