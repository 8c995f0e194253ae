#include "operator/controller/plan_choice.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "trainer/compiler/plan_estimate.h"
#include "trainer/compiler/plan_search.h"
#include "trainer/config/hardware.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

using compiler::plan::Fixed;

double Rounded(double v, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

std::string GiB(int64_t bytes) { return Fixed(compiler::plan::GiB(bytes), 1); }

// PlanConfigYaml's maps of scalars as --set pairs: "mesh: {tp: 2}" is mesh.tp=2.
Result<std::vector<std::string>> AsOverrides(const std::string& yaml) {
  std::vector<std::string> out;
  try {
    const YAML::Node root = YAML::Load(yaml);
    for (const auto& section : root) {
      const std::string top = section.first.as<std::string>();
      for (const auto& key : section.second) {
        out.push_back(top + "." + key.first.as<std::string>() + "=" + key.second.as<std::string>());
      }
    }
  } catch (const YAML::Exception& e) {
    return Internal("spec.mesh.auto: the plan's config keys do not parse (" + std::string(e.what()) + "):\n" + yaml);
  }
  return out;
}

std::string Checkpointing(int every) {
  switch (every) {
    case -1: return "auto";
    case 0: return "none";
    case 1: return "all";
    default: return "every " + std::to_string(every);
  }
}

json Predicted(const compiler::PlanScore& s, const compiler::HardwareProfile& profile) {
  json p = {{"stepSeconds", Rounded(s.step_seconds, 6)},
            {"tokensPerSecondPerRank", Rounded(s.tokens_per_second, 1)},
            {"mfu", Rounded(s.mfu, 4)},
            {"peakMemoryBytes", s.peak_bytes},
            {"deviceMemoryBytes", profile.memory_bytes}};
  if (s.bubble > 0) p["bubble"] = Rounded(s.bubble, 4);
  return p;
}

Result<AdmissionPlan> ChoosePlan(const config::TrainConfig& cfg, const JobSpec& spec, int64_t global_batch,
                                 const json& calibration) {
  const int world = spec.WorldSize();
  MW_ASSIGN_OR_RETURN(compiler::HardwareProfile profile,
                      [&]() -> Result<compiler::HardwareProfile> {
                        auto p = config::MeshProfile(cfg, spec.gpu, spec.processes_per_replica);
                        if (!p.ok()) return InvalidConfig("spec.mesh.auto: no hardware profile to plan with: " + p.status().message());
                        return p;
                      }());
  // A compute rate a gang of this job measured on this profile (status.calibration) replaces the
  // profile's: the plan is then chosen for what the job's ranks reach, not what the profile assumes.
  const double profile_mfu = profile.achieved_mfu;
  bool calibrated = false;
  if (calibration.is_object() && calibration.value("hardwareProfile", "") == profile.name) {
    const double mfu = calibration.value("achievedMfu", 0.0);
    if (mfu > 0 && mfu <= 1) {
      profile.achieved_mfu = mfu;
      calibrated = true;
    }
  }
  compiler::SearchSpec search;
  search.config = cfg.model.dims;
  search.seq_len = cfg.data.seq_len;
  search.global_batch = global_batch;
  search.gpus = world;
  // Pipelines need point-to-point transfers, which Meshwork's NCCL communicator lacks (the CRD
  // and ParseSpec refuse pp > 1 on GPUs for the same reason).
  if (spec.gpu) search.pp = 1;
  // Time counts in a reconcile: the compiled planner of each finalist, and of the choice, is
  // the trainer's to run when it starts (fsdp.mode: compiled).
  search.plan_choice_in_full = false;
  auto found = compiler::SearchPlans(profile, search);
  if (!found.ok()) {
    return InvalidConfig("spec.mesh.auto: no plan of " + std::to_string(world) + " ranks (" +
                         std::to_string(spec.replicas) + " replicas x " + std::to_string(spec.processes_per_replica) +
                         " processes) on " + profile.name + " for " + std::to_string(global_batch) +
                         " sequences a step: " + found.status().message());
  }
  const compiler::PlanSearch& r = *found;
  const compiler::PlanCandidate& best = r.chosen();
  const compiler::ParallelPlan& p = best.plan;
  const compiler::PlanScore& score = *best.simulated;

  AdmissionPlan out;
  MW_ASSIGN_OR_RETURN(out.overrides, AsOverrides(compiler::PlanConfigYaml(p, cfg.data.seq_len, global_batch)));
  out.mesh.dp_replicate = p.dp_replicate;
  out.mesh.dp_shard = p.dp_shard;
  out.mesh.tp = p.tp;
  out.mesh.pp = p.pp;

  json& s = out.status;
  s["worldSize"] = world;
  s["mesh"] = {{"dpReplicate", p.dp_replicate}, {"dpShard", p.dp_shard}, {"tp", p.tp}, {"pp", p.pp}};
  s["meshShape"] = out.mesh.ToString();
  s["description"] = compiler::Describe(p);
  if (p.pp > 1) {
    s["schedule"] = compiler::pipeline::ScheduleName(p.schedule);
    s["virtualStages"] = p.virtual_stages;
    s["microBatches"] = p.microbatches;
  }
  s["globalBatchSize"] = global_batch;
  s["activationCheckpointing"] = Checkpointing(p.checkpoint_every);
  s["reshardAfterForward"] = p.reshard_after_forward;
  s["hardwareProfile"] = profile.name;
  if (calibrated) {
    s["calibrated"] = {{"achievedMfu", profile.achieved_mfu},
                       {"profileMfu", profile_mfu},
                       {"generation", calibration.value("generation", int64_t{0})}};
  }
  s["predicted"] = Predicted(score, profile);
  s["plansSearched"] = r.enumerated;
  s["searchSeconds"] = Rounded(r.seconds, 3);
  json runners = json::array();
  for (size_t i = 1; i < r.finalists.size() && runners.size() < 3; ++i) {
    const compiler::PlanCandidate& c = r.finalists[i];
    runners.push_back({{"description", compiler::Describe(c.plan)},
                       {"tokensPerSecondPerRank", Rounded(c.simulated->tokens_per_second, 1)},
                       {"stepRatio", Rounded(c.simulated->step_seconds / score.step_seconds, 3)}});
  }
  s["runnersUp"] = runners;

  out.summary = "planned " + compiler::Describe(p) + " for " + std::to_string(world) + " ranks on " + profile.name +
                ": predicted " + Fixed(score.tokens_per_second, 0) + " tokens/s a rank, MFU " +
                Fixed(100 * score.mfu, 1) + "%, peak " + GiB(score.peak_bytes) + " of " + GiB(profile.memory_bytes) +
                " GiB (" + std::to_string(r.enumerated) + " plans searched in " + Fixed(r.seconds, 2) + " s";
  if (calibrated) {
    out.summary += "; at the compute rate gang " + std::to_string(calibration.value("generation", int64_t{0})) +
                   " measured, MFU " + Fixed(profile.achieved_mfu, 3) + " (the profile's " + Fixed(profile_mfu, 3) + ")";
  }
  if (r.finalists.size() > 1) {
    out.summary += "; next: " + compiler::Describe(r.finalists[1].plan) + ", x" +
                   Fixed(r.finalists[1].simulated->step_seconds / score.step_seconds, 3) + " the step";
  }
  out.summary += ")";
  return out;
}

}  // namespace

