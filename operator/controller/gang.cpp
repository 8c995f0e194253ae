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

using Resources = PodRequests;

bool FitsIn(const Resources& need, const Resources& free) {
  return need.cpu <= free.cpu + 1e-9 && need.memory <= free.memory && need.gpus <= free.gpus;
}

void Take(Resources& from, const Resources& r) {
  from.cpu -= r.cpu;
  from.memory -= r.memory;
  from.gpus -= r.gpus;
}

void Add(Resources& to, const Resources& r) {
  to.cpu += r.cpu;
  to.memory += r.memory;
  to.gpus += r.gpus;
}

// j[key], or an empty object when j has none: a reference, since the callers read Pods whole
// on every admission and a copy of the spec each time was most of its cost.
const json& At(const json& j, const char* key) {
  static const json kEmpty = json::object();
  if (!j.is_object()) return kEmpty;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? kEmpty : *it;
}

bool Empty(const PodRequests& r) { return r.cpu <= 0 && r.memory <= 0 && r.gpus <= 0; }

// Quantities Kubernetes has already validated; anything unreadable counts as zero.
double Cpu(const json& q) {
  auto v = ParseCpu(q);
  return v.ok() ? *v : 0;
}
int64_t Bytes(const json& q) {
  auto v = ParseBytes(q);
  return v.ok() ? *v : 0;
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

using Claim = RoomLedger::Claim;

Claim ClaimOf(const json& pod) { return {RequestsOf(pod), At(At(pod, "spec"), "nodeSelector")}; }

bool Matches(const json& selector, const Node& node) {
  if (!selector.is_object()) return true;
  for (const auto& [k, v] : selector.items()) {
    if (k == "kubernetes.io/hostname" && v == node.name) continue;
    if (!node.labels.contains(k) || node.labels[k] != v) return false;
  }
  return true;
}

// First fit: the node index, or -1.
int Place(const json& selector, const Resources& need, std::vector<Node>& nodes) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!Matches(selector, nodes[i]) || !FitsIn(need, nodes[i].free)) continue;
    Take(nodes[i].free, need);
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

