#include "trainer/compiler/planner.h"

#include "common/units.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/passes/registry.h"
#include "trainer/compiler/simulator.h"

#include <algorithm>
#include <map>
#include <array>
#include <cmath>
#include <set>
#include <sstream>

namespace meshwork::compiler {

Graph ScaleCompute(Graph skeleton, double scale) {
  const std::vector<double> every(skeleton.modules.size(), scale);
  return ScaleCompute(std::move(skeleton), ModuleScales{every, every});
}

double ModuleScales::Mean() const {
  double sum = 0;
  for (double f : fwd) sum += f;
  for (double b : bwd) sum += b;
  return fwd.empty() && bwd.empty() ? 1.0 : sum / static_cast<double>(fwd.size() + bwd.size());
}

Graph ScaleCompute(Graph skeleton, const ModuleScales& scales) {
  for (size_t m = 0; m < skeleton.modules.size(); ++m) {
    if (m < scales.fwd.size()) skeleton.modules[m].fwd_seconds *= scales.fwd[m];
    if (m < scales.bwd.size()) skeleton.modules[m].bwd_seconds *= scales.bwd[m];
  }
  return skeleton;
}

ModuleScales UnslowTracedCompute(const Graph& measured, const CostModel& cost, const PlanOptions& options) {
  const size_t n = measured.modules.size();
  ModuleScales scales{std::vector<double>(n, 1.0), std::vector<double>(n, 1.0)};
  if (!(cost.interference > 0)) return scales;
  const double lowest = 1.0 / (1.0 + cost.interference * kNumLanes);
  PassContext ctx;
  ctx.cost = cost;
  for (int round = 0; round < 30; ++round) {
    const Graph scaled = ScaleCompute(measured, scales);
    auto eager = EagerPlan(BuildNaiveProgram(scaled, {options.reshard_after_forward}), ctx);
    if (!eager.ok()) return scales;
    const SimResult sim = Simulate(*eager, cost);
    // Each module's simulated time per phase, averaged over its compute ops (micro-batches).
    std::vector<std::array<double, 2>> took(n, {0, 0});
    std::vector<std::array<int, 2>> ops(n, {0, 0});
    for (size_t i = 0; i < eager->ops.size(); ++i) {
      const Op& op = eager->ops[i];
      if (op.kind != OpKind::kCompute || op.module < 0) continue;
      const int phase = op.phase == Phase::kForward ? 0 : 1;
      took[op.module][phase] += sim.ops[i].end - sim.ops[i].start;
      ++ops[op.module][phase];
    }
    double worst = 0;
    for (size_t m = 0; m < n; ++m) {
      for (int phase = 0; phase < 2; ++phase) {
        const double traced = phase == 0 ? measured.modules[m].fwd_seconds : measured.modules[m].bwd_seconds;
        if (!(traced > 0) || ops[m][phase] == 0) continue;
        const double simulated = took[m][phase] / ops[m][phase];
        if (!(simulated > 0)) continue;
        double& f = phase == 0 ? scales.fwd[m] : scales.bwd[m];
        worst = std::max(worst, std::abs(traced / simulated - 1));
        f = std::clamp(f * traced / simulated, lowest, 1.0);
      }
    }
    if (worst < 1e-3) break;
  }
  return scales;
}

namespace {

// The scale in [kMinComputeScale, kMaxComputeScale] at which `simulated(scale)`, which grows
// with the scale, equals `measured` (bisection on a log scale); 1 when nothing was measured.
template <typename F>
double FitScale(F&& simulated, double measured) {
  if (!(measured > 0)) return 1.0;
  double lo = kMinComputeScale, hi = kMaxComputeScale;
  if (simulated(lo) >= measured) return lo;
  if (simulated(hi) <= measured) return hi;
  for (int i = 0; i < 40; ++i) {
    const double mid = std::sqrt(lo * hi);
    (simulated(mid) < measured ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

}  // namespace

double FitComputeScale(const Graph& skeleton, const CostModel& cost, const PlanOptions& options,
                       double measured_step_seconds) {
  if (!(measured_step_seconds > 0)) return 1.0;
  const Graph naive = BuildNaiveProgram(skeleton, {options.reshard_after_forward});
  PassContext ctx;
  ctx.cost = cost;
  return FitScale(
      [&](double scale) {
        auto eager = EagerPlan(ScaleCompute(naive, scale), ctx);
        return eager.ok() ? Simulate(*eager, cost).step_seconds : 0.0;
      },
      measured_step_seconds);
}

double FitPlanComputeScale(const Graph& plan, const CostModel& cost, double measured_step_seconds) {
  return FitScale([&](double scale) { return Simulate(ScaleCompute(plan, scale), cost).step_seconds; },
                  measured_step_seconds);
}

Result<StepPlans> PlanStep(const Graph& skeleton, const CostModel& cost, const PlanOptions& options,
                           std::ostream* dump) {
  StepPlans out;
  out.ctx.cost = cost;
  const Pipeline pipeline = Pipeline::For(options);
  out.passes = pipeline.Describe();
  const Graph naive = BuildNaiveProgram(skeleton, {options.reshard_after_forward});
  MW_ASSIGN_OR_RETURN(out.eager, EagerPlan(naive, out.ctx));
  switch (options.budget.source) {
    case MemoryBudget::Source::kEagerPeak:
      out.ctx.memory_budget_bytes = PeakBytes(out.eager);
      break;
    case MemoryBudget::Source::kFixed:
      out.ctx.memory_budget_bytes = options.budget.bytes;
      break;
    case MemoryBudget::Source::kDeviceMemory:
      out.ctx.memory_budget_bytes = options.budget.bytes - StaticBytes(skeleton);
      if (out.ctx.memory_budget_bytes <= 0) {
        // The shards alone overflow the device: no plan fits, and planning for the least memory
        // would only slow the step. Plan within the eager plan's peak and say so.
        out.ctx.memory_budget_bytes = PeakBytes(out.eager);
        out.static_exceeds_device = true;
      }
      break;
  }
  std::vector<std::string> chosen_by_passes;
  MW_ASSIGN_OR_RETURN(out.compiled, pipeline.Run(naive, out.ctx, dump, &chosen_by_passes));
  out.choices = DescribeChoices(skeleton, out.compiled, out.ctx.memory_budget_bytes);
  out.choices.insert(out.choices.end(), chosen_by_passes.begin(), chosen_by_passes.end());
  if (out.static_exceeds_device) {
    out.choices.insert(out.choices.begin(), "the static state alone exceeds the device's memory: no plan fits; "
                                            "planned within the eager plan's peak");
  }
  return out;
}

std::vector<std::string> DescribeChoices(const Graph& skeleton, const Graph& plan, int64_t budget_bytes) {
  std::vector<std::string> out;
  // Activation checkpointing: which candidates the plan checkpointed, and the memory it saved.
  int candidates = 0;
  std::vector<std::string> chosen;
  for (size_t m = 0; m < skeleton.modules.size() && m < plan.modules.size(); ++m) {
    const bool candidate = skeleton.modules[m].checkpoint_input_bytes > 0;
    candidates += candidate ? 1 : 0;
    if (candidate && IsCheckpointed(plan.modules[m])) chosen.push_back(plan.modules[m].name);
  }
  if (candidates > 0) {
    std::ostringstream s;
    s << "activation checkpointing on " << chosen.size() << " of " << candidates << " candidate modules";
    if (!chosen.empty()) {
      s << " (" << chosen.front() << (chosen.size() > 1 ? " .. " + chosen.back() : "") << ")";
      const Graph least = BuildNaiveProgram(skeleton, {});
      s << ": the least-memory order without it holds " << HumanBytes(PeakBytes(least)) << " of dynamic memory, over the "
        << HumanBytes(budget_bytes) << " budget";
    } else {
      s << ": the budget holds every layer's activations";
    }
    out.push_back(s.str());
  }
  // Overlapped tensor parallelism: how many modules with exchanges split them, into how many chunks.
  int exchanging = 0;
  std::map<int, int> by_chunks;
  for (const ModuleInfo& m : plan.modules) {
    if (m.tp_fwd.calls == 0 && m.tp_bwd.calls == 0) continue;
    ++exchanging;
    if (m.tp_chunks > 1) ++by_chunks[m.tp_chunks];
  }
  if (exchanging > 0) {
    std::ostringstream s;
    s << "async TP on ";
    int overlapped = 0;
    for (const auto& [chunks, n] : by_chunks) overlapped += n;
    s << overlapped << " of " << exchanging << " modules with tensor parallel exchanges";
    for (const auto& [chunks, n] : by_chunks) s << ", " << n << " in " << chunks << " chunks";
    out.push_back(s.str());
  }
  // Layers whose parameters stay gathered from forward to backward (one all-gather a step).
  int layers = 0, kept = 0;
  for (const ModuleInfo& m : plan.modules) {
    if (m.name.rfind("layers.", 0) != 0 || m.params.empty()) continue;
    ++layers;
    int gathers = 0;
    for (const Op& op : plan.ops)
      if (op.kind == OpKind::kAllGather && std::count(op.params.begin(), op.params.end(), m.params[0]) > 0) ++gathers;
    kept += gathers == 1 ? 1 : 0;
  }
  if (layers > 0) {
    out.push_back(std::to_string(kept) + " of " + std::to_string(layers) +
                  " layers stay gathered from forward to backward (no re-gather in backward)");
  }
  // Buckets, prefetch depth (the most computes between an all-gather's issue and the first
  // compute that uses it), and how many reduce-scatters are waited for after the last backward.
  int gathers = 0, reduces = 0, depth = 0, waits_at_step = 0;
  std::set<std::string> reduce_ids;
  bool after_backward = false;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    const Op& op = plan.ops[i];
    if (op.kind == OpKind::kReduceScatter) ++reduces, reduce_ids.insert(op.id);
    if (op.kind == OpKind::kCompute) after_backward = op.phase == Phase::kBackward && op.module == 0;
    if (op.kind == OpKind::kWait && after_backward && reduce_ids.count(op.id)) ++waits_at_step;
    if (op.kind != OpKind::kAllGather) continue;
    ++gathers;
    const std::set<int> params(op.params.begin(), op.params.end());
    int between = 0;
    for (size_t j = i + 1; j < plan.ops.size(); ++j) {
      if (plan.ops[j].kind != OpKind::kCompute) continue;
      const auto& used = plan.modules[plan.ops[j].module].params;
      if (std::any_of(used.begin(), used.end(), [&](int p) { return params.count(p) > 0; })) break;
      ++between;
    }
    depth = std::max(depth, between);
  }
  // Parameters read by rows (the embedding): what the step moves for them instead.
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::kRowGather) continue;
    for (int p : op.params) {
      std::ostringstream r;
      r << plan.params[p].name << " read by rows: " << HumanBytes(plan.params[p].row_bytes * plan.dp_shard)
        << " of rows gathered and as much reduced a step, where the whole parameter is "
        << HumanBytes(plan.params[p].gathered_bytes) << " gathered";
      bool dense = false;
      for (const ModuleInfo& m : plan.modules) dense = dense || std::count(m.params.begin(), m.params.end(), p) > 0;
      bool split = false;
      for (const ModuleInfo& m : plan.modules) split = split || std::count(m.vocab.begin(), m.vocab.end(), p) > 0;
      r << (dense ? " (still gathered for the tied output head, and reduce-scattered right after its backward)"
            : split ? " (never gathered or reduce-scattered whole: the output head splits it by vocabulary)"
                    : " (never gathered or reduce-scattered whole)");
      out.push_back(r.str());
    }
  }
  std::ostringstream s;
  s << gathers << " all-gathers and " << reduces << " reduce-scatters a step; all-gathers issued up to " << depth
    << " compute(s) ahead of their use; " << waits_at_step << " of the reduce-scatters waited for after the last backward";
  out.push_back(s.str());
  return out;
}

}  // namespace meshwork::compiler
