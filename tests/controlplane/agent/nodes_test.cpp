// The nodes config: YAML and JSON, defaults, and errors that name the node, field and value.
#include <gtest/gtest.h>

#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

TEST(ParseNodes, ReadsYamlList) {
  auto nodes = ParseNodes(R"(
- name: gpu-0
  cpu: "4"
  memory: 8Gi
  nvidia.com/gpu: 2
  labels: {pool: gpu}
- name: cpu-0
  cpu: 500m
  memory: "512M"
)");
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].name, "gpu-0");
  EXPECT_DOUBLE_EQ((*nodes)[0].cpu, 4);
  EXPECT_EQ((*nodes)[0].memory_bytes, 8LL << 30);
  EXPECT_EQ((*nodes)[0].gpus, 2);
  EXPECT_EQ((*nodes)[0].labels.at("pool"), "gpu");
  EXPECT_DOUBLE_EQ((*nodes)[1].cpu, 0.5);
  EXPECT_EQ((*nodes)[1].memory_bytes, 512000000);
  EXPECT_EQ((*nodes)[1].gpus, 0);
}

TEST(ParseNodes, ReadsJsonAndTheNodesKey) {
  auto nodes = ParseNodes(R"({"nodes": [{"name": "a", "cpu": 2, "memory": "1Gi", "nvidia.com/gpu": "1"}]})");
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_DOUBLE_EQ((*nodes)[0].cpu, 2);
  EXPECT_EQ((*nodes)[0].gpus, 1);
}

TEST(ParseNodes, DefaultsCpuAndMemoryToThisMachine) {
  auto nodes = ParseNodes("[{name: solo}]");
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  NodeConfig local = DefaultNode();
  EXPECT_EQ((*nodes)[0].cpu, local.cpu);
  EXPECT_EQ((*nodes)[0].memory_bytes, local.memory_bytes);
  EXPECT_EQ(local.name, "local");
  EXPECT_GE(local.cpu, 1);
  EXPECT_GT(local.memory_bytes, 0);
  EXPECT_EQ(local.gpus, 0);
}

TEST(ParseNodes, ErrorsNameTheNodeFieldAndValue) {
  struct Case {
    const char* text;
    std::vector<const char*> mentions;
  } cases[] = {
      {"- name: a\n  cpu: lots\n", {"nodes[0]", "\"a\"", "cpu", "\"lots\""}},
      {"- name: a\n  memory: 8GB\n", {"memory", "\"8GB\""}},
      {"- name: a\n  nvidia.com/gpu: 1.5\n", {"nvidia.com/gpu", "\"1.5\"", "whole"}},
      {"- name: a\n  gpus: 1\n", {"unknown field", "\"gpus\""}},
      {"- cpu: 1\n", {"nodes[0]", "name is required"}},
      {"- name: Bad_Name\n", {"\"Bad_Name\""}},
      {"- name: a\n- name: a\n", {"nodes[1]", "used by another node"}},
      {"[]", {"empty"}},
      {"{nodes: 3}", {"list of nodes"}},
      {"{hosts: []}", {"unknown field", "\"hosts\""}},
      {"- [1, 2]\n", {"nodes[0]"}},
      {"- name: a\n  cpu: 0\n", {"cpu", "\"0\"", "more than 0"}},
      {"[{name: a", {"not valid YAML"}},
  };
  for (const auto& c : cases) {
    auto nodes = ParseNodes(c.text);
    ASSERT_FALSE(nodes.ok()) << c.text;
    EXPECT_EQ(nodes.status().code(), StatusCode::kInvalidConfig) << c.text;
    for (const char* m : c.mentions) {
      EXPECT_NE(nodes.status().message().find(m), std::string::npos)
          << "\"" << nodes.status().message() << "\" should mention " << m;
    }
  }
}

TEST(NodeObject, ReportsCapacityAsKubernetesPrintsIt) {
  NodeConfig n{"gpu-0", 2.5, 8LL << 30, 4, {{"pool", "gpu"}}};
  nlohmann::json node = NodeObject(n);
  EXPECT_EQ(node["kind"], "Node");
  EXPECT_EQ(node["metadata"]["name"], "gpu-0");
  EXPECT_EQ(node["metadata"]["labels"]["kubernetes.io/hostname"], "gpu-0");
  EXPECT_EQ(node["metadata"]["labels"]["pool"], "gpu");
  EXPECT_EQ(node["status"]["capacity"]["cpu"], "2500m");
  EXPECT_EQ(node["status"]["capacity"]["memory"], "8Gi");
  EXPECT_EQ(node["status"]["capacity"]["nvidia.com/gpu"], "4");
  EXPECT_EQ(node["status"]["allocatable"], node["status"]["capacity"]);
  EXPECT_EQ(node["status"]["conditions"][0]["type"], "Ready");
  EXPECT_EQ(node["status"]["conditions"][0]["status"], "True");
}

}  // namespace
}  // namespace meshwork::controlplane::agent
