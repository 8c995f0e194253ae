// SwiGLU and rotary embedding each as one pass forward and one backward, in place of the
// composition's several elementwise kernels (silu, mul; mul, rotate_half's neg and cat, mul,
// add; and as many again in backward): autograd functions over the arithmetic in
// fused_elementwise.h. On a CUDA tensor they launch fused_kernels.cu's kernels, which exist only
// where nvcc was found at build time (FusedKernelsBuilt()); on the CPU they run the same
// arithmetic in a host loop. Each rounds to the storage dtype once, where the composition rounds
// every intermediate: under bf16 the two differ by bf16 rounding, in fp32 and double by the
// last bits. model_test holds the host loops to the composition; fused_ops_gpu_test the kernels.
#pragma once

#include <torch/types.h>

namespace meshwork::model {

// Whether this build compiled the CUDA kernels.
bool FusedKernelsBuilt();

// silu(gate) * up for the merged gate/up GEMM's output gate_up [..., 2f] (gate's columns first)
// -> [..., f] in gate_up's dtype (float, double, bf16 or fp16). Saves gate_up for backward.
torch::Tensor FusedSwiGlu(const torch::Tensor& gate_up);

// x * cos + rotate_half(x) * sin (ApplyRope) for x [batch, heads, seq, dim], any strides, in
// x's dtype (float, double, bf16 or fp16); cos and sin [>= seq, dim] (RopeTables' fp32 tables),
// read in fp32 (double for double x). The result is contiguous. Saves only the tables.
torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// The output head's logits [rows, vocab] (contiguous; float, double, bf16 or fp16) replaced in
// place by the gradient of each row's cross-entropy against `targets` [rows] (int64, in [0,
// vocab)): softmax(row) - onehot(target), rounded to the logits' dtype, from one read of the row
// for its log-sum-exp and one read + write for the gradient (the composition: a cast to fp32, a
// log-sum-exp, a subtraction and an exp in place, a scatter and a cast back). Returns each row's
// log-sum-exp and target logit (fp32; double for double logits), from which the loss is
// mean(lse - target_logit). No autograd: the fused head + loss calls it inside its own forward.
struct SoftmaxGradientStats {
  torch::Tensor lse;
  torch::Tensor target_logit;
};
SoftmaxGradientStats SoftmaxGradientInPlace(torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace meshwork::model
