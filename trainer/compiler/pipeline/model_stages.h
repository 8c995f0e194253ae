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

// FSDP inside the stages as the trainer overlaps it (trainer/train/pipeline_engine.cpp): a rank's
// parameters are flat groups (a decoder layer's; the embedding's; the final norm's and head's),
// all gathered from the program's start in the order its stages use them, one after another on
// the shard link, each needed at its first use; each reduce-scattered once the step's last
// backward through it has run, one after another, the tied table's after the program.
struct FsdpGroup {
  int stage = 0;
  // Where in the stage's forward it is first needed and (backward running in reverse) where its
  // last backward leaves it final: 0 the stage's start (the embedding), k / n before its k-th of n
  // decoder layers, 1 its end (the head).
  double at = 0;
  double gather_seconds = 0;
  double scatter_seconds = 0;
  bool after_program = false;  // a tied table's: the stages exchange its gradient first
};
// The groups of `g`'s modules cut by `partition`, their collectives priced by `fsdp_cost` (the
// shard link). A parameter in two groups (a tied table, on the first and the last stage) makes
// both wait for the program's end. InvalidConfig where the partition does not cut g's layers.
Result<std::vector<FsdpGroup>> FsdpGroupsOf(const Graph& g, const StagePartition& partition, const CostModel& fsdp_cost);

struct RankFsdp {
  double delay = 0;  // the rank's program starts this much later, waiting for gathers
  double end = 0;    // its program and its reduce-scatters done, the delay included
};
// Per rank of `p`, `groups` overlapped with the program's timeline `r` (SimulatePipeline's):
// a group's gather must be done by its stage's first forward reaching it (else the rank's whole
// program waits that much), and its reduce-scatter starts when its stage's last backward (B or
// W) passes it, or at the program's end for a tied table. Step: the slowest rank's end.
std::vector<RankFsdp> OverlapFsdp(const Program& p, const PipelineResult& r, const std::vector<FsdpGroup>& groups);

}  // namespace meshwork::compiler::pipeline
