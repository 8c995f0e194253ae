// TrainingRuntime: a cluster-scoped set of defaults (image, device, processes per Pod, resources,
// Pod template, trainer config, run policy) that a TrainingJob names in spec.runtimeRef, so that
// a platform team sets them once and a job says only what is its own: the model, the data, the
// size (docs/trainingjob.md, "Runtimes"). The operator merges the runtime's spec under the job's
// on every reconcile, then parses the result as any job's spec.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
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

}  // namespace meshwork::op
