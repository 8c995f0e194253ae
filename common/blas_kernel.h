// The BLAS kernels a process runs. OpenBLAS picks its kernel set once, as it loads, from the CPU's
// model number; an OpenBLAS older than the CPU does not know the model and falls back to its
// generic SSE3 kernels ("Prescott"). Debian 12's OpenBLAS 0.3.21 does so on Intel family 6 model
// 207 (Emerald Rapids): fp32 matrix multiplies at 63 GFLOP/s a core instead of 141 with the
// AVX-512 kernels, and a llama-100m training step 3.6x slower. OpenBLAS reads the override,
// OPENBLAS_CORETYPE, only as it loads, before main, so the fix is to run the program again with it.
#pragma once

#include <string>

namespace meshwork {

// The OpenBLAS kernel set this CPU's features allow: "SkylakeX" (AVX-512 F, CD, BW, DQ and VL,
// with the OS saving their state), "Haswell" (AVX2 and FMA), or "" (nothing better than SSE3).
std::string BlasKernelForCpu();

// Whether `corename` (openblas_get_corename()) is a kernel set without AVX2: OpenBLAS's fallback
// for a CPU it does not know, or a CPU that has nothing better.
bool IsPreAvx2BlasKernel(const std::string& corename);

// Call first in main, before any thread starts. When the OpenBLAS this process loaded runs
// kernels without AVX2 on a CPU that has AVX2 or AVX-512, and OPENBLAS_CORETYPE is unset, sets
// OPENBLAS_CORETYPE to BlasKernelForCpu() (and MESHWORK_OPENBLAS_FALLBACK to the kernel OpenBLAS
// chose, which BlasKernelNote reports) and re-executes this program with the same arguments, so
// OpenBLAS loads again with it. Returns when there is nothing to do (no OpenBLAS, OpenBLAS's
// choice is as good, OPENBLAS_CORETYPE set by the user or by an earlier run) or when the re-exec
// fails (a line on stderr says so; the program goes on, slower).
void UseBestBlasKernel(char** argv);

// The threads the OpenBLAS in this process multiplies matrices with (openblas_get_num_threads(),
// its own pool, which libtorch's thread setting does not size), or 0 when none is loaded.
int BlasThreads();
// Sets them (openblas_set_num_threads); nothing when no OpenBLAS is loaded.
void SetBlasThreads(int threads);

// What the BLAS runs, for a start-up log: "OpenBLAS SkylakeX kernels", with why when this
// program chose them; "" when no OpenBLAS is loaded (MKL, cuBLAS on a GPU build).
std::string BlasKernelNote();

}  // namespace meshwork
