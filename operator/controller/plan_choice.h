// spec.mesh.auto at admission: the operator chooses the whole parallel plan of a gang (data,
// tensor and pipeline degrees, the schedule and micro-batches, activation checkpointing and
// reshard-after-forward) with the compiler's plan search (trainer/compiler/plan_search.h), for
// the gang's ranks, the trainer config's model and batch, and the hardware profile the config
// names (dist.hardware_profile, else the built-in one for spec.device), and starts the gang with
// the plan as the trainer's config keys. status.plan records it with the prediction; a PlanChosen
// Event says it. A job no plan fits is refused, naming the closest plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "operator/controller/spec.h"
#include "trainer/config/config.h"

namespace meshwork::op {

struct AdmissionPlan {
  std::vector<std::string> overrides;  // the trainer's --set KEY=VALUE pairs (mesh.*, pipeline.*, ...)
  Mesh mesh;                           // the plan's dims
  nlohmann::json status;               // status.plan
  std::string summary;                 // the PlanChosen Event's message
};

// The plan for the gang of `spec` about to start (spec.WorldSize() ranks), from `config_yaml`
// loaded as the gang would (ValidationOverrides), for its global batch: `elastic_global` for an
// elastic job (ValidateTrainerConfig's), else the config's training.global_batch_size, else its
// rows a step with every rank data parallel. Pipelines are left out on GPUs (Meshwork's NCCL
// communicator has no point-to-point transfers). The plan is then loaded with the trainer's own
// rules, and `pipeline`, when given, set to its status.pipeline (null without stages). A job no
// plan fits is InvalidConfig starting with "spec.mesh.auto: "; a plan the trainer refuses is
// Internal (the search's bug). `calibration`, the job's status.calibration (null: none): the
// compute rate (achieved MFU) a running gang refitted to its measured steps (the trainer's plan
// advice) replaces the profile's when it was measured on the same profile; status.plan.calibrated
// and the Event say so.
Result<AdmissionPlan> PlanGang(const std::string& config_yaml, const JobSpec& spec, const std::string& ns,
                               const std::string& name, int64_t elastic_global, const nlohmann::json& calibration,
                               nlohmann::json* pipeline);

}  // namespace meshwork::op
