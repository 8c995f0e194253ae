// A container's resource requests, as Kubernetes reads them: what the node agent hands out GPUs
// by (nvidia.com/gpu), with errors naming the field and the value.
#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

bool IsExtended(const std::string& name) {
  return name != "cpu" && name != "memory" && name != "ephemeral-storage" && name.rfind("hugepages-", 0) != 0;
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

}  // namespace meshwork::controlplane::agent
