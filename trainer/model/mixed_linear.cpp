#include "trainer/model/mixed_linear.h"

#include <torch/torch.h>

#include "trainer/model/compat.h"
#include "trainer/model/weight_copies.h"

namespace meshwork::model {
namespace {

struct MixedLinearFunction : torch::autograd::Function<MixedLinearFunction> {
  // `w`: the weights stacked in the matmul's dtype (MatmulWeights: their copies, or cast now),
  // not differentiated; `weights` only carry the gradients.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, at::TensorList weights) {
    const auto dtype = w.scalar_type();
    const int64_t rows = w.size(0);
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)}).to(dtype);
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
    out_shape.back() = rows;
    ctx->save_for_backward({x2, w});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weights[0].scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> splits;
    for (const torch::Tensor& part : weights) splits.push_back(part.size(0));
    ctx->saved_data["splits"] = splits;
    // Not a view of the product: an output that is a view may not be modified in place.
    return at::_unsafe_view(torch::mm(x2, w.t()), out_shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x2 = saved[0];
    const torch::Tensor& w = saved[1];
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto weight_dtype = static_cast<torch::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const std::vector<int64_t> splits = ctx->saved_data["splits"].toIntVector();
    const torch::Tensor dy = grad_out[0].reshape({-1, w.size(0)}).to(w.scalar_type());
    // x, the stacked weight (no gradient), each weight.
    torch::autograd::variable_list grads(2 + splits.size());
    if (ctx->needs_input_grad(0)) {
      grads[0] = compat::MatmulTo(dy, w, x_dtype).view(ctx->saved_data["x_shape"].toIntVector());
    }
    bool any_weight = false;
    for (size_t i = 0; i < splits.size(); ++i) any_weight = any_weight || ctx->needs_input_grad(2 + i);
    if (any_weight) {
      const torch::Tensor dw = compat::MatmulTo(dy.t(), x2, weight_dtype);
      int64_t row = 0;
      for (size_t i = 0; i < splits.size(); ++i) {
        if (ctx->needs_input_grad(2 + i)) grads[2 + i] = dw.narrow(0, row, splits[i]);
        row += splits[i];
      }
    }
    return grads;
  }
};

}  // namespace

bool MixedLinearApplies(const torch::Tensor& x, const torch::Tensor& weight) {
  return compat::MatmulDtype(x) != weight.scalar_type();
}

torch::Tensor MixedLinear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights, WeightCopies* copies) {
  TORCH_CHECK(!weights.empty(), "MixedLinear: no weights");
  for (const torch::Tensor& w : weights) {
    TORCH_CHECK(w.dim() == 2 && w.size(1) == x.size(-1) && w.scalar_type() == weights[0].scalar_type() &&
                    w.device() == weights[0].device(),
                "MixedLinear: weight ", w.sizes(), " ", w.scalar_type(), " does not fit x ", x.sizes(), " and ",
                weights[0].sizes(), " ", weights[0].scalar_type());
  }
  return MixedLinearFunction::apply(x, MatmulWeights(copies, weights, compat::MatmulDtype(x)),
                                    at::TensorList(weights));
}

}  // namespace meshwork::model
