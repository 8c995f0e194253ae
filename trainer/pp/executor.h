// Runs one training step of a pipeline program (trainer/compiler/pipeline/program.h) on this
// rank: its actions in order, forwards and backwards of its stages' micro-batches, activations and
// their gradients sent and received over the pipeline group. Any valid lowered program runs
// (GPipe, 1F1B, interleaved 1F1B, zero-bubble): a schedule is its generator, not code here.
//
// Stage boundaries cut the autograd graph: a stage's input is a leaf that requires its gradient,
// and the gradient of a stage's output comes from the next stage (received, or kept in memory
// when that stage is on this rank). The last stage's loss is scaled by 1 / micro-batches, so the
// parameters' gradients, accumulated over the step's micro-batches, are those of the mean loss
// over the global batch, as one process computes them.
//
// Zero-bubble's split backward (split_backward.h): I computes the gradient of the stage's input
// alone and keeps the gradients that reach the stage's weights; W computes the weights' gradients
// from them, so I + W is B's work, split. On the first stage the embedding's output stands for
// the input (StageRunner::FirstStageInput): I stops there and W runs the embedding's backward.
//
// Receives are posted ahead of their actions (PipelineStepOptions::receives_ahead), in program
// order, so a transfer overlaps the compute before its receive on both sides.
//
// FSDP's ops (compiled mode: ag, rs) go to PipelineStepOptions::fsdp: an ag starts its unit's
// gather; before a compute, the rs ops between it and the next compute name the units it makes
// final (FsdpOps::FinalDuring), and each rs then makes sure its reduce-scatter has started.
//
// Asynchronous programs (PipeMare, compiler/pipeline/steps.h) run one step at a time with a
// PipelineCarry: the micro-batches forwarded and not yet through their backward stay in it from
// one step to the next (renumbered by the step's micro-batches), as do the sends a later step
// receives. An update (U) is the stage runner's (Update); a backward learns how many updates of
// its stage passed since its forward (BeforeBackward), for PipeMare's discrepancy correction.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/dist/communicator.h"

namespace meshwork::pp {

struct MicroBatch {
  torch::Tensor tokens;   // int64 [batch, seq]
  torch::Tensor targets;  // int64 [batch, seq]
};

// The stages a rank runs (a model cut into pieces).
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Stage `stage`'s forward of `mb`: `input` is the previous stage's output (undefined on the
  // first stage). On the last stage the mean loss of `mb` (a scalar), else the activation passed on.
  virtual torch::Tensor Forward(int stage, const MicroBatch& mb, const torch::Tensor& input) = 0;
  // The parameters stage `stage` trains (W's backward goes to these).
  virtual std::vector<torch::Tensor> Parameters(int stage) = 0;
  // The first stage's input computed from `mb` (its embedding), for a program that splits the
  // backward: Forward then starts from it, and the stage's I stops at it. Undefined (the
  // default): the first stage's I computes nothing and its W the whole backward.
  virtual torch::Tensor FirstStageInput(const MicroBatch& mb) {
    (void)mb;
    return {};
  }
  // Asynchronous programs: around a backward (B) of stage `stage` whose forward ran `delay` of
  // the stage's updates ago; and the update U of the stage's parameters with the gradients of the
  // step's minibatch `minibatch` (-1: the previous step's), which then starts its next gradients
  // from zero. A synchronous runner need not have them.
  virtual Status BeforeBackward(int stage, int delay) {
    (void)stage, (void)delay;
    return Status::Ok();
  }
  virtual Status AfterBackward(int stage) {
    (void)stage;
    return Status::Ok();
  }
  virtual Status Update(int stage, int minibatch) {
    (void)minibatch;
    return Internal("pipeline stage " + std::to_string(stage) + ": an update in a program whose stages do not update");
  }
};

// FSDP's collectives where the program places them (ag and rs ops, pipeline::PlaceFsdp), by unit
// number: the runner of the rank's units.
class FsdpOps {
 public:
  virtual ~FsdpOps() = default;
  // ag: starts the unit's all-gather (its first use waits for it).
  virtual Status StartGather(int unit) = 0;
  // Before a compute: the units whose gradients it makes final (the rs ops after it), whose
  // reduce-scatters may start inside it, as soon as they are.
  virtual void FinalDuring(const std::vector<int>& units) = 0;
  // rs: starts the unit's reduce-scatter where it has not started inside the compute before.
  virtual Status StartReduceScatter(int unit) = 0;
};

// What an asynchronous program leaves in flight between its steps (opaque: the executor's).
struct PipelineCarry {
  struct State;
  std::shared_ptr<State> state;
};

struct PipelineStepOptions {
  // One micro-batch's activation between stages (and its gradient): [batch, seq, hidden]. Every
  // rank knows it from the config, so receives are posted without a shape exchange.
  std::vector<int64_t> activation_sizes;
  torch::ScalarType activation_dtype = torch::kFloat32;
  // The ranks that hold the same activations as this one at every stage boundary (tensor
  // parallelism without sequence parallelism: every tp rank of a stage has the whole stream),
  // each the same rank of its own pipeline group. Each sends only its 1/size share of an
  // activation or gradient, and a receive gathers the others' shares over this group (inside
  // the node) instead of the link between stages carrying the same tensor size times. Null, size
  // 1, or a tensor that does not divide: whole tensors.
  dist::Communicator* replicas = nullptr;
  // How many of a rank's next receives are kept posted before their place in the program (0:
  // each posted when reached). Gloo moves a message only once its receive is posted, so a receive
  // posted ahead lets its transfer run during the actions before it; each costs one activation's
  // buffer.
  int receives_ahead = 2;
  // Runs the program's FSDP ops; null where it has none (InvalidInput where it has).
  FsdpOps* fsdp = nullptr;
};

// When one action of this rank ran (steady-clock seconds), for the timeline and the measured bubble.
struct ActionSpan {
  compiler::pipeline::Action action;
  double start = 0;
  double end = 0;
};

struct PipelineStepResult {
  double loss = 0;  // the mean over the step's micro-batches, on every rank of the group
  std::vector<ActionSpan> spans;  // this rank's actions in the order they ran
  double seconds = 0;  // this rank's program: its first action's start to its sends' completion
};

// Runs rank comm.rank()'s actions of `program` (lowered: with its transfers; Validate it once
// beforehand) over `microbatches` (one per micro-batch of the program). Gradients accumulate into
// the stages' parameters (.grad()), as a backward does; zeroing them is the caller's. InvalidInput
// where the program's shape does not match the group or the micro-batches, or an action lacks what
// it needs (a program that did not validate); a transfer's failure is its Unavailable.
// With `carry`, `program` is one step of an asynchronous program (AsyncSteps): it begins with what
// the carry holds and leaves in it what is still in flight; a drain (AsyncSteps::Drain, no
// forwards, `microbatches` empty) leaves nothing, every send completed.
Result<PipelineStepResult> RunPipelineStep(const compiler::pipeline::Program& program, StageRunner& stages,
                                           dist::Communicator& comm, const std::vector<MicroBatch>& microbatches,
                                           const PipelineStepOptions& options, PipelineCarry* carry = nullptr);

// Evaluation: `mb` through every stage in order without gradients (each rank runs its stages,
// passing activations on), and the last stage's mean loss, on every rank of the group.
Result<double> RunPipelineForward(const compiler::pipeline::Shape& shape, StageRunner& stages, dist::Communicator& comm,
                                  const MicroBatch& mb, const PipelineStepOptions& options);

}  // namespace meshwork::pp
