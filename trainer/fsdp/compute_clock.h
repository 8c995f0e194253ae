// Times compute as the device runs it, for the trace compiled FSDP plans from: the host clock on
// the CPU, CUDA events on the current stream on a GPU (where the host clock would time kernel
// launches, not kernels). Marks are cheap to take on the hot path; durations are read later
// (on CUDA that waits for the events).
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

namespace meshwork::fsdp {

class ComputeClock {
 public:
  struct Mark {
    double host = 0;  // steady-clock seconds when taken (for Chrome traces, which are host timelines)
    int index = -1;   // CUDA: the event recorded then; -1 on the CPU
  };

  explicit ComputeClock(torch::Device device = torch::kCPU);
  ~ComputeClock();
  ComputeClock(ComputeClock&&) noexcept;
  ComputeClock& operator=(ComputeClock&&) noexcept;

  // Forgets every mark (their events are reused by the next ones).
  void Restart();
  Mark Now();
  // Seconds from `from` to `to` as the device saw them.
  double Seconds(const Mark& from, const Mark& to) const;

 private:
  struct Events;  // CUDA events, where libtorch has CUDA
  torch::Device device_;
  std::unique_ptr<Events> events_;
};

}  // namespace meshwork::fsdp
