#include <algorithm>

#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {

Program PipeMare(const Shape& shape) {
  // 1F1B's order over the whole stream of micro-batches (its warm-up once, at the start, and its
  // cool-down once, at the end), each minibatch's update right after the stage's backward of its
  // last micro-batch.
  Program p = OneFOneB(shape);
  for (std::vector<Action>& list : p.ranks) {
    std::vector<Action> with_updates;
    for (const Action& a : list) {
      with_updates.push_back(a);
      if (a.kind == ActionKind::kBackward && (a.microbatch + 1) % shape.per_update == 0) {
        with_updates.push_back({ActionKind::kUpdate, a.microbatch / shape.per_update, a.stage});
      }
    }
    list = std::move(with_updates);
  }
  return p;
}

}  // namespace meshwork::compiler::pipeline
