#include <algorithm>

#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {

Program Interleaved1F1B(const Shape& shape) {
  Program p;
  p.shape = shape;
  p.ranks.resize(shape.pp);
  const int pp = shape.pp, v = shape.virtual_stages;
  const int total = shape.microbatches * v;  // (micro-batch, local stage) pairs a rank runs
  // The k-th forward of a rank: micro-batches in groups of pp, each group through the rank's
  // first stage, then its second, ... (Megatron's order); backwards go through the stages in
  // reverse.
  auto microbatch = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
  auto forward_chunk = [&](int k) { return (k / pp) % v; };
  auto backward_chunk = [&](int k) { return v - 1 - (k / pp) % v; };
  for (int r = 0; r < pp; ++r) {
    std::vector<Action>& list = p.ranks[r];
    auto forward = [&](int k) { list.push_back({ActionKind::kForward, microbatch(k), forward_chunk(k) * pp + r}); };
    auto backward = [&](int k) { list.push_back({ActionKind::kBackward, microbatch(k), backward_chunk(k) * pp + r}); };
    // Warm-up: the later ranks' share of the first group twice over (a micro-batch passes every
    // rank once per stage it holds), plus the other stages' groups.
    const int warmup = std::min((pp - 1 - r) * 2 + (v - 1) * pp, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int i = 0; i < total - warmup; ++i) {
      forward(warmup + i);
      backward(i);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return p;
}

}  // namespace meshwork::compiler::pipeline
