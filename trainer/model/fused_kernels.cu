// The CUDA kernels of the fused ops: for SwiGLU and RoPE one grid-stride loop each over the output
// packs (N elements, one 16-byte access where the shapes allow), calling the arithmetic in
// fused_elementwise.h; for the head's softmax gradient one block of kRowThreads threads per row
// (fused_softmax.h); for RMSNorm one block of kNormThreads threads per row (fused_norm.h); for
// AdamW one grid-stride loop per parameter (fused_adamw.h). The CPU tests run the same arithmetic
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

// The elementwise kernels: one pack of N elements (fused_elementwise.h) per thread and round.
template <typename T, typename Acc, int N>
__global__ void SwiGluForwardKernel(int64_t packs, Divider per_row, const T* gate_up, T* out) {
  for (int64_t v = FirstIndex(); v < packs; v += Stride()) SwiGluForwardAt<T, Acc, N>(v, per_row, gate_up, out);
}

template <typename T, typename Acc, int N>
__global__ void SwiGluBackwardKernel(int64_t packs, Divider per_row, const T* gate_up, const T* grad_out,
                                     T* grad_gate_up) {
  for (int64_t v = FirstIndex(); v < packs; v += Stride()) {
    SwiGluBackwardAt<T, Acc, N>(v, per_row, gate_up, grad_out, grad_gate_up);
  }
}

template <typename T, typename Acc, int N>
__global__ void RopeForwardKernel(int64_t packs, RopeShape shape, const T* x, const Acc* cos, const Acc* sin, T* out) {
  for (int64_t v = FirstIndex(); v < packs; v += Stride()) RopeForwardAt<T, Acc, N>(v, shape, x, cos, sin, out);
}

template <typename T, typename Acc, int N>
__global__ void RopeBackwardKernel(int64_t packs, RopeShape shape, const T* grad_out, const Acc* cos, const Acc* sin,
                                   T* grad_x) {
  for (int64_t v = FirstIndex(); v < packs; v += Stride()) {
    RopeBackwardAt<T, Acc, N>(v, shape, grad_out, cos, sin, grad_x);
  }
}

// One row per block (grid-stride over rows), kRowThreads threads: each thread's (max, sum) over
// its columns, the tree over the block's threads in shared memory, then the gradient in place.
// The target's logit is read before any thread overwrites it.
template <typename T, typename Acc, int N>
__global__ void __launch_bounds__(kRowThreads)
    SoftmaxGradientKernel(int64_t rows, int64_t vocab, T* logits, const int64_t* targets, Acc* lse,
                          Acc* target_logit) {
  __shared__ SoftmaxStats<Acc> lanes[kRowThreads];
  __shared__ Acc row_lse;
  const int lane = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* row = logits + r * vocab;
    lanes[lane] = LaneStats<T, Acc, N>(row, vocab, lane);
    for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
      __syncthreads();
      TreeStep(lanes, lane, stride);
    }
    __syncthreads();
    const int64_t target = targets[r];
    // A target outside the row (checked on the host by the host loop; here without a sync) reads
    // nothing and makes the row's loss NaN, not a read past the row.
    const bool in_row = target >= 0 && target < vocab;
    if (lane == 0) {
      row_lse = LogSumExp(lanes[0]);
      lse[r] = in_row ? row_lse : static_cast<Acc>(NAN);
      target_logit[r] = in_row ? static_cast<Acc>(row[target]) : static_cast<Acc>(NAN);
    }
    __syncthreads();
    const Acc l = row_lse;
    for (int64_t v = lane; v < vocab / N; v += kRowThreads) SoftmaxGradientAt<T, Acc, N>(row, v, target, l);
    __syncthreads();  // lanes[] and row_lse are reused by the next row
  }
}

// RMSNorm forward: one row per block (grid-stride over rows), kNormThreads threads; each thread
// reads back only the h it wrote itself.
template <typename X, typename D, typename Y, typename Acc, int N>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormForwardKernel(int64_t rows, int64_t dim, const X* x, const D* delta, X* h, const Acc* w, Acc eps, Y* y,
                         Acc* rstd) {
  __shared__ Acc lanes[kNormThreads];
  const int lane = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const X* xr = x + r * dim;
    const D* dr = delta != nullptr ? delta + r * dim : nullptr;
    X* hr = delta != nullptr ? h + r * dim : nullptr;
    lanes[lane] = NormSquaresLane<X, D, Acc, N>(xr, dr, hr, dim, lane);
    for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
      __syncthreads();
      SumTreeStep(lanes, lane, stride);
    }
    __syncthreads();
    const Acc row_rstd = NormRstd(lanes[0], dim, eps);
    if (lane == 0) rstd[r] = row_rstd;
    NormOutputLane<X, Y, Acc, N>(hr != nullptr ? hr : xr, w, row_rstd, y + r * dim, dim, lane);
    __syncthreads();  // every thread has read lanes[0] before the next row overwrites it
  }
}

