// The keep_gathered pass: reshard-after-forward per layer, under the memory budget. Last layer
// first, keep a layer's parameters gathered from its forward to its backward (no re-gather)
// while the budget holds it and the simulator says the step gets faster (the re-gather was
// exposed communication); stops at the first layer that does not fit.
#pragma once

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

Result<Graph> KeepGatheredWithinBudget(const Graph& g, const PassContext& ctx);

}  // namespace meshwork::compiler
