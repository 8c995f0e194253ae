#include "trainer/compiler/pipeline/simulate.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <utility>

#include "trainer/compiler/pipeline/run.h"
#include "trainer/compiler/pipeline/steps.h"

namespace meshwork::compiler::pipeline {
namespace {

double TransferSeconds(const LinkCost& link, int64_t bytes) {
  return link.latency_seconds + static_cast<double>(bytes) / std::max(1.0, link.bus_bytes_per_second);
}

double ComputeSeconds(const StageCost& c, ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward: return c.forward_seconds;
    case ActionKind::kBackward: return c.backward_input_seconds + c.backward_weight_seconds;
    case ActionKind::kBackwardInput: return c.backward_input_seconds;
    case ActionKind::kBackwardWeight: return c.backward_weight_seconds;
    default: return 0;
  }
}

// Activation bytes an action adds to its rank's (negative: releases).
int64_t HeldDelta(const StageCost& c, ActionKind kind) {
  const int64_t w = std::clamp<int64_t>(c.weight_grad_bytes, 0, c.activation_bytes);
  switch (kind) {
    case ActionKind::kForward: return c.activation_bytes;
    case ActionKind::kBackward: return -c.activation_bytes;
    case ActionKind::kBackwardInput: return -(c.activation_bytes - w);
    case ActionKind::kBackwardWeight: return -w;
    default: return 0;
  }
}

Status CheckCosts(const Shape& s, const PipelineCost& cost) {
  if (static_cast<int>(cost.stages.size()) != s.stages()) {
    return InvalidConfig("pipeline costs: " + std::to_string(cost.stages.size()) + " stages' costs for " +
                         std::to_string(s.stages()) + " stages");
  }
  return Status::Ok();
}

PipelineCost EqualStages(int stages) {
  PipelineCost cost;
  cost.stages.assign(static_cast<size_t>(stages), StageCost{1.0, 1.0, 1.0, 0, 0, 0});
  cost.link.bus_bytes_per_second = 1e18;
  return cost;
}

// Prices a lowered program (or one step of an asynchronous one: `earlier_steps_ran`, RunInOrder).
Result<PipelineResult> Price(const Program& p, const PipelineCost& cost, bool earlier_steps_ran) {
  const Shape& s = p.shape;
  PipelineResult r;
  r.busy_seconds.assign(s.pp, 0);
  r.peak_bytes.assign(s.pp, 0);
  std::vector<double> clock(s.pp, 0);
  std::vector<int64_t> held(s.pp, 0);
  std::map<std::pair<int, int>, double> link_free;  // (from rank, to rank) -> when it is free
  if (earlier_steps_ran) {
    // Micro-batches an earlier step forwarded and this one takes backward hold their activations
    // from the start.
    for (int rank = 0; rank < s.pp; ++rank) {
      for (const Action& a : p.ranks[rank]) {
        if (a.kind != ActionKind::kBackward && a.kind != ActionKind::kBackwardInput) continue;
        bool forwarded_here = false;
        for (const Action& f : p.ranks[rank]) forwarded_here |= f.kind == ActionKind::kForward && f.microbatch == a.microbatch && f.stage == a.stage;
        if (!forwarded_here) held[rank] += cost.stages[a.stage].activation_bytes;
      }
      r.peak_bytes[rank] = held[rank];
    }
  }
  MW_RETURN_IF_ERROR(RunInOrder(p, [&](int rank, size_t index, double ready) {
    const Action& a = p.ranks[rank][index];
    const StageCost& c = cost.stages[a.stage];
    TimelineEntry e{rank, a, 0, 0};
    if (IsCompute(a.kind)) {
      e.start = std::max(clock[rank], ready);
      e.end = e.start + ComputeSeconds(c, a.kind);
      clock[rank] = e.end;
      r.busy_seconds[rank] += e.end - e.start;
      held[rank] += HeldDelta(c, a.kind);
      r.peak_bytes[rank] = std::max(r.peak_bytes[rank], held[rank]);
    } else if (a.kind == ActionKind::kUpdate || IsFsdp(a.kind)) {
      // The optimizer's time is not priced here, nor FSDP's collectives (OverlapFsdp prices them).
      e.start = e.end = clock[rank];
    } else if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGrad) {
      // An activation is this stage's output; a gradient is of this stage's input, the previous
      // stage's output.
      const bool forward = a.kind == ActionKind::kSendActivation;
      const int to = s.RankOf(forward ? a.stage + 1 : a.stage - 1);
      const int64_t bytes = forward ? c.output_bytes : cost.stages[a.stage - 1].output_bytes;
      double& free_at = link_free[{rank, to}];
      e.start = std::max({clock[rank], ready, free_at});
      e.end = e.start + TransferSeconds(cost.link, bytes);
      free_at = e.end;
    } else {  // a receive: the rank waits for the tensor
      e.start = clock[rank];
      e.end = std::max(clock[rank], ready);
      clock[rank] = e.end;
    }
    r.entries.push_back(e);
    return e.end;
  }, earlier_steps_ran));
  for (int rank = 0; rank < s.pp; ++rank) r.step_seconds = std::max(r.step_seconds, clock[rank]);
  double busy = 0;
  for (double b : r.busy_seconds) busy += b;
  r.bubble_fraction = r.step_seconds > 0 ? 1 - busy / (s.pp * r.step_seconds) : 0;
  return r;
}

}  // namespace

