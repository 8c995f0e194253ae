#include "trainer/compiler/passes.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

bool UsesAny(const Graph& g, const Op& compute, const std::vector<int>& params) {
  if (compute.kind != OpKind::kCompute) return false;
  for (int p : g.modules[compute.module].params)
    if (std::find(params.begin(), params.end(), p) != params.end()) return true;
  return false;
}

int IndexOf(const Graph& g, OpKind kind, const std::string& id, size_t from = 0) {
  for (size_t i = from; i < g.ops.size(); ++i)
    if (g.ops[i].kind == kind && g.ops[i].id == id) return static_cast<int>(i);
  return -1;
}

void Erase(Graph& g, const std::set<size_t>& indices) {
  std::vector<Op> kept;
  kept.reserve(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (!indices.count(i)) kept.push_back(std::move(g.ops[i]));
  g.ops = std::move(kept);
}

void StripFrees(Graph& g) {
  std::set<size_t> frees;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == OpKind::kFree) frees.insert(i);
  Erase(g, frees);
}

// Moves op `from` to just before index `to` (to < from).
void MoveBefore(Graph& g, size_t from, size_t to) {
  Op op = std::move(g.ops[from]);
  g.ops.erase(g.ops.begin() + static_cast<std::ptrdiff_t>(from));
  g.ops.insert(g.ops.begin() + static_cast<std::ptrdiff_t>(to), std::move(op));
}

// Frees every all-gathered bucket right after its last use before any of its parameters is
// gathered again (or the end of the step); a bucket nobody uses is freed after its wait.
// One linear scan: a bucket stops collecting uses once one of its parameters is re-gathered.
Graph PlaceFrees(Graph g) {
  StripFrees(g);
  std::map<std::string, int> last_use;  // all-gather id -> op index its free follows
  std::map<std::string, bool> closed;
  std::vector<std::string> holder(g.params.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& o = g.ops[i];
    if (o.kind == OpKind::kAllGather) {
      for (int p : o.params) {
        if (!holder[p].empty()) closed[holder[p]] = true;
        holder[p] = o.id;
      }
      closed[o.id] = false;
    } else if (o.kind == OpKind::kWait && closed.count(o.id) && !last_use.count(o.id)) {
      last_use[o.id] = static_cast<int>(i);
    } else if (o.kind == OpKind::kCompute) {
      for (int p : g.modules[o.module].params) {
        const std::string& h = holder[p];
        if (!h.empty() && !closed[h] && last_use.count(h)) last_use[h] = std::max(last_use[h], static_cast<int>(i));
      }
    }
  }
  std::map<int, std::vector<std::string>> after;  // op index -> ids to free after it
  for (size_t i = 0; i < g.ops.size(); ++i)  // in issue order
    if (g.ops[i].kind == OpKind::kAllGather && last_use.count(g.ops[i].id))
      after[last_use[g.ops[i].id]].push_back(g.ops[i].id);
  std::vector<Op> out;
  out.reserve(g.ops.size() + last_use.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    out.push_back(g.ops[i]);
    auto it = after.find(static_cast<int>(i));
    if (it == after.end()) continue;
    for (const auto& id : it->second) {
      Op f;
      f.kind = OpKind::kFree;
      f.id = id;
      out.push_back(f);
    }
  }
  g.ops = std::move(out);
  return g;
}

bool WithinBudget(const Graph& g, const PassContext& ctx) {
  return ctx.memory_budget_bytes <= 0 || PeakBytes(g) <= ctx.memory_budget_bytes;
}

// Merges the collective `victim` (an all_gather or reduce_scatter) into `keeper`: keeper takes
// its parameters; victim, its wait and (HSDP) its all_reduce and that one's wait are removed.
void MergeInto(Graph& g, size_t keeper, size_t victim) {
  const std::string vid = g.ops[victim].id;
  auto& kp = g.ops[keeper].params;
  kp.insert(kp.end(), g.ops[victim].params.begin(), g.ops[victim].params.end());
  std::set<size_t> drop{victim};
  std::string ar_id;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& o = g.ops[i];
    if (o.kind == OpKind::kWait && o.id == vid) drop.insert(i);
    if (o.kind == OpKind::kAllReduce && o.source == vid) {
      drop.insert(i);
      ar_id = o.id;
    }
  }
  if (!ar_id.empty())
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].kind == OpKind::kWait && g.ops[i].id == ar_id) drop.insert(i);
  Erase(g, drop);
}

// Indices of collectives of `kind`, program order.
std::vector<size_t> Collectives(const Graph& g, OpKind kind) {
  std::vector<size_t> v;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == kind) v.push_back(i);
  return v;
}

// Block bucketing: collectives of `kind` with no compute between them become one.
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

// The nearest compute before index `i`, or -1.
int PrevCompute(const Graph& g, size_t i) {
  for (size_t j = i; j-- > 0;)
    if (g.ops[j].kind == OpKind::kCompute) return static_cast<int>(j);
  return -1;
}

// Moves all-gather `a` to before the compute preceding it, when none of the computes it
// passes uses its parameters (they still hold the previous gathering). Returns the new index,
// or -1 when it cannot move.
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