// The schedulable, Ready Nodes of a NodeList with their allocatable room.
std::vector<Node> NodesOf(const json& node_list, std::map<std::string, size_t>* by_name) {
  std::vector<Node> nodes;
  for (const json& n : node_list.value("items", json::array())) {
    if (At(n, "spec").value("unschedulable", false)) continue;
    const json& status = At(n, "status");
    // A node that is not Ready runs nothing new (the node lifecycle controller taints it
    // NoSchedule): counting its room would admit a gang the scheduler cannot place, as after a
    // node loss, when the gang restarts on the nodes left. (A node with no Ready condition at all
    // is counted: only a node said to be not Ready is left out.)
    const json ready = ReadyConditionOf(n);
    if (!ready.is_null() && ready.value("status", "") != "True") continue;
    const json& alloc = status.contains("allocatable") ? At(status, "allocatable") : At(status, "capacity");
    Node node;
    node.name = At(n, "metadata").value("name", "");
    node.labels = At(At(n, "metadata"), "labels");
    if (alloc.contains("cpu")) node.free.cpu = Cpu(alloc["cpu"]);
    if (alloc.contains("memory")) node.free.memory = Bytes(alloc["memory"]);
    if (alloc.contains("nvidia.com/gpu")) node.free.gpus = static_cast<int64_t>(Cpu(alloc["nvidia.com/gpu"]));
    (*by_name)[node.name] = nodes.size();
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// Places the released, not yet bound Pods and then the gang, on `nodes` with the bound Pods'
// room already taken.
GangFit PlaceGang(std::vector<Node>& nodes, const std::vector<Claim>& unbound, const std::vector<json>& gang) {
  for (const Claim& c : unbound) Place(c.node_selector, c.requests, nodes);
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
    if (Place(At(At(*pod, "spec"), "nodeSelector"), need, nodes) >= 0) continue;
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

// A gang Pod released by the operator and not bound yet: its room is promised, even while another
// gate still holds it (Kueue's topology gate, lifted once Kueue has picked its domain).
bool Released(const json& p) {
  const json& labels = At(At(p, "metadata"), "labels");
  return At(p, "spec").value("nodeName", "").empty() && labels.contains(kJobLabel) && !HasGangGate(p);
}

}  // namespace

json ReadyConditionOf(const json& node) {
  const json& conditions = At(At(node, "status"), "conditions");
  if (!conditions.is_array()) return nullptr;
  for (const json& c : conditions) {
    if (c.is_object() && c.value("type", "") == "Ready") return c;
  }
  return nullptr;
}

bool HasGangGate(const json& pod) {
  const json& gates = At(At(pod, "spec"), "schedulingGates");
  if (!gates.is_array()) return false;
  for (const json& g : gates) {
    if (g.is_object() && g.value("name", "") == kGangGate) return true;
  }
  return false;
}

// A container's request for each resource: requests, else limits (the API server defaults one
// to the other), summed over the containers.
PodRequests RequestsOf(const json& pod) {
  PodRequests r;
  const json& containers = At(At(pod, "spec"), "containers");
  if (!containers.is_array()) return r;
  for (const json& c : containers) {
    const json& res = At(c, "resources");
    const json& limits = At(res, "limits");
    const json& requests = At(res, "requests");
    // The request, else the limit; a resource in neither is not there.
    auto effective = [&](const char* name) -> const json* {
      if (auto it = requests.find(name); it != requests.end()) return &*it;
      if (auto it = limits.find(name); it != limits.end()) return &*it;
      return nullptr;
    };
    if (const json* q = effective("cpu")) r.cpu += Cpu(*q);
    if (const json* q = effective("memory")) r.memory += Bytes(*q);
    if (const json* q = effective("nvidia.com/gpu")) r.gpus += static_cast<int64_t>(Cpu(*q));
  }
  return r;
}


GangFit FitGang(const json& node_list, const json& pod_list, const std::vector<json>& gang) {
  std::map<std::string, size_t> by_name;
  std::vector<Node> nodes = NodesOf(node_list, &by_name);
  // What is taken: bound Pods where they are; Pods admitted but not bound yet wherever they fit.
  std::vector<Claim> unbound;
  const json& items = At(pod_list, "items");
  for (const json& p : items.is_array() ? items : At(items, "")) {
    if (Finished(p)) continue;
    const std::string node = At(p, "spec").value("nodeName", "");
    if (!node.empty()) {
      auto it = by_name.find(node);
      if (it != by_name.end()) Take(nodes[it->second].free, RequestsOf(p));
      continue;
    }
    if (Released(p)) unbound.push_back(ClaimOf(p));
  }
  return PlaceGang(nodes, unbound, gang);
}

GangFit FitGang(const json& node_list, const RoomLedger::Snapshot& taken, const std::vector<json>& gang) {
  std::map<std::string, size_t> by_name;
  std::vector<Node> nodes = NodesOf(node_list, &by_name);
  for (const auto& [node, requests] : taken.bound) {
    auto it = by_name.find(node);
    if (it != by_name.end()) Take(nodes[it->second].free, requests);
  }
  return PlaceGang(nodes, taken.released, gang);
}

void RoomLedger::Set(const std::string& key, const json& pod) {
  std::lock_guard<std::mutex> lock(mu_);
  Drop(key);
  if (Finished(pod)) return;
  Entry e;
  e.node = At(pod, "spec").value("nodeName", "");
  const json& refs = At(At(pod, "metadata"), "ownerReferences");
  if (refs.is_array() && !refs.empty() && refs[0].is_object()) e.owner_uid = refs[0].value("uid", "");
  e.version = At(pod, "metadata").value("resourceVersion", "");
  e.requests = RequestsOf(pod);
  if (!e.node.empty()) {
    Add(bound_[e.node], e.requests);
    Add(bound_by_owner_[{e.node, e.owner_uid}], e.requests);
  } else if (Released(pod) && !Empty(e.requests)) {
    e.node_selector = At(At(pod, "spec"), "nodeSelector");
    released_.insert(key);
  }
  pods_[key] = std::move(e);
}

void RoomLedger::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Drop(key);
}

void RoomLedger::Drop(const std::string& key) {
  auto it = pods_.find(key);
  if (it == pods_.end()) return;
  const Entry& e = it->second;
  if (!e.node.empty()) {
    Take(bound_[e.node], e.requests);
    auto owned = bound_by_owner_.find({e.node, e.owner_uid});
    if (owned != bound_by_owner_.end()) {
      Take(owned->second, e.requests);
      if (owned->second.cpu < 1e-9 && owned->second.memory == 0 && owned->second.gpus == 0) bound_by_owner_.erase(owned);
    }
  }
  released_.erase(key);
  pods_.erase(it);
}

RoomLedger::Snapshot RoomLedger::Taken(const std::string& skip_owner_uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.bound = bound_;
  if (!skip_owner_uid.empty()) {
    for (auto& [node, requests] : s.bound) {
      auto owned = bound_by_owner_.find({node, skip_owner_uid});
      if (owned != bound_by_owner_.end()) Take(requests, owned->second);
    }
  }
  for (const std::string& key : released_) {
    const Entry& e = pods_.at(key);
    if (e.owner_uid != skip_owner_uid) s.released.push_back({e.requests, e.node_selector});
  }
  return s;
}

std::string RoomLedger::VersionOf(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pods_.find(key);
  return it == pods_.end() ? "" : it->second.version;
}

}  // namespace meshwork::op
