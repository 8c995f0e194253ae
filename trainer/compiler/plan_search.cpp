#include "trainer/compiler/plan_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "trainer/compiler/frontend.h"
#include "trainer/compiler/passes/fsdp2_order.h"
#include "trainer/compiler/pipeline/price.h"
#include "trainer/compiler/plan_estimate.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

std::string Describe(const ParallelPlan& p) {
  std::ostringstream s;
  s << "tp " << p.tp << " x pp " << p.pp << " x dp_shard " << p.dp_shard;
  if (p.dp_replicate > 1) s << " x dp_replicate " << p.dp_replicate;
  if (p.microbatch == 0) return s.str();  // pruned by its mesh alone: nothing else was chosen
  if (p.pp > 1) {
    s << ", " << pipeline::ScheduleName(p.schedule);
    if (p.virtual_stages > 1) s << " v " << p.virtual_stages;
    s << ", " << p.microbatches << " micro-batches of " << p.microbatch;
  } else {
    s << ", " << p.microbatch << " sequences a rank" << (p.reshard_after_forward ? "" : ", no reshard after forward");
  }
  switch (p.checkpoint_every) {
    case -1: s << ", checkpointing: the compiled plan's"; break;
    case 0: s << ", no checkpointing"; break;
    case 1: s << ", every layer checkpointed"; break;
    default: s << ", every " << p.checkpoint_every << "th layer checkpointed"; break;
  }
  return s.str();
}

std::string PlanConfigYaml(const ParallelPlan& p, int64_t seq_len, int64_t global_batch) {
  std::ostringstream y;
  y << "mesh: {dp_replicate: " << p.dp_replicate << ", dp_shard: " << p.dp_shard << ", tp: " << p.tp
    << ", pp: " << p.pp << "}\n";
  if (p.pp > 1) {
    y << "pipeline: {schedule: " << pipeline::ScheduleName(p.schedule) << ", virtual_stages: " << p.virtual_stages
      << "}\n";
  }
  y << "data: {batch_size: " << p.microbatch << ", seq_len: " << seq_len << "}\n";
  y << "training: {grad_accum: " << (p.pp > 1 ? p.microbatches : 1) << ", global_batch_size: " << global_batch;
  switch (p.checkpoint_every) {
    case -1: y << ", activation_checkpointing: auto"; break;
    case 0: y << ", activation_checkpointing: none"; break;
    case 1: y << ", activation_checkpointing: all"; break;
    default: y << ", activation_checkpointing: selective, checkpoint_every: " << p.checkpoint_every; break;
  }
  y << "}\n";
  y << "fsdp: {mode: " << (p.pp == 1 && p.dp_shard > 1 ? "compiled" : "eager")
    << ", reshard_after_forward: " << (p.reshard_after_forward ? "true" : "false") << "}\n";
  return y.str();
}

