// A linear layer over fp32 master weights whose matmuls run in bf16 (or fp16): y = x W^T with W
// the rows of `weights` stacked ([out_i, in] each; one weight, or q/k/v or gate/up merged into
// one GEMM), cast once into one buffer. Backward returns each weight's gradient in fp32 straight
// from one GEMM with an fp32 output (cuBLAS on CUDA with libtorch >= 2.11: fp32 accumulation,
// never rounded to bf16), and x's gradient in x's dtype.
//
// The composition it replaces (F::linear(x, cat(w.to(bf16)...)) under autocast) casts each
// weight and then concatenates (two passes over the bf16 weights), and in backward rounds the
// weight gradient to bf16 before autograd's cast back to fp32 (one more pass, and a bf16
// temporary the size of the weights). Where the weights are already in the matmul's dtype (fp32
// training, FSDP's bf16 gathers), there is nothing to save: the caller keeps the composition
// (MixedLinearApplies).
#pragma once

#include <torch/types.h>

#include <vector>

namespace meshwork::model {

class WeightCopies;

// Whether MixedLinear differs from the composition for input x: the matmul's dtype
// (compat::MatmulDtype) is not the weights' dtype.
bool MixedLinearApplies(const torch::Tensor& x, const torch::Tensor& weight);

// x [..., in], weights [out_i, in] (same dtype and device): [..., sum out_i] in the matmul's
// dtype. Differentiable in x and every weight. With `copies` in the matmul's dtype, the GEMM
// reads the weights' persistent copies (weight_copies.h) instead of casting them.
torch::Tensor MixedLinear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                          WeightCopies* copies = nullptr);

}  // namespace meshwork::model
