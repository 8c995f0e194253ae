// The one place where libtorch 1.13 (Debian, CPU) and libtorch 2.x (CUDA) differ for Meshwork:
// fused attention, autocast and the optimizer's state keys. Everything else uses APIs both
// versions share.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

namespace meshwork::compat {

inline constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// Causal scaled-dot-product attention over [batch, heads, seq, head_dim] tensors.
// libtorch 2.x has a fused kernel (flash / memory-efficient on GPU); 1.13's is private, so the
// math is spelled out there, with the softmax in fp32 as the fused kernels do.
inline at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  const int64_t seq = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  at::Tensor future = at::ones({seq, k.size(-2)}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  return at::matmul(probs, v);
#endif
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
