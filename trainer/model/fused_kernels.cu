// The CUDA kernels of the fused ops: for SwiGLU and RoPE one grid-stride loop each over the output
// elements, calling the arithmetic in fused_elementwise.h; for the head's softmax gradient one
// block of kRowThreads threads per row (fused_softmax.h). The CPU tests run the same arithmetic
// on the host.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "trainer/model/fused_kernels.h"

namespace meshwork::model::fused {
namespace {

constexpr int kThreads = 256;

// Enough blocks to cover n once, capped: the grid-stride loop covers the rest.
unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, int64_t{1} << 20));
}

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

template <typename T, typename Acc>
__global__ void SwiGluForwardKernel(int64_t n, int64_t f, const T* gate_up, T* out) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) SwiGluForwardAt<T, Acc>(i, f, gate_up, out);
}

template <typename T, typename Acc>
__global__ void SwiGluBackwardKernel(int64_t n, int64_t f, const T* gate_up, const T* grad_out, T* grad_gate_up) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) SwiGluBackwardAt<T, Acc>(i, f, gate_up, grad_out, grad_gate_up);
}

template <typename T, typename Acc>
__global__ void RopeForwardKernel(int64_t n, RopeShape shape, const T* x, const Acc* cos, const Acc* sin, T* out) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) RopeForwardAt<T, Acc>(i, shape, x, cos, sin, out);
}

template <typename T, typename Acc>
__global__ void RopeBackwardKernel(int64_t n, RopeShape shape, const T* grad_out, const Acc* cos, const Acc* sin,
                                   T* grad_x) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) RopeBackwardAt<T, Acc>(i, shape, grad_out, cos, sin, grad_x);
}

// One row per block (grid-stride over rows), kRowThreads threads: each thread's (max, sum) over
// its columns, the tree over the block's threads in shared memory, then the gradient in place.
// The target's logit is read before any thread overwrites it.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kRowThreads)
    SoftmaxGradientKernel(int64_t rows, int64_t vocab, T* logits, const int64_t* targets, Acc* lse,
                          Acc* target_logit) {
  __shared__ SoftmaxStats<Acc> lanes[kRowThreads];
  __shared__ Acc row_lse;
  const int lane = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* row = logits + r * vocab;
    lanes[lane] = LaneStats<T, Acc>(row, vocab, lane);
    for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
      __syncthreads();
      TreeStep(lanes, lane, stride);
    }
    __syncthreads();
    if (lane == 0) {
      row_lse = LogSumExp(lanes[0]);
      lse[r] = row_lse;
      target_logit[r] = static_cast<Acc>(row[targets[r]]);
    }
    __syncthreads();
    const Acc l = row_lse;
    const int64_t target = targets[r];
    for (int64_t j = lane; j < vocab; j += kRowThreads) SoftmaxGradientAt<T, Acc>(row, j, target, l);
    __syncthreads();  // lanes[] and row_lse are reused by the next row
  }
}

// Calls launch(T{}, Acc{}) for the element type; returns the launch's error string or nullptr.
template <typename Launch>
const char* Dispatch(ElementType type, Launch&& launch) {
  switch (type) {
    case ElementType::kFloat: launch(float{}, float{}); break;
    case ElementType::kDouble: launch(double{}, double{}); break;
    case ElementType::kBFloat16: launch(c10::BFloat16{}, float{}); break;
    case ElementType::kHalf: launch(c10::Half{}, float{}); break;
  }
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? nullptr : cudaGetErrorString(status);
}

}  // namespace

const char* LaunchSoftmaxGradient(ElementType type, int64_t rows, int64_t vocab, void* logits, const int64_t* targets,
                                  void* lse, void* target_logit, void* stream) {
  if (rows == 0) return nullptr;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
  return Dispatch(type, [&](auto t, auto acc) {
    using T = decltype(t);
    using Acc = decltype(acc);
    SoftmaxGradientKernel<T, Acc><<<blocks, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        rows, vocab, static_cast<T*>(logits), targets, static_cast<Acc*>(lse), static_cast<Acc*>(target_logit));
  });
}

const char* LaunchSwiGluForward(ElementType type, int64_t rows, int64_t f, const void* gate_up, void* out,
                                void* stream) {
  const int64_t n = rows * f;
  if (n == 0) return nullptr;
  return Dispatch(type, [&](auto t, auto acc) {
    using T = decltype(t);
    using Acc = decltype(acc);
    SwiGluForwardKernel<T, Acc><<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, f, static_cast<const T*>(gate_up), static_cast<T*>(out));
  });
}

const char* LaunchSwiGluBackward(ElementType type, int64_t rows, int64_t f, const void* gate_up,
                                 const void* grad_out, void* grad_gate_up, void* stream) {
  const int64_t n = rows * f;
  if (n == 0) return nullptr;
  return Dispatch(type, [&](auto t, auto acc) {
    using T = decltype(t);
    using Acc = decltype(acc);
    SwiGluBackwardKernel<T, Acc><<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, f, static_cast<const T*>(gate_up), static_cast<const T*>(grad_out), static_cast<T*>(grad_gate_up));
  });
}

const char* LaunchRopeForward(ElementType type, int64_t batch, const RopeShape& shape, const void* x,
                              const void* cos, const void* sin, void* out, void* stream) {
  const int64_t n = batch * shape.heads * shape.seq * shape.dim;
  if (n == 0) return nullptr;
  return Dispatch(type, [&](auto t, auto acc) {
    using T = decltype(t);
    using Acc = decltype(acc);
    RopeForwardKernel<T, Acc><<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, shape, static_cast<const T*>(x), static_cast<const Acc*>(cos), static_cast<const Acc*>(sin),
        static_cast<T*>(out));
  });
}

const char* LaunchRopeBackward(ElementType type, int64_t batch, const RopeShape& shape, const void* grad_out,
                               const void* cos, const void* sin, void* grad_x, void* stream) {
  const int64_t n = batch * shape.heads * shape.seq * shape.dim;
  if (n == 0) return nullptr;
  return Dispatch(type, [&](auto t, auto acc) {
    using T = decltype(t);
    using Acc = decltype(acc);
    RopeBackwardKernel<T, Acc><<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, shape, static_cast<const T*>(grad_out), static_cast<const Acc*>(cos), static_cast<const Acc*>(sin),
        static_cast<T*>(grad_x));
  });
}

}  // namespace meshwork::model::fused
