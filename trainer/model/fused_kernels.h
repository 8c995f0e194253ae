// Launchers of the CUDA kernels in fused_kernels.cu, which is compiled only where nvcc was found
// at build time (then MESHWORK_FUSED_KERNELS is defined: cmake/cuda.cmake). Raw pointers and an
// opaque stream (a cudaStream_t), so that callers include no CUDA header. The tables of the rope
// launchers are in the arithmetic type: double for kDouble, float otherwise. Each returns nullptr
// on success, else the CUDA runtime's error string for the launch.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "trainer/model/fused_adamw.h"
#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_norm.h"
#include "trainer/model/fused_softmax.h"

namespace meshwork::model::fused {

enum class ElementType { kFloat, kDouble, kBFloat16, kHalf };

// The storage and arithmetic types of an element type: calls fn(T{}, Acc{}). The kernels'
// launchers and the host loops dispatch through this one table.
template <typename Fn>
void VisitElementType(ElementType type, Fn&& fn) {
  switch (type) {
    case ElementType::kFloat: fn(float{}, float{}); break;
    case ElementType::kDouble: fn(double{}, double{}); break;
    case ElementType::kBFloat16: fn(c10::BFloat16{}, float{}); break;
    case ElementType::kHalf: fn(c10::Half{}, float{}); break;
  }
}

// The (x, delta, y) type combinations of the RMSNorm kernels and host loops: all one type, or
// float x with bf16/fp16 delta and/or output (of one kind). Calls fn(X{}, D{}, Y{}, Acc{}) and
// returns true, or returns false for any other combination.
template <typename Fn>
bool VisitNormTypes(ElementType x, ElementType d, ElementType y, Fn&& fn) {
  using E = ElementType;
  const auto is = [&](E a, E b, E c) { return x == a && d == b && y == c; };
  if (x == d && d == y) {
    VisitElementType(x, [&](auto t, auto acc) { fn(t, t, t, acc); });
    return true;
  }
  for (const E half : {E::kBFloat16, E::kHalf}) {
    if (!is(E::kFloat, half, half) && !is(E::kFloat, E::kFloat, half) && !is(E::kFloat, half, E::kFloat)) continue;
    VisitElementType(half, [&](auto h, auto) {
      using H = decltype(h);
      if (d == half && y == half) fn(float{}, H{}, H{}, float{});
      else if (y == half) fn(float{}, float{}, H{}, float{});
      else fn(float{}, H{}, float{}, float{});
    });
    return true;
  }
  return false;
}

// VisitElementType with the pack width (PackFor): calls fn(T{}, Acc{},
// std::integral_constant<int, N>{}) for N = 1 or kPack<T> and returns true; false for another
// width. The launchers and the host loops dispatch through it.
template <typename Fn>
bool VisitElementTypePacked(ElementType type, int pack, Fn&& fn) {
  bool known = false;
  VisitElementType(type, [&](auto t, auto acc) {
    known = VisitPack<decltype(t)>(pack, [&](auto width) { fn(t, acc, width); });
  });
  return known;
}

// VisitNormTypes with the pack width (PackFor): calls fn(X{}, D{}, Y{}, Acc{},
// std::integral_constant<int, N>{}) for N = 1 or the kPack of the narrowest of X, D and Y, and
// returns true; false for an unsupported combination or width.
template <typename Fn>
bool VisitNormTypesPacked(ElementType x, ElementType d, ElementType y, int pack, Fn&& fn) {
  bool known = false;
  const bool types = VisitNormTypes(x, d, y, [&](auto xt, auto dt, auto yt, auto acc) {
    constexpr size_t narrowest = std::min({sizeof(decltype(xt)), sizeof(decltype(dt)), sizeof(decltype(yt))});
    known = VisitPackBytes<narrowest>(pack, [&](auto width) { fn(xt, dt, yt, acc, width); });
  });
  return types && known;
}

// `pack`: elements per access, 1 or kPack of the type, as PackFor chose it for the host loops
// too (another width returns an error string).
const char* LaunchSwiGluForward(ElementType type, int64_t rows, int64_t f, int pack, const void* gate_up, void* out,
                                void* stream);
const char* LaunchSwiGluBackward(ElementType type, int64_t rows, int64_t f, int pack, const void* gate_up,
                                 const void* grad_out, void* grad_gate_up, void* stream);
// The rope launchers' shape comes with its pack and dividers (WithDividers).
const char* LaunchRopeForward(ElementType type, int64_t batch, const RopeShape& shape, const void* x,
                              const void* cos, const void* sin, void* out, void* stream);
const char* LaunchRopeBackward(ElementType type, int64_t batch, const RopeShape& shape, const void* grad_out,
                               const void* cos, const void* sin, void* grad_x, void* stream);

// logits [rows, vocab] (contiguous) become softmax - onehot(targets) in place; lse and
// target_logit [rows] (the arithmetic type) receive each row's log-sum-exp and target logit.
const char* LaunchSoftmaxGradient(ElementType type, int64_t rows, int64_t vocab, int pack, void* logits,
                                  const int64_t* targets, void* lse, void* target_logit, void* stream);

// RMSNorm (fused_norm.h) over rows [rows, dim] of x (type x_type), with delta (delta_type; null:
// no add, h unused) added first, into y (y_type); w and rstd [rows] in the arithmetic type. The
// supported (x, delta, y) types: all one type (float, double, bf16, fp16), or float x with
// bf16/fp16 for either; others return an error string. `pack` as PackFor chose it. Forward
// writes h (with a delta), y and rstd; backward (dh_residual optional) writes dx, ddelta (with a
// delta) and dw_partial [min(rows, kNormBlocks), dim], which the caller sums over its first
// dimension.
inline constexpr int64_t kNormBlocks = 1024;
const char* LaunchRmsNormForward(ElementType x_type, ElementType delta_type, ElementType y_type, int64_t rows,
                                 int64_t dim, int pack, const void* x, const void* delta, void* h, const void* w,
                                 double eps, void* y, void* rstd, void* stream);
const char* LaunchRmsNormBackward(ElementType x_type, ElementType delta_type, ElementType y_type, int64_t rows,
                                  int64_t dim, int pack, const void* h, const void* dy, const void* dh_residual,
                                  const void* w, const void* rstd, void* dx, void* ddelta, void* dw_partial,
                                  void* stream);

// AdamW (fused_adamw.h) over one parameter's n contiguous fp32 elements, in place; the gradient
// is read only. scale: one double on the device (the clip factor), or null for 1. `pack`: 1 or
// kPack<float>; with kPack<float>, `head` is the four arrays' CommonPackStart (0 with 1): the
// elements before it and past the last whole pack are done one at a time (AdamWItem). `copy`: the
// parameter's bf16 copy to write the new values into (AdamWCopyFits), or null.
const char* LaunchAdamW(int64_t n, int pack, int64_t head, const AdamWStep& step, const double* scale, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq, c10::BFloat16* copy, void* stream);

}  // namespace meshwork::model::fused
