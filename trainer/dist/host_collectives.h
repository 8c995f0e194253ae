// Small host values (counts, flags, text) through a communicator of any backend. Each goes to
// the communicator's device() in a scratch tensor, through one collective, and back to the
// host: NCCL takes device tensors only, so nothing may hand it a CPU tensor. Every rank of the
// group must call the same function with the same arguments' shapes (collective).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/dist/communicator.h"

namespace meshwork::dist {

// `op` over the ranks of every element of `values` (float64).
Result<std::vector<double>> AllReduceValues(Communicator& group, const std::vector<double>& values, ReduceOp op);
// The median over the ranks of every element of `values` (the upper median for an even count),
// the same on every rank: what lets measurements that differ a little from rank to rank give
// every rank the same plan.
Result<std::vector<double>> MedianAcrossRanks(Communicator& group, const std::vector<double>& values);
// Every rank's `text`, in rank order, on every rank.
Result<std::vector<std::string>> AllGatherText(Communicator& group, const std::string& text);
// `root`'s `text` on every rank (the others' `text` is ignored).
Result<std::string> BroadcastText(Communicator& group, const std::string& text, int root);

}  // namespace meshwork::dist
