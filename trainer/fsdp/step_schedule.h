// Internal to trainer/fsdp: the sharded state FullyShardedLlama owns, and the interface of the two
// schedules that drive it through a training step (EagerSchedule: FSDP2's defaults, by hooks;
// PlanExecutor: a compiled plan's ops in order). Both move the same units; they differ in when.
#pragma once

#include <torch/types.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/chrome_trace.h"
#include "common/status.h"
#include "trainer/dist/communicator.h"
#include "trainer/fsdp/compute_clock.h"
#include "trainer/fsdp/fully_shard.h"
#include "trainer/fsdp/unit.h"
#include "trainer/model/llama.h"
#include "trainer/model/recompute.h"

namespace meshwork::fsdp {

// Trace of the last eager step: per-module compute, by module (embed, layers, head), as spans of
// the compute clock (CUDA events on a GPU), read into seconds by Skeleton().
struct StepTrace {
  struct Span {
    ComputeClock::Mark from, to;
    double share = 1;  // of the span this module gets (the head's forward and backward share one)
  };
  std::vector<Span> fwd, bwd;  // [0] = embed, layer i at [i + 1], then the head
  ComputeClock clock;
  ComputeClock::Mark mark;  // at the last hook
  int64_t batch = 0, seq = 0;
};

struct ShardedState {
  ShardedState(model::LlamaForCausalLM model, dist::Communicator* shard_group, dist::Communicator* reduce_group,
               dist::Communicator* replicate_group, const FsdpOptions& options)
      : model(std::move(model)),
        shard_group(shard_group),
        reduce_group(reduce_group),
        replicate_group(replicate_group),
        options(options) {}

  // What a new unit of this model reports into.
  UnitContext unit_context() { return {shard_group, reduce_group, &options, &stats, &tracer, &gathered_bytes}; }
  // A compute span on the trace, when tracing.
  void TraceCompute(const std::string& label, double start, double end) {
    if (tracer != nullptr) tracer->Span("compute", label, start, end);
  }

  model::LlamaForCausalLM model;
  dist::Communicator* shard_group;
  dist::Communicator* reduce_group;     // dp_shard's ranks, the reduce-scatter lane
  dist::Communicator* replicate_group;  // null: no HSDP
  FsdpOptions options;
  bool sync = true;  // whether this micro-batch's backward reduces gradients
  std::deque<ShardedParam> params;         // every parameter, in the module's order
  std::deque<FlatGroup> groups;            // embed, layer i at [i + 1], head
  std::vector<std::unique_ptr<Unit>> units;  // [0] = root (embed + head), then layer i at [i + 1]
  FsdpStats stats;
  ChromeTrace* tracer = nullptr;
  int64_t gathered_bytes = 0;  // parameter storage allocated now, over every unit
  // A plan applied before FSDP (tensor parallelism) that embeds and computes the loss its own
  // way, and its shape (FullyShardedLlama::SetTensorParallel); empty, tp 1: the model's own.
  model::EmbedRunner embed;
  model::LossRunner loss;
  int tp = 1;
  bool sequence_parallel = false;
  bool tp_blocked_counted = false;  // the trace's clock takes TP's blocked time out of the compute
  std::function<std::vector<int>()> tp_layer_chunks;  // each decoder layer's overlapped-TP chunks now
  std::function<Status(const std::vector<int>&)> set_tp_layer_chunks;  // empty: fixed chunks
  std::function<int64_t()> tp_tokens_per_rank;  // the last forward's tokens a tp rank held
  StepTrace trace;
};

// One decoder layer's forward; with `recompute`, checkpointed (its backward runs it again).
inline torch::Tensor RunLayer(model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope,
                              bool recompute) {
  return recompute ? model::CheckpointedLayer(layer, h, rope) : layer.forward(h, rope);
}

// Decides when the units gather, reduce and free during one micro-batch's forward and backward.
// Errors inside a schedule are thrown as StatusError (hooks run inside autograd).
class StepSchedule {
 public:
  virtual ~StepSchedule() = default;
  // Forward of the whole model, registering whatever backward hooks the schedule needs: the
  // logits, or with `targets` the mean loss (LlamaForCausalLMImpl::ForwardWithLayerRunner).
  virtual torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& targets) = 0;
  // After loss.backward(): what is left of the step's communication.
  virtual void FinishBackward() = 0;
};

}  // namespace meshwork::fsdp
