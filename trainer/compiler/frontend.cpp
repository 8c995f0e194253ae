#include "trainer/compiler/frontend.h"

#include <string>

namespace meshwork::compiler {

Graph BuildNaiveProgram(Graph g, const FrontEndOptions& options) {
  g.ops.clear();
  // The compute sequence: forward in module order, then backward in reverse.
  struct Use {
    int module;
    Phase phase;
  };
  std::vector<Use> seq;
  for (int m = 0; m < static_cast<int>(g.modules.size()); ++m) seq.push_back({m, Phase::kForward});
  for (int m = static_cast<int>(g.modules.size()) - 1; m >= 0; --m) seq.push_back({m, Phase::kBackward});
  const int np = static_cast<int>(g.params.size());
  // uses[p] = positions in seq that use p.
  std::vector<std::vector<int>> uses(np);
  for (int i = 0; i < static_cast<int>(seq.size()); ++i)
    for (int p : g.modules[seq[i].module].params) uses[p].push_back(i);

  int next_ag = 0, next_rs = 0;
  std::vector<std::string> live(np);  // all-gather id holding p, or ""
  for (int i = 0; i < static_cast<int>(seq.size()); ++i) {
    const ModuleInfo& m = g.modules[seq[i].module];
    std::vector<std::string> issued;
    for (int p : m.params) {
      if (!live[p].empty()) continue;
      Op ag;
      ag.kind = OpKind::kAllGather;
      ag.id = "%ag" + std::to_string(next_ag++);
      ag.params = {p};
      live[p] = ag.id;
      issued.push_back(ag.id);
      g.ops.push_back(ag);
    }
    for (const auto& id : issued) {
      Op w;
      w.kind = OpKind::kWait;
      w.id = id;
      g.ops.push_back(w);
    }
    Op c;
    c.kind = OpKind::kCompute;
    c.phase = seq[i].phase;
    c.module = seq[i].module;
    g.ops.push_back(c);
    // Which parameters this compute releases, and which it finishes the gradients of.
    std::vector<int> reduce;
    for (int p : m.params) {
      int next = -1;
      for (int u : uses[p])
        if (u > i) {
          next = u;
          break;
        }
      const bool last_use = next < 0;
      const bool reshard_gap = options.reshard_after_forward && seq[i].phase == Phase::kForward &&
                               seq[next < 0 ? i : next].phase == Phase::kBackward && next != i + 1;
      if (last_use || reshard_gap) {
        if (!live[p].empty()) {
          // A bucket of one parameter: freeing it frees p.
          Op f;
          f.kind = OpKind::kFree;
          f.id = live[p];
          g.ops.push_back(f);
          live[p].clear();
        }
      }
      if (last_use && seq[i].phase == Phase::kBackward) reduce.push_back(p);
    }
    for (int p : reduce) {
      Op rs;
      rs.kind = OpKind::kReduceScatter;
      rs.id = "%rs" + std::to_string(next_rs++);
      rs.params = {p};
      g.ops.push_back(rs);
      Op w;
      w.kind = OpKind::kWait;
      w.id = rs.id;
      g.ops.push_back(w);
      if (g.dp_replicate > 1) {
        Op ar;
        ar.kind = OpKind::kAllReduce;
        ar.id = "%ar" + rs.id.substr(3);
        ar.source = rs.id;
        g.ops.push_back(ar);
        Op wa;
        wa.kind = OpKind::kWait;
        wa.id = ar.id;
        g.ops.push_back(wa);
      }
    }
  }
  Op step;
  step.kind = OpKind::kOptimizerStep;
  g.ops.push_back(step);
  return g;
}

}  // namespace meshwork::compiler
