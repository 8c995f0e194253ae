#include "operator/controller/desired.h"

#include "common/base64.h"
#include "operator/controller/gang.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

json EnvValue(const std::string& name, const std::string& value) { return {{"name", name}, {"value", value}}; }

json EnvField(const std::string& name, const std::string& field_path) {
  return {{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", field_path}}}}}};
}

// Copies `from`'s keys that `to` lacks: where both set a field, the operator's wins. (Lists are
// appended instead, see Append: an env var of the template named like one of the operator's
// comes later and so wins, as in any Pod.)
void AddMissing(json& to, const json& from) {
  if (!from.is_object()) return;
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (!to.contains(it.key())) to[it.key()] = it.value();
  }
}

void Append(json& to, const char* key, const json& from) {
  if (!from.is_object() || !from.contains(key) || !from[key].is_array()) return;
  if (!to.contains(key)) to[key] = json::array();
  for (const auto& v : from[key]) to[key].push_back(v);
}

// spec.template into the Pod: labels and annotations, pod-level fields, the trainer
// container's env and mounts, and any other containers as they are.
void MergeTemplate(json& pod, const JobSpec& spec) {
  const json& tmpl = spec.pod_template;
  if (tmpl.contains("metadata") && tmpl["metadata"].is_object()) {
    const json& tm = tmpl["metadata"];
    for (const char* key : {"labels", "annotations"}) {
      if (!tm.contains(key) || !tm[key].is_object()) continue;
      json& ours = pod["metadata"][key];
      if (ours.is_null()) ours = json::object();
      AddMissing(ours, tm[key]);
    }
  }
  if (!tmpl.contains("spec") || !tmpl["spec"].is_object()) return;
  const json& ts = tmpl["spec"];
  json& ps = pod["spec"];
  for (auto it = ts.begin(); it != ts.end(); ++it) {
    if (it.key() == "containers" || it.key() == "volumes") continue;
    if (!ps.contains(it.key())) ps[it.key()] = it.value();
  }
  Append(ps, "volumes", ts);
  if (!ts.contains("containers") || !ts["containers"].is_array()) return;
  for (const auto& c : ts["containers"]) {
    if (c.is_object() && c.value("name", "") == kTrainerContainer) {
      json& trainer = ps["containers"][0];
      Append(trainer, "env", c);
      Append(trainer, "volumeMounts", c);
      Append(trainer, "ports", c);
      AddMissing(trainer, c);
    } else {
      ps["containers"].push_back(c);
    }
  }
}

}  // namespace

json ChildMetadata(const json& job, const std::string& name) {
  const json& meta = job["metadata"];
  return {{"name", name},
          {"namespace", meta.value("namespace", "default")},
          {"labels", {{kJobLabel, meta.value("name", "")}}},
          {"ownerReferences", json::array({OwnerReference(job)})}};
}

std::string PodName(const std::string& job, int index) { return job + "-" + std::to_string(index); }

std::string ConfigMapName(const std::string& job) { return job + "-config"; }

std::string RendezvousSecretName(const std::string& job) { return job + "-rendezvous"; }

std::string MasterAddr(const std::string& job, const std::string& ns) {
  return PodName(job, 0) + "." + job + "." + ns + ".svc";
}

