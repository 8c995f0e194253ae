// One pipeline plan priced whole, as the trainer runs a dp_replicate x dp_shard x tp x pp mesh
// (trainer/train/pipeline_engine.h): the model's decoder layers cut into pp x v stages balanced by
// compute, the schedule's program simulated (simulate.h), FSDP inside the stages overlapped with
// it (OverlapFsdp), the replicas' all-reduce after it, and the fullest rank's memory. What
// `meshwork-simulate --pp` prints per schedule and what the plan search (plan_search.h) scores
// its pipeline finalists with.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/pipeline/model_stages.h"

namespace meshwork::compiler::pipeline {

struct PipelinePlan {
  // The model, dtypes and compute rate; `batch` is one micro-batch's sequences, `tp` and
  // `sequence_parallel` the mesh's; its dp_shard, dp_replicate and activation_checkpointing
  // are ignored (given below).
  LlamaShape llama;
  int gpus = 1;
  int pp = 2;
  int virtual_stages = 1;
  int microbatches = 4;
  int dp_shard = 1;  // of each stage's gpus / (pp x tp) data parallel ranks; the rest replicate
  ScheduleKind schedule = ScheduleKind::k1F1B;
  // Per decoder layer, whether it is checkpointed (keeps its input, recomputes in backward);
  // empty: none.
  std::vector<bool> checkpointed;
};

struct PricedPipeline {
  ModelStages stages;
  Program program;
  PipelineResult run;            // the program alone
  double step_seconds = 0;       // with FSDP's exposed time and the replicas' all-reduce
  int64_t peak_bytes = 0;        // the fullest rank: static state, gathered weights, gradients, activations
  int64_t activation_bytes = 0;  // of it, the activations (with one checkpointed layer's recompute)
  double tokens_per_second = 0;  // per GPU
  double mfu = 0;                // 6N + attention per token over the device's peak
  int64_t boundary_bytes = 0;    // one transfer between stages
  bool inter_node = false;       // the stages' transfers cross nodes
  LinkCost link;                 // the link they take
  CostModel fsdp_cost;           // FSDP inside the stages (shard and replicate links)
  std::vector<StageParams> per_rank;
};

// InvalidConfig where the mesh cannot be built on the profile (stages on different nodes without
// an inter-node link, a dimension that does not divide), the schedule does not run the shape, or
// `checkpointed` does not name every decoder layer.
Result<PricedPipeline> PricePipeline(const HardwareProfile& profile, const PipelinePlan& plan);

}  // namespace meshwork::compiler::pipeline
