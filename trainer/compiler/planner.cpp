#include "trainer/compiler/planner.h"

#include "trainer/compiler/frontend.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

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
