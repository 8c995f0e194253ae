// The arithmetic of Meshwork's AdamW kernel: one pass over a parameter's fp32 elements reads the
// parameter, its gradient and both moments and writes the parameter and the moments (28 bytes an
// element). libtorch's fused AdamW (at::_fused_adamw_) also writes every gradient back when it
// is given a gradient scale, which the trainer always gives it (the clip factor, on the device so
// that clipping needs no host sync): 32 bytes an element, in launches of at most 320 blocks of
// 65,536 elements each. The kernel (fused_kernels.cu) and the host loop (fused_ops.cpp) run this
// same function over packs of N = 4 floats (one 16-byte access) where the arrays allow it: from
// the element where all four are 16-byte aligned, which an FSDP shard (a view of its flat group
// at any element) puts up to 3 elements in, where its gradient and moments share its offset
// within the 16-byte line (AdamW allocates the moments so; model::ZerosInLineWith).
//
// The update is torch::optim::AdamW's, in its order (decoupled weight decay first), in fp32 with
// the step's constants rounded to fp32 once on the host:
//   g = grad * scale; p *= 1 - lr * wd; m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The gradient is read, never written. Where the parameter has a persistent copy in the matmuls'
// dtype (weight_copies.h), the same pass also writes the updated value there, rounded once
// (C = c10::BFloat16; 2 bytes an element more, where forward would have read 4 and written 2 to
// cast it again).
#pragma once

#include <cstdint>

#include "trainer/model/fused_elementwise.h"

namespace meshwork::model::fused {

// One update's constants for parameters at step count t (after the increment), in fp32.
struct AdamWStep {
  float decay = 1;             // 1 - lr * weight_decay
  float beta1 = 0.9f, one_minus_beta1 = 0.1f;
  float beta2 = 0.999f, one_minus_beta2 = 0.001f;
  float step_size = 0;         // lr / (1 - beta1^t)
  float bias2_sqrt = 1;        // sqrt(1 - beta2^t)
  float eps = 1e-8f;
};

// Host only: the constants of step t (>= 1), computed in double and rounded once.
inline AdamWStep MakeAdamWStep(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t) {
  AdamWStep s;
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.step_size = static_cast<float>(lr / (1.0 - pow(beta1, static_cast<double>(t))));
  s.bias2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, static_cast<double>(t))));
  s.eps = static_cast<float>(eps);
  return s;
}

// Elements [v * N, v * N + N) of a parameter: p, exp_avg and exp_avg_sq updated in place from
// grad times `scale` (the clip factor, 1 when not clipping), and the new p rounded into `copy`
// unless it is null.
template <int N, typename C>
MW_HOST_DEVICE void AdamWAt(int64_t v, const AdamWStep& s, float scale, float* param, const float* grad,
                            float* exp_avg, float* exp_avg_sq, C* copy) {
  const int64_t at = v * N;
  Pack<float, N> p = LoadPack<N>(param + at);
  const Pack<float, N> g = LoadPack<N>(grad + at);
  Pack<float, N> m = LoadPack<N>(exp_avg + at);
  Pack<float, N> q = LoadPack<N>(exp_avg_sq + at);
  MW_UNROLL
  for (int k = 0; k < N; ++k) {
    const float gk = g.v[k] * scale;
    m.v[k] = m.v[k] * s.beta1 + gk * s.one_minus_beta1;
    q.v[k] = q.v[k] * s.beta2 + gk * gk * s.one_minus_beta2;
    const float denom = sqrtf(q.v[k]) / s.bias2_sqrt + s.eps;
    p.v[k] = p.v[k] * s.decay - s.step_size * (m.v[k] / denom);
  }
  StorePack<N>(param + at, p);
  StorePack<N>(exp_avg + at, m);
  StorePack<N>(exp_avg_sq + at, q);
  if (copy != nullptr) {
    Pack<C, N> c;
    MW_UNROLL
    for (int k = 0; k < N; ++k) c.v[k] = static_cast<C>(p.v[k]);
    StorePack<N>(copy + at, c);
  }
}

// A parameter of n elements in work items: `head` loose elements (those before the four arrays'
// common 16-byte boundary, fused_elementwise.h CommonPackStart; 0 with N = 1), then whole packs of
// N, then the loose elements past the last pack. Item r < AdamWPacks is pack r from the
// boundary; the others are the loose elements, one each. The kernel deals the items to its
// threads grid-stride, the host loop in turn. `copy` (or null) has the parameter's n elements,
// its element `head` aligned to a pack of N (AdamWCopyFits).
template <int N>
MW_HOST_DEVICE int64_t AdamWPacks(int64_t n, int64_t head) {
  return (n - head) / N;
}
template <int N>
MW_HOST_DEVICE int64_t AdamWItems(int64_t n, int64_t head) {
  return n - AdamWPacks<N>(n, head) * (N - 1);
}
template <int N, typename C>
MW_HOST_DEVICE void AdamWItem(int64_t r, int64_t n, int64_t head, const AdamWStep& s, float scale, float* param,
                              const float* grad, float* exp_avg, float* exp_avg_sq, C* copy) {
  const int64_t packs = AdamWPacks<N>(n, head);
  if (r < packs) {
    AdamWAt<N>(r, s, scale, param + head, grad + head, exp_avg + head, exp_avg_sq + head,
               copy != nullptr ? copy + head : copy);
    return;
  }
  const int64_t loose = r - packs;
  AdamWAt<1>(loose < head ? loose : packs * N + loose, s, scale, param, grad, exp_avg, exp_avg_sq, copy);
}

// Whether a copy of `bytes`-sized elements at `address` can be written by packs of n floats that
// start at element `head`: its element `head` aligned to a pack of n of its own elements (so
// every element to its size as well). Host only.
inline bool AdamWCopyFits(const void* address, size_t bytes, int64_t head, int n) {
  const auto at = reinterpret_cast<uintptr_t>(address) + static_cast<uintptr_t>(head) * bytes;
  return at % (bytes * static_cast<uintptr_t>(n)) == 0;
}

}  // namespace meshwork::model::fused
