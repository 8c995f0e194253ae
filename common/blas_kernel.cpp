#include "common/blas_kernel.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace meshwork {
namespace {

constexpr const char* kChosenBy = "MESHWORK_OPENBLAS_FALLBACK";

// openblas_get_corename() of the OpenBLAS in this process, or "" when none is loaded.
std::string LoadedCorename() {
  using Corename = char* (*)();
  auto corename = reinterpret_cast<Corename>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return "";
  const char* name = corename();
  return name != nullptr ? name : "";
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::string BlasKernelForCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

bool IsPreAvx2BlasKernel(const std::string& corename) {
  // OpenBLAS's x86-64 kernel sets older than Haswell (its dynamic.c names them so).
  static const char* const kOld[] = {"unknown", "katmai",  "coppermine", "northwood",    "prescott",
                                     "banias",  "atom",    "core2",      "penryn",       "dunnington",
                                     "nehalem", "athlon",  "opteron",    "opteron_sse3", "barcelona",
                                     "nano",    "sandybridge", "bobcat", "bulldozer",    "piledriver"};
  const std::string name = Lower(corename);
  return std::any_of(std::begin(kOld), std::end(kOld), [&](const char* old) { return name == old; });
}

void UseBestBlasKernel(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string loaded = LoadedCorename();
  if (loaded.empty() || !IsPreAvx2BlasKernel(loaded)) return;
  const std::string best = BlasKernelForCpu();
  if (best.empty()) return;
  if (setenv("OPENBLAS_CORETYPE", best.c_str(), 1) != 0 || setenv(kChosenBy, loaded.c_str(), 1) != 0) return;
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  // Only reached when the exec failed: go on with the slow kernels, and say so.
  std::fprintf(stderr, "meshwork: OpenBLAS runs its %s kernels on a CPU with %s; running again with "
               "OPENBLAS_CORETYPE=%s failed (%s): set OPENBLAS_CORETYPE=%s yourself\n",
               loaded.c_str(), best == "SkylakeX" ? "AVX-512" : "AVX2", best.c_str(), std::strerror(errno),
               best.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kChosenBy);
}

int BlasThreads() {
  using Get = int (*)();
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get == nullptr ? 0 : get();
}

void SetBlasThreads(int threads) {
  using Set = void (*)(int);
  auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set != nullptr) set(threads);
}

std::string BlasKernelNote() {
  const std::string loaded = LoadedCorename();
  if (loaded.empty()) return "";
  std::string note = "OpenBLAS " + loaded + " kernels";
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* fallback = std::getenv(kChosenBy);
  if (coretype != nullptr && fallback != nullptr) {
    note += std::string(" (OPENBLAS_CORETYPE=") + coretype + ", set by Meshwork: this OpenBLAS chose its " +
            fallback + " kernels for this CPU; set OPENBLAS_CORETYPE to choose yourself)";
  } else if (coretype != nullptr) {
    note += std::string(" (OPENBLAS_CORETYPE=") + coretype + ")";
  } else if (IsPreAvx2BlasKernel(loaded)) {
    const std::string best = BlasKernelForCpu();
    if (!best.empty()) {
      note += " (this CPU has " + std::string(best == "SkylakeX" ? "AVX-512" : "AVX2") + ": OPENBLAS_CORETYPE=" +
              best + " would be faster)";
    }
  }
  return note;
}

}  // namespace meshwork
