#include "trainer/model/weight_copies.h"

#include <torch/torch.h>

namespace meshwork::model {
namespace {

const void* KeyOf(const torch::Tensor& t) { return t.unsafeGetTensorImpl(); }

bool Copyable(const std::vector<torch::Tensor>& weights) {
  if (weights.empty()) return false;
  for (const torch::Tensor& w : weights) {
    if (!w.defined() || w.dim() != 2 || w.scalar_type() != torch::kFloat || w.layout() != torch::kStrided ||
        w.device() != weights[0].device() || w.size(1) != weights[0].size(1)) {
      return false;
    }
  }
  return true;
}

}  // namespace

torch::Tensor StackWeights(const std::vector<torch::Tensor>& weights, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  if (weights.size() == 1 && weights[0].scalar_type() == dtype) return weights[0];
  int64_t rows = 0;
  for (const torch::Tensor& w : weights) rows += w.size(0);
  torch::Tensor stack = torch::empty({rows, weights[0].size(1)}, weights[0].options().dtype(dtype));
  int64_t row = 0;
  for (const torch::Tensor& part : weights) {
    stack.narrow(0, row, part.size(0)).copy_(part);
    row += part.size(0);
  }
  return stack;
}

torch::Tensor MatmulWeights(WeightCopies* copies, const std::vector<torch::Tensor>& weights, torch::ScalarType dtype) {
  if (copies != nullptr && copies->dtype() == dtype) {
    torch::Tensor stack = copies->Stacked(weights);
    if (stack.defined()) return stack;
  }
  return StackWeights(weights, dtype);
}

bool WeightCopies::Current(const Copy& c, const torch::Tensor& weight) {
  return c.data == weight.data_ptr() && c.version == weight._version();
}

void WeightCopies::Written(Copy& c, const torch::Tensor& weight) {
  c.data = weight.data_ptr();
  c.version = weight._version();
}

const WeightCopies::Copy* WeightCopies::Find(const void* key) const {
  auto it = copies_.find(key);
  return it == copies_.end() || it->second.weight.expired() ? nullptr : &it->second;
}

bool WeightCopies::Fits(const Stack& stack, const std::vector<torch::Tensor>& weights) const {
  if (stack.weights.size() != weights.size() || stack.buffer.device() != weights[0].device() ||
      stack.buffer.size(1) != weights[0].size(1)) {
    return false;
  }
  int64_t rows = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (stack.weights[i] != KeyOf(weights[i]) || Find(stack.weights[i]) == nullptr) return false;
    rows += weights[i].size(0);
  }
  return rows == stack.buffer.size(0);
}

void WeightCopies::DropStack(const void* key) {
  auto it = stacks_.find(key);
  if (it == stacks_.end()) return;
  for (const void* w : it->second.weights) copies_.erase(w);
  stacks_.erase(it);
}

bool WeightCopies::AddStack(const std::vector<torch::Tensor>& weights) {
  std::vector<const void*> dead;
  for (const auto& [key, stack] : stacks_) {
    for (const void* w : stack.weights) {
      if (Find(w) == nullptr) {
        dead.push_back(key);
        break;
      }
    }
  }
  for (const void* key : dead) DropStack(key);
  const void* key = KeyOf(weights[0]);
  for (const torch::Tensor& w : weights) {
    const Copy* c = Find(KeyOf(w));
    if (c != nullptr && c->stack != key) return false;
  }
  // A stack that no longer fits (the weights moved device, or are another list) is made again.
  DropStack(key);
  Stack stack;
  stack.buffer = StackWeights(weights, dtype_);  // fp32 weights: always a new buffer
  int64_t row = 0;
  for (const torch::Tensor& w : weights) {
    Copy c{WeakImpl(w.getIntrusivePtr()), stack.buffer.narrow(0, row, w.size(0)), key};
    Written(c, w);
    copies_.insert_or_assign(KeyOf(w), std::move(c));
    stack.weights.push_back(KeyOf(w));
    row += w.size(0);
  }
  stacks_[key] = std::move(stack);
  return true;
}

torch::Tensor WeightCopies::Stacked(const std::vector<torch::Tensor>& weights) {
  if (!Copyable(weights)) return {};
  auto it = stacks_.find(KeyOf(weights[0]));
  if (it == stacks_.end() || !Fits(it->second, weights)) {
    if (!AddStack(weights)) return {};
    it = stacks_.find(KeyOf(weights[0]));
  }
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& w : weights) {
    Copy& c = copies_.at(KeyOf(w));
    if (Current(c, w)) continue;
    c.rows.copy_(w);  // bumps the buffer's version counter
    Written(c, w);
  }
  return it->second.buffer;
}

torch::Tensor WeightCopies::CopyOf(const torch::Tensor& weight) const {
  const Copy* c = Find(KeyOf(weight));
  return c == nullptr ? torch::Tensor() : c->rows;
}

void WeightCopies::MarkWritten(const torch::Tensor& weight) {
  Copy& c = copies_.at(KeyOf(weight));
  c.rows.unsafeGetTensorImpl()->bump_version();
  Written(c, weight);
}

bool WeightCopies::IsCurrent(const torch::Tensor& weight) const {
  const Copy* c = Find(KeyOf(weight));
  return c != nullptr && Current(*c, weight);
}

int64_t WeightCopies::bytes() const {
  int64_t b = 0;
  for (const auto& [key, stack] : stacks_) b += stack.buffer.numel() * stack.buffer.element_size();
  return b;
}

}  // namespace meshwork::model
