// Persistent copies of fp32 master weights in the matmuls' dtype (bf16 under autocast), kept
// beside the weights as Megatron-LM keeps bf16 model weights beside its optimizer's fp32 ones.
// Without them every forward casts every weight it multiplies by (MixedLinear, the output head):
// 6 bytes a parameter read and written (about 7.4 GB a step at llama3-1b), again for each
// micro-batch and each recomputed layer. With them, Meshwork's AdamW kernel writes a weight's
// copy in the same pass that updates the weight (2 bytes more), and forward finds it current.
//
// A copy is current while its weight's version counter and storage are those it was written
// from. Forward rewrites a stale one (the weight changed some other way: a checkpoint restore,
// libtorch's AdamW, an in-place edit), so a copy is never read stale; a write bumps the copy's
// own version counter, so a graph that saved the old copy fails in backward rather than using
// new values. Weights one GEMM stacks (q/k/v, gate/up) share one buffer, each its rows, which the
// GEMM reads as it is.
//
// Memory: 2 bytes a weight held between steps. Without activation checkpointing forward held the
// casts until backward anyway; with it, they were freed layer by layer. One process only: an
// FSDP rank's weights are gathered for each layer and freed, and a copy would undo resharding.
#pragma once

#include <c10/core/TensorImpl.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace meshwork::model {

// `weights` stacked by rows in `dtype`, one cast per weight straight into its rows of one new
// buffer (one weight already in `dtype`: the weight itself). Under no grad.
torch::Tensor StackWeights(const std::vector<torch::Tensor>& weights, torch::ScalarType dtype);

class WeightCopies;

// The weights a matmul in `dtype` reads: their current copies' stack where `copies` (or null)
// keeps copies in that dtype and can keep these, else StackWeights now.
torch::Tensor MatmulWeights(WeightCopies* copies, const std::vector<torch::Tensor>& weights, torch::ScalarType dtype);

class WeightCopies {
 public:
  explicit WeightCopies(torch::ScalarType dtype) : dtype_(dtype) {}

  torch::ScalarType dtype() const { return dtype_; }

  // `weights` (fp32 [out_i, in] on one device; the same list on every call that starts with the
  // same weight) stacked by rows in dtype(), each part current: [sum out_i, in]. Undefined where
  // these weights cannot have copies (not fp32 and 2-D on one device, or one of them already in a
  // different stack); the caller casts them itself. Runs under no grad.
  torch::Tensor Stacked(const std::vector<torch::Tensor>& weights);

  // The copy of `weight` (its rows of the stack; contiguous), or undefined before the first
  // Stacked that includes it. For the optimizer, which writes it with the weight.
  torch::Tensor CopyOf(const torch::Tensor& weight) const;
  // The optimizer wrote `weight`'s copy from the weight's values now (after bumping the weight's
  // version): current again, and its version counter advanced.
  void MarkWritten(const torch::Tensor& weight);
  // Whether `weight`'s copy exists and is current.
  bool IsCurrent(const torch::Tensor& weight) const;

  // Bytes of every copy.
  int64_t bytes() const;

 private:
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  struct Copy {
    // The weight, held weakly: while held, no other tensor can take its TensorImpl's address
    // (the key), and a weight since freed shows as expired.
    WeakImpl weight;
    torch::Tensor rows;              // a view of the stack's buffer
    const void* stack = nullptr;     // the key of its stack (the first weight's TensorImpl)
    const void* data = nullptr;      // the weight's storage it was written from
    int64_t version = -1;            // and the weight's version then; -1: never written
  };
  struct Stack {
    torch::Tensor buffer;
    std::vector<const void*> weights;  // TensorImpls, in row order
  };
  // A new stack for `weights`, written from them (current), or false where one of them is in
  // another stack. Drops the stacks of freed weights first.
  bool AddStack(const std::vector<torch::Tensor>& weights);
  void DropStack(const void* key);
  // The copy of a live weight at `key`, or null.
  const Copy* Find(const void* key) const;
  // Whether `c` was written from `weight` as it is now.
  static bool Current(const Copy& c, const torch::Tensor& weight);
  // Records that `c` now holds `weight`'s values.
  static void Written(Copy& c, const torch::Tensor& weight);
  bool Fits(const Stack& stack, const std::vector<torch::Tensor>& weights) const;

  torch::ScalarType dtype_;
  std::unordered_map<const void*, Copy> copies_;   // by the weight's TensorImpl
  std::unordered_map<const void*, Stack> stacks_;  // by the first weight's TensorImpl
};

}  // namespace meshwork::model
