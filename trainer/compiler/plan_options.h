// What a step is planned with: the options every caller (the trainer's config through
// config::PlanOptionsOf, meshwork-simulate, mesh choice, tests) gives the planner, which the
// pass registry (passes/registry.h) hands out to each pass as that pass's own options.
#pragma once

#include <cstdint>

#include "trainer/compiler/bucketing.h"

namespace meshwork::compiler {

// The dynamic bytes (gathered weights, activations, gradients) the compiled plan may hold.
struct MemoryBudget {
  enum class Source {
    kEagerPeak,     // no more than the eager plan would: compiled FSDP is there to be lighter
                    // than eager, and faster only within that (the trainer's default)
    kFixed,         // `bytes`; 0: no limit
    kDeviceMemory,  // `bytes` of device memory less the static shards (the simulator): the
                    // plan checkpoints activations and waits early where eager would not fit;
                    // where the shards alone overflow it, the eager plan's peak
  };
  Source source = Source::kEagerPeak;
  int64_t bytes = 0;
};

struct PlanOptions {
  Bucketing bucketing = Bucketing::kAuto;  // the bucket_all_gathers and bucket_reduce_scatters passes'
  bool reorder = true;  // false: the reorder pass is disabled
  bool reshard_after_forward = true;  // the front end's (BuildNaiveProgram), which the choice passes rebuild with
  // Whether the compiled plan reads the embedding by rows (the embedding_rows pass). Only possible
  // with dp_shard over 1 and no replicas (HSDP would need the rows' gradients across replicas
  // too). kWhenFaster: planned both ways when the rows' exchange moves less than the table's
  // collectives, and the plan that fits the budget, then the faster, is kept.
  enum class Rows { kNever, kWhenFaster, kAlways };
  Rows read_by_rows = Rows::kWhenFaster;
  // Whether a tied output head splits the table by vocabulary (the vocab_split pass), on
  // top of reading it by rows (so never where read_by_rows cannot be): kWhenFaster plans it and
  // keeps it when it fits the budget and is predicted faster than the plan chosen without it.
  Rows split_by_vocabulary = Rows::kWhenFaster;
  // Whether the async_tp pass may overlap tensor parallelism's exchanges with their matmuls
  // (passes/async_tp.h); false: disabled, as torchtitan's TP without async TP.
  bool async_tp = true;
  // The tokens of a micro-batch each tp rank holds between the regions, which the async_tp pass's
  // chunks must divide (AsyncTpOptions::tokens_per_rank); 0: unknown, any chunks.
  int64_t tp_tokens_per_rank = 0;
  MemoryBudget budget;
};

}  // namespace meshwork::compiler
