// Local nodes: the nodes config, this machine's default node, and the Node objects the API serves.
#include <unistd.h>

#include <cmath>
#include <ctime>
#include <set>

#include <yaml-cpp/yaml.h>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace internal {

std::string Rfc3339(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string FormatCpu(double cores) {
  long long milli = std::llround(cores * 1000);
  if (milli % 1000 == 0) return std::to_string(milli / 1000);
  return std::to_string(milli) + "m";
}

std::string FormatBytes(int64_t bytes) {
  static const char* kUnits[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  if (bytes == 0 || bytes % 1024 != 0) return std::to_string(bytes);
  int unit = -1;
  while (bytes % 1024 == 0 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

bool IsDns1123Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

bool IsDns1123Subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t begin = 0;
  while (true) {
    size_t dot = s.find('.', begin);
    std::string label = s.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (!IsDns1123Label(label)) return false;
    if (dot == std::string::npos) return true;
    begin = dot + 1;
  }
}

std::string StringAt(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

const nlohmann::json& ObjectAt(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json* const kEmpty = new nlohmann::json(nlohmann::json::object());
  if (obj.is_object()) {
    auto it = obj.find(key);
    if (it != obj.end() && it->is_object()) return *it;
  }
  return *kEmpty;
}

const nlohmann::json& ArrayAt(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json* const kEmpty = new nlohmann::json(nlohmann::json::array());
  if (obj.is_object()) {
    auto it = obj.find(key);
    if (it != obj.end() && it->is_array()) return *it;
  }
  return *kEmpty;
}

}  // namespace internal

namespace {

int64_t MachineMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

double MachineCores() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<double>(n) : 1.0;
}

std::string NodeLabel(size_t index, const std::string& name) {
  std::string s = "nodes[" + std::to_string(index) + "]";
  if (!name.empty()) s += " (\"" + name + "\")";
  return s;
}

std::string ScalarText(const YAML::Node& n) {
  return n.IsScalar() ? n.Scalar() : YAML::Dump(n);
}

Result<NodeConfig> ParseNode(const YAML::Node& n, size_t index) {
  if (!n.IsMap()) {
    return InvalidConfig(NodeLabel(index, "") + ": expected a map with name, cpu, memory, nvidia.com/gpu, got \"" +
                         ScalarText(n) + "\"");
  }
  NodeConfig node;
  node.cpu = MachineCores();
  node.memory_bytes = MachineMemory();
  const YAML::Node name = n["name"];
  if (!name || !name.IsScalar() || name.Scalar().empty()) {
    return InvalidConfig(NodeLabel(index, "") + ": name is required");
  }
  node.name = name.Scalar();
  std::string where = NodeLabel(index, node.name);
  if (!internal::IsDns1123Subdomain(node.name)) {
    return InvalidConfig(where + ": name \"" + node.name +
                         "\" is not a valid node name (lower-case letters, digits, '-' and '.')");
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (key == "name") continue;
    if (key == "labels") {
      if (!v.IsMap()) return InvalidConfig(where + ": labels must be a map of strings");
      for (const auto& l : v) {
        if (!l.second.IsScalar()) {
          return InvalidConfig(where + ": labels." + l.first.Scalar() + " must be a string");
        }
        node.labels[l.first.Scalar()] = l.second.Scalar();
      }
      continue;
    }
    if (!v.IsScalar()) return InvalidConfig(where + ": " + key + " must be a quantity, got \"" + ScalarText(v) + "\"");
    const std::string text = v.Scalar();
    if (key == "cpu") {
      auto cpu = ParseCpu(text);
      if (!cpu.ok()) return InvalidConfig(where + ": cpu: " + cpu.status().message());
      if (*cpu <= 0) return InvalidConfig(where + ": cpu \"" + text + "\" must be more than 0");
      node.cpu = *cpu;
    } else if (key == "memory") {
      auto mem = ParseBytes(text);
      if (!mem.ok()) return InvalidConfig(where + ": memory: " + mem.status().message());
      if (*mem <= 0) return InvalidConfig(where + ": memory \"" + text + "\" must be more than 0");
      node.memory_bytes = *mem;
    } else if (key == "nvidia.com/gpu") {
      auto gpus = ParseCpu(text);
      if (!gpus.ok()) return InvalidConfig(where + ": nvidia.com/gpu: " + gpus.status().message());
      if (*gpus != std::floor(*gpus)) {
        return InvalidConfig(where + ": nvidia.com/gpu \"" + text + "\" must be a whole number");
      }
      node.gpus = static_cast<int64_t>(*gpus);
    } else {
      return InvalidConfig(where + ": unknown field \"" + key +
                           "\" (known: name, cpu, memory, nvidia.com/gpu, labels)");
    }
  }
  return node;
}

}  // namespace

Result<std::vector<NodeConfig>> ParseNodes(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidConfig(std::string("nodes config is not valid YAML or JSON: ") + e.what());
  }
  YAML::Node list = root;
  if (root.IsMap()) {
    for (const auto& kv : root) {
      if (kv.first.Scalar() != "nodes") {
        return InvalidConfig("nodes config: unknown field \"" + kv.first.Scalar() + "\" (expected \"nodes\")");
      }
    }
    list = root["nodes"];
  }
  if (!list || !list.IsSequence()) {
    return InvalidConfig("nodes config: expected a list of nodes (or a map with a \"nodes\" list)");
  }
  if (list.size() == 0) return InvalidConfig("nodes config: the list of nodes is empty");
  std::vector<NodeConfig> nodes;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    MW_ASSIGN_OR_RETURN(NodeConfig node, ParseNode(list[i], i));
    if (!names.insert(node.name).second) {
      return InvalidConfig(NodeLabel(i, node.name) + ": name \"" + node.name + "\" is used by another node");
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

NodeConfig DefaultNode() {
  NodeConfig node;
  node.name = "local";
  node.cpu = MachineCores();
  node.memory_bytes = MachineMemory();
  node.gpus = 0;
  return node;
}

nlohmann::json NodeObject(const NodeConfig& node) {
#if defined(__aarch64__)
  const char* arch = "arm64";
#else
  const char* arch = "amd64";
#endif
  nlohmann::json labels = {{"kubernetes.io/hostname", node.name},
                           {"kubernetes.io/os", "linux"},
                           {"kubernetes.io/arch", arch}};
  for (const auto& [k, v] : node.labels) labels[k] = v;
  nlohmann::json capacity = {{"cpu", internal::FormatCpu(node.cpu)},
                             {"memory", internal::FormatBytes(node.memory_bytes)},
                             {"pods", "110"},
                             {"nvidia.com/gpu", std::to_string(node.gpus)}};
  std::string now = internal::Rfc3339(std::chrono::system_clock::now());
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata", {{"name", node.name}, {"labels", labels}}},
      {"spec", nlohmann::json::object()},
      {"status",
       {{"capacity", capacity},
        {"allocatable", capacity},
        {"conditions",
         {{{"type", "Ready"},
           {"status", "True"},
           {"reason", "KubeletReady"},
           {"message", "meshwork local node agent is posting ready status"},
           {"lastHeartbeatTime", now},
           {"lastTransitionTime", now}}}},
        {"addresses", {{{"type", "InternalIP"}, {"address", "127.0.0.1"}}, {{"type", "Hostname"}, {"address", node.name}}}},
        {"nodeInfo",
         {{"architecture", arch},
          {"operatingSystem", "linux"},
          {"kubeletVersion", "meshwork-local"},
          {"containerRuntimeVersion", "meshwork-process://1"}}}}}};
}

}  // namespace meshwork::controlplane::agent