namespace {

using Clock = std::chrono::steady_clock;
using plan::BaseShape;
using plan::Estimate2d;
using plan::EstimatePipeline;
using plan::Faster;
using plan::Fixed;
using plan::GiB;
using plan::Scored;
using plan::SingleProgramShape;
using plan::TokensPerGpu;

std::vector<int> Divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// A single-program finalist: by the quick plan (checkpointing to fit the device, FSDP2's order:
// passes/fsdp2_order.h), or `full`, by the compiled planner under the device's memory (its
// checkpointing, buckets, order and async TP; minutes for a 405B model), then the simulator.
Status Score2d(const HardwareProfile& profile, const SearchSpec& spec, PlanCandidate& c, bool full) {
  const ParallelPlan& p = c.plan;
  const LlamaShape shape = SingleProgramShape(spec, profile, p);
  MW_ASSIGN_OR_RETURN(const CostModel cost, MakeCostModel(profile, p.dp_replicate, p.dp_shard, p.tp));
  const Graph skeleton = LlamaSkeleton(shape);
  SimResult sim;
  if (full) {
    PlanOptions options;
    options.reshard_after_forward = p.reshard_after_forward;
    options.async_tp = p.tp > 1;
    options.budget = {MemoryBudget::Source::kDeviceMemory, profile.memory_bytes};
    MW_ASSIGN_OR_RETURN(const StepPlans plans, PlanStep(skeleton, cost, options));
    sim = Simulate(plans.compiled, plans.ctx.cost);
    c.choices = plans.choices;
  } else {
    PassContext ctx;
    ctx.cost = cost;
    ctx.memory_budget_bytes = std::max<int64_t>(1, profile.memory_bytes - StaticBytes(skeleton));
    MW_ASSIGN_OR_RETURN(Graph quick, QuickPlan(BuildNaiveProgram(skeleton, {p.reshard_after_forward}), ctx));
    if (p.dp_shard == 1) {
      // No FSDP, so no compiled plan to choose layers: the trainer checkpoints none or all.
      const bool any = std::any_of(quick.modules.begin(), quick.modules.end(), IsCheckpointed);
      c.plan.checkpoint_every = any ? 1 : 0;
      if (any) {
        LlamaShape all = shape;
        all.activation_checkpointing = true;
        MW_ASSIGN_OR_RETURN(quick, QuickPlan(BuildNaiveProgram(LlamaSkeleton(all), {p.reshard_after_forward}), ctx));
      }
    }
    sim = Simulate(quick, ctx.cost);
  }
  c.simulated = Scored(sim.step_seconds, TokensPerGpu(spec), sim.peak_bytes + sim.static_bytes, spec, profile);
  return Status::Ok();
}

// A pipeline finalist by the pipeline simulator, with the fastest checkpointing the trainer can
// express that fits the fullest rank: none, every N-th layer (N = 8, 4, 3, 2) or every layer,
// besides the estimate's own N (milliseconds each). When none fits, the densest, which fails.
Status ScorePipeline(const HardwareProfile& profile, const SearchSpec& spec, PlanCandidate& c) {
  ParallelPlan& p = c.plan;
  pipeline::PipelinePlan plan;
  plan.llama = BaseShape(spec, profile);
  plan.llama.batch = p.microbatch;
  plan.llama.tp = p.tp;
  plan.gpus = spec.gpus;
  plan.pp = p.pp;
  plan.virtual_stages = p.virtual_stages;
  plan.microbatches = p.microbatches;
  plan.dp_shard = p.dp_shard;
  plan.schedule = p.schedule;
  const int layers = static_cast<int>(spec.config.num_hidden_layers);
  std::vector<int> options = {0, 8, 4, 3, 2, 1};
  if (std::find(options.begin(), options.end(), p.checkpoint_every) == options.end()) {
    options.insert(options.begin() + 1, p.checkpoint_every);
  }
  std::optional<PlanScore> best;
  int best_every = 1;
  for (int every : options) {
    plan.checkpointed.assign(static_cast<size_t>(layers), false);
    for (int l = 0; every > 0 && l < layers; l += every) plan.checkpointed[static_cast<size_t>(l)] = true;
    MW_ASSIGN_OR_RETURN(const pipeline::PricedPipeline priced, pipeline::PricePipeline(profile, plan));
    PlanScore score = Scored(priced.step_seconds, TokensPerGpu(spec), priced.peak_bytes, spec, profile);
    score.bubble = priced.run.bubble_fraction;
    const bool fits = priced.peak_bytes <= profile.memory_bytes;
    const bool best_fits = best && best->peak_bytes <= profile.memory_bytes;
    if (!best || (fits && (!best_fits || Faster(score, *best))) || (!fits && !best_fits)) {
      best = score;
      best_every = every;
    }
  }
  p.checkpoint_every = best_every;
  c.simulated = best;
  return Status::Ok();
}

}  // namespace

Result<PlanScore> ScorePlan(const HardwareProfile& profile, const SearchSpec& spec, const ParallelPlan& plan) {
  const int64_t ranks = int64_t{plan.dp_replicate} * plan.dp_shard * plan.tp * plan.pp;
  if (ranks != spec.gpus || plan.dp_replicate < 1 || plan.dp_shard < 1 || plan.tp < 1 || plan.pp < 1) {
    return InvalidConfig("plan " + Describe(plan) + ": its dims make " + std::to_string(ranks) + " ranks, not the " +
                         std::to_string(spec.gpus) + " to score it on");
  }
  PlanCandidate c;
  c.plan = plan;
  MW_RETURN_IF_ERROR(plan.pp == 1 ? Score2d(profile, spec, c, false) : ScorePipeline(profile, spec, c));
  return *c.simulated;
}

