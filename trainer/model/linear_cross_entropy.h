// The output head and the loss in one: mean token cross-entropy of (hidden @ weight^T) against
// targets, computed a chunk of rows at a time so the [tokens, vocab] logits never exist whole.
// Only the hidden states are kept for backward (and the weight, as a plain matmul keeps it),
// plus one fp32 log-sum-exp per token; backward recomputes each chunk's logits. For Llama 3's
// 128,256-token vocabulary at 4 x 2048 tokens this avoids about 10 GB of logits, their fp32
// copy, log-softmax and gradient.
//
// Numerically it is the composition it replaces (CausalLmLoss(matmul(h, W^T))): logits in the
// matmul's dtype (bf16 under CUDA autocast), softmax statistics in fp32, gradients cast back to
// the matmul's dtype before the two backward matmuls. The weight's gradient is summed over
// chunks in fp32.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace meshwork::model {

// About this many bytes of fp32 logits per chunk (forward and backward each hold a few such).
inline constexpr int64_t kLossChunkBytes = int64_t{256} << 20;

// Rows per chunk for a vocabulary: `chunk_bytes` of fp32 logits, at least one row.
int64_t LossChunkRows(int64_t vocab, int64_t chunk_bytes = kLossChunkBytes);

// The dtype the head's matmul runs in for `hidden`: the autocast dtype on CUDA under autocast
// (what at::matmul would pick), else hidden's own. Softmax statistics and the weight's gradient
// sum: fp32, or double for double inputs.
torch::ScalarType HeadMatmulDtype(const torch::Tensor& hidden);
torch::ScalarType LossStatsDtype(const torch::Tensor& hidden);

// hidden [..., d] (any leading shape), weight [vocab, d], targets int64 with hidden's leading
// shape -> scalar fp32 mean loss over every target. chunk_rows <= 0 picks LossChunkRows(vocab).
// Differentiable in hidden and weight; targets must lie in [0, vocab).
torch::Tensor LinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows = 0);

}  // namespace meshwork::model
