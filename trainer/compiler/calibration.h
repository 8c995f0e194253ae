// A compiled-FSDP run's calibration as a text file: the cost model its plan was made with (links,
// the tp link where the plan carries tensor parallelism's exchanges,
// lane sharing, CPU interference, host copies, step overhead), the traced module table (without
// its slowdown by the communication beside it) and the compute scale fitted to the run's eager
// steps. meshwork-simulate --calibration plans and simulates from it, so one run's calibration
// can predict other runs: another link rate, another configuration (the simulator judged out of
// sample, bench/netlab/simulator_oos.py).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/ir.h"

namespace meshwork::compiler {

struct Calibration {
  CostModel cost;
  double compute_scale = 1;       // on the skeleton's compute, fitted to the measured eager step
  double eager_step_seconds = 0;  // the measured eager step it was fitted to (0: unknown)
  Graph skeleton;                 // params and modules (no ops), compute unscaled
};

// "meshwork-calibration 1", one "key value..." line each, then "skeleton" and the skeleton's
// IR text (Print). Every double in its shortest exact form: Parse(Print(c)) prints the same.
std::string PrintCalibration(const Calibration& c);
// InvalidInput naming the line for anything else, a missing key or a bad skeleton.
Result<Calibration> ParseCalibration(std::string_view text);

// The calibration's dp_shard, dp_replicate and tp links with their bus bandwidth times `factor`
// (latencies kept): the same cluster on links `factor` times as fast.
CostModel ScaleLinks(CostModel cost, double factor);

}  // namespace meshwork::compiler
