// The compiler's passes: each a named `Graph -> Graph` function, tested on golden IR text, run
// in a pipeline that validates the program after every pass and can print it (--dump-plan).
//
//   async_tp
//       overlapped tensor parallelism, per module with tensor-parallel exchanges (tp=): split each
//       exchange and the matmul beside it into the chunks (1, 2, 4 or 8; atp=) that the cost
//       model says leave the least of the exchanges exposed (CostModel::TpExposedSeconds): more
//       chunks hide more bandwidth time and pay more latencies. A module-local choice: the tp
//       link is its own, so no other op's timing changes with it.
//   checkpoint
//       activation checkpointing per module, under the memory budget: while the least-memory
//       program (the naive one: one bucket gathered at a time, every reduce-scatter waited for
//       at once) holds more than the budget, checkpoint the next candidate module (ckpt= in the
//       IR), earliest layer first (its activations are held longest). Checkpointing only costs
//       time (the recompute), so no more modules than the budget needs.
//   keep_gathered
//       reshard-after-forward per layer, under the memory budget: last layer first, keep a
//       layer's parameters gathered from its forward to its backward (no re-gather) while the
//       budget holds it and the simulator says the step gets faster (the re-gather was exposed
//       communication); stops at the first layer that does not fit.
//   bucket_all_gathers / bucket_reduce_scatters
//       none: one collective per parameter (as declared). block: one per module (FSDP2's
//       grouping). auto: greedy, in program order: grow a bucket by the next module's
//       collective while the bucket's communication still hides under the compute next to it
//       (the compute it would overlap once reordered) and the predicted peak memory stays
//       within the budget.
//   reorder
//       prefetch: move each all-gather's issue before the compute that precedes its wait (one
//       bucket ahead, as FSDP2's prefetch), then keep moving it earlier while its
//       communication is not hidden yet and the memory budget holds; delay each
//       reduce-scatter's wait until just before the next reduce-scatter's wait (or the
//       optimizer step), so it overlaps the next module's backward. A budget too small for
//       any prefetch leaves the naive order.
//   insert_frees
//       frees each gathered bucket right after its last use before it is gathered again (or
//       the end of the step): gathered memory lives exactly as long as needed.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/compiler/bucketing.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/ir.h"

namespace meshwork::compiler {


struct PassContext {
  CostModel cost;
  Bucketing bucketing = Bucketing::kBlock;
  int64_t memory_budget_bytes = 0;  // dynamic bytes (gathered + activations + grads); 0 = none
};

Result<Graph> AsyncTensorParallel(const Graph& g, const PassContext& ctx);
Result<Graph> CheckpointToFit(const Graph& g, const PassContext& ctx);
Result<Graph> KeepGatheredWithinBudget(const Graph& g, const PassContext& ctx);
Result<Graph> BucketAllGathers(const Graph& g, const PassContext& ctx);
Result<Graph> BucketReduceScatters(const Graph& g, const PassContext& ctx);
Result<Graph> Reorder(const Graph& g, const PassContext& ctx);
Result<Graph> InsertFrees(const Graph& g, const PassContext& ctx);

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

struct Pass {
  std::string name;
  bool optional = true;  // can be disabled by name; required passes cannot
  std::function<Result<Graph>(const Graph&, const PassContext&)> run;
};

class Pipeline {
 public:
  // async_tp, checkpoint, keep_gathered, bucket_all_gathers, bucket_reduce_scatters, reorder,
  // insert_frees (required).
  static Pipeline Default();

  // kInvalidConfig naming the pass when it is unknown or required.
  Status Disable(const std::string& name);
  // Names in order, disabled ones marked: "bucket_all_gathers, reorder (disabled), ...".
  std::string Describe() const;
  // Runs every enabled pass, validating after each; `dump` (optional) gets the IR before the
  // first pass and after each one, under "== <pass> ==" headers.
  Result<Graph> Run(Graph g, const PassContext& ctx, std::ostream* dump = nullptr) const;

 private:
  std::vector<Pass> passes_;
  std::vector<bool> enabled_;
};

}  // namespace meshwork::compiler
