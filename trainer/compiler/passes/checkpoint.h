// The checkpoint pass: activation checkpointing per module, under the memory budget. While the
// least-memory program (the naive one: one bucket gathered at a time, every reduce-scatter
// waited for at once) holds more than the budget, checkpoint the next candidate module (ckpt=
// in the IR), earliest layer first (its activations are held longest). Checkpointing only costs
// time (the recompute), so no more modules than the budget needs.
#pragma once

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

Result<Graph> CheckpointToFit(const Graph& g, const PassContext& ctx);

}  // namespace meshwork::compiler
