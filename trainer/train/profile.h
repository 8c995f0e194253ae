// A kernel-level profile of a few steady training steps (training.profile_out): libtorch's
// Kineto profiler runs around them, writes its Chrome trace (Perfetto, chrome://tracing) and the
// trainer prints where the time went: on a GPU, how much of the steps' wall time the GPU was busy
// (the rest is the host: kernel launches, syncs, Python-free but not launch-free C++), and the
// kernels that took the most of it; on the CPU, the operators (inclusive times). docs/gpu.md.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshwork::train {

// One profiled event: an operator on the host, or a kernel (or copy) on the device.
struct ProfiledSpan {
  std::string name;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  bool on_device = false;
};

struct ProfileSummary {
  struct Row {
    std::string name;
    int64_t calls = 0;
    double seconds = 0;
  };
  double wall_seconds = 0;         // the profiled steps, as the trainer timed them
  double device_busy_seconds = 0;  // the union of the device spans (0 without any)
  int64_t device_spans = 0;
  std::vector<Row> top;            // by total time: device spans if any, else host ones
};

// Sums `spans` by name and keeps the `top` largest; the device's busy time is the length of the
// union of the device spans (overlapping kernels count once).
ProfileSummary Summarize(const std::vector<ProfiledSpan>& spans, double wall_seconds, size_t top);

// Prints `s` (a header line and one line per row) to `log`.
void PrintProfile(const ProfileSummary& s, int64_t first_step, int64_t steps, const std::string& out,
                  std::ostream& log);

// Profiles training steps [first, first + count) (0-based) of one process and writes `out`.
class StepProfiler {
 public:
  // Ok where this libtorch has Kineto's C++ API (2.x); InvalidConfig naming training.profile_out
  // otherwise (Debian's 1.13).
  static Status Available();
  static Result<std::unique_ptr<StepProfiler>> Create(std::string out, int64_t first, int64_t count, bool cuda);
  ~StepProfiler();

  // Call before step `step` and after it, with that step's time: starts at `first`, stops after
  // the last, then writes the trace and prints the summary.
  Status BeforeStep(int64_t step);
  Status AfterStep(int64_t step, double step_seconds, std::ostream& log);

 private:
  StepProfiler(std::string out, int64_t first, int64_t count, bool cuda)
      : out_(std::move(out)), first_(first), count_(count), cuda_(cuda) {}

  std::string out_;
  int64_t first_, count_;
  bool cuda_;
  bool running_ = false;
  double wall_seconds_ = 0;
};

}  // namespace meshwork::train