// RMSNorm backward: block b takes rows b, b + gridDim.x, ... and writes its share of the
// weight's gradient to row b of dw_partial.
template <typename X, typename D, typename Y, typename Acc, int N>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormBackwardKernel(int64_t rows, int64_t dim, const X* h, const Y* dy, const X* dh_residual, const Acc* w,
                          const Acc* rstd, X* dx, D* ddelta, Acc* dw_partial) {
  __shared__ Acc lanes[kNormThreads];
  const int lane = static_cast<int>(threadIdx.x);
  Acc dw[kNormColumnsPerLane];
  for (int k = 0; k < kNormColumnsPerLane; ++k) dw[k] = Acc(0);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t at = r * dim;
    const Acc row_rstd = rstd[r];
    lanes[lane] = NormDotLane<X, Y, Acc, N>(h + at, dy + at, w, row_rstd, dim, lane);
    for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
      __syncthreads();
      SumTreeStep(lanes, lane, stride);
    }
    __syncthreads();
    const Acc dot = lanes[0];
    NormGradLane<X, D, Y, Acc, N>(h + at, dy + at, dh_residual != nullptr ? dh_residual + at : nullptr, w, row_rstd,
                                  dot, dx + at, ddelta != nullptr ? ddelta + at : nullptr, dw, dim, lane);
    __syncthreads();  // every thread has read lanes[0] before the next row overwrites it
  }
  NormWeightGradLane<Acc, N>(dw, dw_partial + blockIdx.x * dim, dim, lane);
}

// AdamW over one parameter, its work items (AdamWItem: packs of N floats from the arrays' common
// 16-byte boundary, then the loose elements before it and past the last pack) dealt
// grid-stride. `scale` (a double on the device, or null for 1) is read by every thread: no host
// sync for the clip factor.
template <int N>
__global__ void AdamWKernel(int64_t n, int64_t head, AdamWStep step, const double* scale, float* param,
                            const float* grad, float* exp_avg, float* exp_avg_sq, c10::BFloat16* copy) {
  const float c = scale != nullptr ? static_cast<float>(*scale) : 1.0f;
  const int64_t items = AdamWItems<N>(n, head);
  for (int64_t r = FirstIndex(); r < items; r += Stride()) {
    AdamWItem<N>(r, n, head, step, c, param, grad, exp_avg, exp_avg_sq, copy);
  }
}

// The last launch's error string, or nullptr.
const char* LaunchError() {
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? nullptr : cudaGetErrorString(status);
}

// Calls launch(X{}, D{}, Y{}, Acc{}, std::integral_constant<int, N>{}) for a supported (x, delta,
// y) combination and pack width (VisitNormTypesPacked); returns the launch's error string, or one
// for an unsupported combination.
template <typename Launch>
const char* DispatchNorm(ElementType x, ElementType d, ElementType y, int pack, Launch&& launch) {
  if (!VisitNormTypesPacked(x, d, y, pack, launch)) return "unsupported combination of dtypes or pack width";
  return LaunchError();
}

// Calls launch(T{}, Acc{}, std::integral_constant<int, N>{}) for the element type and pack width
// N (1 or kPack<T>); returns the launch's error string or nullptr.
template <typename Launch>
const char* DispatchPacked(ElementType type, int pack, Launch&& launch) {
  if (!VisitElementTypePacked(type, pack, launch)) return "unsupported pack width";
  return LaunchError();
}

}  // namespace

const char* LaunchSoftmaxGradient(ElementType type, int64_t rows, int64_t vocab, int pack, void* logits,
                                  const int64_t* targets, void* lse, void* target_logit, void* stream) {
  if (rows == 0) return nullptr;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
  return DispatchPacked(type, pack, [&](auto t, auto acc, auto width) {
    using T = decltype(t);
    using Acc = decltype(acc);
    SoftmaxGradientKernel<T, Acc, decltype(width)::value>
        <<<blocks, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        rows, vocab, static_cast<T*>(logits), targets, static_cast<Acc*>(lse), static_cast<Acc*>(target_logit));
  });
}

const char* LaunchRmsNormForward(ElementType x_type, ElementType delta_type, ElementType y_type, int64_t rows,
                                 int64_t dim, int pack, const void* x, const void* delta, void* h, const void* w,
                                 double eps, void* y, void* rstd, void* stream) {
  if (rows == 0) return nullptr;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
  return DispatchNorm(x_type, delta_type, y_type, pack, [&](auto xt, auto dt, auto yt, auto acc, auto width) {
    using X = decltype(xt);
    using D = decltype(dt);
    using Y = decltype(yt);
    using Acc = decltype(acc);
    RmsNormForwardKernel<X, D, Y, Acc, decltype(width)::value>
        <<<blocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        rows, dim, static_cast<const X*>(x), static_cast<const D*>(delta), static_cast<X*>(h),
        static_cast<const Acc*>(w), static_cast<Acc>(eps), static_cast<Y*>(y), static_cast<Acc*>(rstd));
  });
}

