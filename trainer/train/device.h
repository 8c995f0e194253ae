// The device the trainer runs on: parsing `training.device`, the peak-FLOPs profile MFU is
// measured against, and memory statistics (CUDA caching allocator on GPU, RSS on CPU).
#pragma once

#include <torch/types.h>

#include <string>

#include "common/status.h"
#include "trainer/config/config.h"

namespace meshwork::train {

// The device `training.device` names for the process with local rank `local_rank` (its index
// among the processes of its node or Pod) that sees `cuda_devices` CUDA devices:
//   auto    cuda:<local_rank> when any CUDA device is visible, else the CPU
//   cuda    cuda:<local_rank>
//   cuda:N  device N
//   cpu     the CPU
// Each process of a node gets its own GPU, as torchrun's convention has it: a local rank with no
// device of its own is kUnavailable naming the rank, the count and CUDA_VISIBLE_DEVICES (never a
// silent second process on one GPU, which NCCL refuses). A bad spec is kInvalidConfig.
Result<torch::Device> PickDevice(const std::string& spec, int local_rank, int cuda_devices,
                                 const std::string& cuda_visible_devices);
// PickDevice for this process: LOCAL_RANK (or MESHWORK_LOCAL_RANK) from the environment, and the
// CUDA devices libtorch sees.
Result<torch::Device> ResolveDevice(const std::string& spec);

struct DeviceProfile {
  std::string name;       // "h100-sxm", "cpu", ...
  double peak_flops = 0;  // dense FLOP/s that MFU is relative to
  std::string basis;      // how peak_flops was obtained, for the log
};

// `name` is metrics.device_profile (auto: on CUDA the profile the device's name says, see
// ProfileForCudaName, else cpu); `peak_tflops` > 0 overrides the profile's figure. On the CPU
// the peak is a short fp32 matmul measurement (there is no datasheet figure for "this VM").
DeviceProfile ResolveDeviceProfile(config::DeviceProfileName name, double peak_tflops, const torch::Device& device);

// The profile a CUDA device's name (cudaDeviceProp::name) is: "NVIDIA H200" -> h200, an H100 SXM
// ("NVIDIA H100 80GB HBM3") -> h100-sxm, A100 -> a100, L4 -> l4; auto for any other (an H100
// PCIe or NVL has other peaks than the SXM's).
config::DeviceProfileName ProfileForCudaName(const std::string& name);

// The CPU's peak that MFU is relative to: one core's fp32 GEMM throughput (`core_flops`,
// MeasureCoreMatmulFlops) times the cores this process computes on, its libtorch `threads` but at
// most the `cores` it may run on (CpuComputeCores).
int CpuComputeCores(int threads, int cores);
double CpuPeakFlops(double core_flops, int threads, int cores);
// Best fp32 GEMM throughput of one thread on this CPU, in FLOP/s of the process's CPU time
// (square 1024 matmuls, best of 5; well under a second). Not wall time over the whole machine:
// that is only as good as the moment it runs in, since the ranks of one machine start together
// and each measured whatever share the others left it (the demo's MFU read 19% in one run and
// 53% in the next); CPU time does not count the turns other processes take on the core.
double MeasureCoreMatmulFlops();
// The cores this process may run on (its CPU affinity), at least 1.
int UsableCores();

// Bytes held by tensors: on CUDA the caching allocator's allocated bytes; on the CPU what
// tensors took through libtorch's CPU allocator since CountCpuTensorBytes(). What the compiled
// plan's memory predictions are about (RSS also holds code, libraries and freed heap).
struct TensorBytes {
  int64_t current = 0;
  int64_t peak = 0;  // since the last ResetTensorPeak()
};

struct MemorySample {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;  // since the process started
  int64_t limit_bytes = 0;  // the most this device's memory can hold for us; 0: unknown
  std::string device;       // "cpu" or "cuda"
  TensorBytes tensors;      // CPU: zero unless CountCpuTensorBytes() ran
  // CUDA only (0 on the CPU): the caching allocator's peak reserved bytes (what it took from
  // the device, fragmentation included) and its retries (allocations that first failed and
  // succeeded only after freeing its cache: each one is a device-wide sync and a warning sign
  // that memory is nearly full).
  int64_t reserved_peak_bytes = 0;
  int64_t alloc_retries = 0;
};
// CUDA: bytes allocated by the caching allocator (current / peak since start), and the device's
// total memory; CPU: process RSS (current / high-water mark), and the smaller of the machine's
// memory and the cgroup (container) limit. The limits are read once per process.
MemorySample SampleMemory(const torch::Device& device);

// From now on, CPU tensors are allocated through a counting wrapper around libtorch's CPU
// allocator (once per process; later calls do nothing). Tensors that already exist are not
// counted, and their frees are not either.
void CountCpuTensorBytes();
// training.memory_limit_mib: at most `bytes` of tensors in this process from now on (0: no
// limit). On the CPU (after CountCpuTensorBytes) an allocation past it throws
// c10::OutOfMemoryError naming the key, as a device that small would run out; on CUDA it sets
// the caching allocator's memory fraction. InvalidConfig when it exceeds the CUDA device.
Status LimitTensorMemory(const torch::Device& device, int64_t bytes);
// The limit LimitTensorMemory set, in bytes; 0: none.
int64_t TensorMemoryLimit();
// Starts a new tensor peak (a training step's) at the current bytes. The process's peak in
// MemorySample::peak_bytes is kept.
void ResetTensorPeak(const torch::Device& device);

// The CUDA caching allocator's settings: PYTORCH_CUDA_ALLOC_CONF, set to
// "expandable_segments:True" when the environment leaves it unset (segments that grow instead
// of new fixed-size ones: less fragmentation, as torchtitan runs). Call before anything touches
// CUDA. Returns the value in force, for the log.
std::string ConfigureCudaAllocator();

}  // namespace meshwork::train
