#include "trainer/compiler/pipeline/run.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>

namespace meshwork::compiler::pipeline {
namespace {

// What a finished action makes available, keyed as dependencies name it.
using Key = std::tuple<ActionKind, int, int>;  // kind, micro-batch, stage

std::vector<Key> Provides(const Action& a) {
  switch (a.kind) {
    case ActionKind::kBackward:  // the input's gradient and the weights' both
      return {{ActionKind::kBackward, a.microbatch, a.stage}, {ActionKind::kBackwardWeight, a.microbatch, a.stage}};
    case ActionKind::kBackwardInput:  // the input's gradient, and itself (what a W waits for)
      return {{ActionKind::kBackward, a.microbatch, a.stage}, {ActionKind::kBackwardInput, a.microbatch, a.stage}};
    default: return {{a.kind, a.microbatch, a.stage}};
  }
}

std::string Describe(const Dependency& d) {
  const char* prefix = d.kind == ActionKind::kBackward ? "B/I" : nullptr;
  Action a{d.kind, d.microbatch, d.stage};
  return (prefix ? std::string(prefix) + std::to_string(d.microbatch) + "@" + std::to_string(d.stage) : ToString(a)) +
         " on rank " + std::to_string(d.rank);
}

}  // namespace

bool IsLowered(const Program& p) {
  for (const auto& rank : p.ranks)
    for (const Action& a : rank)
      if (IsTransfer(a.kind)) return true;
  return false;
}

std::vector<Dependency> DependenciesOf(const Program& p, bool lowered, int rank, const Action& a) {
  const Shape& s = p.shape;
  const int m = a.microbatch, st = a.stage, last = s.stages() - 1;
  std::vector<Dependency> deps;
  switch (a.kind) {
    case ActionKind::kForward:
      if (st > 0) {
        if (s.RankOf(st - 1) == rank) deps.push_back({ActionKind::kForward, m, st - 1, rank});
        else if (lowered) deps.push_back({ActionKind::kRecvActivation, m, st, rank});
        else deps.push_back({ActionKind::kForward, m, st - 1, s.RankOf(st - 1)});
      }
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      deps.push_back({ActionKind::kForward, m, st, rank});
      if (st < last) {
        if (s.RankOf(st + 1) == rank) deps.push_back({ActionKind::kBackward, m, st + 1, rank});
        else if (lowered) deps.push_back({ActionKind::kRecvGrad, m, st, rank});
        else deps.push_back({ActionKind::kBackward, m, st + 1, s.RankOf(st + 1)});
      }
      break;
    case ActionKind::kBackwardWeight: deps.push_back({ActionKind::kBackwardInput, m, st, rank}); break;
    case ActionKind::kSendActivation: deps.push_back({ActionKind::kForward, m, st, rank}); break;
    case ActionKind::kRecvActivation: deps.push_back({ActionKind::kSendActivation, m, st - 1, s.RankOf(st - 1)}); break;
    case ActionKind::kSendGrad: deps.push_back({ActionKind::kBackward, m, st, rank}); break;
    case ActionKind::kRecvGrad: deps.push_back({ActionKind::kSendGrad, m, st + 1, s.RankOf(st + 1)}); break;
    case ActionKind::kUpdate: break;  // its place among its rank's backwards is Validate's to check
    case ActionKind::kGather:         // FSDP's collectives run on another group, and their places
    case ActionKind::kReduceScatter:  // among the rank's computes are Validate's to check
      break;
  }
  return deps;
}

Status RunInOrder(const Program& p, const std::function<double(int rank, size_t index, double ready)>& step,
                  bool earlier_steps_ran) {
  const bool lowered = IsLowered(p);
  const int ranks = static_cast<int>(p.ranks.size());
  std::map<Key, double> done_at;
  if (earlier_steps_ran) {
    // What a dependency names that no action here provides ran in an earlier step: done at 0.
    std::set<Key> here;
    for (const auto& list : p.ranks)
      for (const Action& a : list)
        for (const Key& k : Provides(a)) here.insert(k);
    for (int r = 0; r < ranks; ++r)
      for (const Action& a : p.ranks[r])
        for (const Dependency& d : DependenciesOf(p, lowered, r, a))
          if (!here.count({d.kind, d.microbatch, d.stage})) done_at[{d.kind, d.microbatch, d.stage}] = 0;
  }
  std::vector<size_t> pos(ranks, 0);
  auto done = [&](const Dependency& d) -> const double* {
    auto it = done_at.find({d.kind, d.microbatch, d.stage});
    return it == done_at.end() ? nullptr : &it->second;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      while (pos[r] < p.ranks[r].size()) {
        const Action& a = p.ranks[r][pos[r]];
        double ready = 0;
        bool blocked = false;
        for (const Dependency& d : DependenciesOf(p, lowered, r, a)) {
          if (const double* finished = done(d)) {
            ready = std::max(ready, *finished);
            continue;
          }
          if (d.rank == r) {
            return InvalidInput("pipeline program: rank " + std::to_string(r) + "'s " + ToString(a) + " needs " +
                                Describe(d) + ", which does not come before it on that rank");
          }
          blocked = true;
          break;
        }
        if (blocked) break;
        const double finish = step(r, pos[r], ready);
        for (const Key& k : Provides(a)) done_at[k] = finish;
        ++pos[r];
        progress = true;
      }
    }
  }
  std::string waits;
  for (int r = 0; r < ranks; ++r) {
    if (pos[r] >= p.ranks[r].size()) continue;
    const Action& a = p.ranks[r][pos[r]];
    waits += "; rank " + std::to_string(r) + "'s " + ToString(a) + " waits for";
    for (const Dependency& d : DependenciesOf(p, lowered, r, a))
      if (done(d) == nullptr) waits += " " + Describe(d);
  }
  if (!waits.empty()) return InvalidInput("pipeline program deadlocks" + waits);
  return Status::Ok();
}

}  // namespace meshwork::compiler::pipeline
