// The whole parallel plan of a Llama model on a cluster, chosen by the cost model: every mesh
// dp_replicate x dp_shard x tp x pp the trainer can run, with the pipeline's virtual stages,
// schedule and micro-batches, activation checkpointing and reshard-after-forward.
//
// 1. Enumerate, pruned as Galvatron prunes: tp within one node and dividing the heads and the
//    kv-heads; pp across nodes (a pipeline inside a node while data parallel groups cross nodes
//    is left out), no more stages than decoder layers; the global batch divided evenly; meshes the
//    profile's links can build. Each pruned plan keeps its reason.
// 2. Estimate every other plan by a fast model of its step and memory, choosing activation
//    checkpointing per layer by dynamic programming over the layers and the memory left
//    (ChooseCheckpointing): the least recompute that fits. A plan that does not fit even with
//    every layer checkpointed is out (out of memory).
// 3. Score the best estimates (the finalists) by the simulator: a single-program plan by its quick
//    plan (checkpointing to fit, FSDP2's order; mesh_choice.h ranks meshes the same way), a
//    pipeline by the pipeline simulator with FSDP inside its stages as the trainer runs it
//    (pipeline/price.h). The fastest that fits wins; a single-program choice is then planned in
//    full by the compiled planner (PlanStep: its async TP, buckets and order).
//
// What is not searched: PipeMare (an algorithm change, not a schedule: auto never picks it),
// per-layer meshes (the trainer applies one mesh to every layer), bucketing beyond the compiled
// planner's own choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/pipeline/generators.h"
#include "trainer/model/llama_config.h"

