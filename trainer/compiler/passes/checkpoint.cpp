#include "trainer/compiler/passes/checkpoint.h"

#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

Result<Graph> CheckpointToFit(const Graph& g, const PassContext& ctx) {
  Graph out = g;
  if (ctx.memory_budget_bytes <= 0) return out;
  int64_t peak = PeakBytes(out);
  for (ModuleInfo& m : out.modules) {
    if (peak <= ctx.memory_budget_bytes) break;
    if (m.checkpoint_input_bytes <= 0) continue;
    const ModuleInfo before = m;
    Checkpoint(m);
    const int64_t after = PeakBytes(out);
    if (after >= peak) {  // the peak is elsewhere: more checkpointing only costs time
      m = before;
      break;
    }
    peak = after;
  }
  return out;
}

}  // namespace meshwork::compiler
