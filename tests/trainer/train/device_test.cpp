// Device selection: which GPU each process of a node takes (cuda:<LOCAL_RANK>), and the errors
// for a local rank without a GPU of its own, no GPU at all, and bad specs; the CPU tensor-bytes
// counter behind a step's tensor peak. No GPU needed.
#include "trainer/train/device.h"

#include "common/blas_kernel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace meshwork::train {
namespace {

using ::testing::HasSubstr;

TEST(PickDevice, AutoTakesTheLocalRanksGpuOrTheCpuWithoutOne) {
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    auto d = PickDevice("auto", local_rank, 4, "0,1,2,3");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank)));
  }
  auto cpu = PickDevice("auto", 3, 0, "");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, torch::Device(torch::kCPU));
}

TEST(PickDevice, CudaTakesTheLocalRanksGpuAndCudaNTakesN) {
  auto cuda = PickDevice("cuda", 1, 2, "");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(*cuda, torch::Device(torch::kCUDA, 1));
  auto fixed = PickDevice("cuda:1", 0, 2, "");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(*fixed, torch::Device(torch::kCUDA, 1));
  auto cpu = PickDevice("cpu", 1, 8, "");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, torch::Device(torch::kCPU));
}

TEST(PickDevice, ALocalRankWithoutAGpuOfItsOwnIsRefusedNamingWhy) {
  auto d = PickDevice("auto", 2, 2, "4,5");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(d.status().message(), HasSubstr("'auto' on local rank 2 means cuda:2"));
  EXPECT_THAT(d.status().message(), HasSubstr("sees 2 CUDA device(s) (CUDA_VISIBLE_DEVICES='4,5')"));
  EXPECT_THAT(d.status().message(), HasSubstr("processesPerReplica"));
  auto n = PickDevice("cuda:3", 0, 2, "");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("'cuda:3' this process sees 2 CUDA device(s) (CUDA_VISIBLE_DEVICES=(unset or empty))"));
}

TEST(PickDevice, CudaWithoutAnyGpuAndBadSpecsAreNamed) {
  auto none = PickDevice("cuda", 0, 0, "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("key 'training.device': 'cuda' requested but libtorch sees no CUDA device"));
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99999"}) {
    auto d = PickDevice(bad, 0, 2, "");
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidConfig) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr(std::string("got '") + bad + "'"));
  }
}

