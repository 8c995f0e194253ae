#include "trainer/compiler/mesh_choice.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "trainer/compiler/passes/fsdp2_order.h"

namespace meshwork::compiler {

Result<MeshChoice> ChooseMesh(const HardwareProfile& profile, const LlamaShape& shape, int world,
                              const PlanOptions& options, bool plan_chosen) {
  if (world < 1) return InvalidConfig("mesh: auto needs a world of at least 1 rank, got " + std::to_string(world));
  MeshChoice out;
  const MeshCandidate* best = nullptr;
  auto total = [](const MeshCandidate& c) { return c.compiled.peak_bytes + c.compiled.static_bytes; };
  std::vector<Graph> skeletons;  // by candidate, for the full plan of the chosen one
  std::vector<CostModel> costs;
  for (int dp_shard = 1; dp_shard <= world; ++dp_shard) {
    if (world % dp_shard != 0) continue;
    MeshCandidate c;
    c.dp_shard = dp_shard;
    c.dp_replicate = world / dp_shard;
    Result<CostModel> cost = MakeCostModel(profile, c.dp_replicate, dp_shard);
    LlamaShape s = shape;
    s.dp_shard = dp_shard;
    s.dp_replicate = c.dp_replicate;
    skeletons.push_back(LlamaSkeleton(s));
    costs.push_back(cost.ok() ? *cost : CostModel());
    if (!cost.ok()) {
      c.rejected = cost.status().message();
      out.candidates.push_back(std::move(c));
      continue;
    }
    // Ranked by the quick plan (checkpointing to fit, FSDP2's order): the full pipeline's search
    // under a tight budget takes minutes per mesh for a 70B model.
    PassContext ctx;
    ctx.cost = *cost;
    ctx.memory_budget_bytes = std::max<int64_t>(1, profile.memory_bytes - StaticBytes(skeletons.back()));
    MW_ASSIGN_OR_RETURN(const Graph quick,
                        QuickPlan(BuildNaiveProgram(skeletons.back(), {options.reshard_after_forward}), ctx));
    c.compiled = Simulate(quick, ctx.cost);
    c.fits = total(c) <= profile.memory_bytes;
    out.candidates.push_back(std::move(c));
  }
  int buildable = 0, fitting = 0;
  for (const MeshCandidate& c : out.candidates) {
    if (!c.rejected.empty()) continue;
    ++buildable;
    fitting += c.fits ? 1 : 0;
    const bool better = best == nullptr ||
                        (c.fits != best->fits ? c.fits
                         : c.fits             ? c.compiled.step_seconds < best->compiled.step_seconds
                                              : total(c) < total(*best));
    if (better) best = &c;
  }
  if (best == nullptr) {
    return InvalidConfig("mesh: auto: hardware profile '" + profile.name + "' cannot build any mesh of " +
                         std::to_string(world) + " ranks: " + out.candidates.front().rejected);
  }
  // The chosen mesh, planned in full: its row shows the compiled plan and the plan's choices.
  const size_t at = static_cast<size_t>(best - out.candidates.data());
  MeshCandidate& chosen = out.candidates[at];
  const int64_t quick_total = total(chosen);  // what "needs the least" compares, when none fits
  if (plan_chosen) {
    PlanOptions o = options;
    o.budget = {MemoryBudget::Source::kDeviceMemory, profile.memory_bytes};
    MW_ASSIGN_OR_RETURN(StepPlans plans, PlanStep(skeletons[at], costs[at], o));
    chosen.compiled = Simulate(plans.compiled, plans.ctx.cost);
    chosen.fits = total(chosen) <= profile.memory_bytes;
    chosen.choices = std::move(plans.choices);
  }
  out.dp_replicate = chosen.dp_replicate;
  out.dp_shard = chosen.dp_shard;
  std::ostringstream why;
  why << std::fixed << std::setprecision(4) << chosen.dp_replicate << "x" << chosen.dp_shard
      << " (dp_replicate x dp_shard): ";
  if (chosen.fits) {
    why << "the fastest predicted step, " << chosen.compiled.step_seconds << " s, of the " << fitting << " of "
        << buildable << " buildable meshes that fit the device's memory";
  } else {
    why << std::setprecision(2) << "no mesh fits the device's memory; this one needs the least, "
        << static_cast<double>(quick_total) / (1 << 30) << " GiB";
  }
  out.reason = why.str();
  return out;
}

}  // namespace meshwork::compiler
