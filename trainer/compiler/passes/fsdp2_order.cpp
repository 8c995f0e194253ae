#include "trainer/compiler/passes/fsdp2_order.h"

#include <algorithm>
#include <optional>
#include <set>

#include "trainer/compiler/passes/checkpoint.h"
#include "trainer/compiler/passes/program_edit.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace fsdp2 {

using namespace edit;  // NOLINT: the op edits are this file's vocabulary

namespace {

// Moves reduce-scatter `ids[k]`'s wait (with its all-reduce) to just after reduce-scatter
// ids[k + 1] is issued (the last one: before optimizer_step); its all-reduce's wait goes right
// before optimizer_step. False if the wait is not there.
bool DelayOneWait(Graph& g, const std::vector<std::string>& ids, size_t k) {
  std::vector<Op> chain;
  std::set<size_t> drop;
  const int w = IndexOf(g, OpKind::kWait, ids[k]);
  if (w < 0) return false;
  chain.push_back(g.ops[w]);
  drop.insert(w);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].kind == OpKind::kAllReduce && g.ops[i].source == ids[k]) {
      chain.push_back(g.ops[i]);
      drop.insert(i);
      const int wa = IndexOf(g, OpKind::kWait, g.ops[i].id);
      if (wa >= 0) drop.insert(wa);
    }
  }
  Erase(g, drop);
  int at;
  if (k + 1 < ids.size()) {
    at = IndexOf(g, OpKind::kReduceScatter, ids[k + 1]) + 1;
  } else {
    at = IndexOf(g, OpKind::kOptimizerStep, "");
    if (at < 0) at = static_cast<int>(g.ops.size());
  }
  g.ops.insert(g.ops.begin() + at, chain.begin(), chain.end());
  if (chain.size() > 1) {
    Op wa;
    wa.kind = OpKind::kWait;
    wa.id = chain[1].id;
    int step = IndexOf(g, OpKind::kOptimizerStep, "");
    if (step < 0) step = static_cast<int>(g.ops.size());
    g.ops.insert(g.ops.begin() + step, wa);
  }
  return true;
}

// Every reduce-scatter's wait at the end of backward, in issue order, each followed by its
// all-reduce (HSDP), then every all-reduce's wait, then optimizer_step. No wait is left inside backward, so compute never blocks on gradients;
// the cost is that every full gradient stays allocated until the step. False if a wait is not
// there.
bool WaitAllAtStep(Graph& g, const std::vector<std::string>& ids) {
  std::vector<Op> chains, all_reduce_waits;
  std::set<size_t> drop;
  for (const std::string& id : ids) {
    const int w = IndexOf(g, OpKind::kWait, id);
    if (w < 0) return false;
    chains.push_back(g.ops[w]);
    drop.insert(w);
    for (size_t i = 0; i < g.ops.size(); ++i) {
      if (g.ops[i].kind != OpKind::kAllReduce || g.ops[i].source != id) continue;
      chains.push_back(g.ops[i]);
      drop.insert(i);
      const int wa = IndexOf(g, OpKind::kWait, g.ops[i].id);
      if (wa < 0) continue;
      all_reduce_waits.push_back(g.ops[wa]);
      drop.insert(wa);
    }
  }
  Erase(g, drop);
  int at = IndexOf(g, OpKind::kOptimizerStep, "");
  if (at < 0) at = static_cast<int>(g.ops.size());
  chains.insert(chains.end(), all_reduce_waits.begin(), all_reduce_waits.end());
  g.ops.insert(g.ops.begin() + at, chains.begin(), chains.end());
  return true;
}

}  // namespace

Graph BlockBuckets(Graph g, OpKind kind) {
  StripFrees(g);
  bool merged = true;
  while (merged) {
    merged = false;
    const auto idx = Collectives(g, kind);
    for (size_t k = 0; k + 1 < idx.size() && !merged; ++k) {
      bool compute_between = false;
      for (size_t j = idx[k] + 1; j < idx[k + 1]; ++j)
        if (g.ops[j].kind == OpKind::kCompute) compute_between = true;
      if (compute_between) continue;
      MergeInto(g, idx[k], idx[k + 1]);
      merged = true;
    }
  }
  return PlaceFrees(std::move(g));
}

int PrefetchOneMore(Graph& g, size_t a) {
  const int c = PrevCompute(g, a);
  if (c < 0) return -1;
  for (size_t j = static_cast<size_t>(c); j < a; ++j) {
    const Op& o = g.ops[j];
    if (UsesAny(g, o, g.ops[a].params)) return -1;
    if (o.kind == OpKind::kOptimizerStep) return -1;
  }
  MoveBefore(g, a, static_cast<size_t>(c));
  return c;
}

