#include <string>

#include "trainer/compiler/pipeline/program.h"

namespace meshwork::compiler::pipeline {

Result<Program> PlaceFsdp(const Program& lowered, const std::vector<std::vector<FsdpUnit>>& units) {
  const Shape& s = lowered.shape;
  if (s.per_update > 0) {
    return InvalidInput("pipeline program: FSDP's ops are placed in synchronous programs only (per_update " +
                        std::to_string(s.per_update) + ")");
  }
  if (units.size() != lowered.ranks.size()) {
    return InvalidInput("pipeline program: FSDP units for " + std::to_string(units.size()) + " ranks, the program has " +
                        std::to_string(lowered.ranks.size()));
  }
  Program out;
  out.shape = s;
  out.ranks.resize(lowered.ranks.size());
  for (size_t r = 0; r < lowered.ranks.size(); ++r) {
    const std::vector<Action>& list = lowered.ranks[r];
    std::vector<Action>& placed = out.ranks[r];
    for (size_t u = 0; u < units[r].size(); ++u) {
      const int stage = units[r][u].stage;
      if (stage < 0 || stage >= s.stages() || s.RankOf(stage) != static_cast<int>(r)) {
        return InvalidInput("pipeline program: rank " + std::to_string(r) + "'s FSDP unit " + std::to_string(u) +
                            " is on stage " + std::to_string(stage) + ", which is not the rank's");
      }
      placed.push_back({ActionKind::kGather, static_cast<int>(u), stage});
    }
    // Per stage: the position of its last backward, and after it the end of that compute's
    // own sends (what the rs ops follow).
    std::vector<int> last_backward(static_cast<size_t>(s.stages()), -1);
    for (size_t i = 0; i < list.size(); ++i) {
      if (IsFsdp(list[i].kind)) {
        return InvalidInput("pipeline program: rank " + std::to_string(r) + " has FSDP's ops already (" +
                            ToString(list[i]) + ")");
      }
      if (IsBackward(list[i].kind)) last_backward[static_cast<size_t>(list[i].stage)] = static_cast<int>(i);
    }
    for (size_t i = 0; i < list.size(); ++i) {
      placed.push_back(list[i]);
      if (!IsCompute(list[i].kind)) continue;
      const int stage = list[i].stage;
      if (last_backward[static_cast<size_t>(stage)] != static_cast<int>(i)) continue;
      while (i + 1 < list.size() && list[i + 1].kind == ActionKind::kSendGrad && list[i + 1].stage == stage) {
        placed.push_back(list[++i]);
      }
      for (size_t u = units[r].size(); u-- > 0;) {
        if (units[r][u].stage == stage && units[r][u].reduced_in_program) {
          placed.push_back({ActionKind::kReduceScatter, static_cast<int>(u), stage});
        }
      }
    }
  }
  return out;
}

}  // namespace meshwork::compiler::pipeline
