#include "trainer/train/device.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <sched.h>
#include <time.h>

#include "common/blas_kernel.h"
#include "metrics/process_memory.h"
#include "trainer/dist/env.h"

#ifdef MESHWORK_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace meshwork::train {

Result<torch::Device> PickDevice(const std::string& spec, int local_rank, int cuda_devices,
                                 const std::string& cuda_visible_devices) {
  if (spec == "cpu" || (spec == "auto" && cuda_devices == 0)) return torch::Device(torch::kCPU);
  const std::string visible = "CUDA_VISIBLE_DEVICES=" +
                              (cuda_visible_devices.empty() ? std::string("(unset or empty)") : "'" + cuda_visible_devices + "'");
  int64_t index = local_rank;
  if (spec.rfind("cuda:", 0) == 0) {
    const std::string digits = spec.substr(5);
    if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidConfig("key 'training.device': must be auto, cpu, cuda or cuda:N, got '" + spec + "'");
    }
    index = std::stoll(digits);
  } else if (spec != "cuda" && spec != "auto") {
    return InvalidConfig("key 'training.device': must be auto, cpu, cuda or cuda:N, got '" + spec + "'");
  }
  if (cuda_devices == 0) {
    return Unavailable("key 'training.device': '" + spec + "' requested but libtorch sees no CUDA device (" + visible +
                       "; a CPU-only libtorch sees none either); use training.device=cpu");
  }
  if (index >= cuda_devices) {
    const std::string who = spec.rfind("cuda:", 0) == 0 ? "'" + spec + "'"
                                                         : "'" + spec + "' on local rank " + std::to_string(local_rank) +
                                                               " means cuda:" + std::to_string(index) + ", but";
    return Unavailable("key 'training.device': " + who + " this process sees " + std::to_string(cuda_devices) +
                       " CUDA device(s) (" + visible + "): each process of a node needs a GPU of its own, so run " +
                       "at most as many processes per node as it has GPUs (a TrainingJob asks for processesPerReplica " +
                       "nvidia.com/gpu per Pod)");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

Result<torch::Device> ResolveDevice(const std::string& spec) {
  MW_ASSIGN_OR_RETURN(const dist::DistEnv env, dist::ReadDistEnv());
  const int cuda_devices = spec == "cpu" ? 0 : static_cast<int>(torch::cuda::device_count());
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return PickDevice(spec, env.local_rank, cuda_devices, visible == nullptr ? "" : visible);
}

namespace {
// While alive, training.memory_limit_mib does not apply on the CPU (measurements of the machine,
// which a device with that little memory would not make).
class LiftCpuLimit {
 public:
  LiftCpuLimit();
  ~LiftCpuLimit();

 private:
  int64_t saved_;
};
}  // namespace

namespace {
// While alive, libtorch and OpenBLAS (its own pool, which libtorch's setting does not size)
// compute on one thread.
class OneThread {
 public:
  OneThread() : saved_(torch::get_num_threads()), saved_blas_(BlasThreads()) {
    torch::set_num_threads(1);
    if (saved_blas_ > 0) SetBlasThreads(1);
  }
  ~OneThread() {
    torch::set_num_threads(saved_);
    if (saved_blas_ > 0) SetBlasThreads(saved_blas_);
  }

 private:
  int saved_, saved_blas_;
};
}  // namespace

int CpuComputeCores(int threads, int cores) { return std::max(1, std::min(threads, cores)); }

double CpuPeakFlops(double core_flops, int threads, int cores) {
  return core_flops * CpuComputeCores(threads, cores);
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

namespace {
double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

double MeasureCoreMatmulFlops() {
  // Square GEMMs large enough for one thread's blocking to reach its peak (smaller ones fall
  // short, which would put MFU above 100%), small enough to repeat. Timed in this process's CPU
  // time, not wall time: other processes on the machine (the other ranks starting, the control
  // plane) take turns on the core, which stretches the wall time of a round but not the CPU time
  // it used.
  LiftCpuLimit unlimited;
  OneThread one;
  torch::NoGradGuard no_grad;
  const int64_t n = 1024;
  auto a = torch::randn({n, n});
  auto b = torch::randn({n, n});
  auto c = torch::matmul(a, b);  // warm-up: page faults, the BLAS's buffers
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const double t0 = ProcessCpuSeconds();
    c = torch::matmul(a, b);
    const double s = ProcessCpuSeconds() - t0;
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

namespace {

// Dense bf16 tensor-core peaks from the vendors' datasheets (no sparsity); 0 for the CPU, whose
// peak is measured.
double DatasheetPeak(config::DeviceProfileName name) {
  using P = config::DeviceProfileName;
  switch (name) {
    case P::kH100Sxm:
    case P::kH200: return 989.4e12;
    case P::kA100: return 312e12;
    case P::kL4: return 121e12;
    case P::kAuto:
    case P::kCpu: return 0;
  }
  return 0;
}

}  // namespace

config::DeviceProfileName ProfileForCudaName(const std::string& name) {
  using P = config::DeviceProfileName;
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("H200")) return P::kH200;
  if (has("H100") && (has("HBM3") || has("SXM"))) return P::kH100Sxm;
  if (has("A100")) return P::kA100;
  const std::string l4 = " L4";  // a word: not the L40 or L40S
  if (has(" L4 ") || (name.size() >= l4.size() && name.compare(name.size() - l4.size(), l4.size(), l4) == 0)) {
    return P::kL4;
  }
  return P::kAuto;
}

namespace {

std::string CudaDeviceName(const torch::Device& device) {
#ifdef MESHWORK_TORCH_CUDA
  cudaDeviceProp prop;
  if (device.is_cuda() && cudaGetDeviceProperties(&prop, device.has_index() ? device.index() : 0) == cudaSuccess) {
    return prop.name;
  }
#else
  (void)device;
#endif
  return "";
}

}  // namespace

DeviceProfile ResolveDeviceProfile(config::DeviceProfileName name, double peak_tflops, const torch::Device& device) {
  using P = config::DeviceProfileName;
  std::string auto_note = " (auto: set metrics.device_profile)";
  P resolved = name;
  if (name == P::kAuto && !device.is_cuda()) resolved = P::kCpu;
  if (name == P::kAuto && device.is_cuda()) {
    const std::string cuda_name = CudaDeviceName(device);
    resolved = ProfileForCudaName(cuda_name);
    if (resolved != P::kAuto) {
      auto_note = " (auto: the device is '" + cuda_name + "')";
    } else {
      resolved = P::kH100Sxm;
      auto_note = " (auto: '" + cuda_name + "' is none of the profiles: set metrics.device_profile)";
    }
  }
  DeviceProfile p;
  p.name = NameOf(config::kDeviceProfileNames, resolved);
  if (peak_tflops > 0) {
    p.peak_flops = peak_tflops * 1e12;
    p.basis = "metrics.peak_tflops";
    return p;
  }
  if (resolved == P::kCpu) {
    // The matmuls, the FLOPs MFU counts, run on OpenBLAS's threads where it is the BLAS.
    const int threads = std::max(torch::get_num_threads(), BlasThreads()), cores = UsableCores();
    const double core = MeasureCoreMatmulFlops();
    p.peak_flops = CpuPeakFlops(core, threads, cores);
    p.basis = "one core's fp32 matmul peak, measured, x " + std::to_string(CpuComputeCores(threads, cores)) +
              " (" + std::to_string(threads) + " compute threads, " + std::to_string(cores) + " usable cores)";
    return p;
  }
  p.peak_flops = DatasheetPeak(resolved);
  p.basis = "datasheet dense bf16 peak of " + p.name + (name == P::kAuto ? auto_note : "");
  return p;
}

namespace {

void RaiseTo(std::atomic<int64_t>& v, int64_t x) {
  int64_t seen = v.load();
  while (x > seen && !v.compare_exchange_weak(seen, x)) {
  }
}

// libtorch's CPU allocator, with the bytes its live allocations hold counted.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override {
    CheckLimit(n);
    return Wrap(base_->allocate(n), n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override {
    CheckLimit(n);
    return Wrap(base_->allocate(n), n);
  }
#endif

  TensorBytes Sample() const { return {current_.load(), peak_.load()}; }
  void ResetPeak() { peak_.store(current_.load()); }
  void SetLimit(int64_t bytes) { limit_.store(bytes); }
  int64_t limit() const { return limit_.load(); }

 private:
  // The base allocation travels as the context; freeing it frees the memory and uncounts it.
  struct Held {
    c10::DataPtr inner;
    int64_t bytes;
    const CountingCpuAllocator* owner;
  };

  void CheckLimit(size_t n) const {
    const int64_t limit = limit_.load();
    if (limit <= 0) return;
    const int64_t now = current_.load();
    TORCH_CHECK_WITH(OutOfMemoryError, now + static_cast<int64_t>(n) <= limit,
                     "CPU tensor memory limit reached: ", n >> 20, " MiB more requested with ", now >> 20,
                     " MiB held, training.memory_limit_mib is ", limit >> 20);
  }

  c10::DataPtr Wrap(c10::DataPtr inner, size_t n) const {
    void* data = inner.get();
    const int64_t bytes = static_cast<int64_t>(n);
    auto* held = new Held{std::move(inner), bytes, this};
    RaiseTo(peak_, current_.fetch_add(bytes) + bytes);
    return {data, held, &Release, c10::Device(c10::kCPU)};
  }
  static void Release(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    held->owner->current_.fetch_sub(held->bytes);
    delete held;
  }

  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0};  // allocate() is const in libtorch 1.13
  mutable std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> limit_{0};  // 0: none
};

CountingCpuAllocator* cpu_counter = nullptr;  // set once by CountCpuTensorBytes

LiftCpuLimit::LiftCpuLimit() : saved_(cpu_counter != nullptr ? cpu_counter->limit() : 0) {
  if (cpu_counter != nullptr) cpu_counter->SetLimit(0);
}
LiftCpuLimit::~LiftCpuLimit() {
  if (cpu_counter != nullptr) cpu_counter->SetLimit(saved_);
}
#ifdef MESHWORK_TORCH_CUDA
std::atomic<int64_t> cuda_process_peak{0};   // the allocator's peak, across ResetTensorPeak()s
#endif

}  // namespace

void CountCpuTensorBytes() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never freed: tensors allocated through it may outlive everything else.
    cpu_counter = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(cpu_counter, /*priority=*/1);
  });
}

