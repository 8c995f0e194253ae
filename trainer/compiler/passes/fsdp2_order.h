// FSDP2's schedule as program edits (block buckets, one-ahead prefetch, reduce-scatters waited
// for one behind), what several passes start from or judge by, and the two plans made of it
// alone: the eager plan and the quick plan.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

// The eager baseline as a plan: what the eager executor (trainer/fsdp/eager_schedule) does, one
// all-gather and one reduce-scatter per module, the root's modules and the last decoder layer
// kept gathered from their forward to their backward, each all-gather issued one compute ahead, each
// reduce-scatter waited for once the next one is issued (FSDP2's one in flight); no memory
// budget. The simulator compares plans with it, and its peak is the compiled plan's default
// budget.
Result<Graph> EagerPlan(const Graph& naive, const PassContext& ctx);

// A fast stand-in for the pipeline's result, with no search: checkpointing to fit the budget,
// then FSDP2's order (block buckets, one-ahead prefetch, delayed reduce-scatter waits) within
// it. ChooseMesh ranks meshes by it; the chosen one is then planned in full.
Result<Graph> QuickPlan(const Graph& naive, const PassContext& ctx);

namespace fsdp2 {

// Block bucketing: collectives of `kind` with no compute between them become one.
Graph BlockBuckets(Graph g, OpKind kind);
// Moves all-gather `a` to before the compute preceding it, when none of the computes it
// passes uses its parameters (they still hold the previous gathering). Returns the new index,
// or -1 when it cannot move.
int PrefetchOneMore(Graph& g, size_t a);
// FSDP2's prefetch: every all-gather issued one compute ahead of its use, budget permitting.
Graph PrefetchOne(Graph g, const PassContext& ctx);
// Where each reduce-scatter is waited for (with its all-reduce). The eager executor's way
// (FSDP2's): each wait just after the next reduce-scatter is issued, one in flight (the last
// ones before optimizer_step, all-reduce waits last: with HSDP this starts the all-reduces
// during backward). Else the faster, by the simulator, of that and every wait at the optimizer
// step, among those within the budget; under a budget that takes neither whole, move by move,
// each kept only if the program stays valid and within the budget.
Graph DelayReduceScatterWaits(Graph g, const PassContext& ctx, bool as_eager_executor);
// `g` (unbucketed: one all-gather per flat group) with module `m`'s parameters kept gathered
// from its forward to its backward: the re-gather before its backward (the all-gather and its
// wait) is dropped and the frees placed again. Unchanged when a parameter of `m` is not
// re-gathered in exactly that way (a bucket shared with other parameters, a tied weight used by
// another module, or no reshard in the first place).
Graph KeepGathered(const Graph& g, int m);
// FSDP2's order (block buckets, one-ahead prefetch, reduce-scatter waits delayed) within the
// budget.
Graph QuickOrder(const Graph& g, const PassContext& ctx);

}  // namespace fsdp2
}  // namespace meshwork::compiler