bool Acceptable(const Graph& placed, const PassContext& ctx) {
  return WithinBudget(placed, ctx) && Validate(placed).ok();
}

// Where each reduce-scatter is waited for (with its all-reduce). The eager executor's way
// (FSDP2's): each wait just after the next reduce-scatter is issued, one in flight (the last
// ones before optimizer_step, all-reduce waits last: with HSDP this starts the all-reduces
// during backward). Else the faster, by the simulator, of that and every wait at the optimizer
// step (WaitAllAtStep), among those within the budget; under a budget that takes neither whole,
// move by move, each kept only if the program stays valid and within the budget.
Graph PrefetchOne(Graph g, const PassContext& ctx);

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

double StepSeconds(const Graph& g, const PassContext& ctx) { return Simulate(g, ctx.cost).step_seconds; }

// Auto bucketing: greedy in program order; merge the next collective of `kind` into the
// current bucket while the predicted step (with FSDP2-style prefetch and delayed
// reduce-scatter waits) gets faster and the peak stays within the budget.
Graph AutoBuckets(Graph g, OpKind kind, const PassContext& ctx) {
  g = BlockBuckets(std::move(g), kind);
  auto evaluate = [&](const Graph& candidate) {
    return PrefetchOne(DelayReduceScatterWaits(candidate, ctx, false), ctx);
  };
  double best = StepSeconds(evaluate(g), ctx);
  size_t k = 0;
  while (true) {
    Graph stripped = g;
    StripFrees(stripped);
    const auto idx = Collectives(stripped, kind);
    if (k + 1 >= idx.size()) break;
    Graph trial = stripped;
    bool ok = true;
    if (kind == OpKind::kAllGather) {
      // The next bucket is gathered together with this one: its parameters must not be held
      // by an earlier gathering that is still in use between the two issues.
      for (size_t j = idx[k]; j < idx[k + 1]; ++j)
        if (UsesAny(trial, trial.ops[j], trial.ops[idx[k + 1]].params)) ok = false;
      if (ok) MergeInto(trial, idx[k], idx[k + 1]);
    } else {
      // Gradients of this bucket wait for the next one's to be ready.
      MergeInto(trial, idx[k + 1], idx[k]);
    }
    if (ok) {
      Graph placed = PlaceFrees(trial);
      if (Validate(placed).ok()) {
        Graph planned = evaluate(placed);
        const double t = StepSeconds(planned, ctx);
        if (t < best * (1 - 1e-4) && WithinBudget(planned, ctx)) {
          g = std::move(placed);
          best = t;
          continue;  // keep growing the same bucket
        }
      }
    }
    ++k;
  }
  return PlaceFrees(std::move(g));
}

Result<Graph> Checked(Graph g, const char* pass) {
  if (Status s = Validate(g); !s.ok()) return Internal(std::string(pass) + " produced an invalid program: " + s.message());
  return g;
}

}  // namespace

Result<Graph> BucketAllGathers(const Graph& g, const PassContext& ctx) {
  switch (ctx.bucketing) {
    case Bucketing::kNone: return g;
    case Bucketing::kBlock: return BlockBuckets(g, OpKind::kAllGather);
    case Bucketing::kAuto: return AutoBuckets(g, OpKind::kAllGather, ctx);
  }
  return g;
}

Result<Graph> BucketReduceScatters(const Graph& g, const PassContext& ctx) {
  switch (ctx.bucketing) {
    case Bucketing::kNone: return g;
    case Bucketing::kBlock: return BlockBuckets(g, OpKind::kReduceScatter);
    case Bucketing::kAuto: return AutoBuckets(g, OpKind::kReduceScatter, ctx);
  }
  return g;
}

