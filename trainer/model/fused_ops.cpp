#include "trainer/model/fused_ops.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <vector>

#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_kernels.h"
#include "trainer/model/fused_softmax.h"

#if defined(MESHWORK_FUSED_KERNELS)
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace meshwork::model {
namespace {

using fused::ElementType;
using fused::RopeShape;

ElementType ElementTypeOf(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return ElementType::kFloat;
    case torch::kDouble: return ElementType::kDouble;
    case torch::kBFloat16: return ElementType::kBFloat16;
    case torch::kHalf: return ElementType::kHalf;
    default: TORCH_CHECK(false, "fused op: unsupported dtype ", t.scalar_type(), " (float, double, bf16 or fp16)");
  }
}

// The arithmetic dtype for storage dtype t: double for double, fp32 otherwise.
torch::ScalarType AccOf(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// Calls fn(T{}, Acc{}) for t's storage type on the host.
template <typename Fn>
void DispatchHost(const torch::Tensor& t, Fn&& fn) {
  switch (ElementTypeOf(t)) {
    case ElementType::kFloat: fn(float{}, float{}); break;
    case ElementType::kDouble: fn(double{}, double{}); break;
    case ElementType::kBFloat16: fn(c10::BFloat16{}, float{}); break;
    case ElementType::kHalf: fn(c10::Half{}, float{}); break;
  }
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
void CheckLaunch(const char* error, const char* kernel) {
  TORCH_CHECK(error == nullptr, "CUDA kernel ", kernel, " failed to launch: ", error,
              " (set CUDA_LAUNCH_BLOCKING=1 to find the failing call; training.fused_kernels=off runs the "
              "composition instead)");
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
#if defined(MESHWORK_FUSED_KERNELS)
    if (gate_up.is_cuda()) {
      OnDevice on(gate_up);
      CheckLaunch(fused::LaunchSwiGluForward(ElementTypeOf(gate_up), rows, f, gate_up.data_ptr(), out.data_ptr(),
                                             on.stream()),
                  "SwiGluForward");
      ctx->save_for_backward({gate_up});
      return out;
    }
#endif
    DispatchHost(gate_up, [&](auto t, auto acc) {
      using T = decltype(t);
      using Acc = decltype(acc);
      const T* in = gate_up.data_ptr<T>();
      T* o = out.data_ptr<T>();
      HostLoop(rows * f, [&](int64_t i) { fused::SwiGluForwardAt<T, Acc>(i, f, in, o); });
    });
    ctx->save_for_backward({gate_up});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const torch::Tensor gate_up = ctx->get_saved_variables()[0];
    const torch::Tensor grad = grad_out[0].to(gate_up.scalar_type()).contiguous();
    const int64_t f = gate_up.size(-1) / 2;
    const int64_t rows = f == 0 ? 0 : gate_up.numel() / (2 * f);
    torch::Tensor grad_gate_up = torch::empty_like(gate_up);
#if defined(MESHWORK_FUSED_KERNELS)
    if (gate_up.is_cuda()) {
      OnDevice on(gate_up);
      CheckLaunch(fused::LaunchSwiGluBackward(ElementTypeOf(gate_up), rows, f, gate_up.data_ptr(), grad.data_ptr(),
                                              grad_gate_up.data_ptr(), on.stream()),
                  "SwiGluBackward");
      return {grad_gate_up};
    }
#endif
    DispatchHost(gate_up, [&](auto t, auto acc) {
      using T = decltype(t);
      using Acc = decltype(acc);
      const T* in = gate_up.data_ptr<T>();
      const T* g = grad.data_ptr<T>();
      T* gi = grad_gate_up.data_ptr<T>();
      HostLoop(rows * f, [&](int64_t i) { fused::SwiGluBackwardAt<T, Acc>(i, f, in, g, gi); });
    });
    return {grad_gate_up};
  }
};

RopeShape ShapeOf(const torch::Tensor& x) {
  RopeShape s;
  s.heads = x.size(1);
  s.seq = x.size(2);
  s.dim = x.size(3);
  s.batch_stride = x.stride(0);
  s.head_stride = x.stride(1);
  s.seq_stride = x.stride(2);
  return s;
}

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  // cos and sin: [seq, dim], contiguous, in x's arithmetic dtype, on x's device.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    const torch::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
    const RopeShape shape = ShapeOf(x);
    torch::Tensor out = torch::empty(x.sizes(), x.options().memory_format(torch::MemoryFormat::Contiguous));
    ctx->save_for_backward({cos, sin});
#if defined(MESHWORK_FUSED_KERNELS)
    if (x.is_cuda()) {
      OnDevice on(x);
      CheckLaunch(fused::LaunchRopeForward(ElementTypeOf(x), x.size(0), shape, x.data_ptr(), cos.data_ptr(),
                                           sin.data_ptr(), out.data_ptr(), on.stream()),
                  "RopeForward");
      return out;
    }
#endif
    DispatchHost(x, [&](auto t, auto acc) {
      using T = decltype(t);
      using Acc = decltype(acc);
      const T* in = x.data_ptr<T>();
      const Acc* c = cos.data_ptr<Acc>();
      const Acc* s = sin.data_ptr<Acc>();
      T* o = out.data_ptr<T>();
      HostLoop(out.numel(), [&](int64_t i) { fused::RopeForwardAt<T, Acc>(i, shape, in, c, s, o); });
    });
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& cos = saved[0];
    const torch::Tensor& sin = saved[1];
    const torch::Tensor grad = grad_out[0].contiguous();
    const RopeShape shape = ShapeOf(grad);
    torch::Tensor grad_x = torch::empty_like(grad, torch::MemoryFormat::Contiguous);
#if defined(MESHWORK_FUSED_KERNELS)
    if (grad.is_cuda()) {
      OnDevice on(grad);
      CheckLaunch(fused::LaunchRopeBackward(ElementTypeOf(grad), grad.size(0), shape, grad.data_ptr(), cos.data_ptr(),
                                            sin.data_ptr(), grad_x.data_ptr(), on.stream()),
                  "RopeBackward");
      return {grad_x, torch::Tensor(), torch::Tensor()};
    }
#endif
    DispatchHost(grad, [&](auto t, auto acc) {
      using T = decltype(t);
      using Acc = decltype(acc);
      const T* g = grad.data_ptr<T>();
      const Acc* c = cos.data_ptr<Acc>();
      const Acc* s = sin.data_ptr<Acc>();
      T* gx = grad_x.data_ptr<T>();
      HostLoop(grad_x.numel(), [&](int64_t i) { fused::RopeBackwardAt<T, Acc>(i, shape, g, c, s, gx); });
    });
    return {grad_x, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

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
#if defined(MESHWORK_FUSED_KERNELS)
  if (logits.is_cuda()) {
    OnDevice on(logits);
    CheckLaunch(fused::LaunchSoftmaxGradient(ElementTypeOf(logits), rows, vocab, logits.data_ptr(),
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
  DispatchHost(logits, [&](auto type, auto acc) {
    using T = decltype(type);
    using Acc = decltype(acc);
    T* base = logits.data_ptr<T>();
    const int64_t* target = t.data_ptr<int64_t>();
    Acc* lse = out.lse.data_ptr<Acc>();
    Acc* target_logit = out.target_logit.data_ptr<Acc>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<fused::SoftmaxStats<Acc>> lanes(fused::kRowThreads);
      for (int64_t r = begin; r < end; ++r) {
        T* row = base + r * vocab;
        // The block's threads one after another, then the tree one step at a time.
        for (int lane = 0; lane < fused::kRowThreads; ++lane) lanes[lane] = fused::LaneStats<T, Acc>(row, vocab, lane);
        for (int stride = fused::kRowThreads / 2; stride > 0; stride /= 2) {
          for (int lane = 0; lane < fused::kRowThreads; ++lane) fused::TreeStep(lanes.data(), lane, stride);
        }
        lse[r] = fused::LogSumExp(lanes[0]);
        target_logit[r] = static_cast<Acc>(row[target[r]]);
        for (int64_t j = 0; j < vocab; ++j) fused::SoftmaxGradientAt<T, Acc>(row, j, target[r], lse[r]);
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

}  // namespace meshwork::model
