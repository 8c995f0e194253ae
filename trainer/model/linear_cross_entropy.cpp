#include "trainer/model/linear_cross_entropy.h"

#include <torch/torch.h>

#include <algorithm>

#include "trainer/model/compat.h"

namespace meshwork::model {
namespace {

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  // hidden [n, d] and weight [vocab, d] already in the matmul's dtype (under autocast, a
  // matmul of two bf16 tensors stays bf16); targets [n]. Runs under no grad.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden, torch::Tensor weight,
                               torch::Tensor targets, int64_t chunk_rows) {
    const int64_t n = hidden.size(0);
    const auto stats = LossStatsDtype(hidden);
    torch::Tensor lse = torch::empty({n}, hidden.options().dtype(stats));
    torch::Tensor target_logit = torch::empty({n}, hidden.options().dtype(stats));
    for (int64_t r = 0; r < n; r += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - r);
      torch::Tensor logits = torch::matmul(hidden.narrow(0, r, rows), weight.t()).to(stats);
      lse.narrow(0, r, rows).copy_(torch::logsumexp(logits, -1));
      target_logit.narrow(0, r, rows).copy_(logits.gather(1, targets.narrow(0, r, rows).unsqueeze(1)).squeeze(1));
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    return (lse - target_logit).sum() / static_cast<double>(n);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& lse = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const int64_t n = hidden.size(0);
    // d(mean)/d(logit) = (softmax - onehot(target)) / n, times the incoming gradient.
    const auto stats = LossStatsDtype(hidden);
    const torch::Tensor scale = grad_out[0].to(stats) / static_cast<double>(n);
    const bool need_hidden = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);
    torch::Tensor grad_hidden = need_hidden ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight = need_weight ? torch::zeros(weight.sizes(), weight.options().dtype(stats)) : torch::Tensor();
    for (int64_t r = 0; r < n; r += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - r);
      const torch::Tensor h = hidden.narrow(0, r, rows);
      torch::Tensor probs = torch::matmul(h, weight.t()).to(stats);
      probs.sub_(lse.narrow(0, r, rows).unsqueeze(1)).exp_();
      probs.scatter_add_(1, targets.narrow(0, r, rows).unsqueeze(1),
                         torch::full({rows, 1}, -1.0, probs.options()));
      const torch::Tensor g = probs.mul_(scale).to(hidden.scalar_type());
      if (need_hidden) grad_hidden.narrow(0, r, rows).copy_(torch::matmul(g, weight));
      if (need_weight) {
        if (grad_weight.scalar_type() == g.scalar_type()) {
          grad_weight.addmm_(g.t(), h);
        } else {
          grad_weight.add_(torch::matmul(g.t(), h));
        }
      }
    }
    return {grad_hidden, need_weight ? grad_weight.to(weight.scalar_type()) : torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::ScalarType HeadMatmulDtype(const torch::Tensor& hidden) {
  const compat::AutocastState amp = compat::CurrentCudaAutocast();
  if (amp.enabled && hidden.is_cuda()) return amp.dtype;
  return hidden.scalar_type();
}

torch::ScalarType LossStatsDtype(const torch::Tensor& hidden) {
  return c10::promoteTypes(hidden.scalar_type(), torch::kFloat);
}

int64_t LossChunkRows(int64_t vocab, int64_t chunk_bytes) {
  return std::max<int64_t>(1, chunk_bytes / (std::max<int64_t>(vocab, 1) * 4));
}

torch::Tensor LinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows) {
  TORCH_CHECK(weight.dim() == 2 && hidden.size(-1) == weight.size(1), "LinearCrossEntropy: hidden ", hidden.sizes(),
              " does not match weight ", weight.sizes());
  TORCH_CHECK(targets.numel() * hidden.size(-1) == hidden.numel(), "LinearCrossEntropy: targets ", targets.sizes(),
              " do not match hidden ", hidden.sizes());
  const int64_t d = hidden.size(-1);
  const auto dtype = HeadMatmulDtype(hidden);
  // The casts are ordinary autograd ops: their backward returns each gradient in the input's dtype.
  const torch::Tensor h = hidden.reshape({-1, d}).to(dtype);
  const torch::Tensor w = weight.to(dtype);
  const torch::Tensor t = targets.reshape({-1}).to(torch::kLong);
  if (chunk_rows <= 0) chunk_rows = LossChunkRows(weight.size(0));
  return LinearCrossEntropyFunction::apply(h, w, t, chunk_rows);
}

}  // namespace meshwork::model
