#include "trainer/compiler/passes/bucket.h"

#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/passes/program_edit.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

using namespace edit;  // NOLINT: the op edits are this file's vocabulary

namespace {

// Auto bucketing: greedy in program order; merge the next collective of `kind` into the
// current bucket while the predicted step (with FSDP2-style prefetch and delayed
// reduce-scatter waits) gets faster and the peak stays within the budget.
Graph AutoBuckets(Graph g, OpKind kind, const PassContext& ctx) {
  g = fsdp2::BlockBuckets(std::move(g), kind);
  auto evaluate = [&](const Graph& candidate) {
    return fsdp2::PrefetchOne(fsdp2::DelayReduceScatterWaits(candidate, ctx, false), ctx);
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

Graph Buckets(const Graph& g, OpKind kind, const PassContext& ctx, Bucketing bucketing) {
  switch (bucketing) {
    case Bucketing::kNone: return g;
    case Bucketing::kBlock: return fsdp2::BlockBuckets(g, kind);
    case Bucketing::kAuto: return AutoBuckets(g, kind, ctx);
  }
  return g;
}

}  // namespace

Result<Graph> BucketAllGathers(const Graph& g, const PassContext& ctx, Bucketing bucketing) {
  return Buckets(g, OpKind::kAllGather, ctx, bucketing);
}

Result<Graph> BucketReduceScatters(const Graph& g, const PassContext& ctx, Bucketing bucketing) {
  return Buckets(g, OpKind::kReduceScatter, ctx, bucketing);
}

}  // namespace meshwork::compiler
