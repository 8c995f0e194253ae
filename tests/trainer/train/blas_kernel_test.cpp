// The BLAS kernels a torch process runs: OpenBLAS's own pick, unless it is a kernel set without
// AVX2 on a CPU that has AVX2 or AVX-512 (an OpenBLAS that predates the CPU falls back so), where
// UseBestBlasKernel runs the program again with OPENBLAS_CORETYPE. This binary's main calls it
// (tests/common/torch_test_main.cpp), as meshwork-train's does.
#include "common/blas_kernel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>

namespace meshwork {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(BlasKernel, KernelSetsWithoutAvx2AreTheOldOnes) {
  for (const char* old : {"Prescott", "PRESCOTT", "Core2", "Nehalem", "Sandybridge", "Barcelona", "Unknown"})
    EXPECT_TRUE(IsPreAvx2BlasKernel(old)) << old;
  for (const char* modern : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "Excavator", ""})
    EXPECT_FALSE(IsPreAvx2BlasKernel(modern)) << modern;
}

TEST(BlasKernel, TheCpusKernelIsOneOpenBlasKnows) {
  const std::string best = BlasKernelForCpu();
  EXPECT_TRUE(best.empty() || best == "SkylakeX" || best == "Haswell") << best;
  if (!best.empty()) {
    EXPECT_FALSE(IsPreAvx2BlasKernel(best));
  }
}

TEST(BlasKernel, ThisProcessRunsKernelsWithAvx2WhereTheCpuHasThem) {
  torch::mm(torch::ones({8, 8}), torch::ones({8, 8}));  // the BLAS is loaded and in use
  const std::string note = BlasKernelNote();
  if (note.empty()) GTEST_SKIP() << "no OpenBLAS in this process (libtorch uses another BLAS)";
  ASSERT_THAT(note, StartsWith("OpenBLAS "));
  const std::string user = std::getenv("MESHWORK_OPENBLAS_FALLBACK") == nullptr && std::getenv("OPENBLAS_CORETYPE")
                               ? std::getenv("OPENBLAS_CORETYPE")
                               : "";
  if (!user.empty()) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << user << " was set before the test: the user's choice";
  if (BlasKernelForCpu().empty()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: " << note;
  const std::string corename = note.substr(9, note.find(' ', 9) - 9);
  EXPECT_FALSE(IsPreAvx2BlasKernel(corename)) << note;
  if (std::getenv("MESHWORK_OPENBLAS_FALLBACK") != nullptr) {
    EXPECT_THAT(note, HasSubstr("set by Meshwork"));
  }
}

}  // namespace
}  // namespace meshwork
