#include <algorithm>

#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {

Program OneFOneB(const Shape& shape) {
  Program p;
  p.shape = shape;
  p.ranks.resize(shape.pp);
  const int n = shape.microbatches;
  for (int r = 0; r < shape.pp; ++r) {
    std::vector<Action>& list = p.ranks[r];
    // Warm-up: as many forwards ahead as stages after this one, so that the first backward's
    // gradient arrives as the pipeline fills.
    const int warmup = std::min(shape.pp - 1 - r, n);
    for (int m = 0; m < warmup; ++m) list.push_back({ActionKind::kForward, m, r});
    // Steady state: one forward, then the oldest micro-batch's backward.
    for (int i = 0; i < n - warmup; ++i) {
      list.push_back({ActionKind::kForward, warmup + i, r});
      list.push_back({ActionKind::kBackward, i, r});
    }
    // Cool-down: the backwards of the micro-batches still in flight.
    for (int m = n - warmup; m < n; ++m) list.push_back({ActionKind::kBackward, m, r});
  }
  return p;
}

}  // namespace meshwork::compiler::pipeline
