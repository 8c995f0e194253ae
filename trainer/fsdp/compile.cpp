#include "trainer/fsdp/compile.h"

#include <iomanip>
#include <sstream>

#include "common/units.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"
#include "trainer/fsdp/calibrate.h"

namespace meshwork::fsdp {
namespace {

Result<compiler::CostModel> Calibrate(const compiler::Graph& skeleton, dist::DeviceMesh& mesh, bool cpu) {
  compiler::CostModel cost;
  cost.dp_shard = skeleton.dp_shard;
  cost.dp_replicate = skeleton.dp_replicate;
  if (skeleton.dp_shard > 1) {
    MW_ASSIGN_OR_RETURN(cost.shard_link, CalibrateLink(mesh.group("dp_shard"), dist::Collective::kAllGather));
  }
  if (skeleton.dp_replicate > 1) {
    MW_ASSIGN_OR_RETURN(cost.replicate_link, CalibrateLink(mesh.group("dp_replicate"), dist::Collective::kAllReduce));
  }
  if (cpu) {
    // CPU ranks: FSDP's copies take host time, and collectives compete with compute for cores.
    cost.host_copy_bytes_per_second = MeasureCopyRate();
    if (skeleton.dp_shard > 1) {
      MW_ASSIGN_OR_RETURN(cost.interference, MeasureInterference(mesh.group("dp_shard")));
    }
  }
  return cost;
}

std::string Describe(const compiler::StepPlans& plans, const config::FsdpConfig& cfg, bool cpu) {
  const compiler::CostModel& cost = plans.ctx.cost;
  const compiler::SimResult p = compiler::Simulate(plans.compiled, cost);
  const compiler::SimResult e = compiler::Simulate(plans.eager, cost);
  std::ostringstream line;
  line << std::fixed << std::setprecision(4) << "compiled plan: passes " << plans.passes << "; bucketing "
       << compiler::BucketingName(cfg.bucketing) << ", budget " << Mib(plans.ctx.memory_budget_bytes)
       << (cfg.memory_budget > 0 ? "" : " (the eager plan's peak)") << "; " << p.collectives
       << " collectives/step (eager " << e.collectives << "); predicted step " << p.step_seconds << " s (eager "
       << e.step_seconds << "), exposed comm " << p.exposed_comm_seconds << " s (eager " << e.exposed_comm_seconds
       << "), peak dynamic " << Mib(p.peak_bytes) << " (eager " << Mib(e.peak_bytes) << "); dp_shard link "
       << std::setprecision(0) << cost.shard_link.latency_seconds * 1e6 << " us + " << std::setprecision(2)
       << cost.shard_link.bus_bytes_per_second / 1e9 << " GB/s";
  if (cpu) {
    line << ", host copies " << cost.host_copy_bytes_per_second / 1e9 << " GB/s, compute/comm interference "
         << cost.interference;
  }
  line << "\n";
  return line.str();
}

}  // namespace

Status CompileFsdp(FullyShardedLlama& fsdp, dist::DeviceMesh& mesh, const config::FsdpConfig& cfg, bool cpu,
                   std::ostream& log) {
  const compiler::Graph skeleton = fsdp.Skeleton();
  // Every rank calibrates (the measurements are collectives), rank 0 plans from its own trace
  // and calibration, and AgreeOnPlan hands its plan to all.
  MW_ASSIGN_OR_RETURN(const compiler::CostModel cost, Calibrate(skeleton, mesh, cpu));
  compiler::Graph plan;
  if (mesh.group("world").rank() == 0) {
    compiler::PlanOptions options;
    options.bucketing = cfg.bucketing;
    options.reorder = cfg.reorder;
    options.reshard_after_forward = cfg.reshard_after_forward;
    if (cfg.memory_budget > 0) options.budget = {compiler::MemoryBudget::Source::kFixed, cfg.memory_budget << 20};
    MW_ASSIGN_OR_RETURN(compiler::StepPlans plans,
                        compiler::PlanStep(skeleton, cost, options, cfg.dump_plan ? &log : nullptr));
    log << Describe(plans, cfg, cpu);
    plan = std::move(plans.compiled);
  }
  MW_ASSIGN_OR_RETURN(compiler::Graph agreed, AgreeOnPlan(mesh.group("world"), plan));
  return fsdp.UsePlan(agreed);
}

}  // namespace meshwork::fsdp
