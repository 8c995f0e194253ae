#include "trainer/model/linear_cross_entropy.h"

#include <torch/torch.h>

#include <algorithm>

#include "trainer/model/compat.h"
#include "trainer/model/fused_ops.h"

namespace meshwork::model {
namespace {

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  // hidden [n, d] in its own dtype (under autocast the final norm's output, fp32 from the
  // composition and bf16 from the fused norm); weight [vocab, d] (the fp32 parameter) only for
  // its gradient, and `w` the weight in the matmuls' dtype (cast by the caller, or its persistent
  // copy), which is not differentiated; the matmuls run in w's dtype, with h cast here rather than
  // by autograd so that the gradients come back in their inputs' dtypes (the weight's fp32)
  // without a round trip through bf16; targets [n]. Runs under no grad.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& w, const torch::Tensor& targets,
                               int64_t chunk_rows, bool store_gradient, bool fused_softmax) {
    const auto dtype = w.scalar_type();
    const torch::Tensor h = hidden.to(dtype);
    const int64_t n = h.size(0);
    const auto stats = LossStatsDtype(h);
    torch::Tensor lse = torch::empty({n}, h.options().dtype(stats));
    torch::Tensor target_logit = torch::empty({n}, h.options().dtype(stats));
    // softmax - onehot(target) per token, unscaled (backward applies grad_out / n to the
    // smaller products): only when a gradient will be asked for.
    const bool store = store_gradient && (hidden.requires_grad() || weight.requires_grad());
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    if (store && fused_softmax) {
      // Every row's logits at once in the matmul's dtype (the size of the stored gradient), turned
      // into that gradient in place: no fp32 copy, one read for the statistics and one read +
      // write for the gradient (SoftmaxGradientInPlace).
      torch::Tensor logit_grad = torch::matmul(h, w.t());
      const SoftmaxGradientStats row = SoftmaxGradientInPlace(logit_grad, targets);
      ctx->save_for_backward({h, w, targets, row.lse, logit_grad});
      return (row.lse - row.target_logit).sum() / static_cast<double>(n);
    }
    torch::Tensor logit_grad = store ? torch::empty({n, w.size(0)}, h.options()) : torch::Tensor();
    for (int64_t r = 0; r < n; r += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - r);
      const torch::Tensor t = targets.narrow(0, r, rows).unsqueeze(1);
      torch::Tensor logits = torch::matmul(h.narrow(0, r, rows), w.t()).to(stats);
      const torch::Tensor chunk_lse = torch::logsumexp(logits, -1);
      lse.narrow(0, r, rows).copy_(chunk_lse);
      target_logit.narrow(0, r, rows).copy_(logits.gather(1, t).squeeze(1));
      if (store) {
        logits.sub_(chunk_lse.unsqueeze(1)).exp_();
        logits.scatter_add_(1, t, torch::full({rows, 1}, -1.0, logits.options()));
        logit_grad.narrow(0, r, rows).copy_(logits);
      }
    }
    // Saved variables, not saved_data: autograd frees them as soon as this backward has run
    // (saved_data would keep the tokens x vocab gradient alive through the rest of backward).
    ctx->save_for_backward({h, w, targets, lse, logit_grad});
    return (lse - target_logit).sum() / static_cast<double>(n);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& h = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& logit_grad = saved[4];
    const auto hidden_dtype = static_cast<torch::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype = static_cast<torch::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const int64_t n = h.size(0);
    // d(mean)/d(logit) = (softmax - onehot(target)) / n, times the incoming gradient.
    const auto stats = LossStatsDtype(h);
    const torch::Tensor scale = grad_out[0].to(stats) / static_cast<double>(n);
    const bool need_hidden = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);  // input 2, w, is never differentiated
    torch::Tensor grad_hidden, grad_weight;
    if (logit_grad.defined()) {
      // Stored: one matmul per input over every token, scaled after (in fp32, on the products).
      if (need_hidden) grad_hidden = compat::MatmulTo(logit_grad, w, stats).mul_(scale).to(hidden_dtype);
      if (need_weight) grad_weight = compat::MatmulTo(logit_grad.t(), h, stats).mul_(scale).to(weight_dtype);
      return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
              torch::Tensor()};
    }
    // Recomputed, chunk by chunk.
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& lse = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    if (need_hidden) grad_hidden = torch::empty(h.sizes(), h.options().dtype(hidden_dtype));
    if (need_weight) grad_weight = torch::zeros(w.sizes(), w.options().dtype(stats));
    for (int64_t r = 0; r < n; r += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - r);
      const torch::Tensor hc = h.narrow(0, r, rows);
      torch::Tensor probs = torch::matmul(hc, w.t()).to(stats);
      probs.sub_(lse.narrow(0, r, rows).unsqueeze(1)).exp_();
      probs.scatter_add_(1, targets.narrow(0, r, rows).unsqueeze(1),
                         torch::full({rows, 1}, -1.0, probs.options()));
      const torch::Tensor g = probs.mul_(scale).to(h.scalar_type());
      if (need_hidden) grad_hidden.narrow(0, r, rows).copy_(torch::matmul(g, w));
      if (need_weight) {
        // bf16 products summed into fp32: an fp32 product per chunk would move a third more bytes.
        if (grad_weight.scalar_type() == g.scalar_type()) {
          grad_weight.addmm_(g.t(), hc);
        } else {
          grad_weight.add_(torch::matmul(g.t(), hc));
        }
      }
    }
    if (need_weight) grad_weight = grad_weight.to(weight_dtype);
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::ScalarType LossStatsDtype(const torch::Tensor& hidden) {
  return c10::promoteTypes(hidden.scalar_type(), torch::kFloat);
}

int64_t LossChunkRows(int64_t vocab, int64_t chunk_bytes) {
  return std::max<int64_t>(1, chunk_bytes / (std::max<int64_t>(vocab, 1) * 4));
}

torch::Tensor LinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows, HeadGradient gradient,
                                 bool fused_softmax, const torch::Tensor& weight_copy) {
  TORCH_CHECK(weight.dim() == 2 && hidden.size(-1) == weight.size(1), "LinearCrossEntropy: hidden ", hidden.sizes(),
              " does not match weight ", weight.sizes());
  TORCH_CHECK(targets.numel() * hidden.size(-1) == hidden.numel(), "LinearCrossEntropy: targets ", targets.sizes(),
              " do not match hidden ", hidden.sizes());
  const int64_t d = hidden.size(-1);
  const torch::Tensor t = targets.reshape({-1}).to(torch::kLong);
  if (chunk_rows <= 0) chunk_rows = LossChunkRows(weight.size(0));
  const auto dtype = compat::MatmulDtype(hidden);
  TORCH_CHECK(!weight_copy.defined() || (weight_copy.scalar_type() == dtype && weight_copy.sizes() == weight.sizes() &&
                                         weight_copy.device() == weight.device()),
              "LinearCrossEntropy: weight copy ", weight_copy.sizes(), " does not match weight ", weight.sizes(),
              " in the matmul dtype ", dtype);
  torch::Tensor w = weight_copy;
  if (!w.defined()) {
    torch::NoGradGuard no_grad;
    w = weight.to(dtype);
  }
  return LinearCrossEntropyFunction::apply(hidden.reshape({-1, d}), weight, w, t, chunk_rows,
                                           gradient == HeadGradient::kStored, fused_softmax);
}

}  // namespace meshwork::model
