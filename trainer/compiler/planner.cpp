#include "trainer/compiler/planner.h"

#include "trainer/compiler/frontend.h"
#include "trainer/compiler/simulator.h"

#include <cmath>

namespace meshwork::compiler {

Graph ScaleCompute(Graph skeleton, double scale) {
  for (auto& m : skeleton.modules) {
    m.fwd_seconds *= scale;
    m.bwd_seconds *= scale;
  }
  return skeleton;
}

double FitComputeScale(const Graph& skeleton, const CostModel& cost, const PlanOptions& options,
                       double measured_step_seconds) {
  if (!(measured_step_seconds > 0)) return 1.0;
  const Graph naive = BuildNaiveProgram(skeleton, {options.reshard_after_forward});
  PassContext ctx;
  ctx.cost = cost;
  auto eager_seconds = [&](double scale) {
    auto eager = EagerPlan(ScaleCompute(naive, scale), ctx);
    return eager.ok() ? Simulate(*eager, cost).step_seconds : 0.0;
  };
  // The simulated step grows with the scale: bisect on a log scale.
  double lo = kMinComputeScale, hi = kMaxComputeScale;
  if (eager_seconds(lo) >= measured_step_seconds) return lo;
  if (eager_seconds(hi) <= measured_step_seconds) return hi;
  for (int i = 0; i < 40; ++i) {
    const double mid = std::sqrt(lo * hi);
    (eager_seconds(mid) < measured_step_seconds ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

Result<StepPlans> PlanStep(const Graph& skeleton, const CostModel& cost, const PlanOptions& options,
                           std::ostream* dump) {
  StepPlans out;
  out.ctx.cost = cost;
  out.ctx.bucketing = options.bucketing;
  Pipeline pipeline = Pipeline::Default();
  if (!options.reorder) MW_RETURN_IF_ERROR(pipeline.Disable("reorder"));
  out.passes = pipeline.Describe();
  const Graph naive = BuildNaiveProgram(skeleton, {options.reshard_after_forward});
  MW_ASSIGN_OR_RETURN(out.eager, EagerPlan(naive, out.ctx));
  switch (options.budget.source) {
    case MemoryBudget::Source::kEagerPeak:
      out.ctx.memory_budget_bytes = PeakBytes(out.eager);
      break;
    case MemoryBudget::Source::kFixed:
      out.ctx.memory_budget_bytes = options.budget.bytes;
      break;
    case MemoryBudget::Source::kDeviceMemory: {
      const SimResult eager = Simulate(out.eager, cost);
      out.ctx.memory_budget_bytes = options.budget.bytes - eager.static_bytes;
      if (out.ctx.memory_budget_bytes < eager.peak_bytes) {
        out.ctx.memory_budget_bytes = eager.peak_bytes;
        out.budget_is_eager_peak = true;
      }
      break;
    }
  }
  MW_ASSIGN_OR_RETURN(out.compiled, pipeline.Run(naive, out.ctx, dump));
  return out;
}

}  // namespace meshwork::compiler
