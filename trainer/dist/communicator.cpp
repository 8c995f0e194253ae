// Names of the collectives, shared by every backend's messages and metrics labels.
#include "trainer/dist/communicator.h"

namespace meshwork::dist {

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
  }
  return "unknown_collective";
}

}  // namespace meshwork::dist
