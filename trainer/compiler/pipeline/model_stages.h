// A model's module table (the IR's modules: embed, layers.<i>, head, as LlamaSkeleton or a trace
// gives them) cut into pipeline stages (PartitionLayers) and priced as a pipeline's stages
// (simulate.h): each stage's forward and backward seconds, the activations it holds per
// micro-batch, and the activation it passes on.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/pipeline/partition.h"
#include "trainer/compiler/pipeline/simulate.h"

namespace meshwork::compiler::pipeline {

struct ModelStages {
  StagePartition partition;  // over the decoder layers
  PipelineCost cost;
};

// `modules`: one micro-batch's table; the embedding is charged to the first decoder layer and the
// head to the last. Tensor parallelism's exchanges (tp=) lengthen a layer's compute as the cost
// model prices them unoverlapped. A backward splits into I and W by half each (a linear's input
// and weight gradients are one matmul each; attention's own backward, all I, is counted half to W:
// an approximation), and W reads half of a stage's held activations (the linears' inputs and their
// output gradients; also an approximation). Held bytes are the modules' activation_bytes only: a
// checkpointed layer's backward workspace and transients are not counted. `boundary_bytes`: the activation one stage passes the
// next (and its gradient back). InvalidConfig where the table has no decoder layers or fewer
// than `stages`.
Result<ModelStages> StagesOf(const Graph& modules, const CostModel& cost, int stages, int64_t boundary_bytes,
                             const LinkCost& link);

// One stage's parameters as the trainer's FSDP inside a pipeline stage moves them
// (trainer/train/pipeline_engine.h): summed over the stage's modules' parameters (ParamInfo),
// each once; the embedding's with the first stage and the head's with the last, so a tied table
// is counted on both.
struct StageParams {
  int64_t gathered_bytes = 0;  // the all-gather's output: every parameter whole, in param dtype
  int64_t grad_bytes = 0;      // the reduce-scatter's input: every gradient whole, in reduce dtype
  int64_t shard_bytes = 0;     // this rank's fp32 master shards
};
// Per stage of `partition`, from `g`'s module and parameter tables (a skeleton built at the
// stage's dp_shard and tp). InvalidConfig where the partition does not cut g's decoder layers.
Result<std::vector<StageParams>> StageParamsOf(const Graph& g, const StagePartition& partition);

}  // namespace meshwork::compiler::pipeline
