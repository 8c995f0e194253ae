// The CPU communicator: collectives through libtorch's c10d ProcessGroupGloo (the one shipped
// with the libtorch in use). Ops that this Gloo lacks are emulated; see gloo_communicator.cpp.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

#include "common/status.h"
#include "trainer/dist/communicator.h"

namespace meshwork::dist {

// Builds a Gloo process group of `size` ranks that meet through `store` (its keys are put under
// the prefix "gloo/<group_name>/", so groups can share one store). `hostname` picks the address
// Gloo binds to ("127.0.0.1" for tests); empty means Gloo's default device (this machine's
// hostname, falling back to loopback). Blocks until every rank has connected or
// options.timeout passes; the latter, or any connection failure, is kUnavailable.
Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                           int rank, int size,
                                                           const CommunicatorOptions& options,
                                                           const std::string& hostname = "");

}  // namespace meshwork::dist
