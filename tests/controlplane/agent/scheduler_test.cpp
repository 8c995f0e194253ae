// PickNode: requests against node capacity, limits standing in for requests, and the reason text.
#include <gtest/gtest.h>

#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

json PodWith(json requests, json limits = json::object(), std::string node = "", std::string phase = "") {
  json resources = json::object();
  if (!requests.empty()) resources["requests"] = requests;
  if (!limits.empty()) resources["limits"] = limits;
  json pod = {{"metadata", {{"name", "p"}, {"uid", "u-" + std::to_string(rand())}}},
              {"spec", {{"containers", {{{"name", "main"}, {"resources", resources}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  if (!phase.empty()) pod["status"]["phase"] = phase;
  return pod;
}

std::vector<NodeConfig> TwoNodes() {
  return {NodeConfig{"a", 4, 8LL << 30, 0, {}}, NodeConfig{"b", 2, 4LL << 30, 2, {{"pool", "gpu"}}}};
}

TEST(PickNode, PlacesAPodThatFits) {
  Schedule s = PickNode(PodWith({{"cpu", "1"}, {"memory", "1Gi"}}), TwoNodes(), {});
  ASSERT_TRUE(s.node.has_value()) << s.reason;
  EXPECT_EQ(*s.node, "a");  // the least allocated once placed
}

TEST(PickNode, PlacesAGpuPodOnTheNodeWithGpus) {
  Schedule s = PickNode(PodWith({{"nvidia.com/gpu", 1}}), TwoNodes(), {});
  ASSERT_TRUE(s.node.has_value()) << s.reason;
  EXPECT_EQ(*s.node, "b");
}

TEST(PickNode, ReportsInsufficientGpuAsKubernetesDoes) {
  std::vector<json> bound = {PodWith({{"nvidia.com/gpu", "2"}}, {}, "b")};
  Schedule s = PickNode(PodWith({{"nvidia.com/gpu", "1"}}), TwoNodes(), bound);
  EXPECT_FALSE(s.node.has_value());
  EXPECT_EQ(s.reason, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
}

TEST(PickNode, ReportsEachMissingResourceSorted) {
  Schedule s = PickNode(PodWith({{"cpu", "3"}, {"memory", "6Gi"}}), TwoNodes(), {PodWith({{"cpu", "2"}}, {}, "a")});
  EXPECT_FALSE(s.node.has_value());
  // a: 2 of 4 cpus used, 3 more do not fit; b: 2 cpus and 4Gi are both too small.
  EXPECT_EQ(s.reason, "0/2 nodes are available: 2 Insufficient cpu, 1 Insufficient memory.");
}

TEST(PickNode, CountsWhatBoundPodsUseButNotFinishedOnes) {
  std::vector<NodeConfig> one = {NodeConfig{"a", 2, 4LL << 30, 0, {}}};
  std::vector<json> bound = {PodWith({{"cpu", "1500m"}}, {}, "a")};
  EXPECT_FALSE(PickNode(PodWith({{"cpu", "1"}}), one, bound).node.has_value());
  bound[0]["status"]["phase"] = "Succeeded";
  EXPECT_TRUE(PickNode(PodWith({{"cpu", "1"}}), one, bound).node.has_value());
  bound[0]["status"]["phase"] = "Running";
  EXPECT_TRUE(PickNode(PodWith({{"cpu", "500m"}}), one, bound).node.has_value()) << "exactly full fits";
}

TEST(PickNode, TakesLimitsWhenRequestsAreAbsent) {
  std::vector<NodeConfig> one = {NodeConfig{"a", 2, 4LL << 30, 1, {}}};
  Schedule s = PickNode(PodWith({}, {{"cpu", "3"}}), one, {});
  EXPECT_FALSE(s.node.has_value());
  EXPECT_EQ(s.reason, "0/1 nodes are available: 1 Insufficient cpu.");
  // A request wins over its limit.
  EXPECT_TRUE(PickNode(PodWith({{"cpu", "1"}}, {{"cpu", "3"}}), one, {}).node.has_value());
  // GPUs given only as limits count too.
  std::vector<json> bound = {PodWith({}, {{"nvidia.com/gpu", 1}}, "a")};
  EXPECT_EQ(PickNode(PodWith({}, {{"nvidia.com/gpu", 1}}), one, bound).reason,
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.");
}

TEST(PickNode, LeavesAGatedPodAlone) {
  json pod = PodWith({{"cpu", "1"}});
  pod["spec"]["schedulingGates"] = json::array({{{"name", "meshwork.dev/gang"}}});
  Schedule s = PickNode(pod, TwoNodes(), {});
  EXPECT_FALSE(s.node.has_value());
  EXPECT_TRUE(s.gated);
  EXPECT_EQ(s.reason, "Scheduling is blocked due to non-empty scheduling gates");
  pod["spec"]["schedulingGates"] = json::array();  // every gate removed: scheduled
  s = PickNode(pod, TwoNodes(), {});
  EXPECT_TRUE(s.node.has_value()) << s.reason;
  EXPECT_FALSE(s.gated);
}

TEST(PickNode, HonoursNodeSelector) {
  json pod = PodWith({});
  pod["spec"]["nodeSelector"] = {{"pool", "gpu"}};
  EXPECT_EQ(PickNode(pod, TwoNodes(), {}).node.value_or(""), "b");
  pod["spec"]["nodeSelector"] = {{"pool", "tpu"}};
  Schedule s = PickNode(pod, TwoNodes(), {});
  EXPECT_FALSE(s.node.has_value());
  EXPECT_EQ(s.reason, "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.");
}

TEST(PickNode, UnknownExtendedResourceNeverFits) {
  Schedule s = PickNode(PodWith({{"example.com/fpga", 1}}), TwoNodes(), {});
  EXPECT_EQ(s.reason, "0/2 nodes are available: 2 Insufficient example.com/fpga.");
}

TEST(PickNode, ExplainsABadQuantityAndNoNodes) {
  Schedule s = PickNode(PodWith({{"cpu", "lots"}}), TwoNodes(), {});
  EXPECT_FALSE(s.node.has_value());
  EXPECT_NE(s.reason.find("spec.containers[0].resources.requests.cpu"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("\"lots\""), std::string::npos) << s.reason;
  EXPECT_EQ(PickNode(PodWith({}), {}, {}).reason, "no nodes available to schedule pods");
  EXPECT_FALSE(PickNode(json("not a pod"), TwoNodes(), {}).node.has_value());
}

TEST(RequestsOf, SumsContainersAndTakesTheLargestInitContainer) {
  json pod = json::parse(R"({"spec": {
    "containers": [
      {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
      {"name": "b", "resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": 2}}}],
    "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]}})");
  auto r = RequestsOf(pod);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->cpu, 4);
  EXPECT_EQ(r->memory_bytes, 1LL << 30);
  EXPECT_EQ(r->extended.at("nvidia.com/gpu"), 2);
}

}  // namespace
}  // namespace meshwork::controlplane::agent
