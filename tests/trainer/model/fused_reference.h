// What the fused-op tests compare against, shared by the CPU tests (fused_ops_test.cpp) and the
// GPU ones (tests/gpu/fused_ops_gpu_test.cpp): the composition a fused op replaces, a forward +
// backward of any op under a given upstream gradient, and misaligned copies (the ops' one
// element at a time path).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>

namespace meshwork::model::testing {

// A contiguous copy of t one element past an aligned address, through autograd: the fused ops
// then go one element at a time (their addresses no longer fit 16-byte packs).
inline torch::Tensor Misaligned(const torch::Tensor& t) {
  auto buffer = torch::empty({t.numel() + 1}, t.options());
  auto view = buffer.narrow(0, 1, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

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
