// Choosing the device mesh (`mesh: auto`) with the same cost model that plans the step: every
// dp_replicate x dp_shard factorisation of the world that the hardware profile can build gets a
// quick plan (passes/fsdp2_order.h's QuickPlan: checkpointing to fit the device's memory, FSDP2's order) and
// is simulated; the fastest that fits the device's memory wins (the one with the least memory
// when none fits), and only that one is planned in full.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

struct MeshCandidate {
  int dp_replicate = 1;
  int dp_shard = 1;
  std::string rejected;  // why the profile cannot build this mesh; empty when it can
  SimResult compiled;    // the quick plan's predicted step; the chosen mesh's: the full plan's
  bool fits = false;     // peak dynamic + static within the device's memory
  std::vector<std::string> choices;  // the full plan's choices (StepPlans::choices), chosen mesh only
};

struct MeshChoice {
  int dp_replicate = 1;
  int dp_shard = 1;
  std::vector<MeshCandidate> candidates;  // dp_shard ascending
  std::string reason;                     // one sentence: why this mesh
};

// `shape`: the model, batch and dtypes per rank (its dp_shard and dp_replicate are set per
// candidate); `options`: bucketing and reorder (the budget is the profile's device memory).
// `plan_chosen`: plan the chosen mesh in full for its row and choices (seconds for a 70B model);
// the trainer skips it, since it plans again from its own calibration anyway.
// kInvalidConfig when world < 1 or no mesh can be built.
Result<MeshChoice> ChooseMesh(const HardwareProfile& profile, const LlamaShape& shape, int world,
                              const PlanOptions& options, bool plan_chosen = true);

}  // namespace meshwork::compiler
