#include "trainer/train/profile.h"

#include <torch/torch.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

namespace meshwork::train {

ProfileSummary Summarize(const std::vector<ProfiledSpan>& spans, double wall_seconds, size_t top) {
  ProfileSummary s;
  s.wall_seconds = wall_seconds;
  std::vector<std::pair<uint64_t, uint64_t>> device;
  for (const ProfiledSpan& p : spans) {
    if (p.on_device && p.end_ns > p.start_ns) device.emplace_back(p.start_ns, p.end_ns);
  }
  s.device_spans = static_cast<int64_t>(device.size());
  std::sort(device.begin(), device.end());
  uint64_t busy = 0, covered_to = 0;
  for (const auto& [start, end] : device) {
    const uint64_t from = std::max(start, covered_to);
    if (end > from) busy += end - from;
    covered_to = std::max(covered_to, end);
  }
  s.device_busy_seconds = static_cast<double>(busy) * 1e-9;

  const bool by_device = !device.empty();
  std::map<std::string, ProfileSummary::Row> rows;
  for (const ProfiledSpan& p : spans) {
    if (p.on_device != by_device || p.end_ns < p.start_ns) continue;
    ProfileSummary::Row& r = rows[p.name];
    r.name = p.name;
    ++r.calls;
    r.seconds += static_cast<double>(p.end_ns - p.start_ns) * 1e-9;
  }
  for (auto& [name, row] : rows) s.top.push_back(std::move(row));
  std::sort(s.top.begin(), s.top.end(), [](const auto& a, const auto& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  if (s.top.size() > top) s.top.resize(top);
  return s;
}

void PrintProfile(const ProfileSummary& s, int64_t first_step, int64_t steps, const std::string& out,
                  std::ostream& log) {
  char line[512];
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  const double per_step = s.wall_seconds / n;
  std::snprintf(line, sizeof(line), "profile: steps %lld-%lld, %.1f ms a step, trace in %s\n",
                static_cast<long long>(first_step + 1), static_cast<long long>(first_step + steps),
                per_step * 1e3, out.c_str());
  log << line;
  double denominator = s.wall_seconds;
  if (s.device_spans > 0) {
    std::snprintf(line, sizeof(line),
                  "profile: the device was busy %.1f%% of the steps' wall time (%lld kernels and copies, "
                  "%.1f ms a step); the rest is the host's\n",
                  s.wall_seconds > 0 ? 100 * s.device_busy_seconds / s.wall_seconds : 0.0,
                  static_cast<long long>(s.device_spans), s.device_busy_seconds / n * 1e3);
    log << line;
    denominator = s.device_busy_seconds;
  } else {
    log << "profile: no device activity recorded: host operators, inclusive (an operator's time "
           "includes the operators it called)\n";
  }
  for (const ProfileSummary::Row& r : s.top) {
    std::string name = r.name.size() > 110 ? r.name.substr(0, 107) + "..." : r.name;
    std::snprintf(line, sizeof(line), "profile: %7.2f ms a step %5.1f%% %6lld calls  %s\n",
                  r.seconds / n * 1e3, denominator > 0 ? 100 * r.seconds / denominator : 0.0,
                  static_cast<long long>(r.calls), name.c_str());
    log << line;
  }
}

#if TORCH_VERSION_MAJOR >= 2
namespace kineto = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

namespace {
std::set<impl::ActivityType> Activities(bool cuda) {
  std::set<impl::ActivityType> a{impl::ActivityType::CPU};
  if (cuda) a.insert(impl::ActivityType::CUDA);
  return a;
}
}  // namespace

Status StepProfiler::Available() { return Status::Ok(); }

Result<std::unique_ptr<StepProfiler>> StepProfiler::Create(std::string out, int64_t first, int64_t count, bool cuda) {
  kineto::prepareProfiler(impl::ProfilerConfig(impl::ProfilerState::KINETO), Activities(cuda));
  return std::unique_ptr<StepProfiler>(new StepProfiler(std::move(out), first, count, cuda));
}

StepProfiler::~StepProfiler() {
  if (running_) {
    try {
      (void)kineto::disableProfiler();
    } catch (...) {
    }
  }
}

Status StepProfiler::BeforeStep(int64_t step) {
  if (step != first_ || running_) return Status::Ok();
  kineto::enableProfiler(impl::ProfilerConfig(impl::ProfilerState::KINETO), Activities(cuda_));
  running_ = true;
  return Status::Ok();
}

Status StepProfiler::AfterStep(int64_t step, double step_seconds, std::ostream& log) {
  if (!running_) return Status::Ok();
  wall_seconds_ += step_seconds;
  if (step != first_ + count_ - 1) return Status::Ok();
  if (cuda_) torch::cuda::synchronize();
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  running_ = false;
  std::vector<ProfiledSpan> spans;
  for (const kineto::KinetoEvent& e : result->events()) {
    spans.push_back({e.name(), e.startNs(), e.endNs(), e.deviceType() != c10::DeviceType::CPU});
  }
  try {
    result->save(out_);
  } catch (const c10::Error& e) {
    return IOError("cannot write the profile (training.profile_out) to '" + out_ + "': " + e.what_without_backtrace());
  }
  PrintProfile(Summarize(spans, wall_seconds_, 15), first_, count_, out_, log);
  return Status::Ok();
}
#else
Result<std::unique_ptr<StepProfiler>> StepProfiler::Create(std::string, int64_t, int64_t, bool) {
  return Available();
}
Status StepProfiler::Available() {
  return InvalidConfig("key 'training.profile_out' needs libtorch 2.x (Kineto's C++ API); this build has libtorch " +
                     std::string(TORCH_VERSION));
}
StepProfiler::~StepProfiler() = default;
Status StepProfiler::BeforeStep(int64_t) { return Status::Ok(); }
Status StepProfiler::AfterStep(int64_t, double, std::ostream&) { return Status::Ok(); }
#endif

}  // namespace meshwork::train
