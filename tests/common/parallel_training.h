// What the parallel training tests (FSDP, tensor parallelism) share when they train a sharded
// model beside one process: the optimizer both sides use, and a count of the blocks activation
// checkpointing recomputes.
#pragma once

#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace meshwork::testing {

// AdamW with weight decay on `decay` only. eps 1e-4 rather than 1e-8: with a tiny eps, Adam turns
// a gradient element of 1e-9 (rounding noise) into a full-size update, so reduction order alone
// would move single weights.
inline torch::optim::AdamW MakeOptimizer(std::vector<torch::Tensor> decay, std::vector<torch::Tensor> no_decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(1e-2).eps(1e-4).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(1e-2).eps(1e-4).weight_decay(0.0)));
  return torch::optim::AdamW(groups, torch::optim::AdamWOptions(1e-2));
}

// Checkpointed blocks (model::Recompute's autograd node) in the graph behind `loss`.
inline int RecomputeNodes(const torch::Tensor& loss) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find("RecomputeFunction") != std::string::npos) ++n;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return n;
}

}  // namespace meshwork::testing
