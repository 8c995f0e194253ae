// The arithmetic of the fused RMSNorm (fused_ops.h FusedRmsNorm, FusedAddRmsNorm), shared by the
// CUDA kernels (fused_kernels.cu) and the host loops (fused_ops.cpp) like fused_elementwise.h.
// A row of `dim` elements is handled by kNormThreads lanes in packs of N columns (PackFor over
// dim and every array: the narrowest dtype's 16 bytes, else 1), lane k owning packs k, k +
// kNormThreads, ... (at most kNormColumnsPerLane columns in all); a row's sums go through the
// lanes' tree of fused_softmax.h's shape. Rows are dealt to blocks: block b takes rows b, b +
// blocks, ..., and backward sums each block's share of the weight's gradient into its own row of a
// [blocks, dim] buffer, summed afterwards: no atomics, the same sums on the host and the GPU.
//
//   forward   h = x + delta (when there is a delta), r = 1 / sqrt(mean(h^2) + eps),
//             y = w * (h * r), rounded to y's dtype once; r saved per row
//   backward  u = h * r, g = w * dy, dot = sum(g * u);
//             dh = r * (g - u * dot / dim) + dh_residual;  dw += dy * u
#pragma once

#include <math.h>

#include <cstdint>

#include "trainer/model/fused_elementwise.h"

