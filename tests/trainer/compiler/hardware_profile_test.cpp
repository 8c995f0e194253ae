// Hardware profiles: the shipped files load, bad files say which key and value are wrong, and
// a mesh's groups get the link they actually cross.
#include "trainer/compiler/hardware_profile.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace meshwork::compiler {
namespace {

const std::string kProfiles = std::string(MESHWORK_SOURCE_DIR) + "/bench/profiles/";

const std::string kValid = R"(name: "test node"
peak_flops_per_second: 1e15
achieved_mfu: 0.5
memory_bytes: 80e9
gpus_per_node: 8
intra_node:
  latency_seconds: 10e-6
  bus_bytes_per_second: 300e9
inter_node:
  latency_seconds: 50e-6
  bus_bytes_per_second: 40e9
)";

// kValid with the line starting with `key:` replaced by `line` (or dropped when empty).
std::string WithLine(const std::string& key, const std::string& line) {
  std::string out;
  size_t begin = 0;
  while (begin < kValid.size()) {
    const size_t end = kValid.find('\n', begin);
    const std::string l = kValid.substr(begin, end - begin);
    if (l.rfind(key + ":", 0) == 0) {
      if (!line.empty()) out += line + "\n";
    } else {
      out += l + "\n";
    }
    begin = end + 1;
  }
  return out;
}

TEST(HardwareProfileTest, ShippedProfilesLoad) {
  for (const char* file : {"h100-nvlink-node.yaml", "h100-ib-400g.yaml", "cpu-gloo-local.yaml"}) {
    auto p = LoadHardwareProfile(kProfiles + file);
    ASSERT_TRUE(p.ok()) << file << ": " << p.status().ToString();
    EXPECT_FALSE(p->name.empty()) << file;
    EXPECT_GT(p->AchievedFlopsPerSecond(), 0) << file;
    EXPECT_GT(p->memory_bytes, 0) << file;
  }
}

