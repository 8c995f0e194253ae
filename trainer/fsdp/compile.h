// Compiled FSDP, from a traced eager step to the plan every rank runs: calibrate the links (and,
// on CPU ranks, host copies and compute/communication interference), plan the step
// (compiler::PlanStep) on rank 0, agree on it across the world, and hand it to the executor.
#pragma once

#include <ostream>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/planner.h"
#include "trainer/config/config.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/fsdp/fully_shard.h"

namespace meshwork::fsdp {

// What compiling keeps for the re-plan; the same on every rank (medians over the ranks).
struct Compilation {
  compiler::Graph skeleton;  // the traced compute without its slowdown by communication, unscaled
  compiler::CostModel cost;  // the calibration
  compiler::PlanOptions options;
  double unslowed = 1;       // UnslowTracedCompute's mean factor (printed)
  double scale = 1;          // on the traced compute, fitted to a measured step
  double predicted_step_seconds = 0;  // the running plan's, simulated (rank 0)
  compiler::Graph plan;      // what runs
};

// What the eager steps before the plan measured, as this rank timed them (0: unknown).
struct EagerStepTimes {
  double step_seconds = 0;     // a whole step (the trainer passes SteadyEagerStep's)
  double outside_seconds = 0;  // of a step, outside its last micro-batch's forward-to-reduction
};

// The eager step a plan is fitted to, from the eager steps before it (in order): their mean,
// leaving step 1 out when it took over kWarmUpRatio times the mean of the steps after it, as
// one-time warm-up that steady steps do not pay (a GPU's first step: cuBLAS handles, the caching
// allocator's first segments; llama3-1b on an H200: 0.76 s, then 0.21 s). On netlab's CPU ranks
// step 1 ran faster than the steady steps and step 2 slower (1 Gbit/s: 6.68 and 7.40 s against
// 7.02 s), so there both count. No steps: zeros (unknown).
inline constexpr double kWarmUpRatio = 1.5;
EagerStepTimes SteadyEagerStep(const std::vector<EagerStepTimes>& steps);

// Collective over `mesh`: every rank calls it after the same eager step. `cpu`: Gloo ranks,
// whose cost model charges copies and core sharing. `eager`: the eager steps' times (the
// medians over the ranks are used): the time outside forward-to-reduction becomes the cost
// model's step_overhead_seconds, and the traced compute, each module first unslowed by the
// communication beside it (compiler::UnslowTracedCompute), is scaled so that the simulated
// eager plan takes the measured step. Rank 0 logs one line describing the plan (and, with
// fsdp.dump_plan, the IR after each pass) to `log`. `device_memory_bytes`: what this rank's
// device holds for it (0: unknown), the default budget's base (fsdp.memory_budget 0).
Result<Compilation> CompileFsdp(FullyShardedLlama& fsdp, dist::DeviceMesh& mesh, const config::FsdpConfig& cfg,
                                bool cpu, EagerStepTimes eager, int64_t device_memory_bytes, std::ostream& log);

// Once, after compiled steps ran: the compute scale is refitted so that the simulated running
// plan takes the measured compiled step (`measured_step_seconds`, this rank's; the median over
// the ranks is used), the step is planned again from it, and the executor switches to the new
// plan when it differs. Collective over `mesh`. Rank 0 logs one line: measured against
// predicted, the new scale, and whether the plan changed.
Status Replan(FullyShardedLlama& fsdp, dist::DeviceMesh& mesh, Compilation& compilation,
              double measured_step_seconds, std::ostream& log);

}  // namespace meshwork::fsdp
