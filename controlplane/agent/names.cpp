// Pod names: the records a headless Service gives its pods, and each pod's hosts file.
#include <algorithm>
#include <cctype>
#include <set>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

void HeadlessServiceHostsBuilder::AddService(const json& svc) {
  if (internal::StringAt(internal::ObjectAt(svc, "spec"), "clusterIP") != "None") return;
  const json& meta = internal::ObjectAt(svc, "metadata");
  std::string ns = internal::StringAt(meta, "namespace");
  headless_.insert({ns.empty() ? "default" : ns, internal::StringAt(meta, "name")});
}

void HeadlessServiceHostsBuilder::AddPod(const json& pod) {
  const json& meta = internal::ObjectAt(pod, "metadata");
  const json& spec = internal::ObjectAt(pod, "spec");
  std::string ns = internal::StringAt(meta, "namespace");
  if (ns.empty()) ns = "default";
  std::string subdomain = internal::StringAt(spec, "subdomain");
  std::string ip = internal::StringAt(internal::ObjectAt(pod, "status"), "podIP");
  if (subdomain.empty() || ip.empty() || !headless_.count({ns, subdomain})) return;
  std::string hostname = internal::StringAt(spec, "hostname");
  if (hostname.empty()) hostname = internal::StringAt(meta, "name");
  if (hostname.empty()) return;
  hosts_[hostname + "." + subdomain + "." + ns + ".svc"] = ip;
}

std::map<std::string, std::string> HeadlessServiceHosts(const std::vector<json>& pods,
                                                        const std::vector<json>& services) {
  HeadlessServiceHostsBuilder builder;
  for (const json& svc : services) builder.AddService(svc);
  for (const json& pod : pods) builder.AddPod(pod);
  return builder.Take();
}

namespace internal {

std::string RenderHostsFile(const std::string& pod_ip, const std::string& hostname, const std::string& subdomain,
                            const std::string& ns, const std::string& cluster_domain,
                            const std::map<std::string, std::string>& name_to_ip) {
  std::string out =
      "# Kubernetes-managed hosts file (meshwork local node agent).\n"
      "127.0.0.1\tlocalhost\n"
      "::1\tlocalhost ip6-localhost ip6-loopback\n"
      "fe00::0\tip6-localnet\n"
      "fe00::0\tip6-mcastprefix\n"
      "fe00::1\tip6-allnodes\n"
      "fe00::2\tip6-allrouters\n";
  if (!subdomain.empty()) {
    out += pod_ip + "\t" + hostname + "." + subdomain + "." + ns + ".svc." + cluster_domain + "\t" + hostname + "\n";
  } else {
    out += pod_ip + "\t" + hostname + "\n";
  }
  return out + RenderHostsNames(ns, cluster_domain, name_to_ip);
}

std::string RenderHostsNames(const std::string& ns, const std::string& cluster_domain,
                             const std::map<std::string, std::string>& name_to_ip) {
  std::string out;
  // Each name in every form this pod's search path (<ns>.svc.<domain> svc.<domain> <domain>)
  // would complete, because hosts-file lookups do not apply search domains themselves.
  std::map<std::string, std::vector<std::string>> by_ip;
  std::set<std::string> seen;
  const std::string svc_domain = ".svc." + cluster_domain;
  for (const auto& [raw_name, ip] : name_to_ip) {
    std::string name = Lower(raw_name);
    while (!name.empty() && name.back() == '.') name.pop_back();
    if (name.empty() || ip.empty()) continue;
    std::vector<std::string> forms;
    std::string base;
    if (EndsWith(name, svc_domain)) {
      base = name.substr(0, name.size() - svc_domain.size());
    } else if (EndsWith(name, ".svc")) {
      base = name.substr(0, name.size() - 4);
    }
    if (base.empty()) {
      forms.push_back(name);
    } else {
      forms = {base + svc_domain, base + ".svc", base};
      if (EndsWith(base, "." + ns)) forms.push_back(base.substr(0, base.size() - ns.size() - 1));
    }
    for (const std::string& f : forms) {
      if (seen.insert(f).second) by_ip[ip].push_back(f);
    }
  }
  for (const auto& [ip, names] : by_ip) {
    out += ip;
    for (const std::string& n : names) out += (names.front() == n ? "\t" : " ") + n;
    out += "\n";
  }
  return out;
}

}  // namespace internal
}  // namespace meshwork::controlplane::agent