const char* LaunchRmsNormBackward(ElementType x_type, ElementType delta_type, ElementType y_type, int64_t rows,
                                  int64_t dim, int pack, const void* h, const void* dy, const void* dh_residual,
                                  const void* w, const void* rstd, void* dx, void* ddelta, void* dw_partial,
                                  void* stream) {
  if (rows == 0) return nullptr;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, kNormBlocks));
  return DispatchNorm(x_type, delta_type, y_type, pack, [&](auto xt, auto dt, auto yt, auto acc, auto width) {
    using X = decltype(xt);
    using D = decltype(dt);
    using Y = decltype(yt);
    using Acc = decltype(acc);
    RmsNormBackwardKernel<X, D, Y, Acc, decltype(width)::value>
        <<<blocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        rows, dim, static_cast<const X*>(h), static_cast<const Y*>(dy), static_cast<const X*>(dh_residual),
        static_cast<const Acc*>(w), static_cast<const Acc*>(rstd), static_cast<X*>(dx), static_cast<D*>(ddelta),
        static_cast<Acc*>(dw_partial));
  });
}

const char* LaunchSwiGluForward(ElementType type, int64_t rows, int64_t f, int pack, const void* gate_up, void* out,
                                void* stream) {
  const int64_t packs = rows * f / pack;
  if (packs == 0) return nullptr;
  return DispatchPacked(type, pack, [&](auto t, auto acc, auto width) {
    using T = decltype(t);
    using Acc = decltype(acc);
    SwiGluForwardKernel<T, Acc, decltype(width)::value>
        <<<Blocks(packs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            packs, Divider(f / pack, packs), static_cast<const T*>(gate_up), static_cast<T*>(out));
  });
}

const char* LaunchSwiGluBackward(ElementType type, int64_t rows, int64_t f, int pack, const void* gate_up,
                                 const void* grad_out, void* grad_gate_up, void* stream) {
  const int64_t packs = rows * f / pack;
  if (packs == 0) return nullptr;
  return DispatchPacked(type, pack, [&](auto t, auto acc, auto width) {
    using T = decltype(t);
    using Acc = decltype(acc);
    SwiGluBackwardKernel<T, Acc, decltype(width)::value>
        <<<Blocks(packs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            packs, Divider(f / pack, packs), static_cast<const T*>(gate_up), static_cast<const T*>(grad_out),
            static_cast<T*>(grad_gate_up));
  });
}

const char* LaunchRopeForward(ElementType type, int64_t batch, const RopeShape& shape, const void* x,
                              const void* cos, const void* sin, void* out, void* stream) {
  const int64_t packs = batch * shape.heads * shape.seq * shape.dim / shape.pack;
  if (packs == 0) return nullptr;
  return DispatchPacked(type, shape.pack, [&](auto t, auto acc, auto width) {
    using T = decltype(t);
    using Acc = decltype(acc);
    RopeForwardKernel<T, Acc, decltype(width)::value>
        <<<Blocks(packs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            packs, shape, static_cast<const T*>(x), static_cast<const Acc*>(cos), static_cast<const Acc*>(sin),
            static_cast<T*>(out));
  });
}

const char* LaunchRopeBackward(ElementType type, int64_t batch, const RopeShape& shape, const void* grad_out,
                               const void* cos, const void* sin, void* grad_x, void* stream) {
  const int64_t packs = batch * shape.heads * shape.seq * shape.dim / shape.pack;
  if (packs == 0) return nullptr;
  return DispatchPacked(type, shape.pack, [&](auto t, auto acc, auto width) {
    using T = decltype(t);
    using Acc = decltype(acc);
    RopeBackwardKernel<T, Acc, decltype(width)::value>
        <<<Blocks(packs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            packs, shape, static_cast<const T*>(grad_out), static_cast<const Acc*>(cos),
            static_cast<const Acc*>(sin), static_cast<T*>(grad_x));
  });
}

const char* LaunchAdamW(int64_t n, int pack, int64_t head, const AdamWStep& step, const double* scale, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq, c10::BFloat16* copy, void* stream) {
  if (n == 0) return nullptr;
  if (head < 0 || head >= n || (pack == 1 && head != 0)) return "AdamW: a head of elements outside [0, n) or with packs of 1";
  const bool known = VisitPack<float>(pack, [&](auto width) {
    constexpr int N = decltype(width)::value;
    AdamWKernel<N><<<Blocks(AdamWItems<N>(n, head)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, head, step, scale, param, grad, exp_avg, exp_avg_sq, copy);
  });
  return known ? LaunchError() : "unsupported pack width";
}

}  // namespace meshwork::model::fused
