// Headless Service records and the per-pod hosts file they become.
#include <gtest/gtest.h>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

json Pod(const std::string& name, const std::string& ns, const std::string& subdomain, const std::string& ip,
         const std::string& hostname = "") {
  json pod = {{"metadata", {{"name", name}, {"namespace", ns}}}, {"spec", {{"subdomain", subdomain}}}};
  if (!hostname.empty()) pod["spec"]["hostname"] = hostname;
  if (!ip.empty()) pod["status"]["podIP"] = ip;
  return pod;
}

json Service(const std::string& name, const std::string& ns, const std::string& cluster_ip) {
  return {{"metadata", {{"name", name}, {"namespace", ns}}}, {"spec", {{"clusterIP", cluster_ip}}}};
}

TEST(HeadlessServiceHosts, NamesPodsWhoseSubdomainIsAHeadlessService) {
  auto hosts = HeadlessServiceHosts(
      {Pod("job-0", "team", "job", "127.1.0.1"), Pod("job-1", "team", "job", "127.1.0.2", "worker-1"),
       Pod("job-2", "team", "job", ""),              // no IP yet
       Pod("other", "team", "svc-with-ip", "127.1.0.3"),  // not headless
       Pod("job-0", "elsewhere", "job", "127.1.0.4")},    // no such Service in its namespace
      {Service("job", "team", "None"), Service("svc-with-ip", "team", "10.0.0.1")});
  std::map<std::string, std::string> want = {{"job-0.job.team.svc", "127.1.0.1"},
                                             {"worker-1.job.team.svc", "127.1.0.2"}};
  EXPECT_EQ(hosts, want);
}

TEST(RenderHostsFile, WritesOwnNamesAndSearchPathForms) {
  std::string text = internal::RenderHostsFile(
      "127.1.0.1", "job-0", "job", "team", "cluster.local",
      {{"job-1.job.team.svc", "127.1.0.2"}, {"x-0.x.other.svc.cluster.local", "127.1.0.3"}, {"plain", "127.1.0.4"}});
  EXPECT_NE(text.find("127.0.0.1\tlocalhost\n"), std::string::npos) << text;
  EXPECT_NE(text.find("127.1.0.1\tjob-0.job.team.svc.cluster.local\tjob-0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("127.1.0.2\tjob-1.job.team.svc.cluster.local job-1.job.team.svc job-1.job.team job-1.job\n"),
            std::string::npos)
      << text;
  // Another namespace's name gets no short form.
  EXPECT_NE(text.find("127.1.0.3\tx-0.x.other.svc.cluster.local x-0.x.other.svc x-0.x.other\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("127.1.0.4\tplain\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace meshwork::controlplane::agent
