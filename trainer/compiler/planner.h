// The one way a step is planned, used by the trainer (trainer/fsdp/compile.h), the simulator
// and the tests: the naive program from a module table, the eager plan beside it (what the
// eager executor runs), then the pass pipeline under a memory budget.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"
#include "trainer/compiler/plan_options.h"

namespace meshwork::compiler {

struct StepPlans {
  Graph eager;         // the eager executor's schedule, for comparison
  Graph compiled;      // what the plan executor runs
  PassContext ctx;     // as the passes saw it: the cost model and the budget resolved
  std::string passes;  // Pipeline::Describe(): names in order, disabled ones marked
  // What the planner chose and why, one clause each ("activation checkpointing on 23 of 80
  // layers: ..."); empty when it made no choice worth naming.
  std::vector<std::string> choices;
  bool static_exceeds_device = false;  // kDeviceMemory: the shards alone overflow the device
};

// The plan's choices read back from it: activation checkpointing per layer, buckets, how far
// ahead all-gathers are issued, where reduce-scatters are waited for (clauses for a summary).
std::vector<std::string> DescribeChoices(const Graph& skeleton, const Graph& plan, int64_t budget_bytes);

// The factor on every module's compute that makes the simulated eager plan of `skeleton` take
// `measured_step_seconds` (bisection over [kMinComputeScale, kMaxComputeScale]; 1 when nothing
// was measured; the lower bound when the communication alone is predicted to take longer). A traced
// step's compute already includes what running beside communication cost it, which the cost
// model's interference would charge a second time.
inline constexpr double kMinComputeScale = 0.05;
inline constexpr double kMaxComputeScale = 20;
double FitComputeScale(const Graph& skeleton, const CostModel& cost, const PlanOptions& options,
                       double measured_step_seconds);
// The factor on `plan`'s compute that makes its simulation take `measured_step_seconds` (the
// same bisection and bounds): after compiled steps ran, how far the plan's compute was off.
double FitPlanComputeScale(const Graph& plan, const CostModel& cost, double measured_step_seconds);
// `skeleton` with every module's forward and backward compute multiplied by `scale`.
Graph ScaleCompute(Graph skeleton, double scale);

// Per module (forward order), factors on its forward and backward compute.
struct ModuleScales {
  std::vector<double> fwd, bwd;
  double Mean() const;  // over every factor: what the plan line prints
};
// `skeleton` with module m's forward compute multiplied by scales.fwd[m], its backward by bwd[m].
Graph ScaleCompute(Graph skeleton, const ModuleScales& scales);
// A traced module's time on a CPU rank includes what the eager step's collectives beside it
// cost it (Gloo's threads share the core), and the simulator slows compute under communication
// again (CostModel::interference). The factors that make each module's forward and backward
// in the simulated eager plan of `measured` take their traced time: a fixed point over a few
// simulations, each factor within [1 / (1 + kNumLanes x interference), 1]. All 1 where
// interference is 0.
ModuleScales UnslowTracedCompute(const Graph& measured, const CostModel& cost, const PlanOptions& options);

// `skeleton`: modules and parameters with their measured (or modelled) compute; `dump`, when
// given, gets the IR before the first pass and after each.
Result<StepPlans> PlanStep(const Graph& skeleton, const CostModel& cost, const PlanOptions& options,
                           std::ostream* dump = nullptr);

}  // namespace meshwork::compiler
