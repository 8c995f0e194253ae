// Edits of a program's op list that the passes share: finding, moving, merging and erasing
// ops, and placing frees. Internal to the compiler's passes and reference plans.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler::edit {

// Whether `compute` (a compute op) uses any of `params`.
bool UsesAny(const Graph& g, const Op& compute, const std::vector<int>& params);
// The first op of `kind` with `id` at or after `from`, or -1.
int IndexOf(const Graph& g, OpKind kind, const std::string& id, size_t from = 0);
void Erase(Graph& g, const std::set<size_t>& indices);
void StripFrees(Graph& g);
// Moves op `from` to just before index `to` (to < from).
void MoveBefore(Graph& g, size_t from, size_t to);
// Indices of the ops of `kind`, program order.
std::vector<size_t> Collectives(const Graph& g, OpKind kind);
// The nearest compute before index `i`, or -1.
int PrevCompute(const Graph& g, size_t i);
// Merges the collective `victim` (an all_gather or reduce_scatter) into `keeper`: keeper takes
// its parameters; victim, its wait and (HSDP) its all_reduce and that one's wait are removed.
void MergeInto(Graph& g, size_t keeper, size_t victim);

// Frees every all-gathered bucket right after its last use before any of its parameters is
// gathered again (or the end of the step); a bucket nobody uses is freed after its wait.
Graph PlaceFrees(Graph g);

bool WithinBudget(const Graph& g, const PassContext& ctx);
// Within the budget and a valid program.
bool Acceptable(const Graph& placed, const PassContext& ctx);
double StepSeconds(const Graph& g, const PassContext& ctx);
// `g`, or kInternal naming `pass` when it is not a valid program.
Result<Graph> Checked(Graph g, const std::string& pass);

}  // namespace meshwork::compiler::edit
