#include "trainer/compiler/passes/reorder.h"

#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/passes/program_edit.h"

namespace meshwork::compiler {

using namespace edit;  // NOLINT: the op edits are this file's vocabulary

Result<Graph> Reorder(const Graph& input, const PassContext& ctx) {
  // FSDP2's order first (one ahead, waits delayed), then each all-gather whose wait is still
  // exposed moves further ahead while that makes the step faster within the budget.
  Graph g = fsdp2::PrefetchOne(fsdp2::DelayReduceScatterWaits(input, ctx, false), ctx);
  double best = StepSeconds(g, ctx);
  for (int round = 0; round < 8; ++round) {
    bool changed = false;
    StripFrees(g);
    const auto ags = Collectives(g, OpKind::kAllGather);
    for (size_t k = 0; k < ags.size(); ++k) {
      Graph trial = g;
      const size_t a = Collectives(trial, OpKind::kAllGather)[k];
      if (fsdp2::PrefetchOneMore(trial, a) < 0) continue;
      Graph placed = PlaceFrees(trial);
      if (!Validate(placed).ok() || !WithinBudget(placed, ctx)) continue;
      const double t = StepSeconds(placed, ctx);
      if (t < best * (1 - 1e-4)) {
        best = t;
        g = std::move(trial);
        changed = true;
      }
    }
    g = PlaceFrees(std::move(g));
    if (!changed) break;
  }
  return g;
}

}  // namespace meshwork::compiler
