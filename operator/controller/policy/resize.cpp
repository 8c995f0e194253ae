// A resized job (kubectl scale, a new mesh) needs a new gang: the ranks of the old one were
// started with the old shape. With checkpoints on it cannot go on at all (the CRD's CEL rule
// refuses the change where CEL is evaluated): the trainer cannot reshard a checkpoint yet.
#include "operator/controller/policy/policy.h"

namespace meshwork::op::policy {
namespace {

struct ShapeChange {
  std::string from;  // "2 ranks, mesh 1x2x1"
  std::string to;
};

// The first Pod of the current gang started with another world size or mesh than the spec's.
std::optional<ShapeChange> ChangedShape(const JobState& job) {
  const std::string mesh = job.spec.mesh.ToString();
  for (const auto& pod : job.pods) {
    if (pod.generation != job.generation() || pod.world_size < 0) continue;
    if (pod.world_size == job.spec.WorldSize() && (pod.mesh.empty() || pod.mesh == mesh)) continue;
    return ShapeChange{std::to_string(pod.world_size) + " ranks, mesh " + (pod.mesh.empty() ? "?" : pod.mesh),
                       std::to_string(job.spec.WorldSize()) + " ranks, mesh " + mesh};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Decision> ResizeWithCheckpoints(const JobState& job) {
  if (!job.spec.checkpoint_path) return std::nullopt;
  const auto change = ChangedShape(job);
  if (!change) return std::nullopt;
  return InvalidSpec(job.status, job.pods,
                     "spec.replicas/spec.mesh: the gang changed from " + change->from + " to " + change->to +
                         " while checkpoints are on; the trainer cannot reshard a checkpoint yet: create a new "
                         "TrainingJob",
                     job.in.now);
}

std::optional<Decision> Resize(const JobState& job) {
  if (job.spec.checkpoint_path) return std::nullopt;  // ResizeWithCheckpoints
  const auto change = ChangedShape(job);
  if (!change) return std::nullopt;
  const int64_t gen = job.generation() + 1;
  const std::string msg = "the gang changed from " + change->from + " to " + change->to +
                          "; starting a new gang (generation " + std::to_string(gen) + ")";
  Decision d;
  d.status["restartGeneration"] = gen;
  d.conditions = {{"Restarting", "True", "Resized", msg}, {"Running", "False", "Resized", msg}};
  d.events.push_back({"Normal", "Resized", msg});
  d.status_first = true;
  return d;
}

}  // namespace meshwork::op::policy
