#include "trainer/train/plan_advice.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/plan_estimate.h"

namespace meshwork::train {
namespace {

using compiler::plan::Fixed;

compiler::pipeline::ScheduleKind KindOf(config::PipelineSchedule s) {
  using K = compiler::pipeline::ScheduleKind;
  switch (s) {
    case config::PipelineSchedule::kGPipe: return K::kGPipe;
    case config::PipelineSchedule::k1F1B: return K::k1F1B;
    case config::PipelineSchedule::kInterleaved1F1B: return K::kInterleaved1F1B;
    case config::PipelineSchedule::kZeroBubbleH1: return K::kZeroBubbleH1;
    case config::PipelineSchedule::kPipeMare: return K::kPipeMare;
  }
  return K::k1F1B;
}

// The same plan but for the activation checkpointing, which the search chooses itself.
bool SamePlan(const compiler::ParallelPlan& a, const compiler::ParallelPlan& b) {
  if (a.dp_replicate != b.dp_replicate || a.dp_shard != b.dp_shard || a.tp != b.tp || a.pp != b.pp) return false;
  if (a.pp == 1) return a.reshard_after_forward == b.reshard_after_forward;
  return a.schedule == b.schedule && a.virtual_stages == b.virtual_stages && a.microbatch == b.microbatch;
}

}  // namespace

compiler::ParallelPlan RunningPlan(const config::TrainConfig& cfg, const dist::MeshShape& mesh) {
  compiler::ParallelPlan p;
  p.dp_replicate = mesh.dp_replicate;
  p.dp_shard = mesh.dp_shard;
  p.tp = mesh.tp;
  p.pp = static_cast<int>(std::max<int64_t>(1, cfg.mesh.pp));
  if (p.pp > 1) {
    p.schedule = KindOf(cfg.pipeline.schedule);
    p.virtual_stages = static_cast<int>(std::max<int64_t>(1, cfg.pipeline.virtual_stages));
    p.microbatches = static_cast<int>(cfg.training.grad_accum);
    p.microbatch = cfg.data.batch_size;
  } else {
    // A data parallel rank's step as one batch: the search has no gradient accumulation outside
    // pipelines (its memory is then an over-estimate).
    p.microbatch = cfg.data.batch_size * cfg.training.grad_accum;
  }
  switch (cfg.training.activation_checkpointing) {
    case config::ActivationCheckpointing::kAuto: p.checkpoint_every = -1; break;
    case config::ActivationCheckpointing::kNone: p.checkpoint_every = 0; break;
    case config::ActivationCheckpointing::kAll: p.checkpoint_every = 1; break;
    case config::ActivationCheckpointing::kSelective:
      p.checkpoint_every = static_cast<int>(std::max<int64_t>(2, cfg.training.checkpoint_every));
      break;
  }
  p.reshard_after_forward = cfg.fsdp.reshard_after_forward;
  return p;
}

compiler::SearchSpec RunningSearch(const config::TrainConfig& cfg, const compiler::ParallelPlan& running) {
  compiler::SearchSpec spec;
  spec.config = cfg.model.dims;
  spec.seq_len = cfg.data.seq_len;
  spec.gpus = running.dp_replicate * running.dp_shard * running.tp * running.pp;
  const int64_t dp = running.dp_replicate * running.dp_shard;
  spec.global_batch = running.pp > 1 ? dp * running.microbatch * running.microbatches : dp * running.microbatch;
  // Advice names the plan; the compiled planner's own choices are the trainer's when it runs it.
  spec.plan_choice_in_full = false;
  return spec;
}

Result<PlanAdvice> AdvisePlan(const compiler::HardwareProfile& profile, const compiler::SearchSpec& spec,
                              const compiler::ParallelPlan& running, double measured_step_seconds) {
  if (!(measured_step_seconds > 0)) {
    return InvalidConfig("plan advice: the measured step of " + Fixed(measured_step_seconds, 6) + " s is not a time");
  }
  PlanAdvice a;
  a.running = running;
  a.measured_step_seconds = measured_step_seconds;
  a.profile_mfu = profile.achieved_mfu;
  auto step_at = [&](double mfu) -> Result<double> {
    compiler::HardwareProfile p = profile;
    p.achieved_mfu = mfu;
    MW_ASSIGN_OR_RETURN(const compiler::PlanScore s, compiler::ScorePlan(p, spec, running));
    return s.step_seconds;
  };
  MW_ASSIGN_OR_RETURN(a.predicted_at_profile_seconds, step_at(profile.achieved_mfu));
  // The predicted step falls as the compute rate rises: bisect on log(mfu) within [min, 1].
  MW_ASSIGN_OR_RETURN(const double slowest, step_at(kMinFittedMfu));
  MW_ASSIGN_OR_RETURN(const double fastest, step_at(1.0));
  if (measured_step_seconds >= slowest) {
    a.fitted_mfu = kMinFittedMfu;
    a.fit_at_bound = true;
  } else if (measured_step_seconds <= fastest) {
    a.fitted_mfu = 1.0;
    a.fit_at_bound = true;
  } else {
    double lo = std::log(kMinFittedMfu), hi = 0;
    for (int i = 0; i < 30; ++i) {
      const double mid = 0.5 * (lo + hi);
      MW_ASSIGN_OR_RETURN(const double step, step_at(std::exp(mid)));
      (step > measured_step_seconds ? lo : hi) = mid;
    }
    a.fitted_mfu = std::exp(0.5 * (lo + hi));
  }
  compiler::HardwareProfile fitted = profile;
  fitted.achieved_mfu = a.fitted_mfu;
  MW_ASSIGN_OR_RETURN(a.running_at_fit_seconds, step_at(a.fitted_mfu));
  MW_ASSIGN_OR_RETURN(const compiler::PlanSearch search, compiler::SearchPlans(fitted, spec));
  a.best = search.chosen();
  a.speedup = a.running_at_fit_seconds / a.best.simulated->step_seconds;
  a.advised = a.speedup >= kAdviseSpeedup && !SamePlan(a.best.plan, running);
  if (a.advised) a.best_keys = compiler::PlanConfigYaml(a.best.plan, spec.seq_len, spec.global_batch);
  return a;
}

std::string DescribeAdvice(const PlanAdvice& a) {
  std::ostringstream s;
  s << "plan advice: the running plan (" << compiler::Describe(a.running) << ") measured "
    << Fixed(a.measured_step_seconds, 4) << " s a step, predicted " << Fixed(a.predicted_at_profile_seconds, 4)
    << " s at the profile's MFU " << Fixed(a.profile_mfu, 3) << "; refitted MFU " << Fixed(a.fitted_mfu, 4);
  if (a.fit_at_bound) {
    s << (a.fitted_mfu >= 1.0 ? " (at the bound: faster than the profile's peak and links predict)"
                              : " (at the bound: the compute rate alone does not explain the step)");
  }
  if (a.advised) {
    std::string keys = a.best_keys;
    while (!keys.empty() && keys.back() == '\n') keys.pop_back();
    for (auto at = keys.find('\n'); at != std::string::npos; at = keys.find('\n', at)) keys.replace(at, 1, "; ");
    s << "; another plan is predicted x" << Fixed(a.speedup, 2) << " as fast at the refitted rate: "
      << compiler::Describe(a.best.plan) << ", " << Fixed(a.best.simulated->step_seconds, 4) << " s against "
      << Fixed(a.running_at_fit_seconds, 4) << " s; its keys: " << keys
      << " (mesh: auto plans the next gang with the refitted rate)";
  } else if (SamePlan(a.best.plan, a.running)) {
    s << "; the running plan is the search's best at the refitted rate";
  } else {
    s << "; the search's best at the refitted rate, " << compiler::Describe(a.best.plan) << ", is predicted x"
      << Fixed(a.speedup, 2) << " as fast, under x" << Fixed(kAdviseSpeedup, 2) << ": the plan stays";
  }
  return s.str();
}

}  // namespace meshwork::train
