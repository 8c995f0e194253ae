// The arithmetic of Meshwork's fused elementwise ops (SwiGLU, rotary embedding), one output
// element per call. The CUDA kernels (fused_kernels.cu) and the host loops (fused_ops.cpp) both
// run these same functions, so the CPU tests check the code the GPU runs, short of the launch.
// Torch-free and nvcc-safe: T is the storage type (float, double, c10::BFloat16, c10::Half),
// Acc the arithmetic type (float, or double for double), converted with static_cast.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define MW_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MW_HOST_DEVICE inline
#endif

namespace meshwork::model::fused {

MW_HOST_DEVICE float Exp(float x) { return expf(x); }
MW_HOST_DEVICE double Exp(double x) { return exp(x); }

template <typename Acc>
MW_HOST_DEVICE Acc Sigmoid(Acc x) {
  return Acc(1) / (Acc(1) + Exp(-x));
}

MW_HOST_DEVICE uint32_t MulHi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// Division by a fixed divisor as a multiply-high, an add and a shift (Granlund and Montgomery's
// method), for dividends below 2^31: a 64-bit division is a long subroutine on a GPU, and the
// index arithmetic of an elementwise kernel would otherwise cost more than its memory traffic.
// Built on the host for the largest dividend the kernel will see; beyond 2^31 it divides plainly.
struct Divider {
  int64_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;
  bool fast = false;

  Divider() = default;
  Divider(int64_t d, int64_t max_dividend) : divisor(d) {
    constexpr int64_t kLimit = int64_t{1} << 31;
    fast = d >= 1 && d < kLimit && max_dividend < kLimit;
    if (!fast) return;
    while ((int64_t{1} << shift) < d) ++shift;  // shift = ceil(log2(d)) <= 31
    // multiplier = floor(2^32 * (2^shift - d) / d) + 1, which fits 32 bits.
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * static_cast<uint64_t>((int64_t{1} << shift) - d)) /
                                           static_cast<uint64_t>(d) +
                                       1);
  }

  MW_HOST_DEVICE int64_t Div(int64_t n) const {
    if (!fast) return n / divisor;
    const uint32_t x = static_cast<uint32_t>(n);
    return static_cast<int64_t>((MulHi(x, multiplier) + x) >> shift);
  }
};

// SwiGLU of the merged gate/up GEMM's output: gate_up [rows, 2f] holds gate in columns [0, f)
// and up in [f, 2f) (the order MlpImpl concatenates their weights). Element i of out [rows, f]
// is silu(gate) * up, rounded to T once (the composition rounds silu(gate) first).
template <typename T, typename Acc>
MW_HOST_DEVICE void SwiGluForwardAt(int64_t i, const Divider& f_div, const T* gate_up, T* out) {
  const int64_t f = f_div.divisor;
  const int64_t row = f_div.Div(i), col = i - row * f;
  const Acc g = static_cast<Acc>(gate_up[row * 2 * f + col]);
  const Acc u = static_cast<Acc>(gate_up[row * 2 * f + f + col]);
  out[i] = static_cast<T>(g * Sigmoid(g) * u);
}

// Its backward for output element i: d/dgate = dy * up * s * (1 + g * (1 - s)) with s =
// sigmoid(g), d/dup = dy * silu(g), written into grad_gate_up [rows, 2f] (gate's half, up's half).
template <typename T, typename Acc>
MW_HOST_DEVICE void SwiGluBackwardAt(int64_t i, const Divider& f_div, const T* gate_up, const T* grad_out,
                                     T* grad_gate_up) {
  const int64_t f = f_div.divisor;
  const int64_t row = f_div.Div(i), col = i - row * f;
  const int64_t at = row * 2 * f + col;
  const Acc g = static_cast<Acc>(gate_up[at]);
  const Acc u = static_cast<Acc>(gate_up[at + f]);
  const Acc dy = static_cast<Acc>(grad_out[i]);
  const Acc s = Sigmoid(g);
  grad_gate_up[at] = static_cast<T>(dy * u * s * (Acc(1) + g * (Acc(1) - s)));
  grad_gate_up[at + f] = static_cast<T>(dy * g * s);
}

// A [batch, heads, seq, dim] tensor's shape and element strides (dim's stride is 1): q and k
// are views of the merged q/k/v GEMM's output, transposed, so their strides are the GEMM's.
// The dividers split a flat output index into (batch, head, position, dim).
struct RopeShape {
  int64_t heads = 0, seq = 0, dim = 0;
  int64_t batch_stride = 0, head_stride = 0, seq_stride = 0;
  Divider by_dim, by_seq, by_heads;
};

// The dividers for `shape`'s sizes and `elements` outputs in all (batch * heads * seq * dim).
inline RopeShape WithDividers(RopeShape shape, int64_t elements) {
  shape.by_dim = Divider(shape.dim, elements);
  shape.by_seq = Divider(shape.seq, elements);
  shape.by_heads = Divider(shape.heads, elements);
  return shape;
}

// Rotary embedding in Hugging Face's rotate_half layout: out = x * cos + rotate_half(x) * sin,
// where rotate_half(x) = [-x[half:], x[:half]]. Element i of out, contiguous [batch, heads, seq,
// dim]; cos and sin are [>= seq, dim] contiguous tables in Acc. Rounded to T once (the
// composition rounds each product and the sum).
template <typename T, typename Acc>
MW_HOST_DEVICE void RopeForwardAt(int64_t i, const RopeShape& s, const T* x, const Acc* cos, const Acc* sin,
                                  T* out) {
  int64_t rest = s.by_dim.Div(i);
  const int64_t d = i - rest * s.dim;
  const int64_t bh = s.by_seq.Div(rest);
  const int64_t t = rest - bh * s.seq;
  const int64_t b = s.by_heads.Div(bh), h = bh - b * s.heads;
  const T* row = x + b * s.batch_stride + h * s.head_stride + t * s.seq_stride;
  const int64_t half = s.dim / 2;
  const Acc partner = d < half ? -static_cast<Acc>(row[d + half]) : static_cast<Acc>(row[d - half]);
  out[i] = static_cast<T>(static_cast<Acc>(row[d]) * cos[t * s.dim + d] + partner * sin[t * s.dim + d]);
}

// Its backward: the transpose of the same linear map, for grad_out and grad_x both contiguous
// [batch, heads, seq, dim] (`s`'s strides and by_heads unused): grad_x[d] = g[d] * cos[d] + (d < half ?
// g[d + half] * sin[d + half] : -g[d - half] * sin[d - half]).
template <typename T, typename Acc>
MW_HOST_DEVICE void RopeBackwardAt(int64_t i, const RopeShape& s, const T* grad_out, const Acc* cos,
                                   const Acc* sin, T* grad_x) {
  const int64_t row_index = s.by_dim.Div(i);
  const int64_t d = i - row_index * s.dim;
  const int64_t t = row_index - s.by_seq.Div(row_index) * s.seq;
  const int64_t half = s.dim / 2;
  const int64_t row = i - d;  // the element at dim 0 of this (batch, head, position)
  const int64_t table = t * s.dim;
  const int64_t p = d < half ? d + half : d - half;
  const Acc rotated = static_cast<Acc>(grad_out[row + p]) * sin[table + p];
  grad_x[i] = static_cast<T>(static_cast<Acc>(grad_out[i]) * cos[table + d] + (d < half ? rotated : -rotated));
}

}  // namespace meshwork::model::fused
