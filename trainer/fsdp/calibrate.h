// What compiled FSDP measures on the running ranks before it plans: each mesh group's link
// (latency and bus bandwidth), and on CPU ranks the host copy rate and how much collectives in
// flight slow compute. Collective calls: every rank of the group calls them alike. Every tensor
// they hand a communicator lives on its device().
#pragma once

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/dist/communicator.h"

namespace meshwork::fsdp {

// Latency and bus bandwidth of one collective kind (all-gather or all-reduce) on `group`, from
// timing 64 KiB, 1 MiB and 4 MiB messages (the first round of each size is a warm-up). A
// collective's time is what its backend measured on the device (CUDA events for NCCL), else
// the host clock from issue to completion.
Result<compiler::LinkCost> CalibrateLink(dist::Communicator& group, dist::Collective kind);

// Bytes per second of this process copying a 16 MiB fp32 tensor on the CPU (FSDP's copy-in and
// copy-out on CPU ranks), the median of five.
double MeasureCopyRate();

// CostModel::interference of CPU ranks, which share their cores with Gloo's threads: 32 matmuls
// timed alone, then with 16 all-gathers of 2 MiB in flight on `group`, three times, solved for
// the cost model's sharing rule (the median). The all-gathers cycle through 4 scratch buffers,
// so the calibration adds little to the process's peak memory.
Result<double> MeasureInterference(dist::Communicator& group);

}  // namespace meshwork::fsdp