namespace {
std::atomic<int64_t> tensor_memory_limit{0};
}  // namespace

Status LimitTensorMemory(const torch::Device& device, int64_t bytes) {
  if (bytes <= 0) {  // no limit (a CUDA memory fraction set earlier stays)
    if (cpu_counter != nullptr) cpu_counter->SetLimit(0);
    tensor_memory_limit.store(0);
    return Status::Ok();
  }
#ifdef MESHWORK_TORCH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess)
      return Unavailable("training.memory_limit_mib: cannot read the memory of " + device.str());
    const auto total = static_cast<int64_t>(prop.totalGlobalMem);
    if (bytes > total)
      return InvalidConfig("key 'training.memory_limit_mib': " + std::to_string(bytes >> 20) + " MiB is more than " +
                           device.str() + " has (" + std::to_string(total >> 20) + " MiB)");
    c10::cuda::CUDACachingAllocator::setMemoryFraction(static_cast<double>(bytes) / static_cast<double>(total),
                                                       device.index());
    tensor_memory_limit.store(bytes);
    return Status::Ok();
  }
#endif
  (void)device;
  if (cpu_counter == nullptr) return Internal("LimitTensorMemory before CountCpuTensorBytes");
  cpu_counter->SetLimit(bytes);
  tensor_memory_limit.store(bytes);
  return Status::Ok();
}

