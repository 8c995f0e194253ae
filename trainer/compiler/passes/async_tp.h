// The async_tp pass: overlapped tensor parallelism, per module with tensor-parallel exchanges
// (tp=): split each exchange and the matmul beside it into the chunks (1, 2, 4 or 8; atp=) that
// the cost model says leave the least of the exchanges exposed (CostModel::TpExposedSeconds):
// more chunks hide more bandwidth time and pay more latencies. A module-local choice: the tp
// link is its own, so no other op's timing changes with it.
#pragma once

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

Result<Graph> AsyncTensorParallel(const Graph& g, const PassContext& ctx);

}  // namespace meshwork::compiler
