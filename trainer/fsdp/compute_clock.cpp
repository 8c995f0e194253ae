// ComputeClock: host time always, plus a pool of timing CUDA events on a GPU.
#include "trainer/fsdp/compute_clock.h"

#include <algorithm>
#include <chrono>

#ifdef MESHWORK_TORCH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace meshwork::fsdp {

#ifdef MESHWORK_TORCH_CUDA
namespace {
// One timing event (ATen's CUDAEvent would pull in cuBLAS and cuSPARSE headers).
class TimingEvent {
 public:
  TimingEvent() { C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDefault)); }
  ~TimingEvent() { C10_CUDA_CHECK_WARN(cudaEventDestroy(event_)); }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};
}  // namespace
#endif

struct ComputeClock::Events {
#ifdef MESHWORK_TORCH_CUDA
  std::vector<std::unique_ptr<TimingEvent>> pool;  // grows to a step's marks, then reused
#endif
  int used = 0;
};

ComputeClock::ComputeClock(torch::Device device) : device_(device), events_(std::make_unique<Events>()) {}
ComputeClock::~ComputeClock() = default;
ComputeClock::ComputeClock(ComputeClock&&) noexcept = default;
ComputeClock& ComputeClock::operator=(ComputeClock&&) noexcept = default;

void ComputeClock::Restart() { events_->used = 0; }

ComputeClock::Mark ComputeClock::Now() {
  Mark m;
  m.host = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (wait_counter_) m.waited = wait_counter_();
#ifdef MESHWORK_TORCH_CUDA
  if (device_.is_cuda()) {
    auto& pool = events_->pool;
    if (events_->used == static_cast<int>(pool.size())) pool.push_back(std::make_unique<TimingEvent>());
    m.index = events_->used++;
    C10_CUDA_CHECK(cudaEventRecord(pool[m.index]->get(), c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
  }
#endif
  return m;
}

double ComputeClock::Seconds(const Mark& from, const Mark& to) const {
#ifdef MESHWORK_TORCH_CUDA
  if (from.index >= 0 && to.index >= 0) {
    const auto& pool = events_->pool;
    C10_CUDA_CHECK(cudaEventSynchronize(pool[to.index]->get()));
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, pool[from.index]->get(), pool[to.index]->get()));
    return static_cast<double>(ms) / 1e3;
  }
#endif
  return to.host - from.host;
}

double ComputeClock::ComputeSeconds(const Mark& from, const Mark& to) const {
  const double span = Seconds(from, to);
  return host() ? std::max(0.0, span - (to.waited - from.waited)) : span;
}

}  // namespace meshwork::fsdp