json OwnerReference(const json& job) {
  const json& meta = job["metadata"];
  return {{"apiVersion", kApiVersion},
          {"kind", kKind},
          {"name", meta.value("name", "")},
          {"uid", meta.value("uid", "")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

json DesiredService(const json& job, const JobSpec& spec) {
  const std::string name = job["metadata"].value("name", "");
  json svc = {{"apiVersion", "v1"}, {"kind", "Service"}, {"metadata", ChildMetadata(job, name)}};
  json ports = json::array({{{"name", "rendezvous"}, {"port", spec.master_port}, {"protocol", "TCP"}}});
  if (spec.metrics_port > 0) {
    ports.push_back({{"name", "metrics"}, {"port", spec.metrics_port}, {"protocol", "TCP"}});
  }
  svc["spec"] = {{"clusterIP", "None"},
                 {"publishNotReadyAddresses", true},
                 {"selector", {{kJobLabel, name}}},
                 {"ports", ports}};
  return svc;
}

json DesiredConfigMap(const json& job, const JobSpec& spec) {
  const std::string name = job["metadata"].value("name", "");
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", ChildMetadata(job, ConfigMapName(name))},
          {"data", {{kDefaultConfigKey, spec.config_inline}}}};
}

json DesiredRendezvousSecret(const json& job, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", ChildMetadata(job, RendezvousSecretName(job["metadata"].value("name", "")))},
          {"type", "Opaque"},
          {"data", {{kRendezvousTokenKey, Base64Encode(token)}}}};
}

json DesiredPod(const json& job, const JobSpec& spec, int index, int64_t generation) {
  const std::string name = job["metadata"].value("name", "");
  const std::string ns = job["metadata"].value("namespace", "default");
  const std::string master = MasterAddr(name, ns);
  const int nproc = spec.processes_per_replica;
  // mesh: auto: the dims of the plan chosen for this gang; "auto" where none is (yet).
  const bool auto_mesh = spec.mesh.chosen_by_trainer && !spec.planned_mesh;
  const Mesh& mesh = spec.planned_mesh ? *spec.planned_mesh : spec.mesh;

  json env = json::array({
      EnvField("POD_NAME", "metadata.name"),
      EnvField("POD_NAMESPACE", "metadata.namespace"),
      EnvField("POD_IP", "status.podIP"),
      EnvValue("MESHWORK_JOB_NAME", name),
      EnvValue("MASTER_ADDR", master),
      EnvValue("MASTER_PORT", std::to_string(spec.master_port)),
      EnvValue("WORLD_SIZE", std::to_string(spec.WorldSize())),
      // The rank of this Pod's first process; the launcher sets each process's own RANK.
      EnvValue("RANK", std::to_string(index * nproc)),
      EnvValue("NODE_RANK", std::to_string(index)),
      EnvValue("NNODES", std::to_string(spec.replicas)),
      // torchrun reads its flags from PET_* (as Kubeflow's PyTorchJob sets them).
      EnvValue("PET_NNODES", std::to_string(spec.replicas)),
      EnvValue("PET_NPROC_PER_NODE", std::to_string(nproc)),
      EnvValue("PET_NODE_RANK", std::to_string(index)),
      EnvValue("PET_MASTER_ADDR", master),
      EnvValue("PET_MASTER_PORT", std::to_string(spec.master_port)),
      EnvValue("MESHWORK_RESTART_GENERATION", std::to_string(generation)),
      EnvValue("MESHWORK_MESH_DP_REPLICATE", auto_mesh ? "auto" : std::to_string(mesh.dp_replicate)),
      EnvValue("MESHWORK_MESH_DP_SHARD", auto_mesh ? "auto" : std::to_string(mesh.dp_shard)),
      EnvValue("MESHWORK_MESH_TP", auto_mesh ? "auto" : std::to_string(mesh.tp)),
      EnvValue("MESHWORK_MESH_PP", auto_mesh ? "auto" : std::to_string(mesh.pp)),
  });
  const std::string cm_name = spec.config_map_name.empty() ? ConfigMapName(name) : spec.config_map_name;
  const std::string cm_key = spec.config_map_name.empty() ? std::string(kDefaultConfigKey) : spec.config_map_key;
  env.push_back(EnvValue(kConfigFileEnv, kConfigFile));
  // Rank 0's store binds POD_IP and admits only ranks with this job's token.
  env.push_back({{"name", kRendezvousTokenEnv},
                 {"valueFrom", {{"secretKeyRef", {{"name", RendezvousSecretName(name)}, {"key", kRendezvousTokenKey}}}}}});

  json container = {{"name", kTrainerContainer}, {"image", spec.image}, {"env", env}};
  if (!spec.image_pull_policy.empty()) container["imagePullPolicy"] = spec.image_pull_policy;
  if (spec.command.empty()) {
    json cmd = json::array({"meshwork-train", "launch", "--nproc", std::to_string(nproc), "--nnodes",
                            std::to_string(spec.replicas), "--node-rank", std::to_string(index),
                            "--master-addr", master, "--master-port", std::to_string(spec.master_port),
                            "--", "meshwork-train", "train", "--config", kConfigFile});
    for (const auto& o : TrainerOverrides(spec, ns, name, job["metadata"].value("uid", ""))) {
      cmd.push_back("--set");
      cmd.push_back(o);
    }
    for (const auto& a : spec.args) cmd.push_back(a);
    container["command"] = cmd;
  } else {
    container["command"] = spec.command;
    if (!spec.args.empty()) container["args"] = spec.args;
  }
  json resources = spec.resources.is_object() ? spec.resources : json::object();
  if (spec.gpu) {
    json& limits = resources["limits"];
    if (limits.is_null()) limits = json::object();
    if (!limits.contains("nvidia.com/gpu")) limits["nvidia.com/gpu"] = nproc;
  }
  if (!resources.empty()) container["resources"] = resources;
  json ports = json::array({{{"name", "rendezvous"}, {"containerPort", spec.master_port}, {"protocol", "TCP"}}});
  if (spec.metrics_port > 0) {
    // Local rank i serves /metrics on metricsPort + i: one named port each (`metrics`, then
    // `metrics-1`, ...), so that a PodMonitor or kubernetes_sd finds every process.
    for (int i = 0; i < nproc; ++i) {
      ports.push_back({{"name", i == 0 ? std::string("metrics") : "metrics-" + std::to_string(i)},
                       {"containerPort", spec.metrics_port + i},
                       {"protocol", "TCP"}});
    }
  }
  container["ports"] = ports;

  // The config as a file: a ConfigMap's data may be 1 MiB, where an environment variable is
  // limited to 128 KiB (MAX_ARG_STRLEN) and a bigger one fails every exec.
  json volumes = json::array({{{"name", kConfigVolume},
                               {"configMap", {{"name", cm_name}, {"items", {{{"key", cm_key}, {"path", kDefaultConfigKey}}}}}}}});
  json mounts = json::array({{{"name", kConfigVolume}, {"mountPath", kConfigDir}, {"readOnly", true}}});
  if (spec.checkpoint_path && !spec.checkpoint_volume.is_null()) {
    json volume = spec.checkpoint_volume;
    volume["name"] = "checkpoints";
    volumes.push_back(volume);
    mounts.push_back({{"name", "checkpoints"}, {"mountPath", *spec.checkpoint_path}});
  }
  container["volumeMounts"] = mounts;
  json pod_spec = {{"restartPolicy", "Never"},
                   {"hostname", PodName(name, index)},
                   {"subdomain", name},
                   {"containers", json::array({container})},
                   {"volumes", volumes}};

  json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", ChildMetadata(job, PodName(name, index))}};
  pod["metadata"]["labels"][kIndexLabel] = std::to_string(index);
  pod["metadata"]["labels"][kGenerationLabel] = std::to_string(generation);
  pod["metadata"]["labels"][kWorldSizeLabel] = std::to_string(spec.WorldSize());
  pod["metadata"]["labels"][kMeshLabel] = spec.mesh.ToString();
  pod["spec"] = pod_spec;
  MergeTemplate(pod, spec);
  // A failed rank's termination message is the tail of its log unless the template says
  // otherwise: the trainer's last lines say why it failed, and failurePolicy rules match them.
  json& trainer = pod["spec"]["containers"][0];
  if (!trainer.contains("terminationMessagePolicy")) trainer["terminationMessagePolicy"] = "FallbackToLogsOnError";
  return pod;
}

}  // namespace meshwork::op
