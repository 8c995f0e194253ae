#include "trainer/compiler/frontend.h"

#include <algorithm>
#include <map>
#include <set>
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

  // Parameters of one flat group move together (ParamInfo::group); the others each alone.
  auto group_of = [&](int p) { return g.params[p].group >= 0 ? g.params[p].group : -1 - p; };
  int next_ag = 0, next_rs = 0, next_rg = 0, next_rr = 0;
  // The last backward reading each parameter by rows: its row_reduce follows it.
  std::vector<int> last_rows_bwd(np, -1);
  for (int i = 0; i < static_cast<int>(seq.size()); ++i)
    if (seq[i].phase == Phase::kBackward)
      for (int p : g.modules[seq[i].module].rows) last_rows_bwd[p] = i;
  std::vector<bool> rows_gathered(np, false);
  auto emit_with_wait = [&](OpKind kind, const std::string& id, std::vector<int> params) {
    Op op;
    op.kind = kind;
    op.id = id;
    op.params = std::move(params);
    g.ops.push_back(op);
    Op w;
    w.kind = OpKind::kWait;
    w.id = id;
    g.ops.push_back(w);
  };
  std::vector<std::string> live(np);  // all-gather id holding p, or ""
  for (int i = 0; i < static_cast<int>(seq.size()); ++i) {
    const ModuleInfo& m = g.modules[seq[i].module];
    // One all-gather per flat group this compute needs and nothing holds: the whole group.
    std::vector<Op> gathers;
    std::map<int, size_t> gather_of;  // group -> index in gathers
    for (int p : m.params) {
      if (!live[p].empty()) continue;
      const int group = group_of(p);
      if (gather_of.count(group)) continue;
      Op ag;
      ag.kind = OpKind::kAllGather;
      ag.id = "%ag" + std::to_string(next_ag++);
      for (int q = 0; q < np; ++q)
        if (group_of(q) == group) {
          ag.params.push_back(q);
          live[q] = ag.id;
        }
      gather_of[group] = gathers.size();
      gathers.push_back(ag);
    }
    for (const Op& ag : gathers) g.ops.push_back(ag);
    for (const Op& ag : gathers) {
      Op w;
      w.kind = OpKind::kWait;
      w.id = ag.id;
      g.ops.push_back(w);
    }
    // The rows this compute reads and nothing fetched yet: one row_gather.
    std::vector<int> rows;
    for (int p : m.rows)
      if (!rows_gathered[p]) rows.push_back(p), rows_gathered[p] = true;
    if (!rows.empty()) emit_with_wait(OpKind::kRowGather, "%rg" + std::to_string(next_rg++), rows);
    Op c;
    c.kind = OpKind::kCompute;
    c.phase = seq[i].phase;
    c.module = seq[i].module;
    g.ops.push_back(c);
    // Which parameters this compute releases, and which it finishes the gradients of.
    std::set<int> release;
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
      if (last_use || reshard_gap) release.insert(p);
      if (last_use && seq[i].phase == Phase::kBackward) reduce.push_back(p);
    }
    // A gathering is freed once every parameter it holds is released.
    std::vector<std::string> freed;
    for (int p : m.params) {
      const std::string id = live[p];
      if (id.empty() || std::find(freed.begin(), freed.end(), id) != freed.end()) continue;
      bool all = true;
      for (int q = 0; q < np; ++q)
        if (live[q] == id && !release.count(q)) all = false;
      if (!all) continue;
      Op f;
      f.kind = OpKind::kFree;
      f.id = id;
      g.ops.push_back(f);
      freed.push_back(id);
      for (int q = 0; q < np; ++q)
        if (live[q] == id) live[q].clear();
    }
    // One reduce-scatter per flat group whose gradients are complete.
    std::vector<std::vector<int>> buckets;
    std::map<int, size_t> bucket_of;
    for (int p : reduce) {
      const int group = group_of(p);
      auto it = bucket_of.find(group);
      if (it == bucket_of.end()) {
        it = bucket_of.emplace(group, buckets.size()).first;
        buckets.emplace_back();
      }
      buckets[it->second].push_back(p);
    }
    for (auto& params : buckets) {
      Op rs;
      rs.kind = OpKind::kReduceScatter;
      rs.id = "%rs" + std::to_string(next_rs++);
      rs.params = std::move(params);
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
    // The row gradients this backward finished: one row_reduce.
    std::vector<int> row_grads;
    for (int p : m.rows)
      if (last_rows_bwd[p] == i) row_grads.push_back(p);
    if (!row_grads.empty()) emit_with_wait(OpKind::kRowReduce, "%rr" + std::to_string(next_rr++), row_grads);
  }
  Op step;
  step.kind = OpKind::kOptimizerStep;
  g.ops.push_back(step);
  return g;
}

void ReadByRows(Graph& g) {
  std::vector<bool> seen(g.params.size(), false);
  for (ModuleInfo& m : g.modules) {
    std::vector<int> dense;
    for (int p : m.params) {
      const bool first = !seen[p];
      seen[p] = true;
      (first && g.params[p].row_bytes > 0 ? m.rows : dense).push_back(p);
    }
    if (!m.rows.empty() && dense.empty()) m.bwd_seconds = std::min(m.bwd_seconds, m.fwd_seconds);
    m.params = std::move(dense);
  }
}

void SplitByVocabulary(Graph& g) {
  std::vector<bool> by_rows(g.params.size(), false);
  for (ModuleInfo& m : g.modules) {
    for (int p : m.rows) by_rows[p] = true;
    std::vector<int> whole;
    for (int p : m.params) (by_rows[p] ? m.vocab : whole).push_back(p);
    m.params = std::move(whole);
  }
}

void GroupByOwner(Graph& g) {
  for (auto& p : g.params) p.group = -1;
  for (int m = 0; m < static_cast<int>(g.modules.size()); ++m)
    for (int p : g.modules[m].params)
      if (g.params[p].group < 0) g.params[p].group = m;
}

}  // namespace meshwork::compiler