TEST(HardwareProfileTest, ShippedH100ProfilesCarryTheDatasheetFigures) {
  auto node = LoadHardwareProfile(kProfiles + "h100-nvlink-node.yaml");
  auto ib = LoadHardwareProfile(kProfiles + "h100-ib-400g.yaml");
  ASSERT_TRUE(node.ok() && ib.ok());
  for (const auto* p : {&*node, &*ib}) {
    EXPECT_DOUBLE_EQ(p->peak_flops_per_second, 989e12);
    EXPECT_EQ(p->memory_bytes, 80'000'000'000);
    EXPECT_EQ(p->gpus_per_node, 8);
  }
  EXPECT_FALSE(node->has_inter_node);
  ASSERT_TRUE(ib->has_inter_node);
  EXPECT_LT(ib->inter_node.bus_bytes_per_second, ib->intra_node.bus_bytes_per_second);
}

TEST(HardwareProfileTest, ParsesEveryKey) {
  auto p = ParseHardwareProfile(kValid, "test.yaml");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->name, "test node");
  EXPECT_DOUBLE_EQ(p->AchievedFlopsPerSecond(), 0.5e15);
  EXPECT_EQ(p->memory_bytes, 80'000'000'000);
  EXPECT_EQ(p->gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(p->intra_node.latency_seconds, 10e-6);
  EXPECT_DOUBLE_EQ(p->intra_node.bus_bytes_per_second, 300e9);
  ASSERT_TRUE(p->has_inter_node);
  EXPECT_DOUBLE_EQ(p->inter_node.bus_bytes_per_second, 40e9);
}

TEST(HardwareProfileTest, InterNodeLinkIsOptional) {
  const std::string text = kValid.substr(0, kValid.find("inter_node:"));
  auto p = ParseHardwareProfile(text, "one-node.yaml");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->has_inter_node);
}

TEST(HardwareProfileTest, CpuSharingKeysAreOptionalAndReachTheCostModel) {
  auto gpu = ParseHardwareProfile(kValid, "test.yaml");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(gpu->interference, 0);
  EXPECT_EQ(gpu->host_copy_bytes_per_second, 0);
  auto cpu = ParseHardwareProfile(kValid + "interference: 0.5\nhost_copy_bytes_per_second: 4e9\n", "test.yaml");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto cost = MakeCostModel(*cpu, 1, 2);
  ASSERT_TRUE(cost.ok()) << cost.status().ToString();
  EXPECT_DOUBLE_EQ(cost->interference, 0.5);
  EXPECT_DOUBLE_EQ(cost->CopySeconds(int64_t{4} << 30), (int64_t{4} << 30) / 4e9);
  auto bad = ParseHardwareProfile(kValid + "interference: -1\n", "test.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("interference"), std::string::npos) << bad.status().message();
}

TEST(HardwareProfileTest, UnknownTopLevelKeyIsNamed) {
  auto p = ParseHardwareProfile(kValid + "peak_tflops: 989\n", "my.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("my.yaml"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("unknown key 'peak_tflops'"), std::string::npos) << p.status().message();
}

TEST(HardwareProfileTest, UnknownNestedKeyIsNamedWithItsSection) {
  const std::string text = WithLine("intra_node", "intra_node:\n  bandwidth: 300e9");
  auto p = ParseHardwareProfile(text, "my.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("'intra_node.bandwidth'"), std::string::npos) << p.status().message();
}

TEST(HardwareProfileTest, BadValuesNameTheKeyAndTheValue) {
  struct Case {
    std::string key, line, expect_key, expect_value;
  };
  const Case cases[] = {
      {"achieved_mfu", "achieved_mfu: 1.5", "'achieved_mfu'", "1.5"},
      {"achieved_mfu", "achieved_mfu: 0", "'achieved_mfu'", "0"},
      {"peak_flops_per_second", "peak_flops_per_second: fast", "'peak_flops_per_second'", "'fast'"},
      {"memory_bytes", "memory_bytes: -1", "'memory_bytes'", "-1"},
      {"gpus_per_node", "gpus_per_node: 8.5", "'gpus_per_node'", "'8.5'"},
      {"gpus_per_node", "gpus_per_node: [8]", "'gpus_per_node'", "a list"},
      {"name", "name: ''", "'name'", "''"},
  };
  for (const auto& c : cases) {
    auto p = ParseHardwareProfile(WithLine(c.key, c.line), "bad.yaml");
    ASSERT_FALSE(p.ok()) << c.line;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput) << c.line;
    const std::string& m = p.status().message();
    EXPECT_NE(m.find("bad.yaml"), std::string::npos) << m;
    EXPECT_NE(m.find(c.expect_key), std::string::npos) << m;
    EXPECT_NE(m.find(c.expect_value), std::string::npos) << m;
  }
}

TEST(HardwareProfileTest, BadLinkValueNamesTheNestedKey) {
  std::string text = kValid;
  text.replace(text.find("300e9"), 5, "300GB");
  auto p = ParseHardwareProfile(text, "bad.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'intra_node.bus_bytes_per_second'"), std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("'300GB'"), std::string::npos) << p.status().message();
}

TEST(HardwareProfileTest, MissingRequiredKeyIsNamed) {
  auto p = ParseHardwareProfile(WithLine("memory_bytes", ""), "short.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("'memory_bytes'"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("missing"), std::string::npos) << p.status().message();
}

TEST(HardwareProfileTest, YamlSyntaxErrorNamesFileAndLine) {
  auto p = ParseHardwareProfile("name: [unclosed\n", "broken.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("broken.yaml"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("line"), std::string::npos) << p.status().message();
}

TEST(HardwareProfileTest, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path = kProfiles + "no-such-profile.yaml";
  auto p = LoadHardwareProfile(path);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find(path), std::string::npos) << p.status().message();
}

TEST(HardwareProfileTest, GroupsWithinNodeFollowsTheRankLayout) {
  struct Case {
    int size, stride, world, gpus_per_node;
    bool within;
  };
  const Case cases[] = {
      {1, 1, 64, 8, true},    // a group of one crosses nothing
      {8, 1, 8, 8, true},     // one full node
      {4, 1, 4, 8, true},     // part of a node
      {8, 1, 64, 8, true},    // HSDP shard groups: one node each
      {16, 1, 64, 8, false},  // two nodes per group
      {3, 1, 9, 8, false},    // the third group (ranks 6-8) straddles nodes 0 and 1
      {8, 8, 64, 8, false},   // HSDP replicate groups: one rank per node
      {2, 4, 8, 8, true},     // replicate groups inside one node
      {2, 4, 8, 4, false},    // ... but not with 4 per node
  };
  for (const auto& c : cases) {
    EXPECT_EQ(GroupsWithinNode(c.size, c.stride, c.world, c.gpus_per_node), c.within)
        << "size " << c.size << " stride " << c.stride << " world " << c.world << " per node " << c.gpus_per_node;
  }
}

TEST(HardwareProfileTest, CostModelPicksTheLinkEachGroupCrosses) {
  auto p = ParseHardwareProfile(kValid, "test.yaml");
  ASSERT_TRUE(p.ok());
  auto within = MakeCostModel(*p, 1, 8);
  ASSERT_TRUE(within.ok());
  EXPECT_EQ(within->dp_shard, 8);
  EXPECT_EQ(within->dp_replicate, 1);
  EXPECT_DOUBLE_EQ(within->shard_link.bus_bytes_per_second, 300e9);

  auto across = MakeCostModel(*p, 1, 64);
  ASSERT_TRUE(across.ok());
  EXPECT_DOUBLE_EQ(across->shard_link.bus_bytes_per_second, 40e9);
  EXPECT_DOUBLE_EQ(across->shard_link.latency_seconds, 50e-6);

  auto hsdp = MakeCostModel(*p, 8, 8);
  ASSERT_TRUE(hsdp.ok());
  EXPECT_DOUBLE_EQ(hsdp->shard_link.bus_bytes_per_second, 300e9);
  EXPECT_DOUBLE_EQ(hsdp->replicate_link.bus_bytes_per_second, 40e9);
}

// tp is the innermost dim: a tp group is consecutive GPUs of one node, a shard group every tp-th.
TEST(HardwareProfileTest, TensorParallelGroupsStayInANodeAndShardGroupsStrideOverThem) {
  auto p = ParseHardwareProfile(kValid, "test.yaml");  // 8 GPUs a node
  ASSERT_TRUE(p.ok());
  auto fsdp32_tp8 = MakeCostModel(*p, 1, 32, 8);
  ASSERT_TRUE(fsdp32_tp8.ok()) << fsdp32_tp8.status().ToString();
  EXPECT_EQ(fsdp32_tp8->tp, 8);
  EXPECT_DOUBLE_EQ(fsdp32_tp8->tp_link.bus_bytes_per_second, 300e9);   // within the node
  EXPECT_DOUBLE_EQ(fsdp32_tp8->shard_link.bus_bytes_per_second, 40e9);  // one GPU a node
  // dp_shard 2 x tp 4 fills a node: both inside it.
  auto small = MakeCostModel(*p, 4, 2, 4);
  ASSERT_TRUE(small.ok());
  EXPECT_DOUBLE_EQ(small->shard_link.bus_bytes_per_second, 300e9);
  EXPECT_DOUBLE_EQ(small->replicate_link.bus_bytes_per_second, 40e9);
  // tp 16 crosses nodes: the inter-node link.
  auto wide = MakeCostModel(*p, 1, 2, 16);
  ASSERT_TRUE(wide.ok());
  EXPECT_DOUBLE_EQ(wide->tp_link.bus_bytes_per_second, 40e9);
  EXPECT_EQ(MakeCostModel(*p, 1, 2, 0).status().code(), StatusCode::kInvalidConfig);
}

TEST(HardwareProfileTest, SingleNodeProfileRefusesAMeshThatCrossesNodes) {
  auto p = LoadHardwareProfile(kProfiles + "h100-nvlink-node.yaml");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(MakeCostModel(*p, 1, 8).ok());
  auto c = MakeCostModel(*p, 2, 8);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(c.status().message().find(p->name), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("dp_replicate"), std::string::npos) << c.status().message();
}

TEST(HardwareProfileTest, CostModelRefusesAnEmptyMeshDimension) {
  auto p = ParseHardwareProfile(kValid, "test.yaml");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(MakeCostModel(*p, 1, 0).status().code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(MakeCostModel(*p, 0, 8).status().code(), StatusCode::kInvalidConfig);
}

}  // namespace
}  // namespace meshwork::compiler

namespace meshwork::compiler {
namespace {

// The files of bench/profiles/ are built in, by name, and parse as the files do.
TEST(HardwareProfile, BuiltInProfilesAreTheShippedFiles) {
  const std::vector<std::string> names = BuiltinProfileNames();
  EXPECT_EQ(names, (std::vector<std::string>{"cpu-gloo-local", "h100-ib-400g", "h100-nvlink-node"}));
  for (const std::string& name : names) {
    auto built_in = FindHardwareProfile(name);
    auto file = FindHardwareProfile(kProfiles + name + ".yaml");
    ASSERT_TRUE(built_in.ok()) << built_in.status().ToString();
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ(built_in->name, file->name);
    EXPECT_EQ(built_in->memory_bytes, file->memory_bytes);
    EXPECT_EQ(built_in->intra_node.bus_bytes_per_second, file->intra_node.bus_bytes_per_second);
  }
  auto unknown = FindHardwareProfile("h100-nvlnk-node");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("no built-in hardware profile 'h100-nvlnk-node' (built in: cpu-gloo-local, "
                                            "h100-ib-400g, h100-nvlink-node"),
            std::string::npos)
      << unknown.status().message();
  EXPECT_EQ(FindHardwareProfile("/nonexistent/profile.yaml").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace meshwork::compiler
