#include "trainer/model/fused_ops.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_kernels.h"
#include "trainer/model/fused_norm.h"
#include "trainer/model/fused_softmax.h"

#if defined(MESHWORK_FUSED_KERNELS)
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace meshwork::model {
namespace {

using fused::ElementType;
using fused::RopeShape;

std::optional<ElementType> ElementTypeFor(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return ElementType::kFloat;
    case torch::kDouble: return ElementType::kDouble;
    case torch::kBFloat16: return ElementType::kBFloat16;
    case torch::kHalf: return ElementType::kHalf;
    default: return std::nullopt;
  }
}

ElementType ElementTypeOf(torch::ScalarType t) {
  const auto type = ElementTypeFor(t);
  TORCH_CHECK(type.has_value(), "fused op: unsupported dtype ", t, " (float, double, bf16 or fp16)");
  return *type;
}
ElementType ElementTypeOf(const torch::Tensor& t) { return ElementTypeOf(t.scalar_type()); }

// The arithmetic dtype for storage dtype t: double for double, fp32 otherwise.
torch::ScalarType AccOf(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// Calls fn(T{}, Acc{}, std::integral_constant<int, N>{}) for t's storage type and pack width N
// (1 or kPack<T>, as PackFor chose it for the kernel too).
template <typename Fn>
void DispatchHostPacked(const torch::Tensor& t, int pack, Fn&& fn) {
  TORCH_CHECK(fused::VisitElementTypePacked(ElementTypeOf(t), pack, fn), "unsupported pack width ", pack);
}

// A tensor as a PackFor array (an undefined one: absent).
fused::PackArray ArrayOf(const torch::Tensor& t) {
  return t.defined() ? fused::PackArray{t.data_ptr(), static_cast<size_t>(t.element_size())}
                     : fused::PackArray{nullptr, 0};
}

// Runs element(i) for i in [0, n) on the host, split over libtorch's intra-op threads.
template <typename Element>
void HostLoop(int64_t n, Element&& element) {
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) element(i);
  });
}

#if defined(MESHWORK_FUSED_KERNELS)
// The CUDA kernels need the tensor's device current and run on its current stream.
struct OnDevice {
  explicit OnDevice(const torch::Tensor& t) : guard(t.device()) {}
  void* stream() const { return c10::cuda::getCurrentCUDAStream().stream(); }
  c10::cuda::CUDAGuard guard;
};
// `instead`: the setting that avoids the kernel.
void CheckLaunch(const char* error, const char* kernel,
                 const char* instead = "training.fused_kernels=off runs the composition instead") {
  TORCH_CHECK(error == nullptr, "CUDA kernel ", kernel, " failed to launch: ", error,
              " (set CUDA_LAUNCH_BLOCKING=1 to find the failing call; ", instead, ")");
}
#endif

void RequireKernels(const torch::Tensor& t, const char* op) {
  TORCH_CHECK(!t.is_cuda() || FusedKernelsBuilt(), op, " on ", t.device(),
              ": this build has no CUDA kernels (nvcc was not found when it was built); "
              "training.fused_kernels=off runs the composition");
  TORCH_CHECK(t.is_cuda() || t.is_cpu(), op, ": unsupported device ", t.device());
}

struct SwiGluFunction : torch::autograd::Function<SwiGluFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate_up_in) {
    const torch::Tensor gate_up = gate_up_in.contiguous();
    const int64_t f = gate_up.size(-1) / 2;
    const int64_t rows = f == 0 ? 0 : gate_up.numel() / (2 * f);
    auto sizes = gate_up.sizes().vec();
    sizes.back() = f;
    torch::Tensor out = torch::empty(sizes, gate_up.options());
    ctx->save_for_backward({gate_up});
    const int pack = fused::PackFor({f}, {ArrayOf(gate_up), ArrayOf(out)});
#if defined(MESHWORK_FUSED_KERNELS)
    if (gate_up.is_cuda()) {
      OnDevice on(gate_up);
      CheckLaunch(fused::LaunchSwiGluForward(ElementTypeOf(gate_up), rows, f, pack, gate_up.data_ptr(),
                                             out.data_ptr(), on.stream()),
                  "SwiGluForward");
      return out;
    }
#endif
    DispatchHostPacked(gate_up, pack, [&](auto t, auto acc, auto width) {
      using T = decltype(t);
      using Acc = decltype(acc);
      constexpr int N = decltype(width)::value;
      const T* in = gate_up.data_ptr<T>();
      T* o = out.data_ptr<T>();
      const fused::Divider per_row(f / N, rows * f / N);
      HostLoop(rows * f / N, [&](int64_t v) { fused::SwiGluForwardAt<T, Acc, N>(v, per_row, in, o); });
    });
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const torch::Tensor gate_up = ctx->get_saved_variables()[0];
    const torch::Tensor grad = grad_out[0].to(gate_up.scalar_type()).contiguous();
    const int64_t f = gate_up.size(-1) / 2;
    const int64_t rows = f == 0 ? 0 : gate_up.numel() / (2 * f);
    torch::Tensor grad_gate_up = torch::empty_like(gate_up, torch::MemoryFormat::Contiguous);
    const int pack = fused::PackFor({f}, {ArrayOf(gate_up), ArrayOf(grad), ArrayOf(grad_gate_up)});
#if defined(MESHWORK_FUSED_KERNELS)
    if (gate_up.is_cuda()) {
      OnDevice on(gate_up);
      CheckLaunch(fused::LaunchSwiGluBackward(ElementTypeOf(gate_up), rows, f, pack, gate_up.data_ptr(),
                                              grad.data_ptr(), grad_gate_up.data_ptr(), on.stream()),
                  "SwiGluBackward");
      return {grad_gate_up};
    }
#endif
    DispatchHostPacked(gate_up, pack, [&](auto t, auto acc, auto width) {
      using T = decltype(t);
      using Acc = decltype(acc);
      constexpr int N = decltype(width)::value;
      const T* in = gate_up.data_ptr<T>();
      const T* g = grad.data_ptr<T>();
      T* gi = grad_gate_up.data_ptr<T>();
      const fused::Divider per_row(f / N, rows * f / N);
      HostLoop(rows * f / N, [&](int64_t v) { fused::SwiGluBackwardAt<T, Acc, N>(v, per_row, in, g, gi); });
    });
    return {grad_gate_up};
  }
};

