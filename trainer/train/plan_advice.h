// The running plan judged against the whole plan search, on a cost model refitted to what the
// run measures (issue 49, item 2). After dist.advise_after_steps steps, the compute rate the
// hardware profile assumes (achieved_mfu) is refitted so that the search's prediction for the
// running plan equals its measured step; the search then runs on the refitted profile, and where
// another plan is predicted at least kAdviseSpeedup times as fast, the advice says which, with
// its config keys. The refitted rate goes to metrics (meshwork_trainer_plan_fitted_mfu), where
// the operator reads it and plans the job's next gang with it (mesh: auto).
//
// What is refitted is the compute rate alone: the profile's links are kept (a run measures one
// mesh's links; the others it would need are not measured).
#pragma once

#include <string>

#include "common/status.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/plan_search.h"
#include "trainer/config/config.h"
#include "trainer/dist/device_mesh.h"

namespace meshwork::train {

// Another plan is advised when predicted at least this many times as fast as the running one.
inline constexpr double kAdviseSpeedup = 1.10;

struct PlanAdvice {
  compiler::ParallelPlan running;
  double measured_step_seconds = 0;
  double profile_mfu = 0;                // the profile's achieved_mfu
  double predicted_at_profile_seconds = 0;  // the running plan at the profile
  double fitted_mfu = 0;                 // achieved_mfu at which the prediction is the measured step
  // The fit reached a bound of [kMinFittedMfu, 1]: the compute rate alone cannot explain the step
  // (slower: something else takes the time; faster: the profile's peak or links are too low).
  bool fit_at_bound = false;
  double running_at_fit_seconds = 0;     // the running plan at the refitted profile
  compiler::PlanCandidate best;          // the search's choice at the refitted profile
  double speedup = 1;                    // running_at_fit / best's step
  bool advised = false;                  // speedup >= kAdviseSpeedup and best is another plan
  std::string best_keys;                 // best as config keys (PlanConfigYaml), when advised
};

inline constexpr double kMinFittedMfu = 1e-4;

// The plan `cfg` runs at `mesh` (dp_replicate x dp_shard x tp, resolved) as the search
// describes plans: mesh.pp, the pipeline's schedule and virtual stages, training.grad_accum
// micro-batches of data.batch_size, activation checkpointing, fsdp.reshard_after_forward.
compiler::ParallelPlan RunningPlan(const config::TrainConfig& cfg, const dist::MeshShape& mesh);

// The search's spec for the run: the model, seq_len, the global batch the plan runs (data.batch_size
// x training.grad_accum x data parallel ranks) and its ranks.
compiler::SearchSpec RunningSearch(const config::TrainConfig& cfg, const compiler::ParallelPlan& running);

// Refits `profile`'s achieved_mfu to `measured_step_seconds` for `running`, then searches.
// InvalidConfig when the running plan cannot be scored (the search's spec refuses it), or no plan
// fits the refitted profile.
Result<PlanAdvice> AdvisePlan(const compiler::HardwareProfile& profile, const compiler::SearchSpec& spec,
                              const compiler::ParallelPlan& running, double measured_step_seconds);

// "plan advice: ..." (one line, no newline): the measured and predicted steps, the refit, and the
// advised plan with its keys, or that the running plan is within kAdviseSpeedup of the best.
std::string DescribeAdvice(const PlanAdvice& advice);

}  // namespace meshwork::train
