// The reorder pass. prefetch: move each all-gather's issue before the compute that precedes its
// wait (one bucket ahead, as FSDP2's prefetch), then keep moving it earlier while its
// communication is not hidden yet and the memory budget holds; delay each reduce-scatter's wait
// until just before the next reduce-scatter's wait (or the optimizer step), so it overlaps the
// next module's backward. A budget too small for any prefetch leaves the naive order.
#pragma once

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

Result<Graph> Reorder(const Graph& g, const PassContext& ctx);

}  // namespace meshwork::compiler
