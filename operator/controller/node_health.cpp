#include "operator/controller/node_health.h"

#include "operator/controller/gang.h"

namespace meshwork::op {

using nlohmann::json;

std::map<std::string, NodeHealth> UnhealthyNodes(const k8s::Store* nodes, const std::vector<json>& pods,
                                                 const json& lost_nodes, std::chrono::seconds back_after) {
  std::map<std::string, NodeHealth> unhealthy;
  if (nodes == nullptr) return unhealthy;
  for (const auto& pod : pods) {
    const std::string node = pod.value("spec", json::object()).value("nodeName", "");
    if (node.empty() || unhealthy.count(node)) continue;
    const auto cached = nodes->Get(node);
    if (!cached) {
      NodeHealth& h = unhealthy[node];
      h.deleted = true;
      // When the Pod was bound: its PodScheduled condition, else (bound by its spec) its creation.
      const json status = pod.value("status", json::object());
      for (const auto& c : status.value("conditions", json::array())) {
        if (c.is_object() && c.value("type", "") == "PodScheduled") h.since = ParseTime(c.value("lastTransitionTime", ""));
      }
      if (!h.since) h.since = ParseTime(pod.value("metadata", json::object()).value("creationTimestamp", ""));
      continue;
    }
    const json ready = ReadyConditionOf(*cached);
    if (ready.is_null() || ready.value("status", "") == "True") continue;
    NodeHealth& h = unhealthy[node];
    h.ready = ready.value("status", "");
    h.reason = ready.value("reason", "");
    h.since = ParseTime(ready.value("lastTransitionTime", ""));
  }
  // An elastic job shrunk by a node loss runs without those nodes until each is back: Ready for
  // `back_after` (a node that flaps would cost a checkpoint interval each time), schedulable, and
  // without a NoSchedule or NoExecute taint (a repaired node still cordoned would take a full-size
  // gang that cannot start). The entries say why not; having no `since`, they judge no Pod lost.
  const auto now = std::chrono::system_clock::now();
  for (const auto& lost : lost_nodes) {
    if (!lost.is_string() || unhealthy.count(lost.get<std::string>())) continue;
    const auto cached = nodes->Get(lost.get<std::string>());
    const json ready = cached ? ReadyConditionOf(*cached) : json();
    std::string why;
    if (!cached) {
      why = "deleted";
    } else if (!ready.is_object() || ready.value("status", "") != "True") {
      why = "not Ready";
    } else if (auto since = ParseTime(ready.value("lastTransitionTime", "")); !since || now - *since < back_after) {
      why = "Ready for less than " + std::to_string(back_after.count()) + " s";
    } else if (cached->value("spec", json::object()).value("unschedulable", false)) {
      why = "cordoned";
    } else {
      for (const auto& taint : cached->value("spec", json::object()).value("taints", json::array())) {
        const std::string effect = taint.value("effect", "");
        if (effect == "NoSchedule" || effect == "NoExecute") why = "tainted " + taint.value("key", "");
      }
    }
    if (why.empty()) continue;
    NodeHealth& h = unhealthy[lost.get<std::string>()];
    h.deleted = !cached;
    h.ready = ready.is_object() ? ready.value("status", "") : "";
    h.reason = why;
  }
  return unhealthy;
}

}  // namespace meshwork::op