Graph DelayReduceScatterWaits(Graph g, const PassContext& ctx, bool as_eager_executor) {
  StripFrees(g);
  std::vector<std::string> ids;
  for (size_t i : Collectives(g, OpKind::kReduceScatter)) ids.push_back(g.ops[i].id);
  std::optional<Graph> best;
  double best_seconds = 0;
  auto consider = [&](Graph candidate) {
    Graph placed = PlaceFrees(std::move(candidate));
    if (!Acceptable(placed, ctx)) return;
    // Judged with FSDP2's prefetch applied, as every caller goes on to do: without it, waits
    // inside backward look worse than they are.
    const double t = Simulate(PrefetchOne(placed, ctx), ctx.cost).step_seconds;
    if (!best || t < best_seconds * (1 - 1e-6)) {
      best = std::move(placed);
      best_seconds = t;
    }
  };
  Graph one_behind = g;
  for (size_t k = 0; k < ids.size(); ++k) DelayOneWait(one_behind, ids, k);
  if (as_eager_executor) return PlaceFrees(std::move(one_behind));
  Graph at_step = g;
  if (WaitAllAtStep(at_step, ids)) consider(std::move(at_step));
  consider(std::move(one_behind));
  if (best) return std::move(*best);
  for (size_t k = 0; k < ids.size(); ++k) {
    Graph trial = g;
    if (!DelayOneWait(trial, ids, k)) continue;
    if (Acceptable(PlaceFrees(trial), ctx)) g = std::move(trial);
  }
  return PlaceFrees(std::move(g));
}

// FSDP2's prefetch: every all-gather issued one compute ahead of its use, budget permitting
// (one check when all of them together fit, as in DelayReduceScatterWaits).
Graph PrefetchOne(Graph g, const PassContext& ctx) {
  StripFrees(g);
  const size_t gathers = Collectives(g, OpKind::kAllGather).size();
  Graph all = g;
  for (size_t k = 0; k < gathers; ++k) PrefetchOneMore(all, Collectives(all, OpKind::kAllGather)[k]);
  Graph placed_all = PlaceFrees(std::move(all));
  if (Acceptable(placed_all, ctx)) return placed_all;
  for (size_t k = 0; k < gathers; ++k) {
    Graph trial = g;
    if (PrefetchOneMore(trial, Collectives(trial, OpKind::kAllGather)[k]) < 0) continue;
    if (Acceptable(PlaceFrees(trial), ctx)) g = std::move(trial);
  }
  return PlaceFrees(std::move(g));
}

Graph KeepGathered(const Graph& g, int m) {
  int fwd = -1, bwd = -1;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& o = g.ops[i];
    if (o.kind != OpKind::kCompute || o.module != m) continue;
    (o.phase == Phase::kForward ? fwd : bwd) = static_cast<int>(i);
  }
  if (fwd < 0 || bwd < 0) return g;
  std::set<int> mine(g.modules[m].params.begin(), g.modules[m].params.end());
  for (size_t k = 0; k < g.modules.size(); ++k) {
    if (static_cast<int>(k) == m) continue;
    for (int p : g.modules[k].params)
      if (mine.count(p)) return g;  // shared with another module
  }
  std::set<size_t> drop;
  std::set<int> regathered;
  for (int i = fwd + 1; i < bwd; ++i) {
    const Op& o = g.ops[i];
    if (o.kind != OpKind::kAllGather) continue;
    const bool any = std::any_of(o.params.begin(), o.params.end(), [&](int p) { return mine.count(p) > 0; });
    if (!any) continue;
    for (int p : o.params) {
      if (!mine.count(p)) return g;  // bucketed with other parameters: not this pass's input
      regathered.insert(p);
    }
    drop.insert(static_cast<size_t>(i));
    const int wait = IndexOf(g, OpKind::kWait, o.id, static_cast<size_t>(i));
    if (wait < 0 || wait > bwd) return g;
    drop.insert(static_cast<size_t>(wait));
  }
  if (regathered != mine) return g;
  Graph out = g;
  Erase(out, drop);
  return PlaceFrees(std::move(out));
}

Graph QuickOrder(const Graph& g, const PassContext& ctx) {
  Graph q = BlockBuckets(g, OpKind::kAllGather);
  q = BlockBuckets(std::move(q), OpKind::kReduceScatter);
  return PrefetchOne(DelayReduceScatterWaits(std::move(q), ctx, false), ctx);
}

}  // namespace fsdp2

Result<Graph> QuickPlan(const Graph& naive, const PassContext& ctx) {
  MW_ASSIGN_OR_RETURN(const Graph fitted, CheckpointToFit(naive, ctx));
  return edit::Checked(fsdp2::QuickOrder(fitted, ctx), "quick_plan");
}

Result<Graph> EagerPlan(const Graph& naive, const PassContext& ctx) {
  // As the eager executor runs FSDP2's defaults: the root's modules (all but the decoder layers)
  // and the last decoder layer stay gathered from their forward to their backward.
  Graph g = naive;
  bool last_layer = true;
  for (int m = static_cast<int>(naive.modules.size()) - 1; m >= 0; --m) {
    const bool layer = naive.modules[m].name.rfind("layers.", 0) == 0;
    if (layer && !last_layer) continue;
    g = fsdp2::KeepGathered(g, m);
    last_layer = last_layer && !layer;
  }
  g = fsdp2::BlockBuckets(std::move(g), OpKind::kAllGather);
  g = fsdp2::BlockBuckets(std::move(g), OpKind::kReduceScatter);
  PassContext unlimited = ctx;
  unlimited.memory_budget_bytes = 0;  // FSDP2's eager prefetch does not look at memory
  g = fsdp2::PrefetchOne(fsdp2::DelayReduceScatterWaits(std::move(g), unlimited, /*as_eager_executor=*/true), unlimited);
  return edit::Checked(std::move(g), "eager_plan");
}

}  // namespace meshwork::compiler
