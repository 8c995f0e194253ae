// The output head and the loss in one: mean token cross-entropy of (hidden @ weight^T) against
// targets, computed a chunk of rows at a time so the [tokens, vocab] logits never exist whole in
// fp32. For Llama 3's 128,256-token vocabulary at 4 x 2048 tokens this avoids about 10 GB of
// logits, their fp32 copy, log-softmax and gradient. Backward needs the gradient of the logits,
// softmax - onehot(target), which it gets in one of two ways (HeadGradient):
//   kStored     forward computes it chunk by chunk while the chunk's logits are at hand and keeps
//               it whole in the matmul's dtype (tokens x vocab x 2 bytes under bf16: 2.1 GB at
//               4 x 2048 tokens), so backward is two whole matmuls, one for each input: the
//               head's matmul runs 3 times a step, as in the plain composition.
//   kRecompute  forward keeps only one fp32 log-sum-exp per token; backward recomputes each
//               chunk's logits: 4 head matmuls a step, with the weight's gradient summed over
//               chunks, and no tokens x vocab buffer at all.
//
// Numerically it is the composition it replaces (CausalLmLoss(matmul(h, W^T))): logits in the
// matmul's dtype (bf16 under CUDA autocast), softmax statistics in fp32, the logits' gradient in
// the matmul's dtype before the two backward matmuls, the weight's gradient accumulated and
// returned in fp32 (the composition rounds it to bf16 before autograd casts it back).
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace meshwork::model {

// About this many bytes of fp32 logits per chunk (forward and backward each hold a few such).
inline constexpr int64_t kLossChunkBytes = int64_t{256} << 20;

// Rows per chunk for a vocabulary: `chunk_bytes` of fp32 logits, at least one row.
int64_t LossChunkRows(int64_t vocab, int64_t chunk_bytes = kLossChunkBytes);

// The dtype of the softmax statistics and the weight's gradient sum for the head's matmul
// dtype (compat::MatmulDtype): fp32, or double for double inputs.
torch::ScalarType LossStatsDtype(const torch::Tensor& hidden);

enum class HeadGradient { kRecompute, kStored };

// hidden [..., d] (any leading shape), weight [vocab, d], targets int64 with hidden's leading
// shape -> scalar fp32 mean loss over every target. chunk_rows <= 0 picks LossChunkRows(vocab).
// Differentiable in hidden and weight, each gradient in its input's dtype; targets must lie in
// [0, vocab). kStored keeps nothing extra when neither input requires a gradient (evaluation).
// `fused_softmax` (training.fused_kernels) with kStored: the logits of every row at once in the
// matmul's dtype, turned into their gradient in place by SoftmaxGradientInPlace (fused_ops.h),
// instead of chunk by chunk through fp32 (chunk_rows then applies to evaluation only).
// `weight_copy`, where defined: weight already in the matmul's dtype (its persistent copy, or a
// cast: weight_copies.h MatmulWeights), which the matmuls read instead of casting weight here;
// the gradient is still weight's.
torch::Tensor LinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows = 0,
                                 HeadGradient gradient = HeadGradient::kRecompute, bool fused_softmax = false,
                                 const torch::Tensor& weight_copy = {});

}  // namespace meshwork::model