Result<AdmissionPlan> PlanGang(const std::string& config_yaml, const JobSpec& spec, const std::string& ns,
                               const std::string& name, int64_t elastic_global, const json& calibration,
                               json* pipeline) {
  const std::vector<std::string> overrides = ValidationOverrides(spec, ns, name);
  auto loaded = config::LoadConfigFromString(config_yaml, overrides);
  if (!loaded.ok()) return InvalidConfig("spec.mesh.auto: the trainer refuses this config: " + loaded.status().message());
  int64_t global = elastic_global;
  if (global == 0) {
    global = loaded->training.global_batch_size > 0
                 ? loaded->training.global_batch_size
                 : loaded->data.batch_size * loaded->training.grad_accum * int64_t{spec.WorldSize()};
  }
  MW_ASSIGN_OR_RETURN(AdmissionPlan chosen, ChoosePlan(*loaded, spec, global, calibration));
  // The plan as the trainer will load it, checked by its own rules.
  std::vector<std::string> planned;
  for (const std::string& o : overrides) {
    if (o != "dist.mesh=auto") planned.push_back(o);
  }
  planned.insert(planned.end(), chosen.overrides.begin(), chosen.overrides.end());
  auto as_run = config::LoadConfigFromString(config_yaml, planned);
  if (!as_run.ok()) {
    return Internal("spec.mesh.auto: the trainer refuses the chosen plan (" + chosen.status.value("description", "") +
                    "): " + as_run.status().message());
  }
  Status stages = CheckPipeline(*as_run, "spec.mesh.auto (the chosen plan)", pipeline);
  if (!stages.ok()) return Internal(stages.message());
  return chosen;
}

}  // namespace meshwork::op
