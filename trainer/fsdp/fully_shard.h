// FSDP for the Llama model, eager schedule (FSDP2's defaults): the parameters of each module (a
// decoder layer, the embedding, the final norm with an untied head) form a flat group, laid out
// back to back and sharded as one flat vector over the dp_shard group (padded to a multiple of
// its size), kept as an fp32 master shard (unit.h); a unit (one decoder layer, or the root:
// embeddings, final norm, output head) is all-gathered before use and freed after; gradients are
// reduce-scattered per unit and all-reduced over dp_replicate (HSDP). The optimizer only ever
// sees the shards. No copies around collectives: the all-gather writes the parameters' storage
// and the reduce-scatter reads the buffer autograd accumulated the gradients in.
//
// The model runs with ordinary autograd, as in FSDP2: a layer's gathered weights live in one
// storage per group that is freed after the layer's forward (reshard_after_forward) and
// refilled before its backward, so autograd's saved tensors stay valid and nothing is
// recomputed. Hooks on each layer's input and output tensors drive backward: the pre-backward
// waits for the layer's all-gather and prefetches the previous layer's; the post-backward
// reduce-scatters the layer's gradients (async), waits for the previous layer's reduce-scatter
// (one in flight) and frees it. The root unit stays gathered for the whole step (its weights are
// used at both ends of the model), and so does the last decoder layer from its forward to its
// backward, as FSDP2's defaults keep them (docs/distributed.md maps each option to FSDP2's).
//
// That schedule is EagerSchedule (eager_schedule.h); compiled mode swaps in PlanExecutor
// (plan_executor.h). Both drive the same units (unit.h) over the state in step_schedule.h.
#pragma once

#include <torch/types.h>

#include <deque>
#include <functional>
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
  kAll,        // every layer, in both schedules
  kSelective,  // layers 0, N, 2N, ... (FsdpOptions::checkpoint_every), in both schedules
  kPlanned,  // the layers the compiled plan checkpoints (ws= in its IR); none in eager steps
  // Every layer in eager steps (the warm-up and the traced step), then the layers the compiled
  // plan checkpoints: for compiled FSDP under a memory limit that the eager steps, holding every
  // layer's activations, would overrun. The traced backward then includes a recompute, which
  // Skeleton() takes out (one forward per layer).
  kAllUntilPlanned,
};

struct FsdpOptions {
  // Free each decoder layer's gathered weights after its forward (FSDP2's reshard_after_forward;
  // the last layer, which backward needs first, is kept, as torchtitan sets it).
  bool reshard_after_forward = true;
  torch::ScalarType param_dtype = torch::kFloat32;   // gathered weights (bf16 on GPU)
  torch::ScalarType reduce_dtype = torch::kFloat32;  // gradient reduction
  bool prefetch = true;  // issue the next unit's all-gather before computing the current one
  LayerCheckpointing checkpointing = LayerCheckpointing::kPlanned;
  int64_t checkpoint_every = 2;  // kSelective's N
};

// Whether decoder layer `layer` runs checkpointed whatever the schedule (kAll, kSelective's
// layers), and whether it does in the eager steps (those, and every layer under kAllUntilPlanned).
inline bool AlwaysCheckpointed(const FsdpOptions& o, int64_t layer) {
  return o.checkpointing == LayerCheckpointing::kAll ||
         (o.checkpointing == LayerCheckpointing::kSelective && layer % o.checkpoint_every == 0);
}
inline bool CheckpointedInEager(const FsdpOptions& o, int64_t layer) {
  return AlwaysCheckpointed(o, layer) || o.checkpointing == LayerCheckpointing::kAllUntilPlanned;
}

// One sharded parameter: its slice of its flat group's master shard, which the optimizer
// updates, and the module parameter, a view of the group's gathered storage.
struct ShardedParam {
  std::string name;          // HF name, e.g. "model.layers.0.mlp.up_proj.weight"
  torch::Tensor full;        // the module's parameter; its group's storage holds data when gathered
  // This rank's elements of the parameter (fp32 master, requires grad), a view of its group's
  // master shard: the parameter's shape when the rank holds all of it, else 1-D (maybe empty).
  torch::Tensor shard;
  std::vector<int64_t> full_shape;
  int64_t numel = 0;
  int group = 0;             // index of its flat group (FullyShardedLlama's order)
  int64_t flat_offset = 0;   // where it starts in its group's flat layout
  int64_t shard_begin = 0;   // the first of its (flattened) elements this rank holds
  int64_t shard_offset = 0;  // where those start in the group's master shard
};

