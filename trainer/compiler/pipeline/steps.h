// An asynchronous program (PipeMare: generators.h) as the trainer runs it: one minibatch a
// training step. The stream never flushes, so a step's program on each rank is the slice of the
// rank's stream from the forward of the step's first micro-batch to just before the next step's:
// its micro-batches' forwards, and the backwards 1F1B's order puts between them, some of which are
// of micro-batches forwarded in an earlier step (carried: their activations stay in memory from
// one step to the next). Slices number micro-batches from the step's first (carried ones are
// negative) and minibatches from the step's (U-1: the previous one's update).
//
// After a start (the first step, a resume) the pipeline fills for `filling.size()` steps; from
// then on every step is the same slice (`steady`). A drain (before a checkpoint, at the end) runs
// the backwards and updates still due after a step, with no new forwards.
//
// Slices are lowered and cut from a validated stream; they are not programs Validate accepts on
// their own (their carried micro-batches have no forward in them).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/pipeline/program.h"

namespace meshwork::compiler::pipeline {

struct AsyncSteps {
  std::vector<Program> filling;  // steps 0 .. filling.size() - 1 after a start
  Program steady;                // every later step
  std::vector<Program> drains;   // after step k: drains[min(k, filling.size())]
  // Per stage: the most updates of that stage between a micro-batch's forward and its backward
  // (ceil((pp - 1 - s) / per_update)), the delay PipeMare's learning-rate rescheduling scales by.
  std::vector<int> max_delay;

  const Program& Step(int64_t since_start) const;   // the k-th step after a start
  const Program& Drain(int64_t since_start) const;  // after the k-th step after a start
};

// Steps after a start before the pipeline is full: until the first rank's pp - 1 warm-up forwards
// are done, ceil((pp - 1) / per_update).
int FillingSteps(const Shape& shape);

// The steps of PipeMare over `shape` (pp, one virtual stage, minibatches of per_update
// micro-batches; `microbatches`, the stream's length, is not read). InvalidConfig naming the
// shape where PipeMare cannot run it.
Result<AsyncSteps> SplitIntoSteps(const Shape& shape);

}  // namespace meshwork::compiler::pipeline
