#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/pipeline/run.h"

namespace meshwork::compiler::pipeline {

Result<Program> Lower(const Program& compute_only) {
  if (IsLowered(compute_only)) return InvalidInput("pipeline program: Lower takes a program without transfers");
  const Shape& s = compute_only.shape;
  const int last = s.stages() - 1;
  Program out;
  out.shape = s;
  out.ranks.resize(compute_only.ranks.size());
  for (size_t r = 0; r < compute_only.ranks.size(); ++r) {
    std::vector<Action>& list = out.ranks[r];
    for (const Action& a : compute_only.ranks[r]) {
      const int m = a.microbatch, st = a.stage;
      // Neighbours on another rank exchange tensors; on this rank they stay in memory.
      const bool prev_elsewhere = st > 0 && s.RankOf(st - 1) != s.RankOf(st);
      const bool next_elsewhere = st < last && s.RankOf(st + 1) != s.RankOf(st);
      switch (a.kind) {
        case ActionKind::kForward:
          if (prev_elsewhere) list.push_back({ActionKind::kRecvActivation, m, st});
          list.push_back(a);
          if (next_elsewhere) list.push_back({ActionKind::kSendActivation, m, st});
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          if (next_elsewhere) list.push_back({ActionKind::kRecvGrad, m, st});
          list.push_back(a);
          if (prev_elsewhere) list.push_back({ActionKind::kSendGrad, m, st});
          break;
        default: list.push_back(a); break;
      }
    }
  }
  return out;
}

}  // namespace meshwork::compiler::pipeline
