#include "trainer/compiler/pipeline/steps.h"

#include <algorithm>
#include <map>
#include <string>

#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {
namespace {

// Where step k begins in one rank's lowered stream: the first action of the step's first
// micro-batch's forward (its receive, or the forward); the list's end where the stream has no
// such micro-batch.
size_t StepStart(const std::vector<Action>& list, int first_microbatch) {
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if ((a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kForward) && a.microbatch == first_microbatch) return i;
  }
  return list.size();
}

// Actions [begin, end) of every rank's list, renumbered from the step's first micro-batch and minibatch.
Program Slice(const Program& stream, const std::vector<size_t>& begin, const std::vector<size_t>& end, int step) {
  Program out;
  out.shape = stream.shape;
  out.shape.microbatches = stream.shape.per_update;
  out.ranks.resize(stream.ranks.size());
  for (size_t r = 0; r < stream.ranks.size(); ++r) {
    for (size_t i = begin[r]; i < end[r]; ++i) {
      Action a = stream.ranks[r][i];
      a.microbatch -= a.kind == ActionKind::kUpdate ? step : step * stream.shape.per_update;
      out.ranks[r].push_back(a);
    }
  }
  return out;
}

}  // namespace

const Program& AsyncSteps::Step(int64_t since_start) const {
  return since_start < static_cast<int64_t>(filling.size()) ? filling[static_cast<size_t>(since_start)] : steady;
}

const Program& AsyncSteps::Drain(int64_t since_start) const {
  return drains[static_cast<size_t>(std::min<int64_t>(since_start, static_cast<int64_t>(filling.size())))];
}

int FillingSteps(const Shape& shape) { return (shape.pp - 1 + shape.per_update - 1) / std::max(1, shape.per_update); }

Result<AsyncSteps> SplitIntoSteps(const Shape& shape) {
  const std::string what = "pipemare with pp " + std::to_string(shape.pp) + " and " + std::to_string(shape.per_update) +
                           " micro-batches a minibatch: ";
  if (shape.pp < 1 || shape.per_update < 1 || shape.virtual_stages != 1) {
    return InvalidConfig(what + "needs pp >= 1, one virtual stage and minibatches of >= 1 micro-batches");
  }
  const int n = shape.per_update;
  const int fill = FillingSteps(shape);
  // A stream of `minibatches`, lowered and validated.
  auto stream = [&](int minibatches) -> Result<Program> {
    Shape s = shape;
    s.microbatches = minibatches * n;
    MW_ASSIGN_OR_RETURN(Program compute, Generate(ScheduleKind::kPipeMare, s));
    MW_ASSIGN_OR_RETURN(Program lowered, Lower(compute));
    if (Status valid = Validate(lowered); !valid.ok()) return Internal("the pipemare stream does not validate: " + valid.message());
    return lowered;
  };
  AsyncSteps out;
  // Steps 0 .. fill are slices of a stream long enough for each to be followed by another step.
  MW_ASSIGN_OR_RETURN(const Program longest, stream(fill + 2));
  const size_t ranks = static_cast<size_t>(shape.pp);
  std::vector<std::vector<size_t>> starts(static_cast<size_t>(fill + 2), std::vector<size_t>(ranks));
  for (int k = 0; k < fill + 2; ++k)
    for (size_t r = 0; r < ranks; ++r) starts[k][r] = StepStart(longest.ranks[r], k * n);
  for (int k = 0; k < fill; ++k) out.filling.push_back(Slice(longest, starts[k], starts[k + 1], k));
  out.steady = Slice(longest, starts[fill], starts[fill + 1], fill);
  // A stream that ends after step k begins as the longer one does; the rest of it, past step k's
  // slice, is the drain.
  for (int k = 0; k <= fill; ++k) {
    MW_ASSIGN_OR_RETURN(const Program ending, stream(k + 1));
    std::vector<size_t> begin(ranks), end(ranks);
    for (size_t r = 0; r < ranks; ++r) {
      begin[r] = starts[k + 1][r] - starts[0][r];
      end[r] = ending.ranks[r].size();
      for (size_t i = 0; i < begin[r]; ++i) {
        if (!(ending.ranks[r][i] == longest.ranks[r][i])) {
          return Internal("pipemare: the stream ending after step " + std::to_string(k) + " does not begin as the longer one");
        }
      }
    }
    out.drains.push_back(Slice(ending, begin, end, k + 1));
  }
  // The delays, counted in the long stream: updates between each forward and its backward.
  out.max_delay.assign(static_cast<size_t>(shape.stages()), 0);
  for (size_t r = 0; r < ranks; ++r) {
    std::map<int, int> at_forward;
    int updates = 0;
    for (const Action& a : longest.ranks[r]) {
      if (a.kind == ActionKind::kUpdate) ++updates;
      if (a.kind == ActionKind::kForward) at_forward[a.microbatch] = updates;
      if (a.kind == ActionKind::kBackward) {
        int& d = out.max_delay[static_cast<size_t>(a.stage)];
        d = std::max(d, updates - at_forward[a.microbatch]);
      }
    }
  }
  return out;
}

}  // namespace meshwork::compiler::pipeline
