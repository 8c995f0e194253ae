#include "trainer/compiler/passes/async_tp.h"

namespace meshwork::compiler {

Result<Graph> AsyncTensorParallel(const Graph& in, const PassContext& ctx, const AsyncTpOptions& options) {
  Graph g = in;
  if (g.tp <= 1 || ctx.cost.tp <= 1) return g;
  for (ModuleInfo& m : g.modules) {
    if (m.tp_fwd.calls == 0 && m.tp_bwd.calls == 0) continue;
    // The backward is what the plan will run: a later checkpoint pass adds the recompute's
    // exchanges, which the same chunks then overlap as well.
    auto exposed = [&](int chunks) {
      ModuleInfo trial = m;
      trial.tp_chunks = chunks;
      return ctx.cost.TpExposedSeconds(trial, Phase::kForward, m.fwd_seconds) +
             ctx.cost.TpExposedSeconds(trial, Phase::kBackward, m.bwd_seconds);
    };
    int best = 1;
    double best_seconds = exposed(1);
    for (int chunks : {2, 4, 8}) {
      if (options.tokens_per_rank > 0 && options.tokens_per_rank % chunks != 0) continue;
      const double s = exposed(chunks);
      if (s < best_seconds * (1 - 1e-9)) {
        best = chunks;
        best_seconds = s;
      }
    }
    m.tp_chunks = best;
  }
  return g;
}

}  // namespace meshwork::compiler
