// Prices a pipeline program (program.h): each rank runs its actions in order, a compute as soon as
// its inputs are there and the rank is free, a send as soon as its tensor is computed (posted: the
// rank goes on; the tensor occupies the link from its rank to the other, one transfer at a time in
// each direction), a receive blocking its rank until the tensor has arrived. The result is the
// step, the bubble, each rank's peak of held activations, and a timeline per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/pipeline/program.h"

namespace meshwork::compiler::pipeline {

struct StageCost {
  double forward_seconds = 0;
  double backward_input_seconds = 0;   // I; a whole backward B takes I + W
  double backward_weight_seconds = 0;  // W
  // Held from a micro-batch's forward to its backward (B), or to its I, after which only
  // weight_grad_bytes of it (what W reads: the linears' inputs and output gradients) are held
  // until its W.
  int64_t activation_bytes = 0;
  int64_t weight_grad_bytes = 0;
  int64_t output_bytes = 0;  // the activation sent to the next stage, and its gradient back
};

struct PipelineCost {
  std::vector<StageCost> stages;  // one per stage of the program's shape
  // Between two ranks, each direction its own: latency + bytes / bus_bytes_per_second a transfer.
  LinkCost link;
};

struct TimelineEntry {
  int rank = 0;
  Action action;
  double start = 0;
  double end = 0;  // a send's: its arrival
};

struct PipelineResult {
  double step_seconds = 0;
  std::vector<double> busy_seconds;  // per rank: compute
  // The share of the ranks' time not computing: 1 - sum(busy) / (pp x step).
  double bubble_fraction = 0;
  std::vector<int64_t> peak_bytes;  // per rank: the most activation bytes held at once
  std::vector<TimelineEntry> entries;
};

// Validates the program (Validate) and lowers it where it has no transfers. InvalidInput for an
// invalid program; InvalidConfig where the costs do not name one entry per stage.
Result<PipelineResult> SimulatePipeline(const Program& p, const PipelineCost& cost);

// The program with every stage alike (F 1, I 1, W 1: a backward costs twice a forward) and free
// transfers: the schedule's own bubble, what a TrainingJob's status shows and a measured run's
// bubble is read against (stages that differ in cost, and transfers, add to it).
Result<PipelineResult> SimulateEqualStages(const Program& p);

// One step of an asynchronous program as the trainer runs it (AsyncSteps, steps.h): lowered,
// not validated on its own; what it needs from earlier steps is there when it starts (the
// trainer's steps meet at a barrier: the loss reduced over the ranks). Its bubble is the
// schedule's, between two barriers.
Result<PipelineResult> SimulateStep(const Program& step, const PipelineCost& cost);

// The share of the ranks' time the schedule itself leaves idle with stages alike: a synchronous
// program's (SimulateEqualStages), or an asynchronous one's steady step's (SimulateStep). What a
// TrainingJob's status and the trainer's pipeline line show.
Result<double> ScheduleBubble(const Program& p);

// The timeline as text: a header (step, bubble, peaks) and one row per rank, `columns` characters
// wide, each showing what ran at its middle: F, B, I, W (lower case on a rank's later virtual
// stages), '.' waiting.
std::string Timeline(const Program& p, const PipelineResult& r, int columns = 96);

}  // namespace meshwork::compiler::pipeline