int64_t TensorMemoryLimit() { return tensor_memory_limit.load(); }

void ResetTensorPeak(const torch::Device& device) {
#ifdef MESHWORK_TORCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    RaiseTo(cuda_process_peak, stats.allocated_bytes[0].peak);
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return;
  }
#endif
  (void)device;
  if (cpu_counter != nullptr) cpu_counter->ResetPeak();
}

std::string ConfigureCudaAllocator() {
  constexpr const char* kVar = "PYTORCH_CUDA_ALLOC_CONF";
  if (const char* set = std::getenv(kVar); set != nullptr && *set != '\0') return set;
  ::setenv(kVar, "expandable_segments:True", /*overwrite=*/0);
  return std::getenv(kVar);
}

MemorySample SampleMemory(const torch::Device& device) {
  MemorySample s;
#ifdef MESHWORK_TORCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& allocated = stats.allocated_bytes[0];  // StatType::AGGREGATE
    s.current_bytes = allocated.current;
    RaiseTo(cuda_process_peak, allocated.peak);
    s.peak_bytes = cuda_process_peak.load();
    s.tensors = {allocated.current, allocated.peak};
    s.reserved_peak_bytes = stats.reserved_bytes[0].peak;
    s.alloc_retries = stats.num_alloc_retries;
    s.device = "cuda";
    static const int64_t total = [&device] {
      cudaDeviceProp prop{};
      return cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess
                 ? static_cast<int64_t>(prop.totalGlobalMem)
                 : int64_t{0};
    }();
    // training.memory_limit_mib caps what the allocator may take: that is the limit to watch.
    s.limit_bytes = TensorMemoryLimit() > 0 ? std::min(total, TensorMemoryLimit()) : total;
    return s;
  }
#endif
  const auto rss = metrics::ReadProcessMemory();
  s.current_bytes = rss.current_rss_bytes;
  s.peak_bytes = rss.peak_rss_bytes;
  static const int64_t limit = metrics::ReadMemoryLimit();
  s.limit_bytes = limit;
  s.device = "cpu";
  if (cpu_counter != nullptr) s.tensors = cpu_counter->Sample();
  return s;
}

}  // namespace meshwork::train