namespace meshwork::compiler {

// One decoder layer as activation checkpointing sees it, on one rank: the bytes it holds kept
// whole and checkpointed (its input), and the recompute checkpointing costs it.
struct LayerMemory {
  int64_t keep_bytes = 0;
  int64_t checkpoint_bytes = 0;
  double recompute_seconds = 0;
};

struct CheckpointChoice {
  std::vector<bool> checkpointed;  // per layer
  double recompute_seconds = 0;
  int64_t held_bytes = 0;
  bool fits = false;  // false: every layer checkpointed still holds more than the budget
};

// The layers to checkpoint so that what they hold fits `budget_bytes` with the least recompute:
// a 0/1 knapsack by dynamic programming over the layers and the memory, in at most `granules`
// steps of memory (each layer's saving rounded up to a step, so a choice said to fit does).
// Layers that save nothing by checkpointing are never checkpointed.
CheckpointChoice ChooseCheckpointing(const std::vector<LayerMemory>& layers, int64_t budget_bytes, int granules = 1024);

struct ParallelPlan {
  int dp_replicate = 1;
  int dp_shard = 1;
  int tp = 1;
  int pp = 1;
  int virtual_stages = 1;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::k1F1B;  // pp > 1
  int microbatches = 1;  // pp > 1: micro-batches a step, per pipeline
  // Sequences of a micro-batch (pp > 1), or of a data parallel rank's step (pp 1).
  int64_t microbatch = 1;
  // Activation checkpointing, as the trainer's training.activation_checkpointing sets it: -1 the
  // compiled plan's choice under its budget (auto, single-program plans), 0 none, 1 every layer,
  // N > 1 decoder layers 0, N, 2N, ... (selective, training.checkpoint_every N).
  int checkpoint_every = -1;
  bool reshard_after_forward = true;  // pp 1 (fsdp.reshard_after_forward)
};
// "tp 8 x pp 8 x dp_shard 8, interleaved-1f1b v 4, 32 micro-batches of 1, every 2th layer
// checkpointed"; the mesh alone for a plan pruned by its mesh (microbatch 0).
std::string Describe(const ParallelPlan& plan);

// The plan as the trainer's config keys (YAML; docs/config.md): mesh.*, pipeline.schedule and
// virtual_stages, data.batch_size (a micro-batch) and seq_len, training.grad_accum (micro-batches)
// and global_batch_size, activation checkpointing, fsdp.mode (compiled for a single-program plan,
// whose checkpointing it chooses) and reshard_after_forward. The model's keys are the caller's.
std::string PlanConfigYaml(const ParallelPlan& plan, int64_t seq_len, int64_t global_batch);

struct PlanScore {
  double step_seconds = 0;
  double tokens_per_second = 0;  // per GPU
  double mfu = 0;                // 6N + attention per token, over the device's peak
  int64_t peak_bytes = 0;        // the fullest GPU, static state included
  double bubble = 0;             // pipelines: the program's idle share
  double recompute_seconds = 0;  // activation checkpointing's share of the step
};

struct PlanCandidate {
  ParallelPlan plan;
  PlanScore estimate;                  // the fast model's (every plan not pruned)
  std::optional<PlanScore> simulated;  // the planner's and simulator's (the finalists)
  // Why it is out: "<kind>: <the first rule it broke>", the kind one of tp, pipeline, batch,
  // schedule, mesh, out of memory, simulator. Empty for a plan that fits.
  std::string rejected;
  std::vector<std::string> choices;  // the compiled plan's (single-program finalists)
};

struct SearchSpec {
  model::LlamaConfig config;
  int64_t seq_len = 8192;
  int64_t global_batch = 0;  // sequences per optimizer step, over every data parallel rank
  int gpus = 0;
  // Pins (0: searched): a hint the user gave, which every plan keeps.
  int tp = 0;
  int pp = 0;
  // Scored by the planner and the simulator: this many single-program plans (the planner takes
  // seconds on a large model) and 8 times as many pipelines (milliseconds each).
  int finalists = 4;
  bool exhaustive = false;   // every plan that fits scored (small spaces, tests)
  // Single-program finalists by the compiled planner in full (its async TP, buckets and order)
  // rather than the quick plan (checkpointing to fit, FSDP2's order), which ranks them; the choice
  // is planned in full either way. The planner takes minutes on a 405B model.
  bool full_plans = false;
  // The choice, when a single-program plan, planned in full before it is returned (its score and
  // choices then the compiled plan's). Off where only the plan is needed and time counts (the
  // operator at admission: the trainer's compiled mode plans the step itself when it starts).
  bool plan_choice_in_full = true;
  std::vector<int64_t> microbatch_sizes = {1, 2, 4};  // pipelines: sequences a micro-batch
};

struct PlanSearch {
  std::vector<PlanCandidate> finalists;  // scored, the fastest that fits first: the choice
  std::vector<PlanCandidate> estimated;  // fitting by the estimate, not scored, fastest first
  std::vector<PlanCandidate> rejected;   // pruned or out of memory, with the reason
  int enumerated = 0;
  double seconds = 0;  // the search's wall time, in three parts:
  double estimate_seconds = 0;   // enumerating and estimating every plan
  double score_seconds = 0;      // the finalists by the simulator
  double full_plan_seconds = 0;  // a single-program choice planned in full
  const PlanCandidate& chosen() const { return finalists.front(); }
};

// One plan scored as the search scores a finalist (the quick plan, or the pipeline simulator at
// the fastest checkpointing that fits), on `profile`: the search's prediction for a plan already
// running, beside which a search on the same profile is compared (train/plan_advice.h). The
// plan's dims must multiply to spec.gpus (else InvalidConfig naming them).
Result<PlanScore> ScorePlan(const HardwareProfile& profile, const SearchSpec& spec, const ParallelPlan& plan);

// InvalidConfig naming the value for a spec no plan can come from: gpus or global_batch < 1, a
// pin that breaks a rule (tp not dividing the heads or across nodes, pp over the layers), and a
// model no plan fits on these GPUs (naming the plan that needs the least memory, its peak and
// the device's).
Result<PlanSearch> SearchPlans(const HardwareProfile& profile, const SearchSpec& spec);

}  // namespace meshwork::compiler
