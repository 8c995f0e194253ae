// The one place where libtorch 1.13 (Debian, CPU) and libtorch 2.x (CUDA) differ for Meshwork:
// fused attention and RMSNorm, autocast and the optimizer's state keys. Everything else uses
// APIs both versions share.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

namespace meshwork::compat {

inline constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// Grouped-query attention's keys or values [batch, kv_heads, seq, head_dim] widened to
// `heads` heads: query head h reads kv head h / (heads / kv_heads) (HF's repeat_kv order).
inline at::Tensor RepeatKv(const at::Tensor& x, int64_t heads) {
  const int64_t kv_heads = x.size(1);
  if (kv_heads == heads) return x;
  const int64_t b = x.size(0), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv_heads, heads / kv_heads, t, d}).reshape({b, heads, t, d});
}

// Attention spelled out, for libtorch 1.13 (its fused kernel is private): `allowed` bool, true
// where a query may attend a key; the softmax in fp32 as the fused kernels do (double stays
// double: the tests' exact references).
inline at::Tensor MathAttention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& allowed) {
  const at::Tensor k = RepeatKv(k_in, q.size(1));
  const at::Tensor v = RepeatKv(v_in, q.size(1));
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores.to(c10::promoteTypes(scores.scalar_type(), at::kFloat)), -1);
  return at::matmul(probs.to(v.scalar_type()), v);
}

// Causal scaled-dot-product attention: q [batch, heads, seq, head_dim], k and v with heads or
// fewer (grouped-query: a divisor of heads) kv heads. libtorch >= 2.5 takes the kv heads as they
// are (enable_gqa: no widened copies) into its fused kernel (flash / memory-efficient on GPU);
// 2.0-2.4 widen them first; 1.13's kernel is private, so the math is spelled out there, with
// the softmax in fp32 as the fused kernels do.
inline at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  return at::scaled_dot_product_attention(q, k_in, v_in, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/k_in.size(1) != q.size(1));
#elif TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, RepeatKv(k_in, q.size(1)), RepeatKv(v_in, q.size(1)),
                                          /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t seq = q.size(-2);
  return MathAttention(q, k_in, v_in, at::ones({seq, k_in.size(-2)}, q.options().dtype(at::kBool)).tril());
#endif
}

// Attention under an explicit mask (document masking): `allowed` bool, broadcastable to
// [batch, heads, q seq, k seq], true where a query may attend a key. Every row must allow at least
// one key (a document's token always sees itself). With a mask SDPA cannot take the flash kernel
// (the memory-efficient one on GPU, or math), and the mask itself costs batch · seq² bytes.
inline at::Tensor MaskedAttention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                                  const at::Tensor& allowed) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  return at::scaled_dot_product_attention(q, k_in, v_in, allowed, /*dropout_p=*/0.0, /*is_causal=*/false,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/k_in.size(1) != q.size(1));
#elif TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, RepeatKv(k_in, q.size(1)), RepeatKv(v_in, q.size(1)), allowed,
                                          /*dropout_p=*/0.0, /*is_causal=*/false);
#else
  return MathAttention(q, k_in, v_in, allowed);
#endif
}

// Which kernel CausalAttention (or, with `mask`, MaskedAttention) runs for tensors shaped and
// typed like these: SDPA's own choice ("flash_attention", "efficient_attention",
// "cudnn_attention", "math") from libtorch 2.5, where a silent fall back to the math kernel would
// cost seq² memory and most of the speed.
inline std::string AttentionKernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& mask = {}) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  // An undefined tensor is not "no mask": only an empty optional is.
  const std::optional<at::Tensor> attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  switch (at::_fused_sdp_choice(q, k, v, attn_mask, /*dropout_p=*/0.0, /*is_causal=*/!mask.defined(),
                                /*scale=*/std::nullopt, /*enable_gqa=*/k.size(1) != q.size(1))) {
    case 0: return "math";
    case 1: return "flash_attention";
    case 2: return "efficient_attention";
    case 3: return "cudnn_attention";
    default: return "unknown";
  }
#else
  (void)q;
  (void)k;
  (void)v;
  (void)mask;
  return TORCH_VERSION_MAJOR >= 2 ? "sdpa (libtorch < 2.5 does not say which)" : "math (libtorch 1.13: spelled out)";
