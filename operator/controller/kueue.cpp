#include "operator/controller/kueue.h"

#include <algorithm>
#include <map>
#include <set>

#include "operator/controller/decide.h"
#include "operator/controller/desired.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

const json* FindCondition(const json& status, const std::string& type) {
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array()) return nullptr;
  for (const auto& c : status["conditions"]) {
    if (c.is_object() && c.value("type", "") == type) return &c;
  }
  return nullptr;
}

// The job's SetCondition, plus metav1.Condition's observedGeneration (the Workload's).
bool Set(json& status, const std::string& type, const std::string& value, const std::string& reason,
         const std::string& message, SystemTime now, int64_t generation) {
  if (!SetCondition(status, type, value, reason, message, now)) return false;
  for (auto& c : status["conditions"]) {
    if (c.value("type", "") == type) c["observedGeneration"] = generation;
  }
  return true;
}

}  // namespace

k8s::ResourceRef KueueWorkloads() { return k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloads"); }
k8s::ResourceRef KueueResourceFlavors() {
  return k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "resourceflavors", /*namespaced=*/false);
}

k8s::ResourceRef KueueWorkloadPriorityClasses() {
  return k8s::resources::Custom("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", /*namespaced=*/false);
}
k8s::ResourceRef PriorityClasses() {
  return k8s::resources::Custom("scheduling.k8s.io", "v1", "priorityclasses", /*namespaced=*/false);
}

json WorkloadPriorityClassRef(const json& job, const json& pod) {
  const json labels = job.value("metadata", json::object()).value("labels", json::object());
  if (labels.contains(kKueuePriorityClassLabel) && labels[kKueuePriorityClassLabel].is_string() &&
      !labels[kKueuePriorityClassLabel].get<std::string>().empty()) {
    return {{"group", "kueue.x-k8s.io"}, {"kind", "WorkloadPriorityClass"}, {"name", labels[kKueuePriorityClassLabel]}};
  }
  const json pod_spec = pod.value("spec", json::object());
  if (pod_spec.contains("priorityClassName") && pod_spec["priorityClassName"].is_string() &&
      !pod_spec["priorityClassName"].get<std::string>().empty()) {
    return {{"group", "scheduling.k8s.io"}, {"kind", "PriorityClass"}, {"name", pod_spec["priorityClassName"]}};
  }
  return nullptr;
}

std::vector<std::string> AdmittedFlavors(const json& workload) {
  std::set<std::string> names;
  const json admission = workload.value("status", json::object()).value("admission", json::object());
  for (const json& assignment : admission.value("podSetAssignments", json::array())) {
    if (!assignment.is_object()) continue;
    const json assigned = assignment.value("flavors", json::object());  // (items() of a temporary dangles)
    for (const auto& [resource, flavor] : assigned.items()) {
      if (flavor.is_string()) names.insert(flavor.get<std::string>());
    }
  }
  return {names.begin(), names.end()};
}

Result<json> PlaceOnFlavors(json pod, const std::vector<json>& flavors) {
  json& spec = pod["spec"];
  if (!spec["nodeSelector"].is_object()) spec["nodeSelector"] = json::object();
  if (!spec["tolerations"].is_array()) spec["tolerations"] = json::array();
  json& selector = spec["nodeSelector"];
  json& tolerations = spec["tolerations"];
  std::map<std::string, std::string> set_by;  // label -> which flavor set it
  for (const json& flavor : flavors) {
    const std::string name = flavor.value("metadata", json::object()).value("name", "");
    const json fspec = flavor.value("spec", json::object());
    const json node_labels = fspec.value("nodeLabels", json::object());
    for (const auto& [label, value] : node_labels.items()) {
      if (selector.contains(label) && selector[label] != value) {
        const std::string other = set_by.count(label) ? "ResourceFlavor " + set_by[label] : "the Pod template's nodeSelector";
        return InvalidConfig("ResourceFlavor " + name + " places the gang on nodes with " + label + "=" +
                             value.dump() + ", but " + other + " asks for " + label + "=" + selector[label].dump() +
                             ": no node can have both");
      }
      selector[label] = value;
      set_by[label] = name;
    }
    for (const json& toleration : fspec.value("tolerations", json::array())) {
      if (std::find(tolerations.begin(), tolerations.end(), toleration) == tolerations.end()) {
        tolerations.push_back(toleration);
      }
    }
  }
  if (selector.empty()) spec.erase("nodeSelector");
  if (tolerations.empty()) spec.erase("tolerations");
  return pod;
}

std::string KueueQueue(const json& job) {
  const json labels = job.value("metadata", json::object()).value("labels", json::object());
  if (!labels.is_object() || !labels.contains(kKueueQueueLabel) || !labels[kKueueQueueLabel].is_string()) return "";
  return labels[kKueueQueueLabel].get<std::string>();
}

std::string PrebuiltWorkload(const json& job) {
  const json labels = job.value("metadata", json::object()).value("labels", json::object());
  const json value = labels.value(kKueuePrebuiltWorkloadLabel, json(""));
  return value.is_string() ? value.get<std::string>() : "";
}

std::string WorkloadName(const json& job) {
  const std::string prebuilt = PrebuiltWorkload(job);
  return prebuilt.empty() ? "trainingjob-" + job["metadata"].value("name", "") : prebuilt;
}

