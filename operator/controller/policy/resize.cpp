// A resized job (kubectl scale, a new mesh) needs a new gang: the ranks of the old one were
// started with the old shape. With checkpoints on, only an elastic job (spec.elasticPolicy) may
// resize: its new gang resumes from the latest checkpoint, which the trainer reshards, at the same
// global batch; any other job's global batch would change with its world size (data.batch_size
// is per rank), so its resize is refused (the CRD's CEL rule refuses the change where CEL is
// evaluated).
#include "operator/controller/policy/policy.h"

#include <algorithm>

namespace meshwork::op::policy {
namespace {

using nlohmann::json;

struct ShapeChange {
  std::string from;  // "2 ranks, mesh 1x2x1"
  std::string to;
  int64_t from_world = 0;
};

// The first Pod of the current gang started with another world size or mesh than the spec's.
std::optional<ShapeChange> ChangedShape(const JobState& job) {
  const std::string mesh = job.spec.mesh.ToString();
  for (const auto& pod : job.pods) {
    if (pod.generation != job.generation() || pod.world_size < 0) continue;
    if (pod.world_size == job.spec.WorldSize() && (pod.mesh.empty() || pod.mesh == mesh)) continue;
    return ShapeChange{std::to_string(pod.world_size) + " ranks, mesh " + (pod.mesh.empty() ? "?" : pod.mesh),
                       std::to_string(job.spec.WorldSize()) + " ranks, mesh " + mesh, pod.world_size};
  }
  return std::nullopt;
}

// The replicas a node loss leaves (status.elastic.shrunkFrom, lostNodes), or spec.replicas with the
// shrink ended once those nodes are Ready again, the cluster has room for the whole gang elsewhere
// (Observed::room_for_spec), or the user changed spec.replicas.
ElasticSize AfterNodeLoss(const Observed& in, const JobSpec& spec, const json& status) {
  ElasticSize size{spec.replicas, std::nullopt};
  if (!spec.elastic) return size;
  const json elastic = status.value("elastic", json::object());
  if (!elastic.is_object() || !elastic.contains("shrunkFrom")) return size;
  const json lost = elastic.value("lostNodes", json::array());
  auto grow = [&](const std::string& why) {
    json next = elastic;
    next.erase("shrunkFrom");
    next.erase("shrunkTo");
    next.erase("lostNodes");
    Decision d;
    d.status["elastic"] = next;
    if (!why.empty()) d.events.push_back({"Normal", "ElasticGrow", why});
    size.decision = std::move(d);
    return size;
  };
  // The user's size wins over the one a node loss left: a scale since then is a resize to it.
  if (IntOr(elastic, "shrunkFrom", -1) != spec.replicas) return grow("");
  std::string names, still_lost;
  for (const auto& node : lost) {
    const std::string name = node.is_string() ? node.get<std::string>() : "";
    std::string& list = in.unhealthy_nodes.count(name) ? still_lost : names;
    list += (list.empty() ? "" : ", ") + name;
  }
  if (!still_lost.empty() && in.room_for_spec) {
    return grow("the cluster has room for spec.replicas " + std::to_string(spec.replicas) + " again (" +
                *in.room_for_spec + ") while node(s) " + still_lost + " stay lost: the job grows back");
  }
  if (!still_lost.empty()) {
    size.replicas = std::clamp<int>(static_cast<int>(IntOr(elastic, "shrunkTo", spec.replicas)),
                                    spec.elastic->min_replicas, spec.replicas);
    // Nothing else may wake the job when the node comes back or room appears (no Pod of it waits).
    Decision look;
    look.requeue_after = std::chrono::seconds(10);
    size.decision = std::move(look);
    return size;
  }
  return grow("node" + std::string(lost.size() == 1 ? " " : "s ") + names + (lost.size() == 1 ? " is" : " are") +
              " back (Ready, schedulable, untainted): the job grows back to spec.replicas " +
              std::to_string(spec.replicas));
}

}  // namespace

std::optional<Decision> ResizeWithCheckpoints(const JobState& job) {
  if (!job.spec.checkpoint_path || job.spec.elastic) return std::nullopt;
  const auto change = ChangedShape(job);
  if (!change) return std::nullopt;
  return InvalidSpec(job.status, job.pods,
                     "spec.replicas/spec.mesh: the gang changed from " + change->from + " to " + change->to +
                         " while checkpoints are on, and without spec.elasticPolicy the global batch would change "
                         "with the world size; set spec.elasticPolicy to resize a job that checkpoints, or create "
                         "a new TrainingJob",
                     job.in.now);
}

std::optional<Decision> Resize(const JobState& job) {
  if (job.spec.checkpoint_path && !job.spec.elastic) return std::nullopt;  // ResizeWithCheckpoints
  const auto change = ChangedShape(job);
  if (!change) return std::nullopt;
  const int64_t gen = job.generation() + 1;
  std::string msg = "the gang changed from " + change->from + " to " + change->to + "; starting a new gang (generation " +
                    std::to_string(gen) + ")";
  Decision d;
  if (job.spec.elastic) {
    const int64_t from = change->from_world / job.spec.processes_per_replica;
    if (job.spec.checkpoint_path) msg += ", which resumes from the latest checkpoint, resharded";
    d.status["elastic"] = WithResize(job.status.value("elastic", json::object()), from, job.spec.replicas, gen, "",
                                     job.in.now);
  }
  d.status["restartGeneration"] = gen;
  d.conditions = {{"Restarting", "True", "Resized", msg}, {"Running", "False", "Resized", msg}};
  d.events.push_back({"Normal", "Resized", msg});
  d.status_first = true;
  return d;
}

json WithResize(json elastic, int64_t from, int64_t to, int64_t generation, const std::string& reason, SystemTime now) {
  elastic["resizes"] = IntOr(elastic, "resizes", 0) + 1;
  elastic["lastResize"] = {{"fromReplicas", from}, {"toReplicas", to}, {"time", FormatTime(now)}, {"generation", generation}};
  if (!reason.empty()) elastic["lastResize"]["reason"] = reason;
  return elastic;
}

ElasticSize ElasticReplicas(const Observed& in, const JobSpec& spec, const json& status) {
  ElasticSize size = AfterNodeLoss(in, spec, status);
  // Kueue admitted fewer Pods than the pod set's count (partial admission, down to minCount).
  if (spec.elastic && in.admitted_replicas) {
    size.replicas = std::min(size.replicas, std::max(*in.admitted_replicas, 1));
  }
  return size;
}

void RecordElastic(const JobSpec& spec, std::optional<int> admitted, json& status) {
  if (!spec.elastic) {
    status.erase("elastic");
    return;
  }
  json& elastic = status["elastic"];
  if (!elastic.is_object()) elastic = json::object();
  elastic["minReplicas"] = spec.elastic->min_replicas;
  elastic["maxReplicas"] = spec.elastic->max_replicas;
  elastic["replicas"] = spec.replicas;
  if (!elastic.contains("resizes")) elastic["resizes"] = 0;
  if (admitted) {
    elastic["admittedReplicas"] = *admitted;
  } else {
    elastic.erase("admittedReplicas");
  }
}

}  // namespace meshwork::op::policy
