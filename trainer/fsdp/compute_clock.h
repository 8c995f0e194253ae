// Times compute as the device runs it, for the trace compiled FSDP plans from: the host clock on
// the CPU, CUDA events on the current stream on a GPU (where the host clock would time kernel
// launches, not kernels). Marks are cheap to take on the hot path; durations are read later
// (on CUDA that waits for the events).
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

namespace meshwork::fsdp {

class ComputeClock {
 public:
  struct Mark {
    double host = 0;  // steady-clock seconds when taken (for Chrome traces, which are host timelines)
    int index = -1;   // CUDA: the event recorded then; -1 on the CPU
    double waited = 0;  // the wait counter's seconds when taken (SetWaitCounter; 0 without one)
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
  // Seconds this process has blocked so far inside what the clock times, waiting on something
  // other than compute (tensor parallelism's collectives inside a module), read at every mark.
  void SetWaitCounter(std::function<double()> counter) { wait_counter_ = std::move(counter); }
  // On the host clock (the CPU), where those waits are time the spans include: whether
  // ComputeSeconds takes them out.
  bool host() const { return !device_.is_cuda(); }
  // Seconds(from, to) less the waits between them, on the host clock; Seconds itself on a GPU,
  // whose events time the stream (a collective's wait orders the stream there, it does not block
  // the host, so the counter cannot say how much of a span it took).
  double ComputeSeconds(const Mark& from, const Mark& to) const;

 private:
  struct Events;  // CUDA events, where libtorch has CUDA
  torch::Device device_;
  std::unique_ptr<Events> events_;
  std::function<double()> wait_counter_;
};

}  // namespace meshwork::fsdp