json DesiredWorkload(const json& job, const JobSpec& spec, const json& pod) {
  const json& meta = job["metadata"];
  json tmpl_spec = pod.value("spec", json::object());
  for (const char* k : {"schedulingGates", "schedulingGroup", "hostname", "subdomain", "nodeName"}) tmpl_spec.erase(k);
  json tmpl = {{"metadata", {{"labels", pod["metadata"].value("labels", json::object())}}}, {"spec", tmpl_spec}};
  json workload = {{"apiVersion", kKueueApiVersion},
                   {"kind", "Workload"},
                   {"metadata",
                    {{"name", WorkloadName(job)},
                     {"namespace", meta.value("namespace", "default")},
                     {"labels", {{kKueueJobUidLabel, meta.value("uid", "")}}},
                     {"ownerReferences", json::array({OwnerReference(job)})}}},
                   {"spec",
                    {{"queueName", KueueQueue(job)},
                     {"podSets", json::array({{{"name", kKueuePodSetName}, {"count", spec.replicas}, {"template", tmpl}}})}}}};
  // An elastic job may be admitted smaller (Kueue's partial admission, on by default since v0.5):
  // Kueue then assigns the largest count down to minCount that fits, and the gang runs at it.
  if (spec.elastic && spec.elastic->min_replicas < spec.replicas) {
    workload["spec"]["podSets"][0]["minCount"] = spec.elastic->min_replicas;
  }
  const json annotations = pod["metadata"].value("annotations", json::object());
  json request = json::object();
  if (annotations.contains(kKueueRequiredTopology)) request["required"] = annotations[kKueueRequiredTopology];
  if (annotations.contains(kKueuePreferredTopology)) request["preferred"] = annotations[kKueuePreferredTopology];
  if (annotations.value(kKueueUnconstrainedTopology, json("")) == "true") request["unconstrained"] = true;
  if (!request.empty()) {
    request["podIndexLabel"] = kIndexLabel;
    workload["spec"]["podSets"][0]["topologyRequest"] = request;
  }
  return workload;
}

bool AdmittedByTopology(const json& workload) {
  const json admission = workload.value("status", json::object()).value("admission", json::object());
  for (const json& assignment : admission.value("podSetAssignments", json::array())) {
    if (assignment.is_object() && assignment.contains("topologyAssignment") && !assignment["topologyAssignment"].is_null()) {
      return true;
    }
  }
  return false;
}

json GateForTopology(json pod, const std::string& workload_name) {
  pod["metadata"]["labels"][kKueuePodSetLabel] = kKueuePodSetName;
  pod["metadata"]["annotations"][kKueueWorkloadAnnotation] = workload_name;
  json& gates = pod["spec"]["schedulingGates"];
  if (!gates.is_array()) gates = json::array();
  gates.push_back({{"name", kKueueTopologyGate}});
  return pod;
}

WorkloadState ReadWorkload(const json& workload) {
  WorkloadState s;
  const json status = workload.value("status", json::object());
  s.has_admission = status.is_object() && status.contains("admission") && !status["admission"].is_null();
  s.admitted = s.has_admission && ConditionTrue(status, "Admitted");
  s.evicted = ConditionTrue(status, "Evicted");
  s.finished = ConditionTrue(status, "Finished");
  if (s.has_admission) {
    const json assignments = status["admission"].value("podSetAssignments", json::array());
    if (assignments.is_array() && !assignments.empty() && assignments[0].contains("count") &&
        assignments[0]["count"].is_number_integer()) {
      s.admitted_count = assignments[0]["count"].get<int>();
    }
  }
  const std::string name = workload["metadata"].value("name", "");
  const std::string queue = workload.value("spec", json::object()).value("queueName", "");
  if (s.evicted) {
    const json* c = FindCondition(status, "Evicted");
    s.why = "evicted by Kueue (" + c->value("reason", "") + "): " + c->value("message", "") + "; Workload " + name +
            " waits in LocalQueue " + queue + " to be admitted again";
  } else if (!s.admitted) {
    const json* pending = FindCondition(status, "QuotaReserved");
    s.why = "queued by Kueue in LocalQueue " + queue + ": Workload " + name + " is not admitted yet" +
            (pending && !pending->value("message", "").empty() ? " (" + pending->value("message", "") + ")" : "");
  }
  return s;
}

std::optional<json> ClearAdmission(const json& workload, SystemTime now) {
  json updated = workload;
  json& status = updated["status"];
  if (!status.is_object()) status = json::object();
  const json* evicted = FindCondition(status, "Evicted");
  const std::string reason = evicted ? evicted->value("reason", "") : "";
  const std::string message = evicted ? evicted->value("message", "") : "the job stopped";
  const int64_t generation = workload["metadata"].value("generation", int64_t{0});
  bool changed = false;
  if (reason == "Preempted" || reason == "NodeFailures") {
    changed = Set(status, "Requeued", "True", reason, message, now, generation) || changed;
  }
  changed = Set(status, "QuotaReserved", "False", "Pending", message, now, generation) || changed;
  if (status.contains("admission")) {
    status.erase("admission");
    changed = true;
  }
  if (ConditionTrue(status, "Admitted")) {
    changed = Set(status, "Admitted", "False", "NoReservation", "The workload has no reservation", now, generation) ||
              changed;
  }
  if (!changed) return std::nullopt;
  return updated;
}

std::optional<json> FinishWorkload(const json& workload, bool succeeded, const std::string& message,
                                   SystemTime now) {
  if (ConditionTrue(workload.value("status", json::object()), "Finished")) return std::nullopt;
  json updated = workload;
  if (!updated.contains("status") || !updated["status"].is_object()) updated["status"] = json::object();
  Set(updated["status"], "Finished", "True", succeeded ? "Succeeded" : "Failed", message, now,
      workload["metadata"].value("generation", int64_t{0}));
  return updated;
}

}  // namespace meshwork::op
