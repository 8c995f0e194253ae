// The async_tp pass: overlapped tensor parallelism, per module with tensor-parallel exchanges
// (tp=): split each exchange and the matmul beside it into the chunks (1, 2, 4 or 8; atp=) that
// the cost model says leave the least of the exchanges exposed (CostModel::TpExposedSeconds):
// more chunks hide more bandwidth time and pay more latencies. A module-local choice: the tp
// link is its own, so no other op's timing changes with it. Only chunk counts that divide each
// rank's tokens are considered (AsyncTpOptions): the trainer runs a layer whose tokens do not
// divide into its chunks with its exchanges whole, and a plan that counted on their overlap
// would be priced for a step that never runs.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

struct AsyncTpOptions {
  // The tokens of a micro-batch each tp rank holds between the regions (sequence parallelism);
  // 0: unknown (the simulator's profiles), every chunk count is considered.
  int64_t tokens_per_rank = 0;
};

Result<Graph> AsyncTensorParallel(const Graph& g, const PassContext& ctx, const AsyncTpOptions& options = {});

}  // namespace meshwork::compiler
