// TrainingRuntime: a cluster-scoped set of defaults (image, device, processes per Pod, resources,
// Pod template, trainer config, run policy) that a TrainingJob names in spec.runtimeRef, so that
// a platform team sets them once and a job says only what is its own: the model, the data, the
// size (docs/trainingjob.md, "Runtimes"). The operator merges the runtime's spec under the job's
// on every reconcile, then parses the result as any job's spec.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "operator/k8s/object_api.h"
#include "operator/k8s/resource.h"

namespace meshwork::op {

inline constexpr const char* kRuntimeKind = "TrainingRuntime";
inline constexpr const char* kRuntimePlural = "trainingruntimes";
// meshwork.dev/v1alpha1 trainingruntimes, cluster-scoped.
k8s::ResourceRef Runtimes();

// spec.runtimeRef.name of `job`, "" when it names none (or the field is malformed: ParseSpec
// says so).
std::string RuntimeName(const nlohmann::json& job);

// `job` with `runtime`'s spec merged under its own spec. Per field, the job's value wins:
//   image, imagePullPolicy, device, processesPerReplica, metricsPort: the job's when set;
//   resources, checkpoint, runPolicy: merged key by key (RFC 7386: objects recursively, a list
//     such as failurePolicy.rules or permanentExitCodes replaced whole);
//   template: MergePodTemplates;
//   config: the runtime's `inline` config under the job's inline config, merged key by key
//     (config::MergeYaml); the runtime's alone when the job has none. A job that reads its
//     config from a ConfigMap and a runtime with a config do not combine: InvalidConfig.
// Errors name the field: `spec.config.configMapRef: ...`.
Result<nlohmann::json> ApplyRuntime(const nlohmann::json& job, const nlohmann::json& runtime);

// `overlay` (a job's spec.template) on top of `base` (a runtime's): labels, annotations and the
// Pod spec's objects merged key by key (the overlay's value wins), lists replaced, except
// volumes and containers, matched by name (a container's env and ports by name, its
// volumeMounts by mountPath), the overlay's entry winning and the rest kept.
nlohmann::json MergePodTemplates(const nlohmann::json& base, const nlohmann::json& overlay);

// A job's spec merged with its TrainingRuntime for one reconcile (RuntimeCopies::Merge).
struct RuntimeMerge {
  nlohmann::json job;              // merged (the job as it is when it names no runtime)
  std::optional<Status> error;     // the merge is wrong (InvalidConfig naming the field)
  std::optional<std::string> wait;  // the runtime cannot be read and no copy of it is held
  std::string not_found;           // RuntimeNotFound's message: gone, the held copy used instead
};

// The last copy of each job's TrainingRuntime the operator merged, so that a job whose runtime is
// deleted goes on with it (as a Pod goes on when its ConfigMap is deleted): its gang's end, a
// failure, a suspension or the deadline are still decided. In this process only: a restarted
// operator has no copy, and the job waits. Thread-safe.
class RuntimeCopies {
 public:
  // `job` merged with the runtime it names, read through `api`; `now` stamps the copy kept.
  RuntimeMerge Merge(k8s::ObjectApi* api, const std::string& key, const nlohmann::json& job, const std::string& now);
  void Forget(const std::string& key);

 private:
  struct Copy {
    std::string job_uid, name, read_at;
    nlohmann::json runtime;
  };
  std::mutex mu_;
  std::map<std::string, Copy> copies_;  // job key -> its runtime as last merged
};

}  // namespace meshwork::op