#endif
}

// Restricts the attention kernel (libtorch's process-wide SDPA switches) to one of the names
// AttentionKernel gives ("flash_attention", "efficient_attention", "cudnn_attention",
// "math"), or with "" enables them all (SDPA's own choice, its default). False where this
// libtorch cannot: before 2.5 only "" is known, and on libtorch 1.13 "math" too (its attention
// is the composition).
inline bool RestrictAttentionKernel(const std::string& only) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  if (!only.empty() && only != "flash_attention" && only != "efficient_attention" && only != "cudnn_attention" &&
      only != "math") {
    return false;
  }
  at::Context& ctx = at::globalContext();
  ctx.setSDPUseFlash(only.empty() || only == "flash_attention");
  ctx.setSDPUseMemEfficient(only.empty() || only == "efficient_attention");
  ctx.setSDPUseCuDNN(only.empty() || only == "cudnn_attention");
  ctx.setSDPUseMath(only.empty() || only == "math");
  return true;
#else
  return only.empty() || (TORCH_VERSION_MAJOR < 2 && only == "math");
#endif
}

// RMSNorm as Hugging Face's LlamaRMSNorm computes it: normalise in fp32 (double for double), cast back to x's
// dtype, scale by the weight (the product in the promoted dtype). libtorch >= 2.4 has it as
// one op (fused on CUDA from 2.6), used where x and the weight are both fp32 (then the two
// agree up to rounding); otherwise the composition.
inline at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    return at::rms_norm(x, {x.size(-1)}, weight, eps);
  }
#endif
  // fp32 for bf16/fp16/fp32 activations; double stays double (the tests' exact references).
  const at::Tensor xf = x.to(c10::promoteTypes(x.scalar_type(), at::kFloat));
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

// Whether CUDA autocast is on, and to which dtype (what a recomputed block must run under again).
struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
};
inline AutocastState CurrentCudaAutocast() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return {at::autocast::is_autocast_enabled(at::kCUDA), at::autocast::get_autocast_dtype(at::kCUDA)};
#else
  return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
#endif
}

// The dtype a matmul of `input` runs in: the CUDA autocast dtype when input is on CUDA under
// autocast (what at::matmul would cast to), else input's own.
inline at::ScalarType MatmulDtype(const at::Tensor& input) {
  const AutocastState amp = CurrentCudaAutocast();
  return amp.enabled && input.is_cuda() ? amp.dtype : input.scalar_type();
}

// a @ b as a new tensor of dtype `out`. On CUDA, libtorch 2.11's mm takes bf16/fp16 inputs to an
// fp32 output in one cuBLAS call (fp32 accumulation, no bf16 rounding of the product); otherwise
// the product in the inputs' dtype, then cast.
inline at::Tensor MatmulTo(const at::Tensor& a, const at::Tensor& b, at::ScalarType out) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  const bool half = a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf;
  if (a.is_cuda() && half && out == at::kFloat) return at::mm(a, b, out);
#endif
  return at::matmul(a, b).to(out);
}

// Turns CUDA autocast to `dtype` on for its lifetime (no-op when !enabled).
class CudaAutocastGuard {
 public:
  CudaAutocastGuard(bool enabled, at::ScalarType dtype) : enabled_(enabled) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    prev_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    prev_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
  }
  ~CudaAutocastGuard() {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, prev_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, prev_dtype_);
#else
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
#endif
    // Autocast caches casted weights for the region; they must not outlive the step.
    at::autocast::clear_cache();
  }
  CudaAutocastGuard(const CudaAutocastGuard&) = delete;
  CudaAutocastGuard& operator=(const CudaAutocastGuard&) = delete;

 private:
  bool enabled_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kHalf;
};

// A parameter's key in torch::optim::Optimizer::state() (pass that map): its TensorImpl's
// address, printed to a string in 1.13 (c10::guts::to_string) and the pointer itself in 2.x.
template <typename StateMap>
typename StateMap::key_type OptimizerStateKey(const StateMap&, const at::Tensor& param) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream os;
    os << param.unsafeGetTensorImpl();
    return os.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

}  // namespace meshwork::compat
