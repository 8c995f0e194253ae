// Names of the collectives and the argument checks shared by every backend.
#include "trainer/dist/communicator.h"

namespace meshwork::dist {

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "unknown_collective";
}

Result<std::unique_ptr<Work>> Communicator::Send(torch::Tensor, int) {
  return Internal(std::string("send on group '") + group_name() + "': the " + backend() +
                       " communicator has no point-to-point transfers");
}

Result<std::unique_ptr<Work>> Communicator::Recv(torch::Tensor, int) {
  return Internal(std::string("recv on group '") + group_name() + "': the " + backend() +
                       " communicator has no point-to-point transfers");
}

std::string CheckCollectivePair(Collective c, const torch::Tensor& output, const torch::Tensor& input, int size) {
  if (output.scalar_type() != input.scalar_type()) {
    return std::string("output dtype ") + c10::toString(output.scalar_type()) + " differs from input dtype " +
           c10::toString(input.scalar_type());
  }
  const bool gather = c == Collective::kAllGather;
  const torch::Tensor& big = gather ? output : input;
  const torch::Tensor& small = gather ? input : output;
  if (big.numel() != size * small.numel()) {
    return std::string(gather ? "output" : "input") + " has " + std::to_string(big.numel()) +
           " elements, expected size · " + (gather ? "input" : "output") + " = " + std::to_string(size) + " · " +
           std::to_string(small.numel());
  }
  return "";
}

}  // namespace meshwork::dist
