// The GPU communicator: collectives through the NCCL C API on a dedicated CUDA stream, ordered
// against the compute stream with CUDA events. Built only when CUDA and NCCL are found
// (MESHWORK_HAVE_NCCL); CUDA and NCCL headers stay inside nccl_communicator.cpp.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "common/status.h"
#include "trainer/dist/communicator.h"

namespace meshwork::dist {

// Rank 0 creates the NCCL unique id and publishes it in `store` under
// "nccl/<group_name>/unique_id"; every rank then joins with ncclCommInitRank on `cuda_device`.
// No usable CUDA device or driver is kUnavailable. Tensors passed to the communicator must live
// on `cuda_device`; collectives are ordered after the work already queued on the compute stream
// (libtorch's current stream), and Work::Wait() orders the compute stream after them without
// blocking the host, except for Barrier, whose Wait() blocks until it is done or timed out.
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                           int rank, int size, int cuda_device,
                                                           const CommunicatorOptions& options);

}  // namespace meshwork::dist
