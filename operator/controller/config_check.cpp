#include "operator/controller/config_check.h"

#include "operator/controller/desired.h"
#include "operator/controller/trainer_report.h"

namespace meshwork::op {

using nlohmann::json;

namespace {

// spec.mesh.auto, once the config checks: the gang's plan (and the pipeline status of its stages).
void AddPlan(const std::string& config_yaml, const json& job, const JobSpec& spec, const std::string& ns,
             const std::string& name, ConfigCheck& check) {
  if (check.error || !spec.mesh.chosen_by_trainer) return;
  const json calibration = job.value("status", json::object()).value("calibration", json());
  auto plan = PlanGang(config_yaml, spec, ns, name, check.global_batch_size, calibration, &check.pipeline);
  if (!plan.ok()) {
    check.error = plan.status().message();
    return;
  }
  check.plan = std::move(*plan);
}

}  // namespace

// The trainer config problem that makes the job InvalidSpec, if any. A ConfigMap that does not
// exist (yet) is not a spec error: the job waits for it.
ConfigCheck CheckTrainerConfig(k8s::ObjectApi* api, const json& job, const JobSpec& spec) {
  const std::string ns = job["metadata"].value("namespace", "default");
  const std::string name = job["metadata"].value("name", "");
  ConfigCheck check;
  if (spec.config_map_name.empty()) {
    Status s = ValidateTrainerConfig(spec.config_inline, spec, ns, name, "spec.config.inline", &check.pipeline,
                                     &check.global_batch_size);
    if (!s.ok()) check.error = s.message();
    AddPlan(spec.config_inline, job, spec, ns, name, check);
    return check;
  }
  auto cm = api->Get(k8s::resources::ConfigMaps(), ns, spec.config_map_name);
  const std::string field = "spec.config.configMapRef";
  if (!cm.ok()) {
    check.wait = k8s::IsNotFound(cm.error())
                     ? "waiting for ConfigMap " + ns + "/" + spec.config_map_name + " (" + field + ".name)"
                     : "reading ConfigMap " + spec.config_map_name + ": " + cm.error().ToString();
    return check;
  }
  const json data = cm->value("data", json::object());
  if (!data.contains(spec.config_map_key) || !data[spec.config_map_key].is_string()) {
    check.error = field + ".key: ConfigMap " + spec.config_map_name + " has no key \"" + spec.config_map_key + "\"";
    return check;
  }
  const std::string text = data[spec.config_map_key].get<std::string>();
  Status s = ValidateTrainerConfig(text, spec, ns, name,
                                   field + " (ConfigMap " + spec.config_map_name + ", key " + spec.config_map_key +
                                       ")",
                                   &check.pipeline, &check.global_batch_size);
  if (!s.ok()) check.error = s.message();
  AddPlan(text, job, spec, ns, name, check);
  return check;
}

std::optional<FinalReport> ReadFinalReport(k8s::ObjectApi* api, const json& job) {
  k8s::LogOptions log_options;
  log_options.container = kTrainerContainer;
  log_options.tail_lines = 20;
  auto log = api->GetLog(job["metadata"].value("namespace", "default"),
                          PodName(job["metadata"].value("name", ""), 0), log_options);
  if (!log.ok()) return std::nullopt;
  return ParseFinalLine(*log);
}

}  // namespace meshwork::op
