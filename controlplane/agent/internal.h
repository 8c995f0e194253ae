// Helpers shared by the agent's sources; not part of its public API.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent::internal {

// "2026-11-21T04:04:00Z", as the API writes times.
std::string Rfc3339(std::chrono::system_clock::time_point t);
// Quantities as Kubernetes prints them: "4", "500m"; "8Gi", "512Ki", "1000".
std::string FormatCpu(double cores);
std::string FormatBytes(int64_t bytes);
// A DNS-1123 subdomain (node names), and a label (hostnames, container names).
bool IsDns1123Subdomain(const std::string& s);
bool IsDns1123Label(const std::string& s);
// obj[key] when obj is an object and obj[key] a string, else "".
std::string StringAt(const nlohmann::json& obj, const char* key);
// obj[key] when obj is an object and obj[key] an object (ObjectAt) or an array (ArrayAt), else an
// empty one. A reference into obj (or to a shared empty value), valid while obj is: walking a
// cached Pod reads it without copying its spec.
const nlohmann::json& ObjectAt(const nlohmann::json& obj, const char* key);
const nlohmann::json& ArrayAt(const nlohmann::json& obj, const char* key);

// One container's effective requests: a request, else the limit (Kubernetes defaults one to the
// other). `where` ("spec.containers[0]") prefixes errors.
Result<PodRequests> ContainerRequests(const nlohmann::json& container, const std::string& where);

// The hosts file of one pod, as kubelet writes it (localhost, the pod's own names), followed by the
// names given to SetHosts in the forms the pod's DNS search path would resolve.
std::string RenderHostsFile(const std::string& pod_ip, const std::string& hostname, const std::string& subdomain,
                            const std::string& ns, const std::string& cluster_domain,
                            const std::map<std::string, std::string>& name_to_ip);
// The part of RenderHostsFile after the pod's own names: the same for every pod of namespace `ns`.
std::string RenderHostsNames(const std::string& ns, const std::string& cluster_domain,
                             const std::map<std::string, std::string>& name_to_ip);

}  // namespace meshwork::controlplane::agent::internal
