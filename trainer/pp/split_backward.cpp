#include "trainer/pp/split_backward.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace meshwork::pp {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;

// A tensor's gradient edge as backward(inputs=...) takes it: its grad_fn, else a leaf's
// accumulator (none: the graph does not use it).
Edge TargetEdge(const torch::Tensor& t) {
  std::shared_ptr<Node> fn = t.grad_fn();
  if (!fn) fn = torch::autograd::impl::try_get_grad_accumulator(t);
  const uint32_t input_nr = fn ? t.output_nr() : 0;
  return Edge(std::move(fn), input_nr);
}

// Per node of the graph under `root`: whether the stage's input lies below it, whether a
// parameter does. Iterative: a stage's graph has thousands of nodes and a deep chain.
struct Reach {
  bool input = false;
  bool parameter = false;
};

std::unordered_map<Node*, Reach> ReachBelow(const std::shared_ptr<Node>& root, const Node* input,
                                            const std::unordered_set<const Node*>& parameters) {
  std::unordered_map<Node*, Reach> reach;
  std::vector<std::pair<Node*, size_t>> stack;  // node, next edge to look at
  std::unordered_set<Node*> entered;
  stack.emplace_back(root.get(), 0);
  entered.insert(root.get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    const auto& edges = node->next_edges();
    if (next < edges.size()) {
      Node* child = edges[next++].function.get();
      if (child != nullptr && entered.insert(child).second) stack.emplace_back(child, 0);
      continue;
    }
    Reach r;
    r.input = node == input;
    r.parameter = parameters.count(node) > 0;
    for (const Edge& e : edges) {
      if (!e.function) continue;
      const Reach& c = reach[e.function.get()];
      r.input = r.input || c.input;
      r.parameter = r.parameter || c.parameter;
    }
    reach[node] = r;
    stack.pop_back();
  }
  return reach;
}

}  // namespace

torch::Tensor BackwardInput(const torch::Tensor& output, const torch::Tensor& output_grad, const torch::Tensor& input,
                            const std::vector<torch::Tensor>& parameters, WeightBackward* weight) {
  TORCH_CHECK(output.grad_fn() != nullptr, "BackwardInput: the output has no graph");
  TORCH_CHECK(input.requires_grad() && input.is_leaf(), "BackwardInput: the input must be a leaf that requires grad");
  *weight = WeightBackward();
  std::unordered_set<const Node*> parameter_nodes;
  for (const torch::Tensor& p : parameters) {
    Edge e = TargetEdge(p);
    if (!e.function) continue;
    if (!p.is_leaf()) p.retain_grad();  // as backward(inputs=...) does: its .grad() is the result
    parameter_nodes.insert(e.function.get());
    weight->parameters.push_back(std::move(e));
  }
  const Edge input_edge = torch::autograd::impl::gradient_edge(input);
  const auto reach = ReachBelow(output.grad_fn(), input_edge.function.get(), parameter_nodes);

  // The boundary: nodes on the way to the input with an edge into what reaches parameters only.
  // Each of their input slots is captured (a node has one per output of its forward).
  edge_list captures{input_edge};
  auto visit = [&](const std::shared_ptr<Node>& node) {
    const Reach& r = reach.at(node.get());
    if (!r.input || !r.parameter) return;
    const edge_list& edges = node->next_edges();
    bool boundary = false;
    for (const Edge& e : edges) {
      boundary = boundary || (e.function && !reach.at(e.function.get()).input && reach.at(e.function.get()).parameter);
    }
    if (!boundary) return;
    for (uint32_t slot = 0; slot < node->num_inputs(); ++slot) {
      captures.emplace_back(node, slot);
      weight->roots.emplace_back(node, slot);
    }
    for (size_t i = 0; i < edges.size(); ++i) {
      if (edges[i].function && reach.at(edges[i].function.get()).input) weight->cuts.emplace_back(node, i);
    }
  };
  // Every node once, with its shared pointer (the edges hold them).
  std::unordered_set<Node*> seen{output.grad_fn().get()};
  std::vector<std::shared_ptr<Node>> todo{output.grad_fn()};
  while (!todo.empty()) {
    std::shared_ptr<Node> node = std::move(todo.back());
    todo.pop_back();
    visit(node);
    for (const Edge& e : node->next_edges()) {
      if (e.function && seen.insert(e.function.get()).second) todo.push_back(e.function);
    }
  }

  auto got = torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::impl::gradient_edge(output)}, {output_grad}, /*keep_graph=*/true, /*create_graph=*/false,
      /*accumulate_grad=*/false, captures);
  // A slot no gradient reached (an output of the node the stage did not use) starts nothing.
  edge_list roots;
  for (size_t i = 0; i < weight->roots.size(); ++i) {
    if (!got[i + 1].defined()) continue;
    roots.push_back(weight->roots[i]);
    weight->grads.push_back(got[i + 1]);
  }
  weight->roots = std::move(roots);
  return got[0];
}

void BackwardWeight(WeightBackward& weight, const torch::Tensor& extra_root, const torch::Tensor& extra_grad) {
  edge_list roots = std::move(weight.roots);
  std::vector<torch::Tensor> grads = std::move(weight.grads);
  if (extra_root.defined() && extra_root.grad_fn() != nullptr && extra_grad.defined()) {
    roots.push_back(torch::autograd::impl::gradient_edge(extra_root));
    grads.push_back(extra_grad);
  }
  for (auto& [node, index] : weight.cuts) node->next_edges()[index] = Edge();
  if (!roots.empty() && !weight.parameters.empty()) {
    torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                                          /*create_graph=*/false, /*accumulate_grad=*/true,
                                                          weight.parameters);
  }
  weight = WeightBackward();
}

}  // namespace meshwork::pp
