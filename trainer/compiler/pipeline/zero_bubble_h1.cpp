#include <deque>
#include <map>
#include <string>
#include <tuple>

#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {

// A list scheduler in unit time steps (F, I and W one step each, transfers free), every rank
// choosing at each step, by priority: the oldest forwarded micro-batch's I once its gradient is
// there (the previous stage waits for it); else the next forward once its input is there, while
// fewer than pp - r micro-batches are forwarded and not through W (1F1B's memory: rank r holds
// pp - r micro-batches' activations); else the oldest pending W. On equal F, I and W times this is
// ZB-H1: the bubble is (pp - 1) x (F + I) where 1F1B's is (pp - 1) x (F + I + W), at 1F1B's peak.
Result<Program> ZeroBubbleH1(const Shape& shape) {
  const int pp = shape.pp, n = shape.microbatches;
  Program p;
  p.shape = shape;
  p.ranks.resize(pp);
  std::vector<int> next_forward(pp, 0);
  std::vector<std::deque<int>> awaiting_input(pp), awaiting_weight(pp);
  std::map<std::tuple<ActionKind, int, int>, int> finished_at;  // (kind, micro-batch, stage) -> step
  auto finished_by = [&](ActionKind kind, int m, int stage, int64_t step) {
    auto it = finished_at.find({kind, m, stage});
    return it != finished_at.end() && it->second <= step;
  };
  const size_t per_rank = 3 * static_cast<size_t>(n);
  // A rank waits at most for the ranks before it to fill the pipeline: 3n steps of its own and
  // pp of waiting would do; the bound (four times that) only guards against a bug looping forever.
  const int64_t bound = 4 * (3 * static_cast<int64_t>(n) + pp) + 16;
  for (int64_t step = 0; step < bound; ++step) {
    bool all_done = true;
    for (int r = 0; r < pp; ++r) all_done = all_done && p.ranks[r].size() == per_rank;
    if (all_done) break;
    std::vector<Action> chosen(pp);
    std::vector<bool> acts(pp, false);
    for (int r = 0; r < pp; ++r) {
      if (!awaiting_input[r].empty()) {
        const int m = awaiting_input[r].front();
        const bool gradient_here = r == pp - 1 ? finished_by(ActionKind::kForward, m, r, step)
                                               : finished_by(ActionKind::kBackwardInput, m, r + 1, step);
        if (gradient_here) {
          chosen[r] = {ActionKind::kBackwardInput, m, r};
          acts[r] = true;
          continue;
        }
      }
      const int held = static_cast<int>(awaiting_input[r].size() + awaiting_weight[r].size());
      if (next_forward[r] < n && held < pp - r) {
        const int m = next_forward[r];
        if (r == 0 || finished_by(ActionKind::kForward, m, r - 1, step)) {
          chosen[r] = {ActionKind::kForward, m, r};
          acts[r] = true;
          continue;
        }
      }
      if (!awaiting_weight[r].empty()) {
        chosen[r] = {ActionKind::kBackwardWeight, awaiting_weight[r].front(), r};
        acts[r] = true;
      }
    }
    for (int r = 0; r < pp; ++r) {
      if (!acts[r]) continue;
      const Action& a = chosen[r];
      p.ranks[r].push_back(a);
      finished_at[{a.kind, a.microbatch, a.stage}] = static_cast<int>(step + 1);
      if (a.kind == ActionKind::kForward) {
        ++next_forward[r];
        awaiting_input[r].push_back(a.microbatch);
      } else if (a.kind == ActionKind::kBackwardInput) {
        awaiting_input[r].pop_front();
        awaiting_weight[r].push_back(a.microbatch);
      } else {
        awaiting_weight[r].pop_front();
      }
    }
  }
  for (int r = 0; r < pp; ++r) {
    if (p.ranks[r].size() != per_rank) {
      return Internal("pipeline schedule zb-h1 stalled with pp " + std::to_string(pp) + " and " + std::to_string(n) +
                      " micro-batches: rank " + std::to_string(r) + " placed " + std::to_string(p.ranks[r].size()) +
                      " of its " + std::to_string(per_rank) + " actions");
    }
  }
  return p;
}

}  // namespace meshwork::compiler::pipeline