fused::RopeStrides StridesOf(const torch::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// The shape of `in` [batch, heads, seq, dim] (dim contiguous), its strides and `out`'s, the pack
// width for both and the tables, and the dividers.
RopeShape ShapeOf(const torch::Tensor& in, const torch::Tensor& out, const torch::Tensor& cos,
                  const torch::Tensor& sin) {
  RopeShape s;
  s.heads = in.size(1);
  s.seq = in.size(2);
  s.dim = in.size(3);
  s.in = StridesOf(in);
  s.out = StridesOf(out);
  s.pack = fused::RopePack(s, in.element_size(), in.data_ptr(), out.data_ptr(), cos.element_size(), cos.data_ptr(),
                           sin.data_ptr());
  return fused::WithDividers(s, in.numel());
}

// out = rope(in) (forward) or rope's transpose applied to in (backward: in is the output's
// gradient), written at out's strides (in: stride(3) == 1; cos and sin: [seq, dim], contiguous,
// in in's arithmetic dtype, on in's device).
enum class RopeDirection { kForward, kBackward };
template <RopeDirection kDirection>
void RopeInto(const torch::Tensor& in, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  constexpr bool kForward = kDirection == RopeDirection::kForward;
  const RopeShape shape = ShapeOf(in, out, cos, sin);
#if defined(MESHWORK_FUSED_KERNELS)
  if (in.is_cuda()) {
    OnDevice on(in);
    const auto launch = kForward ? fused::LaunchRopeForward : fused::LaunchRopeBackward;
    CheckLaunch(launch(ElementTypeOf(in), in.size(0), shape, in.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                       out.data_ptr(), on.stream()),
                kForward ? "RopeForward" : "RopeBackward");
    return;
  }
#endif
  DispatchHostPacked(in, shape.pack, [&](auto t, auto acc, auto width) {
    using T = decltype(t);
    using Acc = decltype(acc);
    constexpr int N = decltype(width)::value;
    const T* i = in.data_ptr<T>();
    const Acc* c = cos.data_ptr<Acc>();
    const Acc* s = sin.data_ptr<Acc>();
    T* o = out.data_ptr<T>();
    HostLoop(out.numel() / N, [&](int64_t v) {
      if constexpr (kForward) {
        fused::RopeForwardAt<T, Acc, N>(v, shape, i, c, s, o);
      } else {
        fused::RopeBackwardAt<T, Acc, N>(v, shape, i, c, s, o);
      }
    });
  });
}

// An empty [batch, heads, seq, dim] tensor laid out as [batch, seq, heads, dim] in memory: the
// GEMM output's order, which the composition's elementwise ops keep and SDPA's kernels follow.
torch::Tensor EmptyHeadsInner(int64_t b, int64_t heads, int64_t seq, int64_t dim, const torch::TensorOptions& options) {
  return torch::empty({b, seq, heads, dim}, options).transpose(1, 2);
}

torch::Tensor StrideOneInDim(const torch::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }

// Heads [first, first + count) of a [batch, seq, width] q/k/v buffer, as [batch, count, seq, dim].
torch::Tensor HeadsOf(const torch::Tensor& all, int64_t dim, int64_t first, int64_t count) {
  return all.narrow(2, first * dim, count * dim).view({all.size(0), all.size(1), count, dim}).transpose(1, 2);
}

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  // cos and sin: [seq, dim], contiguous, in x's arithmetic dtype, on x's device.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    const torch::Tensor x = StrideOneInDim(x_in);
    // x a transposed [batch, seq, heads, dim] buffer (the model's q and k): the output is laid
    // out the same way, as the composition's elementwise ops lay it out, so that SDPA's kernels
    // (which allocate their output like q) give an output whose transpose back to [batch, seq,
    // hidden] for the o projection is a view, not a copy; and the gradient is written in that
    // layout, so that the transpose and view back to the GEMM output copy nothing.
    const bool heads_inner = x.size(1) > 1 && x.size(2) > 1 && x.stride(1) < x.stride(2);
    torch::Tensor out = heads_inner ? EmptyHeadsInner(x.size(0), x.size(1), x.size(2), x.size(3), x.options())
                                    : torch::empty(x.sizes(), x.options().memory_format(torch::MemoryFormat::Contiguous));
    RopeInto<RopeDirection::kForward>(x, cos, sin, out);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads_inner"] = heads_inner;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor grad = StrideOneInDim(grad_out[0]);
    const int64_t b = grad.size(0), heads = grad.size(1), seq = grad.size(2), dim = grad.size(3);
    torch::Tensor grad_x = ctx->saved_data["heads_inner"].toBool() ? EmptyHeadsInner(b, heads, seq, dim, grad.options())
                                                                  : torch::empty({b, heads, seq, dim}, grad.options());
    RopeInto<RopeDirection::kBackward>(grad, saved[0], saved[1], grad_x);
    return {grad_x, torch::Tensor(), torch::Tensor()};
  }
};