namespace meshwork::model::fused {

// Lanes (a CUDA block's threads) per row: a power of two.
inline constexpr int kNormThreads = 256;
// Columns a lane owns at most: rows up to kNormThreads * kNormColumnsPerLane = 8192 wide (Llama 3
// 70B's hidden size); wider ones take the composition.
inline constexpr int kNormColumnsPerLane = 32;
inline constexpr int64_t kNormMaxDim = int64_t{kNormThreads} * kNormColumnsPerLane;

MW_HOST_DEVICE float Rsqrt(float x) { return 1.f / sqrtf(x); }
MW_HOST_DEVICE double Rsqrt(double x) { return 1.0 / sqrt(x); }

// One step of a tree of sums over the lanes: lane < stride adds lane + stride's.
template <typename Acc>
MW_HOST_DEVICE void SumTreeStep(Acc* lanes, int lane, int stride) {
  if (lane < stride) lanes[lane] += lanes[lane + stride];
}

// Forward, first pass: lane's sum of h^2 over its columns of the row, writing h = x + delta when
// there is a delta (h and x the same type X; delta D).
template <typename X, typename D, typename Acc, int N = 1>
MW_HOST_DEVICE Acc NormSquaresLane(const X* x, const D* delta, X* h, int64_t dim, int lane) {
  Acc sum = Acc(0);
  for (int64_t j = int64_t{lane} * N; j < dim; j += int64_t{kNormThreads} * N) {
    const Pack<X, N> xs = LoadPack<N>(x + j);
    if (delta != nullptr) {
      const Pack<D, N> ds = LoadPack<N>(delta + j);
      Pack<X, N> hs;
      MW_UNROLL
      for (int k = 0; k < N; ++k) {
        hs.v[k] = static_cast<X>(static_cast<Acc>(xs.v[k]) + static_cast<Acc>(ds.v[k]));
        const Acc v = static_cast<Acc>(hs.v[k]);
        sum += v * v;
      }
      StorePack(h + j, hs);
    } else {
      MW_UNROLL
      for (int k = 0; k < N; ++k) {
        const Acc v = static_cast<Acc>(xs.v[k]);
        sum += v * v;
      }
    }
  }
  return sum;
}

template <typename Acc>
MW_HOST_DEVICE Acc NormRstd(Acc sum_squares, int64_t dim, Acc eps) {
  return Rsqrt(sum_squares / static_cast<Acc>(dim) + eps);
}

// Forward, second pass: y = w * (h * r) for the lane's columns.
template <typename X, typename Y, typename Acc, int N = 1>
MW_HOST_DEVICE void NormOutputLane(const X* h, const Acc* w, Acc rstd, Y* y, int64_t dim, int lane) {
  for (int64_t j = int64_t{lane} * N; j < dim; j += int64_t{kNormThreads} * N) {
    const Pack<X, N> hs = LoadPack<N>(h + j);
    const Pack<Acc, N> ws = LoadPack<N>(w + j);
    Pack<Y, N> ys;
    MW_UNROLL
    for (int k = 0; k < N; ++k) ys.v[k] = static_cast<Y>(ws.v[k] * (static_cast<Acc>(hs.v[k]) * rstd));
    StorePack(y + j, ys);
  }
}

// Backward, first pass: lane's sum of g * u over its columns.
template <typename X, typename Y, typename Acc, int N = 1>
MW_HOST_DEVICE Acc NormDotLane(const X* h, const Y* dy, const Acc* w, Acc rstd, int64_t dim, int lane) {
  Acc sum = Acc(0);
  for (int64_t j = int64_t{lane} * N; j < dim; j += int64_t{kNormThreads} * N) {
    const Pack<X, N> hs = LoadPack<N>(h + j);
    const Pack<Y, N> dys = LoadPack<N>(dy + j);
    const Pack<Acc, N> ws = LoadPack<N>(w + j);
    MW_UNROLL
    for (int k = 0; k < N; ++k) sum += ws.v[k] * static_cast<Acc>(dys.v[k]) * (static_cast<Acc>(hs.v[k]) * rstd);
  }
  return sum;
}

// Backward, second pass for the lane's columns: dh (into dx, and into ddelta when there is a
// delta), plus dh_residual when given; the weight's gradient added into the lane's accumulators
// (the m-th pack's column k in dw[m * N + k]).
template <typename X, typename D, typename Y, typename Acc, int N = 1>
MW_HOST_DEVICE void NormGradLane(const X* h, const Y* dy, const X* dh_residual, const Acc* w, Acc rstd, Acc dot,
                                 X* dx, D* ddelta, Acc* dw, int64_t dim, int lane) {
  const Acc mean_dot = dot / static_cast<Acc>(dim);
  int m = 0;
  for (int64_t j = int64_t{lane} * N; j < dim; j += int64_t{kNormThreads} * N, ++m) {
    const Pack<X, N> hs = LoadPack<N>(h + j);
    const Pack<Y, N> dys = LoadPack<N>(dy + j);
    const Pack<Acc, N> ws = LoadPack<N>(w + j);
    Pack<X, N> res{};
    if (dh_residual != nullptr) res = LoadPack<N>(dh_residual + j);
    Pack<X, N> dxs;
    Pack<D, N> dds;
    MW_UNROLL
    for (int k = 0; k < N; ++k) {
      const Acc u = static_cast<Acc>(hs.v[k]) * rstd;
      const Acc g = static_cast<Acc>(dys.v[k]);
      Acc d = rstd * (ws.v[k] * g - u * mean_dot);
      if (dh_residual != nullptr) d += static_cast<Acc>(res.v[k]);
      dxs.v[k] = static_cast<X>(d);
      dds.v[k] = static_cast<D>(d);
      dw[m * N + k] += g * u;
    }
    StorePack(dx + j, dxs);
    if (ddelta != nullptr) StorePack(ddelta + j, dds);
  }
}

// The lane's weight-gradient accumulators (NormGradLane's dw) into its columns of dw_row [dim].
template <typename Acc, int N = 1>
MW_HOST_DEVICE void NormWeightGradLane(const Acc* dw, Acc* dw_row, int64_t dim, int lane) {
  int m = 0;
  for (int64_t j = int64_t{lane} * N; j < dim; j += int64_t{kNormThreads} * N, ++m) {
    MW_UNROLL
    for (int k = 0; k < N; ++k) dw_row[j + k] = dw[m * N + k];
  }
}

}  // namespace meshwork::model::fused