// ResolveDevice reads LOCAL_RANK (this build's libtorch, CPU-only in CI, sees no GPU).
TEST(ResolveDevice, ReadsTheLocalRankFromTheEnvironment) {
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  auto d = ResolveDevice("cuda");
  if (torch::cuda::device_count() == 0) {
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(d.status().message(), HasSubstr("sees no CUDA device"));
  } else if (torch::cuda::device_count() >= 2) {
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, torch::Device(torch::kCUDA, 1));
  }
  ::setenv("LOCAL_RANK", "5", 1);
  auto bad = ResolveDevice("cpu");
  EXPECT_FALSE(bad.ok()) << "a local rank beyond LOCAL_WORLD_SIZE is refused by the environment check";
  for (const char* v : {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"}) ::unsetenv(v);
}

TEST(TensorBytes, CountsCpuTensorsAndTheirPeakSinceTheLastReset) {
  CountCpuTensorBytes();
  CountCpuTensorBytes();  // a second call changes nothing
  const torch::Device cpu(torch::kCPU);
  const TensorBytes before = SampleMemory(cpu).tensors;
  constexpr int64_t kMiB = 1 << 20;
  {
    torch::Tensor a = torch::empty({4 * kMiB / 4}, torch::kFloat);  // 4 MiB
    const TensorBytes held = SampleMemory(cpu).tensors;
    EXPECT_GE(held.current - before.current, 4 * kMiB);
    EXPECT_GE(held.peak, held.current);
    {
      torch::Tensor b = torch::ones({2 * kMiB / 4}, torch::kFloat);  // 2 MiB more, then freed
      EXPECT_GE(SampleMemory(cpu).tensors.current - held.current, 2 * kMiB);
    }
    const TensorBytes after_b = SampleMemory(cpu).tensors;
    EXPECT_LT(after_b.current - held.current, kMiB) << "the freed tensor is uncounted";
    EXPECT_GE(after_b.peak - held.current, 2 * kMiB) << "the peak remembers it";
    ResetTensorPeak(cpu);
    EXPECT_EQ(SampleMemory(cpu).tensors.peak, SampleMemory(cpu).tensors.current);
  }
  EXPECT_LT(SampleMemory(cpu).tensors.current - before.current, kMiB);
  // The process's peak RSS is not the tensor peak and survives the reset.
  EXPECT_GT(SampleMemory(cpu).peak_bytes, 0);
}

TEST(TensorBytes, AnAllocationPastTheLimitIsOutOfMemoryAndZeroLifts) {
  CountCpuTensorBytes();
  const torch::Device cpu(torch::kCPU);
  constexpr int64_t kMiB = 1 << 20;
  const int64_t held = SampleMemory(cpu).tensors.current;
  ASSERT_TRUE(LimitTensorMemory(cpu, held + 8 * kMiB).ok());
  EXPECT_EQ(TensorMemoryLimit(), held + 8 * kMiB);
  {
    torch::Tensor fits = torch::empty({4 * kMiB / 4}, torch::kFloat);  // 4 MiB of 8
    try {
      torch::Tensor over = torch::empty({8 * kMiB / 4}, torch::kFloat);
      ADD_FAILURE() << "8 MiB more fitted under the limit";
    } catch (const c10::OutOfMemoryError& e) {
      EXPECT_NE(std::string(e.what()).find("training.memory_limit_mib"), std::string::npos) << e.what();
    }
  }
  ASSERT_TRUE(LimitTensorMemory(cpu, 0).ok());
  EXPECT_EQ(TensorMemoryLimit(), 0);
  torch::Tensor big = torch::empty({16 * kMiB / 4}, torch::kFloat);
  EXPECT_EQ(big.numel(), 4 * kMiB);
}

TEST(ConfigureCudaAllocator, ExpandableSegmentsUnlessTheEnvironmentSaysOtherwise) {
  const char* before = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(ConfigureCudaAllocator(), "expandable_segments:True");
  EXPECT_STREQ(std::getenv("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:True");
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128", 1);
  EXPECT_EQ(ConfigureCudaAllocator(), "max_split_size_mb:128");  // a user's setting stays
  if (before != nullptr) {
    ::setenv("PYTORCH_CUDA_ALLOC_CONF", saved.c_str(), 1);
  } else {
    ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  }
}

TEST(DeviceProfile, AutoOnCudaReadsTheDevicesName) {
  using P = config::DeviceProfileName;
  EXPECT_EQ(ProfileForCudaName("NVIDIA H200"), P::kH200);
  EXPECT_EQ(ProfileForCudaName("NVIDIA H100 80GB HBM3"), P::kH100Sxm);
  EXPECT_EQ(ProfileForCudaName("NVIDIA H100 SXM5 80GB"), P::kH100Sxm);
  EXPECT_EQ(ProfileForCudaName("NVIDIA A100-SXM4-80GB"), P::kA100);
  EXPECT_EQ(ProfileForCudaName("NVIDIA L4"), P::kL4);
  // Other peaks than any profile's: auto (the trainer says so and assumes h100-sxm).
  EXPECT_EQ(ProfileForCudaName("NVIDIA H100 PCIe"), P::kAuto);
  EXPECT_EQ(ProfileForCudaName("NVIDIA L40S"), P::kAuto);
  EXPECT_EQ(ProfileForCudaName(""), P::kAuto);
}

// The CPU's peak is one core's times the threads that compute, no more than the usable cores.
TEST(DeviceProfile, CpuPeakIsOneCoresTimesTheThreadsThatFitTheCores) {
  EXPECT_DOUBLE_EQ(CpuPeakFlops(10e9, 4, 2), 20e9);
  EXPECT_DOUBLE_EQ(CpuPeakFlops(10e9, 1, 8), 10e9);
  EXPECT_DOUBLE_EQ(CpuPeakFlops(10e9, 0, 8), 10e9);
  EXPECT_GE(UsableCores(), 1);
}

// The measurement runs on one thread and gives the process its threads back; the profile's
// figure is that measurement scaled (bounded here by the measurement's own spread: the profile
// measures again), and its basis says how it was made.
TEST(DeviceProfile, CpuPeakIsMeasuredOnOneThreadAndSaysSo) {
  const int threads = torch::get_num_threads(), blas = BlasThreads();
  const double core = MeasureCoreMatmulFlops();
  EXPECT_GT(core, 1e8);
  EXPECT_EQ(torch::get_num_threads(), threads);
  EXPECT_EQ(BlasThreads(), blas);
  const DeviceProfile p = ResolveDeviceProfile(config::DeviceProfileName::kAuto, 0, torch::kCPU);
  EXPECT_EQ(p.name, "cpu");
  EXPECT_GT(p.peak_flops, 0);
  const int used = std::max(1, std::min(std::max(threads, blas), UsableCores()));
  EXPECT_NE(p.basis.find("x " + std::to_string(used)), std::string::npos) << p.basis;
  EXPECT_EQ(ResolveDeviceProfile(config::DeviceProfileName::kCpu, 2.5, torch::kCPU).peak_flops, 2.5e12);
}

}  // namespace
}  // namespace meshwork::train