Result<PipelineResult> SimulatePipeline(const Program& in, const PipelineCost& cost) {
  MW_RETURN_IF_ERROR(Validate(in));
  MW_RETURN_IF_ERROR(CheckCosts(in.shape, cost));
  if (IsLowered(in)) return Price(in, cost, false);
  MW_ASSIGN_OR_RETURN(const Program lowered, Lower(in));
  return Price(lowered, cost, false);
}

Result<PipelineResult> SimulateStep(const Program& step, const PipelineCost& cost) {
  MW_RETURN_IF_ERROR(CheckCosts(step.shape, cost));
  return Price(step, cost, true);
}

Result<PipelineResult> SimulateEqualStages(const Program& p) { return SimulatePipeline(p, EqualStages(p.shape.stages())); }

Result<double> ScheduleBubble(const Program& p) {
  if (p.shape.per_update == 0) {
    MW_ASSIGN_OR_RETURN(const PipelineResult r, SimulateEqualStages(p));
    return r.bubble_fraction;
  }
  MW_RETURN_IF_ERROR(Validate(p));
  MW_ASSIGN_OR_RETURN(const AsyncSteps steps, SplitIntoSteps(p.shape));
  MW_ASSIGN_OR_RETURN(const PipelineResult r, SimulateStep(steps.steady, EqualStages(p.shape.stages())));
  return r.bubble_fraction;
}

std::string Timeline(const Program& p, const PipelineResult& r, int columns) {
  columns = std::max(1, columns);
  const Shape& s = p.shape;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "step %.4f s, bubble %.1f%%; peak held activations per rank (MiB):", r.step_seconds,
                100 * r.bubble_fraction);
  out += line;
  for (int64_t b : r.peak_bytes) {
    std::snprintf(line, sizeof line, " %.1f", static_cast<double>(b) / (1 << 20));
    out += line;
  }
  out += "\n";
  std::vector<std::string> rows(s.pp, std::string(columns, '.'));
  for (const TimelineEntry& e : r.entries) {
    if (!IsCompute(e.action.kind) || r.step_seconds <= 0) continue;
    const char* letters = "FBIW";
    char c = letters[static_cast<int>(e.action.kind)];
    if (e.action.stage / s.pp > 0) c = static_cast<char>(std::tolower(c));
    for (int col = 0; col < columns; ++col) {
      const double mid = (col + 0.5) * r.step_seconds / columns;
      if (mid >= e.start && mid < e.end) rows[e.rank][col] = c;
    }
  }
  for (int rank = 0; rank < s.pp; ++rank) out += "rank " + std::to_string(rank) + " |" + rows[rank] + "|\n";
  return out;
}

}  // namespace meshwork::compiler::pipeline
