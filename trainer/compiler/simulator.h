// A discrete-event model of one step of a plan: the host issues ops in program order; compute
// runs on the host's lane (the host waits for it, as a CPU does, and a GPU does at its sync
// points); collectives queue FIFO on their communication lane (all-gathers, reduce-scatters,
// all-reduces: cost_model.h's Lane) and start when issued and their lane is free; the
// all-gather and reduce-scatter lanes share the dp_shard link (CostModel::shard_lanes_share);
// `wait` blocks the host until its collective ends, and that blocking is the exposed
// communication; `optimizer_step` is host work of CostModel::step_overhead_seconds (what a
// step spends outside forward and backward). Gloo's reduction at a reduce-scatter's wait is
// host work (CostModel::CopySeconds; the flat layout makes no other copies around
// collectives), and on CPU ranks host work and communication share the cores: while both
// run, host work progresses at 1 / (1 + lanes busy x CostModel::interference) of its speed
// and communication at
// 1 / (1 + CostModel::CommInterference()). Memory follows program order: an all-gather
// allocates its output at issue and `free` releases it; forward compute adds the module's
// activations and its backward releases them; backward adds full gradients (in the parameters'
// dtype: the buffer the reduce-scatter reads, or casts), released when their reduce-scatter has
// been waited for. A module's tensor-parallel exchanges (tp=) run on their own link inside its
// compute, adding CostModel::TpExposedSeconds to it.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/ir.h"

namespace meshwork::compiler {

struct OpTiming {
  double start = 0;
  double end = 0;
};

struct SimResult {
  double step_seconds = 0;
  double compute_seconds = 0;       // the modules' compute alone (no copies, no slowdown)
  double copy_seconds = 0;          // host work around collectives (Gloo's reduction at a wait), alone
  double comm_seconds = 0;          // the collectives' own durations, summed over the lanes
  double exposed_comm_seconds = 0;  // host blocked in waits, and exchanges inside compute
  // Tensor parallelism's exchanges (in comm_seconds and exposed_comm_seconds too): alone, and
  // what they added to the modules' compute (less when overlapped).
  double tp_comm_seconds = 0;
  double tp_exposed_seconds = 0;
  int64_t peak_bytes = 0;           // gathered weights + activations + full gradients, at peak
  int64_t static_bytes = 0;         // shards: parameters, gradients, AdamW state (4 x shard)
  int collectives = 0;
  std::vector<OpTiming> ops;        // one per op, program order
};

SimResult Simulate(const Graph& g, const CostModel& cost);

// Static bytes of every rank: its fp32 shards of parameters and gradients and AdamW's two
// moments (4 x the shard bytes).
int64_t StaticBytes(const Graph& g);

// Peak dynamic bytes only (the memory half of Simulate; what the passes check budgets with).
int64_t PeakBytes(const Graph& g);

}  // namespace meshwork::compiler
