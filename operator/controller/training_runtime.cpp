#include "operator/controller/training_runtime.h"

#include "operator/controller/spec.h"
#include "trainer/config/config.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

// Objects merged key by key (the overlay wins), anything else replaced (RFC 7386 without its
// null-deletes: a null in a job's spec means "unset", not "remove the runtime's").
json MergeObjects(const json& base, const json& overlay) {
  if (!base.is_object() || !overlay.is_object()) return overlay.is_null() ? base : overlay;
  json out = base;
  for (auto it = overlay.begin(); it != overlay.end(); ++it) {
    if (it->is_null()) continue;
    out[it.key()] = out.contains(it.key()) ? MergeObjects(out[it.key()], *it) : *it;
  }
  return out;
}

// Lists of objects matched by `key`: base's entries in order, each replaced (or, with `deep`,
// merged) by the overlay's entry of the same key; the overlay's other entries after them.
json MergeByKey(const json& base, const json& overlay, const char* key, bool deep,
                json (*merge_entry)(const json&, const json&) = nullptr) {
  if (!base.is_array()) return overlay.is_array() ? overlay : base;
  if (!overlay.is_array()) return base;
  json out = json::array();
  std::vector<bool> used(overlay.size(), false);
  for (const auto& b : base) {
    json entry = b;
    for (size_t i = 0; i < overlay.size(); ++i) {
      const json& o = overlay[i];
      if (used[i] || !b.is_object() || !o.is_object() || !b.contains(key) || b[key] != o.value(key, json())) continue;
      entry = !deep ? o : merge_entry ? merge_entry(b, o) : MergeObjects(b, o);
      used[i] = true;
      break;
    }
    out.push_back(entry);
  }
  for (size_t i = 0; i < overlay.size(); ++i) {
    if (!used[i]) out.push_back(overlay[i]);
  }
  return out;
}

json MergeContainer(const json& base, const json& overlay) {
  json out = MergeObjects(base, overlay);
  out["env"] = MergeByKey(base.value("env", json()), overlay.value("env", json()), "name", false);
  out["ports"] = MergeByKey(base.value("ports", json()), overlay.value("ports", json()), "name", false);
  out["volumeMounts"] =
      MergeByKey(base.value("volumeMounts", json()), overlay.value("volumeMounts", json()), "mountPath", false);
  for (const char* k : {"env", "ports", "volumeMounts"}) {
    if (out[k].is_null()) out.erase(k);
  }
  return out;
}

}  // namespace

k8s::ResourceRef Runtimes() { return k8s::resources::Custom(kGroup, kVersion, kRuntimePlural, /*namespaced=*/false); }

std::string RuntimeName(const json& job) {
  const json spec = job.value("spec", json::object());
  if (!spec.is_object() || !spec.contains("runtimeRef") || !spec["runtimeRef"].is_object()) return "";
  const json& ref = spec["runtimeRef"];
  return ref.contains("name") && ref["name"].is_string() ? ref["name"].get<std::string>() : "";
}

json MergePodTemplates(const json& base, const json& overlay) {
  if (!base.is_object()) return overlay;
  if (!overlay.is_object()) return base;
  json out = base;
  if (overlay.contains("metadata")) out["metadata"] = MergeObjects(base.value("metadata", json()), overlay["metadata"]);
  if (!overlay.contains("spec") || !overlay["spec"].is_object()) return out;
  const json base_value = base.value("spec", json::object());
  const json base_spec = base_value.is_object() ? base_value : json::object();  // free-form: may be anything
  const json& over_spec = overlay["spec"];
  json spec = base_spec;
  for (auto it = over_spec.begin(); it != over_spec.end(); ++it) {
    if (it.key() == "containers") {
      spec["containers"] = MergeByKey(base_spec.value("containers", json()), *it, "name", true, MergeContainer);
    } else if (it.key() == "initContainers") {
      spec["initContainers"] = MergeByKey(base_spec.value("initContainers", json()), *it, "name", true, MergeContainer);
    } else if (it.key() == "volumes") {
      spec["volumes"] = MergeByKey(base_spec.value("volumes", json()), *it, "name", false);
    } else {
      spec[it.key()] = spec.contains(it.key()) ? MergeObjects(spec[it.key()], *it) : *it;
    }
  }
  out["spec"] = spec;
  return out;
}

