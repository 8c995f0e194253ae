// The children a TrainingJob should have, as API objects: a headless Service for stable DNS,
// a ConfigMap for an inline trainer config, and one Pod per replica. Pure functions of the job
// and its parsed spec, so every reconcile computes the same names and contents.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "operator/controller/spec.h"

namespace meshwork::op {

// "<job>-<index>": also the Pod's hostname, so rank 0 is <job>-0.<job>.<ns>.svc.
std::string PodName(const std::string& job, int index);
// The ConfigMap the operator writes for spec.config.inline.
std::string ConfigMapName(const std::string& job);
// The Secret holding the job's rendezvous token: "<job>-rendezvous", key "token". Every Pod
// reads it into MESHWORK_RENDEZVOUS_TOKEN; rank 0's store admits only ranks that present it.
std::string RendezvousSecretName(const std::string& job);
inline constexpr const char* kRendezvousTokenKey = "token";
inline constexpr const char* kRendezvousTokenEnv = "MESHWORK_RENDEZVOUS_TOKEN";
// Rank 0's stable DNS name, MASTER_ADDR for every rank.
std::string MasterAddr(const std::string& job, const std::string& ns);

// The controller owner reference to `job` (blockOwnerDeletion: deleting the job cascades).
nlohmann::json OwnerReference(const nlohmann::json& job);

// Headless (clusterIP None), publishNotReadyAddresses so ranks resolve rank 0 before any Pod is
// Ready, selecting the job's Pods, with the rendezvous and metrics ports.
nlohmann::json DesiredService(const nlohmann::json& job, const JobSpec& spec);

// Holds spec.config.inline under key config.yaml.
nlohmann::json DesiredConfigMap(const nlohmann::json& job, const JobSpec& spec);

// The rendezvous Secret with `token` (the caller draws it), owned by the job.
nlohmann::json DesiredRendezvousSecret(const nlohmann::json& job, const std::string& token);

// The metadata of the job's child `name`: its namespace, the job's label, and the controller
// owner reference to the job.
nlohmann::json ChildMetadata(const nlohmann::json& job, const std::string& name);

// Replica `index` of restart generation `generation`: the launcher with --nproc
// processesPerReplica running `meshwork-train train --config /etc/meshwork/config/config.yaml`
// (the config's ConfigMap key, mounted as a configMap volume) and the
// operator's overrides (or spec.command), the rank environment (Meshwork's and torchrun's),
// restartPolicy Never (the operator restarts whole gangs), and spec.template merged in. The gang
// backend marks it when it is created (integration.h, GangBackend::MarkPod).
nlohmann::json DesiredPod(const nlohmann::json& job, const JobSpec& spec, int index, int64_t generation);

}  // namespace meshwork::op
