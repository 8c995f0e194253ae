#include "trainer/compiler/passes/keep_gathered.h"

#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

Result<Graph> KeepGatheredWithinBudget(const Graph& g, const PassContext& ctx) {
  if (ctx.memory_budget_bytes <= 0) return g;
  Graph best = g;
  double best_seconds = Simulate(fsdp2::QuickOrder(best, ctx), ctx.cost).step_seconds;
  // Last layer first: its forward and backward are closest, so it holds the memory least long.
  for (int m = static_cast<int>(g.modules.size()) - 1; m >= 0; --m) {
    if (g.modules[m].name.rfind("layers.", 0) != 0) continue;
    Graph candidate = fsdp2::KeepGathered(best, m);
    if (candidate.ops.size() == best.ops.size()) continue;  // not re-gathered: nothing to keep
    const Graph quick = fsdp2::QuickOrder(candidate, ctx);
    if (PeakBytes(quick) > ctx.memory_budget_bytes) break;
    const double seconds = Simulate(quick, ctx.cost).step_seconds;
    if (seconds >= best_seconds * (1 - 1e-3)) continue;  // the communication it saves was hidden
    best = std::move(candidate);
    best_seconds = seconds;
  }
  return best;
}

}  // namespace meshwork::compiler
