#include "trainer/compiler/pipeline/price.h"

#include <algorithm>
#include <string>

#include "trainer/compiler/pipeline/steps.h"

namespace meshwork::compiler::pipeline {

namespace {

// The module table with the chosen decoder layers checkpointed ("layers.<i>").
Graph CheckpointedSkeleton(LlamaShape shape, const std::vector<bool>& checkpointed) {
  shape.activation_checkpointing = false;
  Graph g = LlamaSkeleton(shape);
  for (ModuleInfo& m : g.modules) {
    if (m.name.rfind("layers.", 0) != 0) continue;
    const size_t layer = std::stoul(m.name.substr(7));
    if (layer < checkpointed.size() && checkpointed[layer]) Checkpoint(m);
  }
  return g;
}

}  // namespace

Result<PricedPipeline> PricePipeline(const HardwareProfile& profile, const PipelinePlan& plan) {
  const int layers = static_cast<int>(plan.llama.config.num_hidden_layers);
  if (!plan.checkpointed.empty() && static_cast<int>(plan.checkpointed.size()) != layers) {
    return InvalidConfig("checkpointed layers: " + std::to_string(plan.checkpointed.size()) + " flags for " +
                         std::to_string(layers) + " decoder layers");
  }
  const int tp = plan.llama.tp;
  if (plan.pp < 1 || tp < 1 || plan.dp_shard < 1 || plan.gpus % (plan.pp * tp * plan.dp_shard) != 0) {
    return InvalidConfig("pipeline mesh: pp " + std::to_string(plan.pp) + " x tp " + std::to_string(tp) + " x dp_shard " +
                         std::to_string(plan.dp_shard) + " does not divide " + std::to_string(plan.gpus) + " GPUs");
  }
  PricedPipeline out;
  const Shape shape{plan.pp, plan.virtual_stages, plan.microbatches};
  const bool async = plan.schedule == ScheduleKind::kPipeMare;
  // PipeMare: its steady step, as the trainer runs it between two steps' barriers (steps.h), the
  // minibatch of `microbatches`; FSDP inside the stages does not compose with it (the trainer
  // refuses it).
  if (async) {
    if (plan.dp_shard > 1) {
      return InvalidConfig("pipemare updates each stage at its own time, which FSDP inside the stages (dp_shard " +
                           std::to_string(plan.dp_shard) + ") does not allow");
    }
    Shape one = shape;
    one.per_update = shape.microbatches;
    MW_ASSIGN_OR_RETURN(AsyncSteps steps, SplitIntoSteps(one));
    out.program = std::move(steps.steady);
  } else {
    MW_ASSIGN_OR_RETURN(out.program, Generate(plan.schedule, shape));
  }

  // One micro-batch on one tp group, no data parallel sharding: each rank holds its stages'
  // layers whole.
  LlamaShape one_group = plan.llama;
  one_group.dp_shard = 1;
  one_group.dp_replicate = 1;
  MW_ASSIGN_OR_RETURN(const CostModel tp_cost, MakeCostModel(profile, 1, 1, tp));
  // pp is the outermost mesh dim: a pipeline's ranks are gpus / pp apart, on other nodes once
  // that spans a node.
  out.inter_node = !GroupsWithinNode(plan.pp, plan.gpus / plan.pp, plan.gpus, profile.gpus_per_node);
  if (out.inter_node && !profile.has_inter_node) {
    return InvalidConfig("pp " + std::to_string(plan.pp) + ": the stages are on different nodes and profile " +
                         profile.name + " has no inter_node link");
  }
  out.link = out.inter_node ? profile.inter_node : profile.intra_node;
  // The residual stream a stage passes on (its gradient back): split by tokens under sequence
  // parallelism.
  out.boundary_bytes = plan.llama.batch * plan.llama.seq_len * plan.llama.config.hidden_size *
                       plan.llama.activation_bytes / (tp > 1 && plan.llama.sequence_parallel ? tp : 1);
  const Graph skeleton = CheckpointedSkeleton(one_group, plan.checkpointed);
  MW_ASSIGN_OR_RETURN(out.stages, StagesOf(skeleton, tp_cost, shape.stages(), out.boundary_bytes, out.link));

  // FSDP inside the stages, as the trainer runs it (trainer/train/pipeline_engine.cpp): a group
  // per decoder layer (and the embedding's, the head's), gathered over dp_shard from the program's
  // start in the order the stages use them, each reduce-scattered as the step's last backward
  // through it ends (the tied table's after the program), then all-reduced over the replicas
  // (OverlapFsdp); static state 16 bytes a parameter over dp_shard (fp32 master, gradient and
  // AdamW's two moments), and while the step runs the parameters whole in bf16 and their gradients
  // whole in fp32.
  const int replicas = plan.gpus / (plan.pp * tp * plan.dp_shard);
  MW_ASSIGN_OR_RETURN(out.fsdp_cost, MakeCostModel(profile, replicas, plan.dp_shard, tp));
  LlamaShape sharded = plan.llama;
  sharded.dp_shard = plan.dp_shard;
  sharded.dp_replicate = replicas;
  sharded.activation_checkpointing = false;
  const Graph sharded_skeleton = LlamaSkeleton(sharded);
  MW_ASSIGN_OR_RETURN(const std::vector<StageParams> params, StageParamsOf(sharded_skeleton, out.stages.partition));
  MW_ASSIGN_OR_RETURN(const std::vector<FsdpGroup> groups,
                      FsdpGroupsOf(sharded_skeleton, out.stages.partition, out.fsdp_cost));
  out.per_rank.assign(static_cast<size_t>(plan.pp), StageParams{});
  for (int s = 0; s < shape.stages(); ++s) {
    StageParams& r = out.per_rank[static_cast<size_t>(shape.RankOf(s))];
    r.gathered_bytes += params[static_cast<size_t>(s)].gathered_bytes;
    r.grad_bytes += params[static_cast<size_t>(s)].grad_bytes;
    r.shard_bytes += params[static_cast<size_t>(s)].shard_bytes;
  }
  // A checkpointed layer's backward recomputes it: its whole activations on top, one at a time.
  int64_t workspace = 0;
  for (const ModuleInfo& m : skeleton.modules) workspace = std::max(workspace, m.backward_workspace_bytes);

  if (async) {
    MW_ASSIGN_OR_RETURN(out.run, SimulateStep(out.program, out.stages.cost));
  } else {
    MW_ASSIGN_OR_RETURN(out.run, SimulatePipeline(out.program, out.stages.cost));
  }
  // Each rank's program late by what it waits for gathers, its reduce-scatters overlapped with
  // its last backwards, then the replicas' all-reduce.
  const std::vector<RankFsdp> overlapped = OverlapFsdp(out.program, out.run, groups);
  for (int rank = 0; rank < plan.pp; ++rank) {
    const StageParams& p = out.per_rank[static_cast<size_t>(rank)];
    out.step_seconds =
        std::max(out.step_seconds, overlapped[static_cast<size_t>(rank)].end +
                                       out.fsdp_cost.CollectiveSeconds(OpKind::kAllReduce, p.grad_bytes / plan.dp_shard));
    const int64_t activations = out.run.peak_bytes[static_cast<size_t>(rank)] + workspace;
    // PipeMare also keeps the velocity of its discrepancy correction, and a copy of the weights
    // while a corrected backward runs: two more copies of the stage's parameters.
    const int64_t rank_peak = (async ? 6 : 4) * p.shard_bytes + p.gathered_bytes + p.grad_bytes + activations;
    if (rank_peak > out.peak_bytes) {
      out.peak_bytes = rank_peak;
      out.activation_bytes = activations;
    }
  }
  const double tokens = static_cast<double>(plan.microbatches) * static_cast<double>(plan.llama.batch) *
                        static_cast<double>(plan.llama.seq_len);
  out.tokens_per_second = out.step_seconds > 0 ? tokens / out.step_seconds / (plan.pp * tp) : 0;
  out.mfu = out.tokens_per_second * plan.llama.config.TrainingFlopsPerToken(plan.llama.seq_len) /
            profile.peak_flops_per_second;
  return out;
}

}  // namespace meshwork::compiler::pipeline
