// Meshwork's fused ops, each one pass forward and one backward in place of the composition's
// several kernels: SwiGLU, rotary embedding, RMSNorm (with the residual add and the cast to the
// matmul's dtype folded in) and the output head's softmax gradient; and, outside autograd,
// AdamW's update. Autograd functions (the softmax gradient is called inside the head's own) over
// the arithmetic in fused_elementwise.h, fused_norm.h, fused_softmax.h and fused_adamw.h. On a CUDA tensor they launch fused_kernels.cu's kernels, which exist only
// where nvcc was found at build time (FusedKernelsBuilt()); on the CPU they run the same
// arithmetic in host loops, the rows dealt to lanes and blocks in the kernels' order. Each
// rounds to the storage dtype once, where the composition rounds every intermediate: under bf16
// the two differ by bf16 rounding, in fp32 and double by the last bits. model_test holds the
// host loops to the composition; fused_ops_gpu_test the kernels.
#pragma once

#include <torch/types.h>

#include <utility>
#include <vector>

#include "trainer/model/fused_adamw.h"

namespace meshwork::model {

// Whether this build compiled the CUDA kernels.
bool FusedKernelsBuilt();

// silu(gate) * up for the merged gate/up GEMM's output gate_up [..., 2f] (gate's columns first)
// -> [..., f] in gate_up's dtype (float, double, bf16 or fp16). Saves gate_up for backward.
torch::Tensor FusedSwiGlu(const torch::Tensor& gate_up);

// x * cos + rotate_half(x) * sin (ApplyRope) for x [batch, heads, seq, dim], any strides, in
// x's dtype (float, double, bf16 or fp16); cos and sin [>= seq, dim] (RopeTables' fp32 tables),
// read in fp32 (double for double x). Saves only the tables. When x is a transposed [batch,
// seq, heads, dim] buffer (the model's q and k), the result and x's gradient are laid out that
// way too (SDPA then allocates its output in the same order, so the attention output's transpose
// back is a view); contiguous otherwise. The output's gradient is read at its own strides.
torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// The merged q/k/v GEMM's output qkv [batch, seq, (heads + 2 kv_heads) x dim] as attention's
// {q, k, v} [batch, heads or kv_heads, seq, dim]: q and k rotated (FusedRope), v copied, all
// three laid out as [batch, seq, heads, dim]. The copy of v lets the GEMM output go after
// forward (a view of v would keep it for attention's backward), and backward writes the three
// gradients straight into qkv's gradient, where the composition's split, views and transposes
// cost autograd a reshape of v's gradient and a concatenation of all three. Differentiable in qkv.
std::vector<torch::Tensor> FusedQkvRope(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                        const torch::Tensor& cos, const torch::Tensor& sin);

// Hugging Face's RMSNorm of x [..., dim] with weight [dim]: weight * (x / sqrt(mean(x^2) + eps)),
// the statistics and the product in fp32 (double for double x), rounded once to `out_dtype`
// (x's dtype, or the bf16/fp16 the next matmul runs in under autocast: the composition's
// separate cast folded in). FusedAddRmsNorm first adds delta (x's shape; x's dtype, or bf16/fp16
// with fp32 x: a block's output joining the residual stream) and returns the sum h, in x's
// dtype, with the norm of h: the residual add, the norm and the cast in one pass forward and
// one backward (which also takes h's own gradient, from the residual stream). Saves x (or h), the
// weight and one fp32 per row. Differentiable in x, delta and weight.
// FusedRmsNormSupports says whether the dtypes and width qualify (dim <= fused::kNormMaxDim);
// otherwise the caller takes the composition.
bool FusedRmsNormSupports(const torch::Tensor& x, const torch::Tensor& delta, torch::ScalarType out_dtype);
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                           torch::ScalarType out_dtype);
// FusedRmsNorm that also returns x (`through`, x itself as a view), for x's other uses (the
// residual stream): the gradient they send back through it is added to the norm's own in the
// backward kernel, where the composition's autograd adds x's two gradients in a kernel of its own.
std::pair<torch::Tensor, torch::Tensor> FusedRmsNormPassingX(const torch::Tensor& x, const torch::Tensor& weight,
                                                             double eps, torch::ScalarType out_dtype);
std::pair<torch::Tensor, torch::Tensor> FusedAddRmsNorm(const torch::Tensor& x, const torch::Tensor& delta,
                                                        const torch::Tensor& weight, double eps,
                                                        torch::ScalarType out_dtype);

// The rows of `table` [rows, dim] for `tokens` (int64), as torch::embedding, whose gradient
// for the table is sparse and coalesced: each token's row once, its occurrences summed after a
// sort (the tied head's table: autograd then adds it in place into the head's dense gradient,
// one write per row, no atomics).
torch::Tensor EmbeddingWithSparseGradient(const torch::Tensor& table, const torch::Tensor& tokens);

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

// Meshwork's AdamW update of one parameter (fused_adamw.h) in one pass: param, exp_avg and
// exp_avg_sq updated in place from grad times `scale` (a one-element tensor on the parameter's
// device, any floating dtype: the clip factor; undefined for 1). The gradient is not written.
// FusedAdamWSupports says whether the four tensors qualify: fp32, contiguous, one shape, one
// device, the CPU or a CUDA device where this build has the kernels. 16-byte accesses where the
// four share their offset within a 16-byte line (CommonPackStart), else one element at a time.
// `copy` (or undefined): the parameter's bf16 copy (weight_copies.h), written with the new values
// in the same pass where it is contiguous, of the parameter's size and device, and aligned with
// the packs (AdamWCopyFits). Returns whether it was written (the caller then marks it current
// and bumps the version counters; the update writes through data pointers).
bool FusedAdamWSupports(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                        const torch::Tensor& exp_avg_sq);
bool FusedAdamWUpdate(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                      const torch::Tensor& exp_avg_sq, const fused::AdamWStep& step, const torch::Tensor& scale,
                      const torch::Tensor& copy = {});

// Zeros shaped like t (t's dtype and device) that start at t's offset within a 16-byte line, so
// that a kernel taking 16-byte packs of both can take them from the same element
// (CommonPackStart): AdamW's moments for an FSDP shard, a view of its flat group at any element.
// A plain zeros_like (t's strides) where t is aligned, not contiguous, or not at a whole element
// of the line.
torch::Tensor ZerosInLineWith(const torch::Tensor& t);

}  // namespace meshwork::model
