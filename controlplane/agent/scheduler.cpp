// The scheduler: a pod's resource requests against what each local node has left.
#include <algorithm>
#include <vector>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

bool IsExtended(const std::string& name) {
  return name != "cpu" && name != "memory" && name != "ephemeral-storage" && name.rfind("hugepages-", 0) != 0;
}

struct Usage {
  double cpu = 0;
  int64_t memory = 0;
  std::map<std::string, int64_t> extended;
  void Add(const PodRequests& r) {
    cpu += r.cpu;
    memory += r.memory_bytes;
    for (const auto& [k, v] : r.extended) extended[k] += v;
  }
};

int64_t Capacity(const NodeConfig& node, const std::string& resource) {
  return resource == "nvidia.com/gpu" ? node.gpus : 0;
}

bool MatchesSelector(const json& pod, const NodeConfig& node) {
  const json selector = internal::ObjectAt(internal::ObjectAt(pod, "spec"), "nodeSelector");
  for (const auto& [k, v] : selector.items()) {
    std::string want = v.is_string() ? v.get<std::string>() : v.dump();
    if (k == "kubernetes.io/hostname") {
      if (want != node.name) return false;
      continue;
    }
    auto it = node.labels.find(k);
    if (it == node.labels.end() || it->second != want) return false;
  }
  return true;
}

}  // namespace

// One container's effective requests: a request, else the limit (Kubernetes defaults one to the other).
Result<PodRequests> internal::ContainerRequests(const json& c, const std::string& where) {
  PodRequests r;
  if (!c.is_object()) return InvalidInput(where + " must be an object");
  const json res = c.contains("resources") && !c["resources"].is_null() ? c["resources"] : json::object();
  if (!res.is_object()) return InvalidInput(where + ".resources must be an object");
  std::map<std::string, std::pair<json, std::string>> effective;  // name -> (quantity, field)
  for (const char* kind : {"limits", "requests"}) {  // requests last: they win over limits
    const json section = res.value(kind, json::object());
    if (section.is_null()) continue;
    if (!section.is_object()) return InvalidInput(where + ".resources." + kind + " must be a map");
    for (const auto& [name, q] : section.items()) {
      effective[name] = {q, where + ".resources." + kind + "." + name};
    }
  }
  for (const auto& [name, qf] : effective) {
    const auto& [q, field] = qf;
    if (name == "cpu") {
      auto v = ParseCpu(q);
      if (!v.ok()) return InvalidInput(field + ": " + v.status().message());
      r.cpu = *v;
    } else if (name == "memory") {
      auto v = ParseBytes(q);
      if (!v.ok()) return InvalidInput(field + ": " + v.status().message());
      r.memory_bytes = *v;
    } else if (IsExtended(name)) {
      auto v = ParseCpu(q);
      if (!v.ok()) return InvalidInput(field + ": " + v.status().message());
      if (*v != static_cast<double>(static_cast<int64_t>(*v))) {
        return InvalidInput(field + ": \"" + (q.is_string() ? q.get<std::string>() : q.dump()) +
                            "\" must be a whole number for an extended resource");
      }
      r.extended[name] = static_cast<int64_t>(*v);
    }
  }
  return r;
}

Result<PodRequests> RequestsOf(const json& pod) {
  PodRequests total;
  if (!pod.is_object() || !pod.contains("spec") || !pod["spec"].is_object()) {
    return InvalidInput("spec must be an object");
  }
  const json& spec = pod["spec"];
  const json containers = spec.contains("containers") ? spec["containers"] : json::array();
  if (!containers.is_array()) return InvalidInput("spec.containers must be a list");
  for (size_t i = 0; i < containers.size(); ++i) {
    MW_ASSIGN_OR_RETURN(PodRequests r,
                        internal::ContainerRequests(containers[i], "spec.containers[" + std::to_string(i) + "]"));
    total.cpu += r.cpu;
    total.memory_bytes += r.memory_bytes;
    for (const auto& [k, v] : r.extended) total.extended[k] += v;
  }
  // Init containers run one at a time before the others: the pod needs the largest of them.
  const json inits = spec.contains("initContainers") && !spec["initContainers"].is_null()
                         ? spec["initContainers"] : json::array();
  if (!inits.is_array()) return InvalidInput("spec.initContainers must be a list");
  for (size_t i = 0; i < inits.size(); ++i) {
    MW_ASSIGN_OR_RETURN(PodRequests r,
                        internal::ContainerRequests(inits[i], "spec.initContainers[" + std::to_string(i) + "]"));
    total.cpu = std::max(total.cpu, r.cpu);
    total.memory_bytes = std::max(total.memory_bytes, r.memory_bytes);
    for (const auto& [k, v] : r.extended) total.extended[k] = std::max(total.extended[k], v);
  }
  return total;
}

