#include "operator/controller/gang.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>

#include "common/quantity.h"
#include "operator/controller/spec.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

struct Resources {
  double cpu = 0;
  int64_t memory = 0;
  int64_t gpus = 0;
  bool FitsIn(const Resources& free) const {
    return cpu <= free.cpu + 1e-9 && memory <= free.memory && gpus <= free.gpus;
  }
  void Take(const Resources& r) {
    cpu -= r.cpu;
    memory -= r.memory;
    gpus -= r.gpus;
  }
};

json At(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && !j[key].is_null() ? j[key] : json::object();
}

// Quantities Kubernetes has already validated; anything unreadable counts as zero.
double Cpu(const json& q) {
  auto v = ParseCpu(q);
  return v.ok() ? *v : 0;
}
int64_t Bytes(const json& q) {
  auto v = ParseBytes(q);
  return v.ok() ? *v : 0;
}

// A container's request for each resource: requests, else limits (the API server defaults one
// to the other), summed over the containers.
Resources RequestsOf(const json& pod) {
  Resources r;
  const json containers = At(pod, "spec").value("containers", json::array());
  for (const json& c : containers) {
    const json res = At(c, "resources");
    json effective = At(res, "limits");
    const json requests = At(res, "requests");  // named: items() of a temporary would dangle
    for (const auto& [k, v] : requests.items()) effective[k] = v;
    if (effective.contains("cpu")) r.cpu += Cpu(effective["cpu"]);
    if (effective.contains("memory")) r.memory += Bytes(effective["memory"]);
    if (effective.contains("nvidia.com/gpu")) r.gpus += static_cast<int64_t>(Cpu(effective["nvidia.com/gpu"]));
  }
  return r;
}

bool Finished(const json& pod) {
  const std::string phase = At(pod, "status").value("phase", "");
  return phase == "Succeeded" || phase == "Failed";
}

struct Node {
  std::string name;
  json labels;
  Resources free;
};

bool Matches(const json& pod, const Node& node) {
  const json selector = At(At(pod, "spec"), "nodeSelector");  // named: items() of a temporary would dangle
  for (const auto& [k, v] : selector.items()) {
    if (k == "kubernetes.io/hostname" && v == node.name) continue;
    if (!node.labels.contains(k) || node.labels[k] != v) return false;
  }
  return true;
}

// First fit: the node index, or -1.
int Place(const json& pod, const Resources& need, std::vector<Node>& nodes) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!Matches(pod, nodes[i]) || !need.FitsIn(nodes[i].free)) continue;
    nodes[i].free.Take(need);
    return static_cast<int>(i);
  }
  return -1;
}

std::string Describe(const Resources& r) {
  std::ostringstream os;
  os << r.cpu << " cpu, " << r.memory / (1 << 20) << " MiB memory";
  if (r.gpus > 0) os << ", " << r.gpus << " nvidia.com/gpu";
  return os.str();
}

}  // namespace

bool HasGangGate(const json& pod) {
  for (const json& g : At(pod, "spec").value("schedulingGates", json::array())) {
    if (g.is_object() && g.value("name", "") == kGangGate) return true;
  }
  return false;
}

GangFit FitGang(const json& node_list, const json& pod_list, const std::vector<json>& gang) {
  std::vector<Node> nodes;
  std::map<std::string, size_t> by_name;
  for (const json& n : node_list.value("items", json::array())) {
    if (At(n, "spec").value("unschedulable", false)) continue;
    const json status = At(n, "status");
    // A node that is not Ready runs nothing new (the node lifecycle controller taints it
    // NoSchedule): counting its room would admit a gang the scheduler cannot place, as after a
    // node loss, when the gang restarts on the nodes left. (A node with no Ready condition at all
    // is counted: only a node said to be not Ready is left out.)
    bool ready = true;
    for (const json& c : status.value("conditions", json::array())) {
      if (c.is_object() && c.value("type", "") == "Ready") ready = c.value("status", "") == "True";
    }
    if (!ready) continue;
    const json alloc = status.contains("allocatable") ? At(status, "allocatable") : At(status, "capacity");
    Node node;
    node.name = At(n, "metadata").value("name", "");
    node.labels = At(At(n, "metadata"), "labels");
    if (alloc.contains("cpu")) node.free.cpu = Cpu(alloc["cpu"]);
    if (alloc.contains("memory")) node.free.memory = Bytes(alloc["memory"]);
    if (alloc.contains("nvidia.com/gpu")) node.free.gpus = static_cast<int64_t>(Cpu(alloc["nvidia.com/gpu"]));
    by_name[node.name] = nodes.size();
    nodes.push_back(std::move(node));
  }
  // What is taken: bound Pods where they are; Pods admitted but not bound yet wherever they fit.
  std::vector<json> unbound;
  for (const json& p : pod_list.value("items", json::array())) {
    if (Finished(p)) continue;
    const std::string node = At(p, "spec").value("nodeName", "");
    if (!node.empty()) {
      auto it = by_name.find(node);
      if (it != by_name.end()) nodes[it->second].free.Take(RequestsOf(p));
      continue;
    }
    // A gang Pod released by the operator counts even while another gate still holds it (Kueue's
    // topology gate, lifted once Kueue has picked its domain): its room is promised.
    const json labels = At(At(p, "metadata"), "labels");
    if (labels.contains(kJobLabel) && !HasGangGate(p)) unbound.push_back(p);
  }
  for (const json& p : unbound) Place(p, RequestsOf(p), nodes);

  std::vector<std::pair<Resources, const json*>> want;
  Resources total;
  for (const json& p : gang) {
    want.emplace_back(RequestsOf(p), &p);
    total.cpu += want.back().first.cpu;
    total.memory += want.back().first.memory;
    total.gpus += want.back().first.gpus;
  }
  std::stable_sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
    return a.first.gpus != b.first.gpus ? a.first.gpus > b.first.gpus : a.first.cpu > b.first.cpu;
  });
  GangFit out;
  for (const auto& [need, pod] : want) {
    if (Place(*pod, need, nodes) >= 0) continue;
    Resources free;
    for (const Node& n : nodes) {
      free.cpu += std::max(0.0, n.free.cpu);
      free.memory += std::max<int64_t>(0, n.free.memory);
      free.gpus += std::max<int64_t>(0, n.free.gpus);
    }
    out.why = "the gang's " + std::to_string(gang.size()) + " Pods need " + Describe(total) + " in all (pod " +
              pod->value("metadata", json::object()).value("name", std::string()) + " alone " + Describe(need) + "); free on " +
              std::to_string(nodes.size()) + " schedulable node(s): " + Describe(free) +
              " (Pods bound, or released and not bound yet, count)";
    return out;
  }
  out.fits = true;
  return out;
}

}  // namespace meshwork::op
