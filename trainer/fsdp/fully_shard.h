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
//
// That schedule is EagerSchedule (eager_schedule.h); compiled mode swaps in PlanExecutor
// (plan_executor.h). Both drive the same units (unit.h) over the state in step_schedule.h.
#pragma once

#include <torch/types.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/chrome_trace.h"
#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/dist/communicator.h"
#include "trainer/model/llama.h"

namespace meshwork::fsdp {

// Which decoder layers run checkpointed (model/recompute.h): their backward recomputes the forward.
enum class LayerCheckpointing {
  kNone,
  kAll,      // every layer, in both schedules
  kPlanned,  // the layers the compiled plan checkpoints (ws= in its IR); none in eager steps
};

struct FsdpOptions {
  bool reshard_after_forward = true;       // free each layer's gathered weights after forward
  torch::ScalarType param_dtype = torch::kFloat32;   // gathered weights (bf16 on GPU)
  torch::ScalarType reduce_dtype = torch::kFloat32;  // gradient reduction
  bool prefetch = true;  // issue the next unit's all-gather before computing the current one
  LayerCheckpointing checkpointing = LayerCheckpointing::kPlanned;
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

// The communicators FSDP runs on. All-gathers and reduce-scatters are separate lanes (each its
// own communicator over the same ranks), so a reduce-scatter in flight never holds back the
// next layer's all-gather, as the compiler's simulator assumes (cost_model.h's Lane).
struct FsdpGroups {
  dist::Communicator* shard = nullptr;           // dp_shard: all-gathers
  dist::Communicator* reduce_scatter = nullptr;  // dp_shard's ranks: reduce-scatters (null: `shard`)
  dist::Communicator* replicate = nullptr;       // dp_replicate: HSDP all-reduces (null: no HSDP)
};

struct ShardedState;  // step_schedule.h
class StepSchedule;

class FullyShardedLlama {
 public:
  // Shards `model` (whose parameters hold the full, identical-on-every-rank initial values) over
  // `groups.shard`.
  static Result<std::unique_ptr<FullyShardedLlama>> Create(model::LlamaForCausalLM model, const FsdpGroups& groups,
                                                           const FsdpOptions& options);
  ~FullyShardedLlama();

  // Forward of the whole model; keep the root unit gathered until FinishBackward(). Returns the
  // logits, or with `targets` the mean loss (the logits never whole: linear_cross_entropy.h).
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& targets = {});
  // Whether this micro-batch's backward reduces gradients (false until the last micro-batch of
  // gradient accumulation: full gradients accumulate locally instead).
  void SetGradientSync(bool sync);
  // After loss.backward(): reduce the root's gradients, wait for every reduction, write the
  // shard gradients (HSDP: averaged over replicas) and free the root.
  Status FinishBackward();
  // Forward without gradients (evaluation); frees everything after.
  torch::Tensor ForwardNoGrad(const torch::Tensor& tokens, const torch::Tensor& targets = {});

  // The master shards (optimizer parameters), split by whether weight decay applies.
  std::vector<torch::Tensor> DecayShards() const;
  std::vector<torch::Tensor> NoDecayShards() const;
  // Squared global gradient norm over the whole model (reduced across dp_shard), for exact
  // clipping: a one-element fp64 tensor on the device, not read on the host here (the optimizer
  // takes the clip factor as a tensor). ScaleGrads(clip factor) clips without the optimizer.
  Result<torch::Tensor> GradNormSquared();
  void ScaleGrads(double factor);
  void ZeroGrad();

  // Full parameters by HF name, on every rank (collective: all ranks must call).
  Result<std::map<std::string, torch::Tensor>> GatherFullState();

  // Every parameter with its master shard, in the module's order (checkpoints read and write
  // the shards in place, so the optimizer keeps holding the same tensors).
  const std::deque<ShardedParam>& sharded_params() const;
  const model::LlamaConfig& config() const;
  model::LlamaForCausalLM& module();
  FsdpStats TakeStats();
  // Records into `trace` (null: stops) until told otherwise: compute per module, each collective
  // from issue to completion, the time blocked waiting for one, and the gathered bytes.
  void TraceInto(ChromeTrace* trace);
  // Per-rank bytes of parameter shards, gradient shards (same) — optimizer state is 2x.
  int64_t ShardBytes() const;

  // --- Compiled mode (fsdp.mode: compiled) ---
  // The compiler's view of this model: parameters (HF order, bytes in param/reduce dtype, the
  // padded fp32 shard) and modules "embed", "layers.<i>", "head", with the compute seconds
  // traced in the last eager step (zero before one ran) and estimated activation bytes. Decoder
  // layers are checkpointing candidates (ckpt=) under LayerCheckpointing::kPlanned, and already
  // checkpointed under kAll (their traced backward includes the recompute).
  compiler::Graph Skeleton() const;
  // From the next Forward on, every collective, wait and free follows `plan` (validated here
  // against this model); the eager hooks no longer schedule anything.
  Status UsePlan(const compiler::Graph& plan);
  bool compiled() const { return compiled_; }

 private:
  explicit FullyShardedLlama(std::unique_ptr<ShardedState> state);

  std::unique_ptr<ShardedState> state_;
  std::unique_ptr<StepSchedule> schedule_;  // EagerSchedule until UsePlan swaps in a PlanExecutor
  bool compiled_ = false;
};

// Every rank must run the same plan: rank 0 of `group` sends its plan's text, the others parse
// it (their own timings, and so their own plans, may differ). `plan` is read on rank 0 only.
Result<compiler::Graph> AgreeOnPlan(dist::Communicator& group, const compiler::Graph& plan);

}  // namespace meshwork::fsdp
