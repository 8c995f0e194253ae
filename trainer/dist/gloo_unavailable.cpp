// MakeGlooCommunicator for a build whose libtorch ships no Gloo headers (the pip wheel: see
// cmake/torch.cmake). Callers are unchanged; asking for Gloo says why it is missing and what to do.
#include "trainer/dist/gloo_communicator.h"

namespace meshwork::dist {

Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                           int rank, int size,
                                                           const CommunicatorOptions& options,
                                                           const std::string& hostname) {
  return Unavailable(
      "the Gloo communicator (distributed training on CPU) is not in this build: its libtorch "
      "ships no Gloo headers (the pip PyTorch wheel does not), so CMake configured it with Gloo "
      "OFF. Train distributed on GPUs with training.device=cuda (NCCL), or build against a "
      "libtorch that has Gloo's headers (Debian's libtorch-dev with libgloo-dev; docs/gpu.md)");
}

}  // namespace meshwork::dist
