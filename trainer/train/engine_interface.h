// The engine interface every parallelism implements (one process, FSDP, tensor parallelism,
// pipeline stages), and the small pieces they share: where a rank's elements sit in a whole
// parameter (ShardPiece), the communication counters (EngineStats) and which layers recompute.
// engine.h makes the engines; the engines themselves include only this.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/dist/communicator.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/model/llama.h"

namespace meshwork::tp {
struct LocalParam;
}  // namespace meshwork::tp

namespace meshwork::train {

class AdamW;

// Elements [begin, begin + value.numel()) of parameter `name` flattened (its whole shape
// `shape`): what one rank holds of it, `value` the very tensor the optimizer updates (FSDP: a
// view of a flat group's master shard; one process: the parameter itself). A resharding
// checkpoint stores pieces with these offsets, so any mesh can find the elements it needs.
// With `cols` > 0 the piece is of a column block instead: columns [col_begin, col_begin + cols)
// of every row of the 2-D parameter, flattened row-major, and `begin` counts within that block
// (a tensor parallel rank's slice of a column-split parameter, o_proj or down_proj, is such a
// block; FSDP shards it as a flat run of the block).
struct ShardPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  torch::Tensor value;
  int64_t col_begin = 0;
  int64_t cols = 0;
};

// Where a tensor parallel rank's elements of `p` lie in the whole parameter, as a checkpoint
// addresses them: `local_begin` the first element held of the rank's slice (flattened), `value`
// them. A slice by rows is a run of the whole parameter; a slice by columns is a column block
// (ShardPiece::cols); a replicated parameter is whole on every rank.
ShardPiece TensorParallelPiece(const tp::LocalParam& p, int tp, int64_t local_begin, const torch::Tensor& value);

struct EngineStats {
  double exposed_comm_seconds = 0;  // blocked waiting on collectives since the last call
  dist::CommStats comm;             // cumulative, all of this rank's groups
  // Pipelines, the last step: per pipeline rank, the seconds its forwards and backwards ran and
  // the seconds its program took (first action to last, its sends done); 1 - busy / seconds is
  // that rank's bubble. Empty without a pipeline.
  std::vector<double> pipeline_busy_seconds;
  std::vector<double> pipeline_seconds;
  // FSDP inside pipeline stages, the last step: how many of this rank's gradient groups started
  // their reduce-scatter inside the program, overlapping its remaining compute (the others after
  // it); -1 without FSDP inside stages.
  int pipeline_overlapped_reduce_scatters = -1;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual int rank() const = 0;           // global rank (0 logs, evaluates output and exports)
  virtual int world_size() const = 0;
  virtual int dp_rank() const = 0;        // which slice of the global batch this rank reads
  virtual int dp_size() const = 0;
  virtual std::string Describe() const = 0;
  virtual dist::MeshShape mesh_shape() const = 0;  // one process: 1 x 1

