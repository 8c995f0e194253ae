#include <map>
#include <string>
#include <tuple>

#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/pipeline/run.h"

namespace meshwork::compiler::pipeline {
namespace {

// FSDP's ops on each rank (the ranges and duplicates are checked with the other actions): a unit
// belongs to one stage; its rs needs its ag; its ag comes before every compute of its stage, its
// rs after every backward of it.
Status ValidateFsdp(const Program& p) {
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    struct UnitAt {
      int stage = -1;
      int gathered_at = -1, reduced_at = -1;  // positions in the rank's list
    };
    std::map<int, UnitAt> units;
    const std::vector<Action>& list = p.ranks[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (!IsFsdp(a.kind)) continue;
      UnitAt& u = units[a.microbatch];
      const std::string what = "pipeline program: rank " + std::to_string(r) + "'s " + ToString(a);
      if (u.stage >= 0 && u.stage != a.stage) {
        return InvalidInput(what + ": unit " + std::to_string(a.microbatch) + " is stage " + std::to_string(u.stage) +
                            "'s elsewhere on the rank");
      }
      u.stage = a.stage;
      (a.kind == ActionKind::kGather ? u.gathered_at : u.reduced_at) = static_cast<int>(i);
    }
    for (const auto& [unit, u] : units) {
      const std::string which = std::to_string(unit) + "@" + std::to_string(u.stage);
      const std::string where = "pipeline program: rank " + std::to_string(r) + "'s unit " + std::to_string(unit);
      if (u.reduced_at >= 0 && u.gathered_at < 0) {
        return InvalidInput(where + " is reduce-scattered (rs" + which + ") but never gathered (no ag" + which + ")");
      }
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        if (a.stage != u.stage || !IsCompute(a.kind)) continue;
        const int at = static_cast<int>(i);
        if (u.gathered_at > at) {
          return InvalidInput(where + ": ag" + which + " comes after " + ToString(a) + ", which uses it");
        }
        if (u.reduced_at >= 0 && IsBackward(a.kind) && u.reduced_at < at) {
          return InvalidInput(where + ": rs" + which + " comes before " + ToString(a) +
                              ", which still adds to its gradients");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status Validate(const Program& p) {
  const Shape& s = p.shape;
  if (s.pp < 1 || s.virtual_stages < 1 || s.microbatches < 1) {
    return InvalidInput("pipeline program: pp " + std::to_string(s.pp) + ", virtual stages " +
                        std::to_string(s.virtual_stages) + " and micro-batches " + std::to_string(s.microbatches) +
                        " must each be >= 1");
  }
  if (static_cast<int>(p.ranks.size()) != s.pp) {
    return InvalidInput("pipeline program: " + std::to_string(p.ranks.size()) + " ranks' action lists for pp " +
                        std::to_string(s.pp));
  }
  if (s.per_update < 0 || (s.per_update > 0 && s.microbatches % s.per_update != 0)) {
    return InvalidInput("pipeline program: per_update " + std::to_string(s.per_update) + " must be >= 0 and divide the " +
                        std::to_string(s.microbatches) + " micro-batches");
  }
  const int last = s.stages() - 1;
  const bool lowered = IsLowered(p);
  const int minibatches = s.per_update > 0 ? s.microbatches / s.per_update : 0;
  std::map<std::tuple<ActionKind, int, int>, int> count;
  for (int r = 0; r < s.pp; ++r) {
    for (const Action& a : p.ranks[r]) {
      const std::string what = "pipeline program: rank " + std::to_string(r) + "'s " + ToString(a);
      if (IsFsdp(a.kind)) {
        if (s.per_update > 0) return InvalidInput(what + ": FSDP's ops in an asynchronous program (per_update)");
        if (a.microbatch < 0) return InvalidInput(what + ": unit out of range");
      } else if (a.kind == ActionKind::kUpdate) {
        if (s.per_update == 0) return InvalidInput(what + ": an update in a synchronous program (no per_update)");
        if (a.microbatch < 0 || a.microbatch >= minibatches)
          return InvalidInput(what + ": minibatch out of range (" + std::to_string(minibatches) + " minibatches)");
      } else if (a.microbatch < 0 || a.microbatch >= s.microbatches)
        return InvalidInput(what + ": micro-batch out of range (" + std::to_string(s.microbatches) + " micro-batches)");
      if (a.stage < 0 || a.stage > last)
        return InvalidInput(what + ": stage out of range (" + std::to_string(s.stages()) + " stages)");
      if (s.RankOf(a.stage) != r)
        return InvalidInput(what + ": stage " + std::to_string(a.stage) + " is on rank " + std::to_string(s.RankOf(a.stage)));
      // A transfer names its own stage's end that crosses to another rank.
      const bool to_prev = a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kSendGrad;
      const bool to_next = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad;
      if (to_prev && (a.stage == 0 || s.RankOf(a.stage - 1) == r))
        return InvalidInput(what + ": no stage on another rank before stage " + std::to_string(a.stage));
      if (to_next && (a.stage == last || s.RankOf(a.stage + 1) == r))
        return InvalidInput(what + ": no stage on another rank after stage " + std::to_string(a.stage));
      if (++count[{a.kind, a.microbatch, a.stage}] > 1) return InvalidInput(what + " appears twice");
    }
  }
  auto n = [&](ActionKind k, int m, int st) {
    auto it = count.find({k, m, st});
    return it == count.end() ? 0 : it->second;
  };
  for (int m = 0; m < s.microbatches; ++m) {
    for (int st = 0; st <= last; ++st) {
      const std::string which = std::to_string(m) + "@" + std::to_string(st);
      const std::string where = "pipeline program: micro-batch " + std::to_string(m) + " on stage " +
                                std::to_string(st) + " (rank " + std::to_string(s.RankOf(st)) + ")";
      if (n(ActionKind::kForward, m, st) != 1) return InvalidInput(where + " has no forward F" + which);
      const int b = n(ActionKind::kBackward, m, st), i = n(ActionKind::kBackwardInput, m, st),
                w = n(ActionKind::kBackwardWeight, m, st);
      if (!((b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1))) {
        return InvalidInput(where + " needs one backward B" + which + ", or one I" + which + " and one W" + which +
                            " (has " + std::to_string(b) + " B, " + std::to_string(i) + " I, " + std::to_string(w) + " W)");
      }
      if (!lowered || st == last || s.RankOf(st + 1) == s.RankOf(st)) continue;
      // The boundary to the next stage, on another rank: both directions, both ends.
      const std::string next = std::to_string(m) + "@" + std::to_string(st + 1);
      if (n(ActionKind::kSendActivation, m, st) != 1) return InvalidInput(where + " does not send its activation (sa" + which + ")");
      if (n(ActionKind::kRecvActivation, m, st + 1) != 1) return InvalidInput(where + "'s activation is not received (ra" + next + ")");
      if (n(ActionKind::kSendGrad, m, st + 1) != 1) return InvalidInput(where + "'s output gradient is not sent (sg" + next + ")");
      if (n(ActionKind::kRecvGrad, m, st) != 1) return InvalidInput(where + " does not receive its output's gradient (rg" + which + ")");
    }
  }
  for (int k = 0; k < minibatches; ++k) {
    for (int st = 0; st <= last; ++st) {
      if (n(ActionKind::kUpdate, k, st) != 1) {
        return InvalidInput("pipeline program: stage " + std::to_string(st) + " (rank " + std::to_string(s.RankOf(st)) +
                            ") has no update U" + std::to_string(k) + "@" + std::to_string(st));
      }
    }
  }
  MW_RETURN_IF_ERROR(ValidateFsdp(p));
  if (minibatches > 0) {
    // On each stage, minibatch k's backwards all come before its update, and a later minibatch's
    // after it: a gradient is never stepped twice, nor mixed into another minibatch's update.
    for (int r = 0; r < s.pp; ++r) {
      std::map<int, int> updated;  // stage -> updates so far on this rank
      for (const Action& a : p.ranks[r]) {
        const bool backward = IsBackward(a.kind);
        const std::string what = "pipeline program: rank " + std::to_string(r) + "'s " + ToString(a);
        if (a.kind == ActionKind::kUpdate) {
          if (a.microbatch != updated[a.stage]) {
            return InvalidInput(what + " comes where stage " + std::to_string(a.stage) + "'s update U" +
                                std::to_string(updated[a.stage]) + " is due");
          }
          ++updated[a.stage];
        } else if (backward && a.microbatch / s.per_update != updated[a.stage]) {
          return InvalidInput(what + " runs " + (a.microbatch / s.per_update < updated[a.stage] ? "after" : "before") +
                              " the update of minibatch " + std::to_string(a.microbatch / s.per_update) +
                              ", which its gradient belongs to");
        }
      }
    }
  }
  return RunInOrder(p, [](int, size_t, double) { return 0.0; });
}

}  // namespace meshwork::compiler::pipeline