Result<Graph> Reorder(const Graph& input, const PassContext& ctx) {
  // FSDP2's order first (one ahead, waits delayed), then each all-gather whose wait is still
  // exposed moves further ahead while that makes the step faster within the budget.
  Graph g = PrefetchOne(DelayReduceScatterWaits(input, ctx, false), ctx);
  double best = StepSeconds(g, ctx);
  for (int round = 0; round < 8; ++round) {
    bool changed = false;
    StripFrees(g);
    const auto ags = Collectives(g, OpKind::kAllGather);
    for (size_t k = 0; k < ags.size(); ++k) {
      Graph trial = g;
      const size_t a = Collectives(trial, OpKind::kAllGather)[k];
      if (PrefetchOneMore(trial, a) < 0) continue;
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

Result<Graph> InsertFrees(const Graph& g, const PassContext&) { return PlaceFrees(g); }

namespace {

// `g` (unbucketed: one all-gather per flat group) with module `m`'s parameters kept gathered
// from its forward to its backward: the re-gather before its backward (the all-gather and its
// wait) is dropped and the frees placed again. Unchanged when a parameter of `m` is not
// re-gathered in exactly that way (a bucket shared with other parameters, a tied weight used by
// another module, or no reshard in the first place).
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

// FSDP2's order (block buckets, one-ahead prefetch, reduce-scatter waits delayed) within the
// budget: what keep_gathered decides on.
Graph QuickOrder(const Graph& g, const PassContext& ctx) {
  Graph q = BlockBuckets(g, OpKind::kAllGather);
  q = BlockBuckets(std::move(q), OpKind::kReduceScatter);
  return PrefetchOne(DelayReduceScatterWaits(std::move(q), ctx, false), ctx);
}

}  // namespace

Result<Graph> KeepGatheredWithinBudget(const Graph& g, const PassContext& ctx) {
  if (ctx.memory_budget_bytes <= 0) return g;
  Graph best = g;
  double best_seconds = Simulate(QuickOrder(best, ctx), ctx.cost).step_seconds;
  // Last layer first: its forward and backward are closest, so it holds the memory least long.
  for (int m = static_cast<int>(g.modules.size()) - 1; m >= 0; --m) {
    if (g.modules[m].name.rfind("layers.", 0) != 0) continue;
    Graph candidate = KeepGathered(best, m);
    if (candidate.ops.size() == best.ops.size()) continue;  // not re-gathered: nothing to keep
    const Graph quick = QuickOrder(candidate, ctx);
    if (PeakBytes(quick) > ctx.memory_budget_bytes) break;
    const double seconds = Simulate(quick, ctx.cost).step_seconds;
    if (seconds >= best_seconds * (1 - 1e-3)) continue;  // the communication it saves was hidden
    best = std::move(candidate);
    best_seconds = seconds;
  }
  return best;
}

Result<Graph> QuickPlan(const Graph& naive, const PassContext& ctx) {
  MW_ASSIGN_OR_RETURN(const Graph fitted, CheckpointToFit(naive, ctx));
  return Checked(QuickOrder(fitted, ctx), "quick_plan");
}

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

Result<Graph> EagerPlan(const Graph& naive, const PassContext& ctx) {
  // As the eager executor runs FSDP2's defaults: the root's modules (all but the decoder layers)
  // and the last decoder layer stay gathered from their forward to their backward.
  Graph g = naive;
  bool last_layer = true;
  for (int m = static_cast<int>(naive.modules.size()) - 1; m >= 0; --m) {
    const bool layer = naive.modules[m].name.rfind("layers.", 0) == 0;
    if (layer && !last_layer) continue;
    g = KeepGathered(g, m);
    last_layer = last_layer && !layer;
  }
  g = BlockBuckets(std::move(g), OpKind::kAllGather);
  g = BlockBuckets(std::move(g), OpKind::kReduceScatter);
  PassContext unlimited = ctx;
  unlimited.memory_budget_bytes = 0;  // FSDP2's eager prefetch does not look at memory
  g = PrefetchOne(DelayReduceScatterWaits(std::move(g), unlimited, /*as_eager_executor=*/true), unlimited);
  return Checked(std::move(g), "eager_plan");
}

Result<Graph> AsyncTensorParallel(const Graph& in, const PassContext& ctx) {
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

Pipeline Pipeline::Default() {
  Pipeline p;
  p.passes_ = {
      {"async_tp", true, AsyncTensorParallel},
      {"checkpoint", true, CheckpointToFit},
      {"keep_gathered", true, KeepGatheredWithinBudget},
      {"bucket_all_gathers", true, BucketAllGathers},
      {"bucket_reduce_scatters", true, BucketReduceScatters},
      {"reorder", true, Reorder},
      {"insert_frees", false, InsertFrees},
  };
  p.enabled_.assign(p.passes_.size(), true);
  return p;
}

Status Pipeline::Disable(const std::string& name) {
  std::string known;
  for (size_t i = 0; i < passes_.size(); ++i) {
    if (passes_[i].name == name) {
      if (!passes_[i].optional) return InvalidConfig("pass '" + name + "' is required and cannot be disabled");
      enabled_[i] = false;
      return Status::Ok();
    }
    known += (i ? ", " : "") + passes_[i].name;
  }
  return InvalidConfig("unknown pass '" + name + "' (passes: " + known + ")");
}

std::string Pipeline::Describe() const {
  std::string s;
  for (size_t i = 0; i < passes_.size(); ++i) {
    s += (i ? ", " : "") + passes_[i].name;
    if (!enabled_[i]) s += " (disabled)";
  }
  return s;
}

Result<Graph> Pipeline::Run(Graph g, const PassContext& ctx, std::ostream* dump) const {
  if (Status s = Validate(g); !s.ok()) return Internal("input program: " + s.message());
  if (dump) *dump << "== input ==\n" << Print(g);
  for (size_t i = 0; i < passes_.size(); ++i) {
    if (!enabled_[i]) {
      if (dump) *dump << "== " << passes_[i].name << " (disabled) ==\n";
      continue;
    }
    auto out = passes_[i].run(g, ctx);
    if (!out.ok()) return out.status();
    MW_ASSIGN_OR_RETURN(g, Checked(std::move(out).value(), passes_[i].name.c_str()));
    if (dump) *dump << "== " << passes_[i].name << " ==\n" << Print(g);
  }
  return g;
}

}  // namespace meshwork::compiler