// The merged q/k/v GEMM's output [batch, seq, (heads + 2 kv) * dim] split into q and k, each
// rotated, and v, all [batch, heads or kv, seq, dim] laid out as [batch, seq, heads, dim]. v is a
// copy (one read and write of its 1/(2 + heads/kv) of the columns), so that attention, which
// keeps q, k and v for backward, does not keep the whole GEMM output alive through a view of v.
// Backward writes the three gradients straight into one [batch, seq, width] buffer, where the
// composition's split, view and transpose have autograd reshape v's gradient and concatenate all
// three (a read and a write of the whole width per layer).
struct QkvRopeFunction : torch::autograd::Function<QkvRopeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv,
                                                int64_t heads, int64_t kv, const torch::Tensor& cos,
                                                const torch::Tensor& sin) {
    const int64_t b = qkv.size(0), seq = qkv.size(1), dim = qkv.size(2) / (heads + 2 * kv);
    torch::Tensor q = EmptyHeadsInner(b, heads, seq, dim, qkv.options());
    torch::Tensor k = EmptyHeadsInner(b, kv, seq, dim, qkv.options());
    torch::Tensor v = EmptyHeadsInner(b, kv, seq, dim, qkv.options());
    RopeInto<RopeDirection::kForward>(HeadsOf(qkv, dim, 0, heads), cos, sin, q);
    RopeInto<RopeDirection::kForward>(HeadsOf(qkv, dim, heads, kv), cos, sin, k);
    v.copy_(HeadsOf(qkv, dim, heads + kv, kv));
    ctx->save_for_backward({cos, sin});
    ctx->set_materialize_grads(false);  // an unused output's gradient: none, not zeros
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv"] = kv;
    return {q, k, v};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt(), kv = ctx->saved_data["kv"].toInt();
    // The one defined gradient gives the shape (autograd gives none for an unused output).
    const torch::Tensor& any = grad_out[0].defined() ? grad_out[0] : grad_out[1].defined() ? grad_out[1] : grad_out[2];
    const int64_t b = any.size(0), seq = any.size(2), dim = any.size(3);
    torch::Tensor grad_qkv = torch::empty({b, seq, (heads + 2 * kv) * dim}, any.options());
    const int64_t firsts[] = {0, heads, heads + kv}, counts[] = {heads, kv, kv};
    for (int i = 0; i < 3; ++i) {
      torch::Tensor into = HeadsOf(grad_qkv, dim, firsts[i], counts[i]);
      if (!grad_out[i].defined()) {
        into.zero_();
      } else if (i < 2) {
        RopeInto<RopeDirection::kBackward>(StrideOneInDim(grad_out[i]), saved[0], saved[1], into);
      } else {
        into.copy_(grad_out[i]);
      }
    }
    return {grad_qkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Whether the RMSNorm kernels and host loops take these (x, delta, y) dtypes (VisitNormTypes).
bool NormTypesSupported(torch::ScalarType x, torch::ScalarType d, torch::ScalarType y) {
  const auto xt = ElementTypeFor(x), dt = ElementTypeFor(d), yt = ElementTypeFor(y);
  return xt && dt && yt && fused::VisitNormTypes(*xt, *dt, *yt, [](auto...) {});
}

// Calls fn(X{}, D{}, Y{}, Acc{}, std::integral_constant<int, N>{}) on the host for a supported
// combination and the pack width PackFor chose.
template <typename Fn>
void DispatchNormHost(torch::ScalarType x, torch::ScalarType d, torch::ScalarType y, int pack, Fn&& fn) {
  TORCH_CHECK(fused::VisitNormTypesPacked(ElementTypeOf(x), ElementTypeOf(d), ElementTypeOf(y), pack, fn),
              "RMSNorm: unsupported dtypes x ", x, ", delta ", d, ", output ", y, " (pack ", pack, ")");
}


#if defined(MESHWORK_FUSED_KERNELS)
const void* DataOrNull(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* MutableDataOrNull(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
#endif

// What RmsNormFunction returns: {y}; {h, y} for x + delta (kAdd); {x, y} (kPassX: x itself,
// which autograd hands on as a view, so that the gradient its later uses send back joins the
// norm's in the backward kernel). With two outputs, the first one's gradient is added to x's
// in the kernel.
enum class NormOutputs : int64_t { kNorm, kAdd, kPassX };

// Inputs: x, delta (empty without kAdd; libtorch 1.13's apply takes no undefined tensor),
// weight; outputs as `outputs` says.
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                                                const torch::Tensor& delta_in, const torch::Tensor& weight,
                                                double eps, int64_t out_dtype, int64_t outputs) {
    const bool add = static_cast<NormOutputs>(outputs) == NormOutputs::kAdd;
    const torch::Tensor x = x_in.contiguous();
    const torch::Tensor delta = add ? delta_in.contiguous() : torch::Tensor();
    const auto y_type = static_cast<torch::ScalarType>(out_dtype);
    const auto acc = AccOf(x);
    const int64_t dim = x.size(-1), rows = x.numel() / std::max<int64_t>(dim, 1);
    const torch::Tensor w = weight.to(x.device(), acc).contiguous();
    torch::Tensor h = add ? torch::empty_like(x) : torch::Tensor();
    torch::Tensor y = torch::empty(x.sizes(), x.options().dtype(y_type));
    torch::Tensor rstd = torch::empty({rows}, x.options().dtype(acc));
    const auto d_type = add ? delta.scalar_type() : x.scalar_type();
    const int pack = fused::PackFor({dim}, {ArrayOf(x), ArrayOf(delta), ArrayOf(h), ArrayOf(y), ArrayOf(w)});
#if defined(MESHWORK_FUSED_KERNELS)
    if (x.is_cuda()) {
      OnDevice on(x);
      CheckLaunch(fused::LaunchRmsNormForward(ElementTypeOf(x), add ? ElementTypeOf(delta) : ElementTypeOf(x),
                                              ElementTypeOf(y), rows, dim, pack, x.data_ptr(), DataOrNull(delta),
                                              MutableDataOrNull(h), w.data_ptr(), eps, y.data_ptr(), rstd.data_ptr(),
                                              on.stream()),
                  "RmsNormForward");
    } else
#endif
    {
      DispatchNormHost(x.scalar_type(), d_type, y_type, pack, [&](auto xt, auto dt, auto yt, auto at, auto width) {
        using X = decltype(xt);
        using D = decltype(dt);
        using Y = decltype(yt);
        using Acc = decltype(at);
        constexpr int N = decltype(width)::value;
        const X* xp = x.data_ptr<X>();
        const D* dp = add ? delta.data_ptr<D>() : nullptr;
        X* hp = add ? h.data_ptr<X>() : nullptr;
        const Acc* wp = w.data_ptr<Acc>();
        Y* yp = y.data_ptr<Y>();
        Acc* rp = rstd.data_ptr<Acc>();
        at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
          std::vector<Acc> lanes(fused::kNormThreads);
          for (int64_t r = begin; r < end; ++r) {
            const int64_t o = r * dim;
            for (int lane = 0; lane < fused::kNormThreads; ++lane) {
              lanes[lane] = fused::NormSquaresLane<X, D, Acc, N>(xp + o, add ? dp + o : nullptr, add ? hp + o : nullptr,
                                                              dim, lane);
            }
            for (int stride = fused::kNormThreads / 2; stride > 0; stride /= 2) {
              for (int lane = 0; lane < fused::kNormThreads; ++lane) fused::SumTreeStep(lanes.data(), lane, stride);
            }
            rp[r] = fused::NormRstd(lanes[0], dim, static_cast<Acc>(eps));
            for (int lane = 0; lane < fused::kNormThreads; ++lane) {
              fused::NormOutputLane<X, Y, Acc, N>(add ? hp + o : xp + o, wp, rp[r], yp + o, dim, lane);
            }
          }
        });
      });
    }
    ctx->save_for_backward({add ? h : x, weight, rstd});
    ctx->saved_data["outputs"] = outputs;
    // An output nobody used sends an undefined gradient, not a zero-filled one: the kernel
    // skips dh (and backward zero-fills only a missing dy).
    ctx->set_materialize_grads(false);
    ctx->saved_data["delta_dtype"] = static_cast<int64_t>(d_type);
    switch (static_cast<NormOutputs>(outputs)) {
      case NormOutputs::kAdd: return {h, y};
      case NormOutputs::kPassX: return {x_in, y};
      case NormOutputs::kNorm: break;
    }
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& h = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& rstd = saved[2];
    const auto outputs = static_cast<NormOutputs>(ctx->saved_data["outputs"].toInt());
    const bool add = outputs == NormOutputs::kAdd;
    const bool two = outputs != NormOutputs::kNorm;
    const auto d_type = static_cast<torch::ScalarType>(ctx->saved_data["delta_dtype"].toInt());
    const torch::Tensor& dy_in = two ? grads[1] : grads[0];
    const torch::Tensor dh_in = two ? grads[0] : torch::Tensor();
    const auto acc = AccOf(h);
    const int64_t dim = h.size(-1), rows = h.numel() / std::max<int64_t>(dim, 1);
    // The output's dtype is the one forward wrote; an undefined gradient is zero.
    const torch::Tensor dy = dy_in.defined() ? dy_in.contiguous() : torch::zeros(h.sizes(), h.options());
    const torch::Tensor dh = dh_in.defined() ? dh_in.to(h.scalar_type()).contiguous() : torch::Tensor();
    const torch::Tensor w = weight.to(h.device(), acc).contiguous();
    torch::Tensor dx = torch::empty_like(h);
    torch::Tensor ddelta = add ? torch::empty(h.sizes(), h.options().dtype(d_type)) : torch::Tensor();
    const int64_t blocks = std::min<int64_t>(rows, fused::kNormBlocks);
    torch::Tensor dw_partial = torch::empty({blocks, dim}, h.options().dtype(acc));
    const int pack = fused::PackFor(
        {dim}, {ArrayOf(h), ArrayOf(dy), ArrayOf(dh), ArrayOf(w), ArrayOf(dx), ArrayOf(ddelta), ArrayOf(dw_partial)});
#if defined(MESHWORK_FUSED_KERNELS)
    if (h.is_cuda()) {
      OnDevice on(h);
      CheckLaunch(fused::LaunchRmsNormBackward(ElementTypeOf(h), add ? ElementTypeOf(ddelta) : ElementTypeOf(h),
                                               ElementTypeOf(dy), rows, dim, pack, h.data_ptr(), dy.data_ptr(),
                                               DataOrNull(dh), w.data_ptr(), rstd.data_ptr(), dx.data_ptr(),
                                               MutableDataOrNull(ddelta), dw_partial.data_ptr(), on.stream()),
                  "RmsNormBackward");
    } else
#endif
    {
      DispatchNormHost(h.scalar_type(), d_type, dy.scalar_type(), pack,
                       [&](auto xt, auto dt, auto yt, auto at, auto width) {
        using X = decltype(xt);
        using D = decltype(dt);
        using Y = decltype(yt);
        using Acc = decltype(at);
        constexpr int N = decltype(width)::value;
        const X* hp = h.data_ptr<X>();
        const Y* dyp = dy.data_ptr<Y>();
        const X* dhp = dh.defined() ? dh.data_ptr<X>() : nullptr;
        const Acc* wp = w.data_ptr<Acc>();
        const Acc* rp = rstd.data_ptr<Acc>();
        X* dxp = dx.data_ptr<X>();
        D* ddp = add ? ddelta.data_ptr<D>() : nullptr;
        Acc* dwp = dw_partial.data_ptr<Acc>();
        // The kernel's blocks one after another: block b's rows b, b + blocks, ..., its lanes'
        // weight-gradient sums written to row b of dw_partial.
        at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
          std::vector<Acc> lanes(fused::kNormThreads);
          std::vector<Acc> dw(static_cast<size_t>(fused::kNormThreads) * fused::kNormColumnsPerLane);
          for (int64_t b = begin; b < end; ++b) {
            std::fill(dw.begin(), dw.end(), Acc(0));
            for (int64_t r = b; r < rows; r += blocks) {
              const int64_t o = r * dim;
              for (int lane = 0; lane < fused::kNormThreads; ++lane) {
                lanes[lane] = fused::NormDotLane<X, Y, Acc, N>(hp + o, dyp + o, wp, rp[r], dim, lane);
              }
              for (int stride = fused::kNormThreads / 2; stride > 0; stride /= 2) {
                for (int lane = 0; lane < fused::kNormThreads; ++lane) fused::SumTreeStep(lanes.data(), lane, stride);
              }
              for (int lane = 0; lane < fused::kNormThreads; ++lane) {
                fused::NormGradLane<X, D, Y, Acc, N>(hp + o, dyp + o, dhp != nullptr ? dhp + o : nullptr, wp, rp[r],
                                                  lanes[0], dxp + o, ddp != nullptr ? ddp + o : nullptr,
                                                  dw.data() + lane * fused::kNormColumnsPerLane, dim, lane);
              }
            }
            for (int lane = 0; lane < fused::kNormThreads; ++lane) {
              fused::NormWeightGradLane<Acc, N>(dw.data() + lane * fused::kNormColumnsPerLane, dwp + b * dim, dim,
                                                lane);
            }
          }
        });
      });
    }
    const torch::Tensor dweight = dw_partial.sum(0).to(weight.scalar_type());
    return {dx, ddelta, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool FusedRmsNormSupports(const torch::Tensor& x, const torch::Tensor& delta, torch::ScalarType out_dtype) {
  if (x.dim() < 1 || x.size(-1) < 1 || x.size(-1) > fused::kNormMaxDim) return false;
  if (!(x.is_cpu() || (x.is_cuda() && FusedKernelsBuilt()))) return false;
  if (delta.defined() && (delta.sizes() != x.sizes() || delta.device() != x.device())) return false;
  return NormTypesSupported(x.scalar_type(), delta.defined() ? delta.scalar_type() : x.scalar_type(), out_dtype);
}

namespace {
// The norms' entry points: x (and delta) as FusedRmsNormSupports takes them, weight [dim]; then
// RmsNormFunction.
torch::autograd::variable_list ApplyRmsNorm(const char* name, const torch::Tensor& x, const torch::Tensor& delta,
                                            const torch::Tensor& weight, double eps, torch::ScalarType out_dtype,
                                            NormOutputs outputs) {
  const bool add = outputs == NormOutputs::kAdd;
  TORCH_CHECK((!add || delta.defined()) && FusedRmsNormSupports(x, delta, out_dtype), name, ": x ", x.sizes(), " ",
              x.scalar_type(), add ? " + delta " : "", delta.defined() ? delta.sizes() : torch::IntArrayRef{}, " ",
              delta.defined() ? delta.scalar_type() : x.scalar_type(), " on ", x.device(), " to ", out_dtype,
              " is not supported (same shape; dim <= ", fused::kNormMaxDim, "; CUDA needs this build's kernels)");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), name, ": weight ", weight.sizes(),
              " does not match x ", x.sizes());
  return RmsNormFunction::apply(x, add ? delta : torch::empty({0}, x.options()), weight, eps,
                                static_cast<int64_t>(out_dtype), static_cast<int64_t>(outputs));
}
}  // namespace

torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                           torch::ScalarType out_dtype) {
  return ApplyRmsNorm("FusedRmsNorm", x, torch::Tensor(), weight, eps, out_dtype, NormOutputs::kNorm)[0];
}

std::pair<torch::Tensor, torch::Tensor> FusedRmsNormPassingX(const torch::Tensor& x, const torch::Tensor& weight,
                                                             double eps, torch::ScalarType out_dtype) {
  const auto out =
      ApplyRmsNorm("FusedRmsNormPassingX", x, torch::Tensor(), weight, eps, out_dtype, NormOutputs::kPassX);
  return {out[0], out[1]};
}

std::pair<torch::Tensor, torch::Tensor> FusedAddRmsNorm(const torch::Tensor& x, const torch::Tensor& delta,
                                                        const torch::Tensor& weight, double eps,
                                                        torch::ScalarType out_dtype) {
  const auto out = ApplyRmsNorm("FusedAddRmsNorm", x, delta, weight, eps, out_dtype, NormOutputs::kAdd);
  return {out[0], out[1]};
}

namespace {
struct SparseGradEmbeddingFunction : torch::autograd::Function<SparseGradEmbeddingFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& table,
                               const torch::Tensor& tokens) {
    ctx->save_for_backward({tokens});
    ctx->saved_data["rows"] = table.size(0);
    return torch::embedding(table, tokens);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor tokens = ctx->get_saved_variables()[0];
    // Coalesced: each row's occurrences summed once, after a sort, so that the dense + sparse
    // add that follows is one write per row, without atomics.
    const torch::Tensor sparse = at::embedding_sparse_backward(grads[0], tokens, ctx->saved_data["rows"].toInt(),
                                                               /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
    return {sparse.coalesce(), torch::Tensor()};
  }
};
}  // namespace