Result<json> ApplyRuntime(const json& job, const json& runtime) {
  const std::string name = runtime.value("metadata", json::object()).value("name", "");
  const json rt = runtime.value("spec", json::object());
  if (!rt.is_object()) return InvalidConfig("TrainingRuntime " + name + ": spec must be an object");
  json out = job;
  json& spec = out["spec"];
  if (!spec.is_object()) return out;  // ParseSpec names the problem
  for (const char* key : {"image", "imagePullPolicy", "device", "processesPerReplica", "metricsPort"}) {
    if (rt.contains(key) && (!spec.contains(key) || spec[key].is_null())) spec[key] = rt[key];
  }
  for (const char* key : {"resources", "checkpoint", "runPolicy"}) {
    if (rt.contains(key)) spec[key] = MergeObjects(rt[key], spec.value(key, json()));
  }
  // A volume source names one type: the job's replaces the runtime's whole (nfs over a PVC).
  const json job_checkpoint = job["spec"].value("checkpoint", json());
  if (job_checkpoint.is_object() && job_checkpoint.contains("volume") && !job_checkpoint["volume"].is_null()) {
    spec["checkpoint"]["volume"] = job_checkpoint["volume"];
  }
  if (rt.contains("template")) spec["template"] = MergePodTemplates(rt["template"], spec.value("template", json()));
  const json rt_config = rt.value("config", json::object());
  if (rt_config.is_object() && rt_config.contains("inline") && rt_config["inline"].is_string()) {
    const std::string defaults = rt_config["inline"].get<std::string>();
    json config = spec.value("config", json());
    if (config.is_object() && config.contains("configMapRef") && !config["configMapRef"].is_null()) {
      return InvalidConfig("spec.config.configMapRef: TrainingRuntime " + name +
                           " sets a default config (its spec.config.inline), which the operator merges only "
                           "under an inline config: give this job's config as spec.config.inline");
    }
    if (config.is_object() && config.contains("inline") && config["inline"].is_string()) {
      auto merged = config::MergeYaml(defaults, config["inline"].get<std::string>(),
                                      "TrainingRuntime " + name + " spec.config.inline", "spec.config.inline");
      if (!merged.ok()) return merged.status();
      spec["config"]["inline"] = *merged;
    } else {
      spec["config"] = {{"inline", defaults}};
    }
  }
  return out;
}

RuntimeMerge RuntimeCopies::Merge(k8s::ObjectApi* api, const std::string& key, const nlohmann::json& job,
                                  const std::string& now) {
  RuntimeMerge out;
  out.job = job;
  const std::string runtime = RuntimeName(job);
  if (runtime.empty()) return out;
  const std::string uid = job["metadata"].value("uid", "");
  auto rt = api->Get(Runtimes(), "", runtime);
  if (rt.ok()) {
    auto merged = ApplyRuntime(job, *rt);
    if (!merged.ok()) {
      out.error = merged.status();
      return out;
    }
    out.job = std::move(*merged);
    std::lock_guard<std::mutex> lock(mu_);
    copies_[key] = Copy{uid, runtime, now, *rt};
    return out;
  }
  const std::string why = k8s::IsNotFound(rt.error()) ? "it does not exist" : rt.error().ToString();
  std::optional<Copy> copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = copies_.find(key);
    if (it != copies_.end() && it->second.job_uid == uid && it->second.name == runtime) copy = it->second;
  }
  auto merged = copy ? ApplyRuntime(job, copy->runtime) : Result<nlohmann::json>(NotFound(""));
  if (merged.ok()) {
    out.job = std::move(*merged);
    out.not_found = "TrainingRuntime " + runtime + " (spec.runtimeRef.name): " + why +
                    "; the job goes on with the copy the operator read at " + copy->read_at +
                    " until it is back (an operator restart loses the copy)";
  } else {
    out.wait = k8s::IsNotFound(rt.error()) ? "waiting for TrainingRuntime " + runtime + " (spec.runtimeRef.name): it does not exist"
                                           : "reading TrainingRuntime " + runtime + ": " + rt.error().ToString();
  }
  return out;
}

void RuntimeCopies::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  copies_.erase(key);
}

}  // namespace meshwork::op