  // Once before each step's first micro-batch: compiled FSDP makes its plan here (from the
  // traced second step) and a step trace starts; errors are values, not exceptions from Forward.
  virtual Status BeginStep() { return Status::Ok(); }
  // Once after each step, with its wall time (BeginStep to the optimizer's update and the
  // loss's average): compiled FSDP fits its cost model to whole steps.
  virtual void EndStep(double /*step_seconds*/) {}
  // The first step (0-based) from which every step runs the same schedule: after warm-up, and
  // in compiled FSDP after the plan (and the re-plan) took over. Steady-state figures start here.
  virtual int64_t SteadyFromStep() const { return 1; }
  // Training forward of one micro-batch to its mean loss (the output head and the loss fused:
  // the logits never exist whole); `sync` = last micro-batch (gradients are reduced).
  virtual torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets, bool sync) = 0;
  virtual Status AfterBackward(bool sync) = 0;
  // Pipeline parallelism runs a step's micro-batches as one program (their forwards and backwards
  // interleaved across stages), not one micro-batch at a time: where this is true the loop calls
  // StepLoss with every micro-batch instead of Loss, backward and AfterBackward for each.
  virtual bool RunsWholeSteps() const { return false; }
  // Step `step`'s (0-based) forwards and backwards over `microbatches` ((tokens, targets) each, on
  // the device): the mean loss over them (one element), the gradients accumulated and reduced.
  virtual Result<torch::Tensor> StepLoss(int64_t step,
                                         const std::vector<std::pair<torch::Tensor, torch::Tensor>>& microbatches) {
    (void)step, (void)microbatches;
    return Internal("this engine runs micro-batches one at a time (Loss), not whole steps");
  }
  // Asynchronous pipelines (PipeMare) update each stage's parameters inside StepLoss, each at its
  // own time, with `optimizer` (AttachOptimizer, once it exists): where this is true the loop
  // neither zeroes the gradients nor steps the optimizer, and GradNorm reports the updates'.
  virtual bool UpdatesInsideStep() const { return false; }
  virtual void AttachOptimizer(AdamW* optimizer) { (void)optimizer; }
  // Finishes what a step left in flight (an asynchronous pipeline's micro-batches: their
  // backwards and updates), so that the parameters and the optimizer's state are the step's whole:
  // before a checkpoint and at the end of training. Collective; nothing to do for the others.
  virtual Status Drain() { return Status::Ok(); }
  // The global gradient norm (across shards): a one-element tensor on the device, read on the
  // host only once the optimizer has stepped (its clip factor goes to the optimizer as a tensor).
  virtual Result<torch::Tensor> GradNorm() = 0;
  virtual void ZeroGrad() = 0;
  virtual std::vector<torch::Tensor> DecayParams() const = 0;
  virtual std::vector<torch::Tensor> NoDecayParams() const = 0;
  // This rank's parameters by HF name, the very tensors the optimizer updates (FSDP: the
  // non-empty fp32 master shards, slices of the flat groups' shards). A training checkpoint saves
  // and restores these.
  virtual std::vector<std::pair<std::string, torch::Tensor>> LocalParams() const = 0;
  // The same tensors with where they sit in each whole parameter (ShardPiece); what a
  // checkpoint saves, and fills again at any mesh.
  virtual std::vector<ShardPiece> LocalShards() const = 0;
  // Bytes of this rank's parameters (gradients are the same, AdamW state twice that).
  virtual int64_t ParamBytes() const = 0;

  // Hands the model persistent weight copies (model/weight_copies.h) for its matmuls to read;
  // false where this engine's weights cannot have them (FSDP: each layer's weights are gathered
  // and freed, and a copy of them would undo resharding), and then nothing holds them.
  virtual bool AttachWeightCopies(const std::shared_ptr<model::WeightCopies>& /*copies*/) { return false; }

  // Mean loss of one evaluation batch, without gradients.
  virtual torch::Tensor EvalBatchLoss(const torch::Tensor& tokens, const torch::Tensor& targets) = 0;
  // Mean of a per-rank value over the data-parallel ranks.
  virtual Result<double> AverageAcrossRanks(double local) = 0;
  // Full parameters by HF name (collective: every rank calls; only rank 0's result is used).
  virtual Result<std::map<std::string, torch::Tensor>> FullState() = 0;
  virtual EngineStats TakeStats() = 0;
};

// Adds every group's counters (null groups skipped) and, where a device backend measures them, its
// stream's stalls (NCCL: the time the compute stream stood waiting; Gloo: 0, the caller's clock
// measures that) to `s`.
void AddGroupStats(const std::vector<dist::Communicator*>& groups, EngineStats* s);

// Decoder layers 0, N, 2N, ... run checkpointed where the config asks for every layer or a
// selection (0: none): the engines without a compiled plan (one process, tensor parallelism alone,
// pipeline stages).
int64_t CheckpointEvery(const config::TrainConfig& cfg);

}  // namespace meshwork::train
