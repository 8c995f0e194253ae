// The insert_frees pass (required, last): frees each gathered bucket right after its last use
// before it is gathered again (or the end of the step), so gathered memory lives exactly as
// long as needed.
#pragma once

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

Result<Graph> InsertFrees(const Graph& g, const PassContext& ctx);

}  // namespace meshwork::compiler
