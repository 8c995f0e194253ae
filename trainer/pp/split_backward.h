// Zero-bubble's backward in two halves over one autograd graph: I, the gradient of a stage's
// input alone, and W, its parameters' gradients alone, each computing only its own share.
//
// The graph is cut where the path from the stage's output to its input meets the parameters:
// the boundary nodes are those on that path (a matmul's backward, a norm's) with an edge into a
// part of the graph that reaches only parameters (the weight's transpose, its cast, its
// accumulator). I runs the backward to the input and keeps the gradients that flow into the
// boundary nodes; W starts the backward again at those nodes with those gradients, their edges
// towards the input removed first, so a matmul's backward then computes its weight's gradient
// and not its input's, and nothing below it runs twice. As torch.distributed.pipelining's
// stage_backward_input/_weight split, on the engine's edges (libtorch >= 1.13); removing the
// edges instead of restricting each parameter group's backward to its own parameters keeps a
// parameter used on both sides of a boundary (a shared weight) from being counted twice.
//
// A boundary node's backward runs twice, once in I and once in W, each time asked for some of
// its gradients only (needs_input_grad): it must compute only those to save the work, and must
// not accumulate anything itself. What cannot split computes in I: a node with no edge to the
// parameters whose backward still makes their gradients (activation checkpointing's recompute
// runs a whole backward of its block inside it) accumulates them there, and W has nothing left
// of it.
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <memory>
#include <utility>
#include <vector>

namespace meshwork::pp {

// What I leaves for W.
struct WeightBackward {
  torch::autograd::edge_list roots;        // where W starts (boundary nodes, their input slots)
  std::vector<torch::Tensor> grads;        // the gradient I captured at each root
  torch::autograd::edge_list parameters;   // where W ends: the parameters' gradient edges
  // The boundary nodes' edges towards the input (node, index in its next edges), removed by W.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, size_t>> cuts;
};

// I: the gradient of `input` (a leaf of output's graph that requires its gradient) for output's
// gradient `output_grad`, no parameter's gradient accumulated; *weight gets what W needs for
// `parameters`. The graph is kept for W.
torch::Tensor BackwardInput(const torch::Tensor& output, const torch::Tensor& output_grad, const torch::Tensor& input,
                            const std::vector<torch::Tensor>& parameters, WeightBackward* weight);

// W: accumulates the parameters' gradients (.grad()) from what I left, freeing the buffers of the
// graph it runs; the graph is spent (its boundary nodes lose their edges towards the input). `extra_root` (optional): one more tensor of the graph and its gradient to
// start from, e.g. the first stage's embedding output, cut off by the stage's input leaf.
void BackwardWeight(WeightBackward& weight, const torch::Tensor& extra_root = {}, const torch::Tensor& extra_grad = {});

}  // namespace meshwork::pp