torch::Tensor EmbeddingWithSparseGradient(const torch::Tensor& table, const torch::Tensor& tokens) {
  TORCH_CHECK(table.dim() == 2 && tokens.scalar_type() == torch::kLong, "EmbeddingWithSparseGradient: table ",
              table.sizes(), ", tokens ", tokens.scalar_type());
  return SparseGradEmbeddingFunction::apply(table, tokens);
}

bool FusedKernelsBuilt() {
#if defined(MESHWORK_FUSED_KERNELS)
  return true;
#else
  return false;
#endif
}

torch::Tensor FusedSwiGlu(const torch::Tensor& gate_up) {
  RequireKernels(gate_up, "FusedSwiGlu");
  (void)ElementTypeOf(gate_up);  // an unsupported dtype fails here, naming it
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "FusedSwiGlu: gate_up ", gate_up.sizes(),
              " must end in an even dimension (gate's columns, then up's)");
  return SwiGluFunction::apply(gate_up);
}

SoftmaxGradientStats SoftmaxGradientInPlace(torch::Tensor& logits, const torch::Tensor& targets) {
  RequireKernels(logits, "SoftmaxGradientInPlace");
  (void)ElementTypeOf(logits);
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "SoftmaxGradientInPlace: logits ", logits.sizes(),
              " must be a contiguous [rows, vocab]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) && targets.scalar_type() == torch::kLong &&
                  targets.device() == logits.device(),
              "SoftmaxGradientInPlace: targets ", targets.sizes(), " ", targets.scalar_type(), " on ",
              targets.device(), " must be int64 [", logits.size(0), "] on ", logits.device());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab > 0, "SoftmaxGradientInPlace: an empty vocabulary");
  const torch::Tensor t = targets.contiguous();
  const auto stats_options = logits.options().dtype(AccOf(logits));
  SoftmaxGradientStats out{torch::empty({rows}, stats_options), torch::empty({rows}, stats_options)};
  const int pack = fused::PackFor({vocab}, {ArrayOf(logits)});
