#include "trainer/fsdp/compile.h"

#include <algorithm>
#include <iomanip>
#include <vector>
#include <sstream>

#include "common/file.h"
#include "common/units.h"
#include "trainer/compiler/calibration.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"
#include "trainer/config/hardware.h"
#include "trainer/dist/host_collectives.h"
#include "trainer/fsdp/calibrate.h"

namespace meshwork::fsdp {
namespace {

// Message sizes to calibrate a collective at: what the plan's buckets will move. A typical
// module's bytes (the median module: a decoder layer), an eighth of it and twice it, within
// [256 KiB, 256 MiB]. (Timing the largest module too, the embeddings, cost seconds per run on
// slow links for no better fit.)
std::vector<int64_t> CalibrationSizes(const compiler::Graph& skeleton, bool gradients) {
  std::vector<int64_t> modules;
  for (const auto& m : skeleton.modules) {
    int64_t bytes = 0;
    for (int p : m.params) bytes += gradients ? skeleton.params[p].grad_bytes : skeleton.params[p].gathered_bytes;
    if (bytes > 0) modules.push_back(bytes);
  }
  if (modules.empty()) modules.push_back(int64_t{1} << 20);
  std::sort(modules.begin(), modules.end());
  const int64_t typical = modules[modules.size() / 2];
  auto clamp = [](int64_t b) { return std::clamp<int64_t>(b, int64_t{256} << 10, int64_t{256} << 20); };
  std::vector<int64_t> sizes = {clamp(typical / 8), clamp(typical), clamp(2 * typical)};
  if (sizes[1] == sizes[0]) sizes[1] = 2 * sizes[0];
  if (sizes[2] <= sizes[1]) sizes[2] = 2 * sizes[1];
  return sizes;
}

// One collective's bus bytes of a typical decoder layer's tensor-parallel exchange (the median
// layer's forward bytes over its calls); 0 where no module carries exchanges.
int64_t TypicalTpCallBytes(const compiler::Graph& skeleton) {
  std::vector<int64_t> calls;
  for (const auto& m : skeleton.modules)
    if (m.tp_fwd.calls > 0 && m.tp_gemm_share > 0) calls.push_back(m.tp_fwd.bytes / m.tp_fwd.calls);
  if (skeleton.tp <= 1 || calls.empty()) return 0;
  std::sort(calls.begin(), calls.end());
  return std::max<int64_t>(1, calls[calls.size() / 2]);
}

// Every rank measures (the measurements are collectives); the medians over the ranks are what
// the cost model gets, so that a slow or lucky rank does not decide the plan for all.
Result<compiler::CostModel> Calibrate(compiler::Graph& skeleton, dist::DeviceMesh& mesh, bool cpu,
                                      EagerStepTimes& measured) {
  compiler::CostModel cost;
  cost.dp_shard = skeleton.dp_shard;
  cost.dp_replicate = skeleton.dp_replicate;
  compiler::LinkCost reduce_scatter;
  if (skeleton.dp_shard > 1) {
    dist::Communicator& shard = mesh.group("dp_shard");
    MW_ASSIGN_OR_RETURN(cost.shard_link,
                        CalibrateLink(shard, dist::Collective::kAllGather, CalibrationSizes(skeleton, false), 2));
    MW_ASSIGN_OR_RETURN(reduce_scatter,
                        CalibrateLink(mesh.group("dp_shard_reduce"), dist::Collective::kReduceScatter,
                                      CalibrationSizes(skeleton, true), 2));
    // The two lanes together, at a typical module's size.
    MW_ASSIGN_OR_RETURN(cost.shard_lanes_share,
                        MeasureLaneShare(shard, mesh.group("dp_shard_reduce"), CalibrationSizes(skeleton, false)[1],
                                         CalibrationSizes(skeleton, true)[1]));
  }
  if (skeleton.dp_replicate > 1) {
    // The replicas all-reduce reduced shards: a dp_shard-th of the reduce-scatters' inputs.
    std::vector<int64_t> sizes = CalibrationSizes(skeleton, true);
    for (int64_t& b : sizes) b = std::max<int64_t>(int64_t{64} << 10, b / std::max(1, skeleton.dp_shard));
    MW_ASSIGN_OR_RETURN(cost.replicate_link, CalibrateLink(mesh.group("dp_replicate"), dist::Collective::kAllReduce, sizes, 2));
  }
  // Tensor parallelism's exchanges, where the plan carries them: its own link, timed with
  // all-gathers of one collective's bytes of a typical layer's exchange (a region's all-gather of
  // the stream), a quarter of it and twice it.
  const int64_t tp_call = TypicalTpCallBytes(skeleton);
  if (tp_call > 0) {
    auto clamp = [](int64_t b) { return std::clamp<int64_t>(b, int64_t{64} << 10, int64_t{256} << 20); };
    std::vector<int64_t> sizes = {clamp(tp_call / 4), clamp(tp_call), clamp(2 * tp_call)};
    if (sizes[1] == sizes[0]) sizes[1] = 2 * sizes[0];
    if (sizes[2] <= sizes[1]) sizes[2] = 2 * sizes[1];
    MW_ASSIGN_OR_RETURN(cost.tp_link, CalibrateLink(mesh.group("tp"), dist::Collective::kAllGather, sizes, 2));
    cost.tp = skeleton.tp;
  }
  if (cpu) {
    // CPU ranks: FSDP's copies take host time, and collectives compete with compute for cores.
    cost.host_copy_bytes_per_second = MeasureCopyRate();
    // Timed on the dp_shard group, else on the tp group, whose overlapped exchanges
    // (CostModel::TpExposedSeconds) slow their matmuls just as FSDP's collectives slow compute:
    // the same Gloo threads on the same cores.
    const char* timed_on = skeleton.dp_shard > 1 ? "dp_shard" : tp_call > 0 ? "tp" : nullptr;
    if (timed_on != nullptr) {
      MW_ASSIGN_OR_RETURN(const Interference k, MeasureInterference(mesh.group(timed_on)));
      cost.interference = k.compute;
      cost.comm_interference = k.comm;
    }
  }
  std::vector<double> mine = {cost.shard_link.latency_seconds, cost.shard_link.bus_bytes_per_second,
                              reduce_scatter.latency_seconds,  reduce_scatter.bus_bytes_per_second,
                              cost.replicate_link.latency_seconds, cost.replicate_link.bus_bytes_per_second,
                              cost.host_copy_bytes_per_second, cost.interference, measured.step_seconds,
                              cost.shard_lanes_share, cost.comm_interference, measured.outside_seconds,
                              cost.tp_link.latency_seconds, cost.tp_link.bus_bytes_per_second};
  for (const auto& m : skeleton.modules) {
    mine.push_back(m.fwd_seconds);
    mine.push_back(m.bwd_seconds);
  }
  MW_ASSIGN_OR_RETURN(const std::vector<double> median, dist::MedianAcrossRanks(mesh.group("world"), mine));
  cost.shard_link = {median[0], median[1]};
  if (skeleton.dp_shard > 1) cost.shard_reduce_scatter_link = compiler::LinkCost{median[2], median[3]};
  cost.replicate_link = {median[4], median[5]};
  cost.host_copy_bytes_per_second = median[6];
  cost.interference = median[7];
  measured.step_seconds = median[8];
  cost.shard_lanes_share = median[9];
  cost.comm_interference = median[10];
  measured.outside_seconds = median[11];
  cost.step_overhead_seconds = measured.outside_seconds;
  cost.tp_link = {median[12], median[13]};
  constexpr size_t kModulesAt = 14;
  for (size_t m = 0; m < skeleton.modules.size(); ++m) {
    skeleton.modules[m].fwd_seconds = median[kModulesAt + 2 * m];
    skeleton.modules[m].bwd_seconds = median[kModulesAt + 1 + 2 * m];
  }
  return cost;
}

// fsdp.memory_budget: MiB; 0: the device's memory less the static state (the eager plan's peak
// where the device's memory is unknown); -1: the eager plan's peak.
compiler::MemoryBudget BudgetOf(const config::FsdpConfig& cfg, int64_t device_memory_bytes) {
  using Source = compiler::MemoryBudget::Source;
  if (cfg.memory_budget > 0) return {Source::kFixed, cfg.memory_budget << 20};
  if (cfg.memory_budget == 0 && device_memory_bytes > 0) return {Source::kDeviceMemory, device_memory_bytes};
  return {Source::kEagerPeak, 0};
}

const char* BudgetSource(compiler::MemoryBudget::Source source) {
  switch (source) {
    case compiler::MemoryBudget::Source::kFixed: return "fsdp.memory_budget";
    case compiler::MemoryBudget::Source::kDeviceMemory: return "the device's memory less the static state";
    case compiler::MemoryBudget::Source::kEagerPeak: return "the eager plan's peak";
  }
  return "";
}

std::string Describe(const compiler::StepPlans& plans, const compiler::PlanOptions& options,
                     const config::FsdpConfig& cfg, bool cpu, double unslowed, double scale,
                     double measured_step_seconds) {
  const compiler::CostModel& cost = plans.ctx.cost;
  const compiler::SimResult p = compiler::Simulate(plans.compiled, cost);
  const compiler::SimResult e = compiler::Simulate(plans.eager, cost);

  std::ostringstream line;
  line << std::fixed << std::setprecision(4) << "compiled plan: passes " << plans.passes << "; bucketing "
       << compiler::BucketingName(cfg.bucketing) << ", budget " << Mib(plans.ctx.memory_budget_bytes)
       << " (" << BudgetSource(options.budget.source) << ")" << "; " << p.collectives
       << " collectives/step (eager " << e.collectives << "); predicted step " << p.step_seconds << " s (eager "
       << e.step_seconds << "), exposed comm " << p.exposed_comm_seconds << " s (eager " << e.exposed_comm_seconds
       << "), peak dynamic " << Mib(p.peak_bytes) << " (eager " << Mib(e.peak_bytes) << ") + static "
       << Mib(compiler::StaticBytes(plans.compiled)) << "; dp_shard link "
       << std::setprecision(0) << cost.shard_link.latency_seconds * 1e6 << " us + " << std::setprecision(2)
       << cost.shard_link.bus_bytes_per_second / 1e9 << " GB/s";
  if (cost.shard_reduce_scatter_link) {
    line << " (reduce-scatter " << std::setprecision(0) << cost.shard_reduce_scatter_link->latency_seconds * 1e6
         << " us + " << std::setprecision(2) << cost.shard_reduce_scatter_link->bus_bytes_per_second / 1e9 << " GB/s)";
  }
  if (cost.dp_shard > 1) line << ", lanes together at " << std::setprecision(2) << cost.shard_lanes_share << " of their speed";
  if (cost.tp > 1) {
    line << "; tp link " << std::setprecision(0) << cost.tp_link.latency_seconds * 1e6 << " us + " << std::setprecision(2)
         << cost.tp_link.bus_bytes_per_second / 1e9 << " GB/s";
  }
  if (cpu) {
    line << ", host copies " << cost.host_copy_bytes_per_second / 1e9 << " GB/s, compute/comm interference "
         << cost.interference << " (comm slowed by compute " << cost.CommInterference() << ")";
  }
  if (unslowed < 1) {
    line << "; traced compute x" << std::setprecision(2) << unslowed
         << " (mean) without the eager step's collectives beside it";
  }
  if (measured_step_seconds > 0) {
    line << (unslowed < 1 ? ", then x" : "; traced compute x") << std::setprecision(2) << scale << " to fit the eager step's measured "
         << std::setprecision(3) << measured_step_seconds << " s";
    if (cost.step_overhead_seconds > 0)
      line << " (" << cost.step_overhead_seconds << " s of it outside forward and backward)";
    if (scale <= compiler::kMinComputeScale) line << " (at the bound: the calibrated links alone predict more)";
  }
  line << "\n";
  for (const std::string& choice : plans.choices) line << "compiled plan chose: " << choice << "\n";
  return line.str();
}

// Whether two plans of one model run the same step: the same ops, and the same layers checkpointed.
bool SameSchedule(const compiler::Graph& a, const compiler::Graph& b) {
  if (a.ops != b.ops || a.modules.size() != b.modules.size()) return false;
  for (size_t m = 0; m < a.modules.size(); ++m) {
    if (compiler::IsCheckpointed(a.modules[m]) != compiler::IsCheckpointed(b.modules[m])) return false;
    // Overlapped TP's chunks (atp=), which the re-plan's refitted compute may change alone.
    if (std::max(1, a.modules[m].tp_chunks) != std::max(1, b.modules[m].tp_chunks)) return false;
  }
  return true;
}

}  // namespace

Result<Compilation> CompileFsdp(FullyShardedLlama& fsdp, dist::DeviceMesh& mesh, const config::FsdpConfig& cfg,
                                bool cpu, EagerStepTimes eager, int64_t device_memory_bytes,
                                std::ostream& log) {
  Compilation c;
  c.skeleton = fsdp.Skeleton();
  // Every rank calibrates and the medians over the ranks (links and traced compute) go into
  // the plan; rank 0 plans and AgreeOnPlan hands its plan to all.
  MW_ASSIGN_OR_RETURN(c.cost, Calibrate(c.skeleton, mesh, cpu, eager));
  // A model split by tensor parallelism (FullyShardedLlama::SetTensorParallel) reads no rows and
  // splits no head of the plan's.
  c.options = config::PlanOptionsOf(cfg, fsdp.tensor_parallel());
  c.options.budget = BudgetOf(cfg, device_memory_bytes);
  // The async_tp pass chooses each layer's chunks only where the plan may set them (mesh.async_tp_chunks
  // 1, the exchanges in the plan); fixed chunks stay as the skeleton records them.
  c.options.async_tp = fsdp.PlansTensorParallelChunks();
  c.options.tp_tokens_per_rank = fsdp.TensorParallelTokensPerRank();
  compiler::Graph plan;
  if (mesh.group("world").rank() == 0) {
    // The measured eager step recomputed every layer when the warm-up was checkpointed: fit the
    // compute to that program, then plan the plain one.
    compiler::Graph measured = c.skeleton;
    if (fsdp.checkpointing() == LayerCheckpointing::kAllUntilPlanned)
      for (auto& m : measured.modules) compiler::Checkpoint(m);
    // First each module's own slowdown by the collectives beside it, then one scale for what
    // the modules' times leave out of the measured step.
    const compiler::ModuleScales unslow = compiler::UnslowTracedCompute(measured, c.cost, c.options);
    measured = compiler::ScaleCompute(std::move(measured), unslow);
    c.skeleton = compiler::ScaleCompute(std::move(c.skeleton), unslow);
    c.unslowed = unslow.Mean();
    c.scale = compiler::FitComputeScale(measured, c.cost, c.options, eager.step_seconds);
    MW_ASSIGN_OR_RETURN(compiler::StepPlans plans,
                        compiler::PlanStep(compiler::ScaleCompute(c.skeleton, c.scale), c.cost, c.options,
                                           cfg.dump_plan ? &log : nullptr));
    log << Describe(plans, c.options, cfg, cpu, c.unslowed, c.scale, eager.step_seconds);
    c.predicted_step_seconds = compiler::Simulate(plans.compiled, c.cost).step_seconds;
    if (!cfg.calibration_out.empty()) {
      // What the plan was made from, for meshwork-simulate --calibration to plan other runs.
      const std::string text = compiler::PrintCalibration({c.cost, c.scale, eager.step_seconds, c.skeleton});
      Status written = [&]() -> Status {
        MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(cfg.calibration_out));
        MW_RETURN_IF_ERROR(out.Write(text.data(), text.size()));
        return out.Commit();
      }();
      if (!written.ok()) return IOError("key 'fsdp.calibration_out': " + written.message());
      log << "calibration: written to " << cfg.calibration_out << "\n";
    }
    plan = std::move(plans.compiled);
  }
  MW_ASSIGN_OR_RETURN(c.plan, AgreeOnPlan(mesh.group("world"), plan));
  MW_RETURN_IF_ERROR(fsdp.UsePlan(c.plan));
  return c;
}

