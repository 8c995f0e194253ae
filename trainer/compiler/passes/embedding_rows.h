// The embedding_rows pass (a choice pass: it changes what is communicated): the embedding read
// by rows (compiler::ReadByRows): each rank fetches the rows of its micro-batch's tokens
// (row_gather) and sums their gradients into the owners' shards (row_reduce) instead of the
// table's all-gathers and reduce-scatters. Only with dp_shard over 1 and no replicas (HSDP
// would need the rows' gradients across replicas too). Each rank's row exchange grows with
// dp_shard (every rank's rows), the table's collectives do not, so reading by rows can only win
// by taking the table's collectives off the critical path: it is offered when the row exchange
// takes less time than the collectives it relieves (always with kAlways), and the pipeline
// keeps the plan that fits the budget, then the faster.
#pragma once

#include "common/status.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"
#include "trainer/compiler/plan_options.h"

namespace meshwork::compiler {

// The pass's own options: when to offer the rows, and the front end's options that the naive
// program is rebuilt with.
struct RowsChoiceOptions {
  PlanOptions::Rows when = PlanOptions::Rows::kWhenFaster;
  FrontEndOptions front_end;
};

// `naive`: the front end's program (BuildNaiveProgram), whose module table it rewrites.
Result<Choice> ChooseEmbeddingRows(const Graph& naive, const PassContext& ctx, const RowsChoiceOptions& options);

}  // namespace meshwork::compiler