Schedule PickNode(const json& pod, const std::vector<NodeConfig>& nodes, const std::vector<json>& bound_pods) {
  Schedule out;
  const json gates = internal::ObjectAt(pod, "spec").value("schedulingGates", json::array());
  if (gates.is_array() && !gates.empty()) {
    out.gated = true;
    out.reason = "Scheduling is blocked due to non-empty scheduling gates";
    return out;
  }
  if (nodes.empty()) {
    out.reason = "no nodes available to schedule pods";
    return out;
  }
  auto requests = RequestsOf(pod);
  if (!requests.ok()) {
    out.reason = "pod cannot be scheduled: " + requests.status().message();
    return out;
  }
  const std::string self_uid = internal::StringAt(internal::ObjectAt(pod, "metadata"), "uid");

  std::map<std::string, Usage> used;
  for (const json& b : bound_pods) {
    std::string node = internal::StringAt(internal::ObjectAt(b, "spec"), "nodeName");
    if (node.empty()) continue;
    std::string phase = internal::StringAt(internal::ObjectAt(b, "status"), "phase");
    if (phase == "Succeeded" || phase == "Failed") continue;
    if (!self_uid.empty() && internal::StringAt(internal::ObjectAt(b, "metadata"), "uid") == self_uid) continue;
    auto r = RequestsOf(b);
    if (r.ok()) used[node].Add(*r);
  }

  std::map<std::string, int> failures;  // reason -> how many nodes
  const NodeConfig* best = nullptr;
  double best_score = -1;
  for (const NodeConfig& node : nodes) {
    if (!MatchesSelector(pod, node)) {
      ++failures["node(s) didn't match Pod's node affinity/selector"];
      continue;
    }
    const Usage& u = used[node.name];
    bool fits = true;
    if (requests->cpu > 0 && u.cpu + requests->cpu > node.cpu + 1e-9) {
      ++failures["Insufficient cpu"];
      fits = false;
    }
    if (requests->memory_bytes > 0 && u.memory + requests->memory_bytes > node.memory_bytes) {
      ++failures["Insufficient memory"];
      fits = false;
    }
    for (const auto& [name, want] : requests->extended) {
      if (want <= 0) continue;
      auto it = u.extended.find(name);
      int64_t in_use = it == u.extended.end() ? 0 : it->second;
      if (in_use + want > Capacity(node, name)) {
        ++failures["Insufficient " + name];
        fits = false;
      }
    }
    if (!fits) continue;
    // Least allocated: the mean free fraction of cpu and memory once the pod is placed.
    double cpu_free = node.cpu > 0 ? (node.cpu - u.cpu - requests->cpu) / node.cpu : 0;
    double mem_free = node.memory_bytes > 0
                          ? static_cast<double>(node.memory_bytes - u.memory - requests->memory_bytes) /
                                static_cast<double>(node.memory_bytes)
                          : 0;
    double score = (cpu_free + mem_free) / 2;
    if (best == nullptr || score > best_score + 1e-12) {
      best = &node;
      best_score = score;
    }
  }
  if (best != nullptr) {
    out.node = best->name;
    return out;
  }
  std::vector<std::string> parts;
  for (const auto& [reason, count] : failures) parts.push_back(std::to_string(count) + " " + reason);
  std::sort(parts.begin(), parts.end(), [](const std::string& a, const std::string& b) {
    return a.substr(a.find(' ') + 1) < b.substr(b.find(' ') + 1);
  });
  out.reason = "0/" + std::to_string(nodes.size()) + " nodes are available: ";
  for (size_t i = 0; i < parts.size(); ++i) out.reason += (i ? ", " : "") + parts[i];
  out.reason += ".";
  return out;
}

}  // namespace meshwork::controlplane::agent