#if defined(MESHWORK_FUSED_KERNELS)
  if (logits.is_cuda()) {
    OnDevice on(logits);
    CheckLaunch(fused::LaunchSoftmaxGradient(ElementTypeOf(logits), rows, vocab, pack, logits.data_ptr(),
                                             t.data_ptr<int64_t>(), out.lse.data_ptr(), out.target_logit.data_ptr(),
                                             on.stream()),
                "SoftmaxGradient");
    return out;
  }
#endif
  // Targets outside [0, vocab) would read and write past the row: checked here on the host (on
  // the GPU that check would cost a sync; the model's data pipeline bounds them).
  if (rows > 0) {
    TORCH_CHECK(t.min().item<int64_t>() >= 0 && t.max().item<int64_t>() < vocab, "SoftmaxGradientInPlace: targets in [",
                t.min().item<int64_t>(), ", ", t.max().item<int64_t>(), "], outside [0, ", vocab, ")");
  }
  DispatchHostPacked(logits, pack, [&](auto type, auto acc, auto width) {
    using T = decltype(type);
    using Acc = decltype(acc);
    constexpr int N = decltype(width)::value;
    T* base = logits.data_ptr<T>();
    const int64_t* target = t.data_ptr<int64_t>();
    Acc* lse = out.lse.data_ptr<Acc>();
    Acc* target_logit = out.target_logit.data_ptr<Acc>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<fused::SoftmaxStats<Acc>> lanes(fused::kRowThreads);
      for (int64_t r = begin; r < end; ++r) {
        T* row = base + r * vocab;
        // The block's threads one after another, then the tree one step at a time.
        for (int lane = 0; lane < fused::kRowThreads; ++lane) {
          lanes[lane] = fused::LaneStats<T, Acc, N>(row, vocab, lane);
        }
        for (int stride = fused::kRowThreads / 2; stride > 0; stride /= 2) {
          for (int lane = 0; lane < fused::kRowThreads; ++lane) fused::TreeStep(lanes.data(), lane, stride);
        }
        lse[r] = fused::LogSumExp(lanes[0]);
        target_logit[r] = static_cast<Acc>(row[target[r]]);
        for (int64_t v = 0; v < vocab / N; ++v) fused::SoftmaxGradientAt<T, Acc, N>(row, v, target[r], lse[r]);
      }
    });
  });
  return out;
}

torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  RequireKernels(x, "FusedRope");
  (void)ElementTypeOf(x);
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "FusedRope: x ", x.sizes(),
              " must be [batch, heads, seq, dim] with an even dim");
  const int64_t seq = x.size(2), dim = x.size(3);
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) >= seq && cos.size(1) == dim && sin.sizes() == cos.sizes(),
              "FusedRope: tables ", cos.sizes(), " and ", sin.sizes(), " do not cover x ", x.sizes());
  const auto acc = AccOf(x);
  auto table = [&](const torch::Tensor& t) { return t.narrow(0, 0, seq).to(x.device(), acc).contiguous(); };
  return RopeFunction::apply(x, table(cos), table(sin));
}

std::vector<torch::Tensor> FusedQkvRope(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                        const torch::Tensor& cos, const torch::Tensor& sin) {
  RequireKernels(qkv, "FusedQkvRope");
  (void)ElementTypeOf(qkv);
  TORCH_CHECK(qkv.dim() == 3 && heads > 0 && kv_heads > 0 && qkv.size(2) % (heads + 2 * kv_heads) == 0 &&
                  (qkv.size(2) / (heads + 2 * kv_heads)) % 2 == 0,
              "FusedQkvRope: qkv ", qkv.sizes(), " must be [batch, seq, (", heads, " + 2 x ", kv_heads,
              ") x dim] with an even dim");
  const int64_t seq = qkv.size(1), dim = qkv.size(2) / (heads + 2 * kv_heads);
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) >= seq && cos.size(1) == dim && sin.sizes() == cos.sizes(),
              "FusedQkvRope: tables ", cos.sizes(), " and ", sin.sizes(), " do not cover ", seq, " positions of dim ",
              dim);
  const torch::Tensor x = qkv.stride(2) == 1 ? qkv : qkv.contiguous();
  const auto acc = AccOf(x);
  auto table = [&](const torch::Tensor& t) { return t.narrow(0, 0, seq).to(x.device(), acc).contiguous(); };
  return QkvRopeFunction::apply(x, heads, kv_heads, table(cos), table(sin));
}

