#include "trainer/compiler/passes/insert_frees.h"

#include "trainer/compiler/passes/program_edit.h"

namespace meshwork::compiler {

Result<Graph> InsertFrees(const Graph& g, const PassContext&) { return edit::PlaceFrees(g); }

}  // namespace meshwork::compiler
