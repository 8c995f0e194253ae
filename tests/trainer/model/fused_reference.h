// What the fused-op tests compare against, shared by the CPU tests (fused_ops_test.cpp) and the
// GPU ones (tests/gpu/fused_ops_gpu_test.cpp): the composition a fused op replaces, and a
// forward + backward of any op under a given upstream gradient.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>

namespace meshwork::model::testing {

// The output of f(input) and input's gradient under upstream gradient `upstream`.
inline std::pair<torch::Tensor, torch::Tensor> ForwardBackward(
    const std::function<torch::Tensor(const torch::Tensor&)>& f, const torch::Tensor& input,
    const torch::Tensor& upstream) {
  auto x = input.detach().clone().requires_grad_(true);
  auto y = f(x);
  y.backward(upstream);
  return {y.detach(), x.grad()};
}

// silu(gate) * up for gate_up [..., 2f], as MlpImpl composes it.
inline torch::Tensor SwiGluComposition(const torch::Tensor& gate_up) {
  const auto halves = gate_up.chunk(2, -1);
  return torch::silu(halves[0]) * halves[1];
}

}  // namespace meshwork::model::testing
