#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {

Program GPipe(const Shape& shape) {
  Program p;
  p.shape = shape;
  p.ranks.resize(shape.pp);
  for (int r = 0; r < shape.pp; ++r) {
    for (int m = 0; m < shape.microbatches; ++m) p.ranks[r].push_back({ActionKind::kForward, m, r});
    for (int m = 0; m < shape.microbatches; ++m) p.ranks[r].push_back({ActionKind::kBackward, m, r});
  }
  return p;
}

}  // namespace meshwork::compiler::pipeline