bool FusedAdamWSupports(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                        const torch::Tensor& exp_avg_sq) {
  if (!(param.is_cpu() || (param.is_cuda() && FusedKernelsBuilt()))) return false;
  for (const torch::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!t->defined() || t->layout() != torch::kStrided || t->scalar_type() != torch::kFloat ||
        !t->is_contiguous() || t->device() != param.device() || t->sizes() != param.sizes()) {
      return false;
    }
  }
  return true;
}

bool FusedAdamWUpdate(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                      const torch::Tensor& exp_avg_sq, const fused::AdamWStep& step, const torch::Tensor& scale,
                      const torch::Tensor& copy) {
  TORCH_CHECK(FusedAdamWSupports(param, grad, exp_avg, exp_avg_sq), "FusedAdamWUpdate: parameter ", param.sizes(),
              " ", param.scalar_type(), " on ", param.device(),
              ": needs fp32 contiguous parameter, gradient and moments of one shape on one device (the CPU, or "
              "CUDA with this build's kernels)");
  TORCH_CHECK(!scale.defined() || (scale.numel() == 1 && scale.device() == param.device()),
              "FusedAdamWUpdate: the scale must be one element on ", param.device());
  const int64_t n = param.numel();
  const int64_t start =
      fused::CommonPackStart(n, {ArrayOf(param), ArrayOf(grad), ArrayOf(exp_avg), ArrayOf(exp_avg_sq)});
  const int pack = start >= 0 ? fused::kPack<float> : 1;
  const int64_t head = std::max<int64_t>(start, 0);
  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* q = exp_avg_sq.data_ptr<float>();
  const bool write_copy = copy.defined() && copy.layout() == torch::kStrided && copy.scalar_type() == torch::kBFloat16 &&
                          copy.is_contiguous() && copy.numel() == n && copy.device() == param.device() &&
                          fused::AdamWCopyFits(copy.data_ptr(), sizeof(c10::BFloat16), head, pack);
  c10::BFloat16* w = write_copy ? copy.data_ptr<c10::BFloat16>() : nullptr;
#if defined(MESHWORK_FUSED_KERNELS)
  if (param.is_cuda()) {
    OnDevice on(param);
    const torch::Tensor factor = scale.defined() ? scale.to(torch::kDouble).contiguous() : torch::Tensor();
    CheckLaunch(fused::LaunchAdamW(n, pack, head, step, factor.defined() ? factor.data_ptr<double>() : nullptr, p, g, m, q,
                                   w, on.stream()),
                "AdamW", "optimizer.implementation=fused runs libtorch's kernel instead");
    return write_copy;
  }
#endif
  const float c = scale.defined() ? static_cast<float>(scale.item<double>()) : 1.0f;
  TORCH_CHECK(fused::VisitPack<float>(pack, [&](auto width) {
                constexpr int N = decltype(width)::value;
                HostLoop(fused::AdamWItems<N>(n, head),
                         [&](int64_t r) { fused::AdamWItem<N>(r, n, head, step, c, p, g, m, q, w); });
              }),
              "unsupported pack width ", pack);
  return write_copy;
}

torch::Tensor ZerosInLineWith(const torch::Tensor& t) {
  const auto bytes = static_cast<uintptr_t>(t.element_size());
  const auto offset = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16;
  if (offset == 0 || offset % bytes != 0 || !t.is_contiguous() || t.layout() != torch::kStrided) {
    return torch::zeros_like(t);  // t's strides: libtorch's fused AdamW wants them equal
  }
  const auto line = static_cast<int64_t>(16 / bytes);
  const torch::Tensor buffer = torch::zeros({t.numel() + line}, t.options());
  const auto base = reinterpret_cast<uintptr_t>(buffer.data_ptr()) % 16;
  const auto shift = static_cast<int64_t>(((16 + offset - base) % 16) / bytes);
  return buffer.narrow(0, shift, t.numel()).view(t.sizes());
}

}  // namespace meshwork::model
