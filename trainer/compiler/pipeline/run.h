// Runs a pipeline program's ranks as their dependencies allow (internal to pipeline/): what
// Validate checks a program with and SimulatePipeline prices it with, so the two never disagree
// on what an action waits for.
#pragma once

#include <functional>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/pipeline/program.h"

namespace meshwork::compiler::pipeline {

// Whether the program carries its transfers (Lower's output) or only compute.
bool IsLowered(const Program& p);

// What one action waits for: actions of this rank earlier in its list, or of another rank.
struct Dependency {
  ActionKind kind;  // kBackward stands for "B or I" (the input's gradient is ready)
  int microbatch;
  int stage;
  int rank;
};
std::vector<Dependency> DependenciesOf(const Program& p, bool lowered, int rank, const Action& a);

// Steps every action once its dependencies have been stepped: each rank in its order, a rank
// moving on while the next action's dependencies are done. `step(rank, index, ready)` gets the
// latest finish time among the action's dependencies (0 without any) and returns its own finish
// time. InvalidInput naming the rank and the action where an action waits for a later action of
// its own rank (or one that is missing), or where every unfinished rank waits: a deadlock.
// `earlier_steps_ran`: `p` is one step of an asynchronous program (AsyncSteps), and what its
// actions depend on that none of its actions provides ran in an earlier step (done at time 0,
// after the barrier between the steps).
Status RunInOrder(const Program& p, const std::function<double(int rank, size_t index, double ready)>& step,
                  bool earlier_steps_ran = false);

}  // namespace meshwork::compiler::pipeline