EagerStepTimes SteadyEagerStep(const std::vector<EagerStepTimes>& steps) {
  size_t first = 0;
  if (steps.size() >= 2) {
    double later = 0;
    for (size_t i = 1; i < steps.size(); ++i) later += steps[i].step_seconds;
    later /= static_cast<double>(steps.size() - 1);
    if (steps[0].step_seconds > kWarmUpRatio * later) first = 1;
  }
  EagerStepTimes mean;
  for (size_t i = first; i < steps.size(); ++i) {
    mean.step_seconds += steps[i].step_seconds;
    mean.outside_seconds += steps[i].outside_seconds;
  }
  if (steps.size() > first) {
    mean.step_seconds /= static_cast<double>(steps.size() - first);
    mean.outside_seconds /= static_cast<double>(steps.size() - first);
  }
  return mean;
}

Status Replan(FullyShardedLlama& fsdp, dist::DeviceMesh& mesh, Compilation& c, double measured_step_seconds,
              std::ostream& log) {
  dist::Communicator& world = mesh.group("world");
  MW_ASSIGN_OR_RETURN(const std::vector<double> median, dist::MedianAcrossRanks(world, {measured_step_seconds}));
  const double measured = median[0];
  compiler::Graph plan;
  if (world.rank() == 0) {
    // The running plan's compute carries the old scale: the refit is relative to it.
    const double factor = compiler::FitPlanComputeScale(c.plan, c.cost, measured);
    const double scale = std::clamp(c.scale * factor, compiler::kMinComputeScale, compiler::kMaxComputeScale);
    MW_ASSIGN_OR_RETURN(compiler::StepPlans plans,
                        compiler::PlanStep(compiler::ScaleCompute(c.skeleton, scale), c.cost, c.options));
    const double running = compiler::Simulate(compiler::ScaleCompute(c.plan, factor), c.cost).step_seconds;
    const double replanned = compiler::Simulate(plans.compiled, c.cost).step_seconds;
    // Only a plan predicted faster than the running one at the refitted compute replaces it.
    const bool better = !SameSchedule(plans.compiled, c.plan) && replanned < running;
    std::ostringstream line;
    line << std::fixed << std::setprecision(3) << "re-plan: the compiled step measured " << measured
         << " s (median over ranks) against " << c.predicted_step_seconds << " s predicted; compute x"
         << std::setprecision(2) << scale << " (was x" << c.scale << "); "
         << (better ? "a new plan, predicted " : "the plan stays, predicted ") << std::setprecision(3)
         << (better ? replanned : running) << " s";
    if (better) line << " (the running one " << running << " s)";
    log << line.str() << "\n";
    c.scale = scale;
    c.predicted_step_seconds = better ? replanned : running;
    plan = better ? std::move(plans.compiled) : compiler::ScaleCompute(c.plan, factor);
  }
  MW_ASSIGN_OR_RETURN(compiler::Graph agreed, AgreeOnPlan(world, plan));
  const bool changed = !SameSchedule(agreed, c.plan);
  c.plan = std::move(agreed);
  return changed ? fsdp.UsePlan(c.plan) : Status::Ok();
}

}  // namespace meshwork::fsdp