Result<PlanSearch> SearchPlans(const HardwareProfile& profile, const SearchSpec& spec) {
  const auto t0 = Clock::now();
  if (spec.gpus < 1) return InvalidConfig("gpus: " + std::to_string(spec.gpus) + ": a plan needs at least one GPU");
  if (spec.global_batch < 1) {
    return InvalidConfig("global batch: " + std::to_string(spec.global_batch) + " sequences: a step needs at least one");
  }
  if (spec.seq_len < 1) return InvalidConfig("seq_len: " + std::to_string(spec.seq_len) + " must be >= 1");
  const int layers = static_cast<int>(spec.config.num_hidden_layers);
  const int node = std::max(1, profile.gpus_per_node);
  if (spec.tp > 0) {
    if (std::string why = model::WhyNotSplittable(spec.config, spec.tp); !why.empty()) {
      return InvalidConfig("tp " + std::to_string(spec.tp) + ": " + why);
    }
    if (node % spec.tp != 0 || spec.gpus % spec.tp != 0) {
      return InvalidConfig("tp " + std::to_string(spec.tp) + ": a tp group must be within one node of " +
                           std::to_string(node) + " GPUs and divide the " + std::to_string(spec.gpus) + " GPUs");
    }
  }
  if (spec.pp > 0 && (spec.pp > layers || spec.gpus % spec.pp != 0)) {
    return InvalidConfig("pp " + std::to_string(spec.pp) + ": needs at most one stage a decoder layer (" +
                         std::to_string(layers) + ") and to divide the " + std::to_string(spec.gpus) + " GPUs");
  }

  PlanSearch out;
  std::vector<PlanCandidate> fitting;
  auto reject = [&](ParallelPlan plan, std::string why) {
    PlanCandidate c;
    c.plan = plan;
    c.rejected = std::move(why);
    out.rejected.push_back(std::move(c));
  };
  for (int tp : Divisors(std::min(node, spec.gpus))) {
    if (spec.tp > 0 && tp != spec.tp) continue;
    ParallelPlan base;
    base.microbatch = 0;  // a mesh only, until its batch is split
    base.tp = tp;
    if (spec.gpus % tp != 0) continue;
    if (std::string why = model::WhyNotSplittable(spec.config, tp); !why.empty()) {
      ++out.enumerated;
      reject(base, "tp: " + std::to_string(tp) + ": " + why);
      continue;
    }
    for (int pp : Divisors(spec.gpus / tp)) {
      if (spec.pp > 0 && pp != spec.pp) continue;
      base.pp = pp;
      if (pp > layers) {
        ++out.enumerated;
        reject(base, "pipeline: pp " + std::to_string(pp) + " is more stages than the " + std::to_string(layers) +
                         " decoder layers");
        continue;
      }
      // pp is the outermost dim: its ranks are gpus / pp apart. Inside one node while the
      // job spans several, the data parallel groups would cross nodes instead.
      if (pp > 1 && spec.gpus > node && spec.gpus / pp < node) {
        ++out.enumerated;
        reject(base, "pipeline: pp " + std::to_string(pp) + " would put a pipeline's stages in one node while the data "
                     "parallel groups cross nodes (pipelines go across nodes)");
        continue;
      }
      const int dp = spec.gpus / (tp * pp);
      for (int dp_shard : Divisors(dp)) {
        base.dp_shard = dp_shard;
        base.dp_replicate = dp / dp_shard;
        if (spec.global_batch % dp != 0) {
          ++out.enumerated;
          reject(base, "batch: the global batch of " + std::to_string(spec.global_batch) + " sequences does not divide over " +
                           std::to_string(dp) + " data parallel ranks");
          continue;
        }
        const int64_t per_rank = spec.global_batch / dp;
        std::vector<ParallelPlan> plans;
        if (pp == 1) {
          for (bool reshard : {true, false}) {
            ParallelPlan p = base;
            p.microbatch = per_rank;
            p.reshard_after_forward = reshard;
            plans.push_back(p);
          }
        } else {
          for (int v : {1, 2, 4}) {
            if (pp * v > layers) continue;
            for (pipeline::ScheduleKind kind : pipeline::AllSchedules()) {
              if (kind == pipeline::ScheduleKind::kPipeMare) continue;  // an algorithm change
              if ((kind == pipeline::ScheduleKind::kInterleaved1F1B) != (v > 1)) continue;
              for (int64_t b : spec.microbatch_sizes) {
                if (per_rank % b != 0) continue;
                ParallelPlan p = base;
                p.virtual_stages = v;
                p.schedule = kind;
                p.microbatch = b;
                p.microbatches = static_cast<int>(per_rank / b);
                const bool needs_pp = kind == pipeline::ScheduleKind::k1F1B ||
                                      kind == pipeline::ScheduleKind::kZeroBubbleH1;
                if ((needs_pp && p.microbatches < pp) ||
                    (kind == pipeline::ScheduleKind::kInterleaved1F1B && p.microbatches % pp != 0)) {
                  ++out.enumerated;
                  reject(p, "schedule: " + std::string(pipeline::ScheduleName(kind)) + " needs " +
                                (needs_pp ? "at least pp micro-batches" : "micro-batches a multiple of pp") + ", not " +
                                std::to_string(p.microbatches));
                  continue;
                }
                plans.push_back(p);
              }
            }
          }
        }
        for (const ParallelPlan& p : plans) {
          ++out.enumerated;
          PlanCandidate c;
          c.plan = p;
          if (p.pp == 1) {
            Estimate2d(profile, spec, c);
          } else {
            EstimatePipeline(profile, spec, c);
          }
          if (c.rejected.empty()) {
            fitting.push_back(std::move(c));
          } else {
            out.rejected.push_back(std::move(c));
          }
        }
      }
    }
  }
  if (fitting.empty()) {
    const PlanCandidate* least = nullptr;
    for (const PlanCandidate& c : out.rejected) {
      if (c.estimate.peak_bytes > 0 && (least == nullptr || c.estimate.peak_bytes < least->estimate.peak_bytes)) least = &c;
    }
    if (least == nullptr) {
      return InvalidConfig("no plan of " + std::to_string(spec.gpus) + " GPUs can be built: " +
                           (out.rejected.empty() ? std::string("none enumerated") : out.rejected.front().rejected));
    }
    const double need = GiB(least->estimate.peak_bytes), have = GiB(profile.memory_bytes);
    return InvalidConfig("no plan of " + std::to_string(spec.gpus) + " GPUs fits " + Fixed(have, 1) +
                         " GiB a GPU: the closest, " + Describe(least->plan) + ", needs " + Fixed(need, 1) +
                         " GiB; about " + std::to_string(static_cast<int>(std::ceil(spec.gpus * need / have))) +
                         " GPUs of this kind would hold it");
  }
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) { return Faster(a.estimate, b.estimate); });
  const auto t_estimated = Clock::now();
  out.estimate_seconds = std::chrono::duration<double>(t_estimated - t0).count();
  // The finalists: the best `finalists` single-program plans by the estimate (the planner takes
  // seconds on a large model) and the best 8 x `finalists` pipelines (the pipeline simulator
  // takes milliseconds), or every plan when exhaustive.
  const size_t per_family = static_cast<size_t>(std::max(1, spec.finalists));
  size_t taken_2d = 0, taken_pipeline = 0;
  for (PlanCandidate& c : fitting) {
    size_t& taken = c.plan.pp == 1 ? taken_2d : taken_pipeline;
    const size_t limit = c.plan.pp == 1 ? per_family : 8 * per_family;
    if (!spec.exhaustive && taken >= limit) {
      out.estimated.push_back(std::move(c));
      continue;
    }
    ++taken;
    const Status s = c.plan.pp == 1 ? Score2d(profile, spec, c, spec.full_plans && c.plan.dp_shard > 1)
                                    : ScorePipeline(profile, spec, c);
    if (!s.ok()) {
      c.rejected = "simulator: it refused the plan: " + s.message();
      out.rejected.push_back(std::move(c));
      continue;
    }
    if (c.simulated->peak_bytes > profile.memory_bytes) {
      c.rejected = "out of memory: as simulated, " + Fixed(GiB(c.simulated->peak_bytes), 1) +
                   " GiB, the device holds " + Fixed(GiB(profile.memory_bytes), 1);
      out.rejected.push_back(std::move(c));
      continue;
    }
    out.finalists.push_back(std::move(c));
  }
  if (out.finalists.empty()) {
    return InvalidConfig("none of the " + std::to_string(taken_2d + taken_pipeline) +
                         " best estimated plans fits as simulated: " +
                         out.rejected.back().rejected + " (" + Describe(out.rejected.back().plan) + ")");
  }
  std::stable_sort(out.finalists.begin(), out.finalists.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) { return Faster(*a.simulated, *b.simulated); });
  // The choice, when a single-program plan, planned in full as the trainer will (its row and
  // choices then the compiled plan's; never slower than the quick plan it was ranked by).
  const auto t_scored = Clock::now();
  out.score_seconds = std::chrono::duration<double>(t_scored - t_estimated).count();
  PlanCandidate& chosen = out.finalists.front();
  if (chosen.plan.pp == 1 && chosen.plan.dp_shard > 1 && !spec.full_plans && spec.plan_choice_in_full) {
    PlanCandidate full = chosen;
    if (Score2d(profile, spec, full, true).ok() && full.simulated->peak_bytes <= profile.memory_bytes &&
        full.simulated->step_seconds <= chosen.simulated->step_seconds) {
      chosen = std::move(full);
    }
  }
  const auto t_end = Clock::now();
  out.full_plan_seconds = std::chrono::duration<double>(t_end - t_scored).count();
  out.seconds = std::chrono::duration<double>(t_end - t0).count();
  return out;
}

}  // namespace meshwork::compiler