struct FsdpStats {
  double exposed_comm_seconds = 0;  // time blocked in Wait(), summed since the last reset
  // Parameter gradients autograd left outside their group's flat buffer, copied in before the
  // reduce-scatter (0 when the accumulation hooks work, as they should).
  int64_t gradient_copies = 0;
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
  // Tensor parallelism applied to the model before FSDP (parallel/parallelize.h): its embedding
  // and loss (the vocabulary split over the tp ranks) replace the model's own in every forward
  // from here on, and the compiler's view (Skeleton) estimates a tp rank's activations. A
  // compiled plan's by-rows embedding and vocabulary-split head would bypass them, so a plan for
  // such a model is made without those (fsdp/compile.cpp) and UsePlan refuses one with them.
  struct TensorParallel {
    model::EmbedRunner embed;
    model::LossRunner loss;
    int tp = 1;
    bool sequence_parallel = false;
    // Seconds this rank has blocked in tensor parallelism's collectives so far: on the host clock
    // the trace takes them out of each module's compute, and the compiled plan carries the
    // exchanges instead (Skeleton), priced on the tp link.
    std::function<double()> blocked_seconds;
    // Each decoder layer's overlapped-TP chunks as they run now, and how a plan's atp= sets them;
    // empty `set_layer_chunks`: the chunks are fixed (mesh.async_tp_chunks), no plan changes them.
    std::function<std::vector<int>()> layer_chunks;
    std::function<Status(const std::vector<int>&)> set_layer_chunks;
    // The tokens each tp rank held in the last forward (sequence parallelism), which a layer's
    // chunks must divide for it to overlap; empty or 0: unknown.
    std::function<int64_t()> tokens_per_rank;
  };
  void SetTensorParallel(TensorParallel tp);
  bool tensor_parallel() const;
  // After loss.backward(): reduce the root's gradients, wait for every reduction, write the
  // shard gradients (HSDP: averaged over replicas) and free the root.
  Status FinishBackward();
  // Forward without gradients (evaluation); frees everything after.
  torch::Tensor ForwardNoGrad(const torch::Tensor& tokens, const torch::Tensor& targets = {});

  // The master shards (optimizer parameters, the empty ones left out), split by whether weight
  // decay applies.
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
  // the shards in place, so the optimizer keeps holding the same tensors). A shard may be empty
  // (the rank holds none of that parameter).
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
  // The compiler's view of this model: parameters (HF order, bytes in param/reduce dtype, this
  // rank's fp32 shard, the flat group) and modules "embed", "layers.<i>", "head", with the compute seconds
  // traced in the last eager step (zero before one ran) and estimated activation bytes. Decoder
  // layers are checkpointing candidates (ckpt=) under LayerCheckpointing::kPlanned, and already
  // checkpointed under kAll (their traced backward includes the recompute).
  compiler::Graph Skeleton() const;
  // From the next Forward on, every collective, wait and free follows `plan` (validated here
  // against this model); the eager hooks no longer schedule anything.
  Status UsePlan(const compiler::Graph& plan);
  // With tensor parallelism on the host clock (CPU ranks), Skeleton() gives each module's TP
  // exchanges (the compiler's Llama estimate of them) and its compute without the time blocked in
  // them, and UsePlan runs the plan's atp= chunks layer by layer where the chunks are the plan's
  // to choose. On a GPU the exchanges stay inside the traced compute (the stream's time): no tp=
  // exchanges in the plan, and the chunks stay mesh.async_tp_chunks.
  bool compiled() const { return compiled_; }
  // Whether Skeleton() carries TP's exchanges (tensor parallelism timed on the host clock).
  bool PlansTensorParallelExchanges() const;
  // Whether a plan may choose the overlapped-TP chunks (PlansTensorParallelExchanges, and chunks
  // not fixed by mesh.async_tp_chunks): the async_tp pass runs for it.
  bool PlansTensorParallelChunks() const;
  // The tokens each tp rank held in the last forward, which the plan's chunks must divide (0:
  // unknown, or no tensor parallelism).
  int64_t TensorParallelTokensPerRank() const;
  LayerCheckpointing checkpointing() const;

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
