// The bucket_all_gathers and bucket_reduce_scatters passes: one algorithm over either kind of
// collective, with its own option, the bucketing (fsdp.bucketing). none: one collective per
// flat group (as declared). block: one per module (FSDP2's grouping). auto: greedy, in program
// order: grow a bucket by the next module's collective while the predicted step (with FSDP2's
// prefetch and delayed reduce-scatter waits) gets faster and the peak stays within the budget.
#pragma once

#include "common/status.h"
#include "trainer/compiler/bucketing.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

Result<Graph> BucketAllGathers(const Graph& g, const PassContext& ctx, Bucketing bucketing);
Result<Graph> BucketReduceScatters(const Graph& g, const PassContext& ctx, Bucketing bucketing);

}  // namespace meshwork::compiler
