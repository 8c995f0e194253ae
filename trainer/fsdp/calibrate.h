// What compiled FSDP measures on the running ranks before it plans: each mesh group's link
// (latency and bus bandwidth), and on CPU ranks the host copy rate and how much collectives in
// flight slow compute. Collective calls: every rank of the group calls them alike. Every tensor
// they hand a communicator lives on its device().
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/dist/communicator.h"

namespace meshwork::fsdp {

// Latency and bus bandwidth of one collective kind (all-gather, reduce-scatter or all-reduce) on
// `group`, fitted to messages of `sizes` bytes (the all-gather's output, the reduce-scatter's
// input, the all-reduce's tensor: what the plan's buckets move), each timed `reps` times after
// one warm-up. A collective's time is what its backend measured on the device (CUDA events for
// NCCL), else the host clock from issue to completion. Needs two distinct sizes.
Result<compiler::LinkCost> CalibrateLink(dist::Communicator& group, dist::Collective kind,
                                         const std::vector<int64_t>& sizes, int reps = 3);

// Bytes per second of this process copying a 16 MiB fp32 tensor on the CPU (FSDP's copy-in and
// copy-out on CPU ranks), the median of five.
double MeasureCopyRate();

// CostModel::interference and comm_interference of CPU ranks, which share their cores with
// Gloo's threads, three times each (the medians):
//   - compute: 32 matmuls timed alone, then with 16 all-gathers of 2 MiB in flight on `group`,
//     solved for the cost model's rule (compute at 1 / (1 + k) while communication runs);
//   - communication: the 16 all-gathers timed alone, then with matmuls running until the last
//     one completes (k = with / alone - 1).
// The all-gathers cycle through 4 scratch buffers, so the calibration adds little to the
// process's peak memory.
struct Interference {
  double compute = 0;
  double comm = 0;
};
Result<Interference> MeasureInterference(dist::Communicator& group);

// CostModel::shard_lanes_share: an all-gather of `gather_bytes` (its output) on `gather` and a
// reduce-scatter of `reduce_bytes` (its input) on `reduce`, two communicators over the same
// ranks (FSDP's two lanes), timed alone and then issued together, three times each. Solved for
// the simulator's rule (both at share s until the shorter ends, the longer alone after):
// together = shorter / s + (longer - shorter). The median, within [0.1, 1].
Result<double> MeasureLaneShare(dist::Communicator& gather, dist::Communicator& reduce, int64_t gather_bytes,
                                int64_t reduce_bytes);

}  // namespace meshwork::fsdp
