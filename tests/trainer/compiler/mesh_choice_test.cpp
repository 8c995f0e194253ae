// mesh: auto: every buildable factorisation of the world is planned and simulated, and the
// fastest that fits the device's memory is chosen.
#include "trainer/compiler/mesh_choice.h"

#include <gtest/gtest.h>

#include <string>

namespace meshwork::compiler {
namespace {

// Nodes of 2 devices: a fast link inside a node, a slow one between nodes.
HardwareProfile TwoPerNode(int64_t memory_bytes) {
  HardwareProfile p;
  p.name = "test";
  p.peak_flops_per_second = 1e14;
  p.achieved_mfu = 0.5;
  p.memory_bytes = memory_bytes;
  p.gpus_per_node = 2;
  p.intra_node = {10e-6, 100e9};
  p.has_inter_node = true;
  p.inter_node = {50e-6, 1e9};
  return p;
}

LlamaShape Tiny() {
  LlamaShape s;
  s.config = *model::PresetConfig("llama-100m");
  s.batch = 2;
  s.seq_len = 512;
  s.flops_per_second = 5e13;
  return s;
}

TEST(MeshChoice, PicksTheFastestMeshThatFits) {
  auto choice = ChooseMesh(TwoPerNode(int64_t{80} << 30), Tiny(), 4, PlanOptions());
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  ASSERT_EQ(choice->candidates.size(), 3u);  // 4x1, 2x2, 1x4
  const MeshCandidate* fastest = nullptr;
  for (const auto& c : choice->candidates) {
    EXPECT_EQ(c.dp_replicate * c.dp_shard, 4);
    EXPECT_EQ(c.rejected, "");
    EXPECT_TRUE(c.fits) << c.dp_replicate << "x" << c.dp_shard;
    EXPECT_GT(c.compiled.step_seconds, 0);
    if (fastest == nullptr || c.compiled.step_seconds < fastest->compiled.step_seconds) fastest = &c;
  }
  EXPECT_EQ(choice->dp_shard, fastest->dp_shard);
  EXPECT_EQ(choice->dp_replicate, fastest->dp_replicate);
  // The slow link between nodes makes fully sharding over both nodes (1x4) the slowest.
  EXPECT_NE(choice->dp_shard, 4);
  EXPECT_NE(choice->reason.find("the fastest predicted step"), std::string::npos) << choice->reason;
  EXPECT_NE(choice->reason.find("of the 3 of 3 buildable meshes"), std::string::npos) << choice->reason;
  // Without the full plan of the winner (the trainer's way) the choice is the same.
  auto quick_only = ChooseMesh(TwoPerNode(int64_t{80} << 30), Tiny(), 4, PlanOptions(), /*plan_chosen=*/false);
  ASSERT_TRUE(quick_only.ok()) << quick_only.status().ToString();
  EXPECT_EQ(quick_only->dp_shard, choice->dp_shard);
  for (const auto& c : quick_only->candidates) EXPECT_TRUE(c.choices.empty());
}

TEST(MeshChoice, MemoryRulesOutMeshesThatShardTooLittle) {
  // Device memory that holds only the static state of a mesh sharded 2 ways: meshes that shard
  // less or as little cannot fit, whatever their plans do; sharding 4 ways is the choice.
  const LlamaShape shape = Tiny();
  auto roomy = ChooseMesh(TwoPerNode(int64_t{80} << 30), shape, 4, PlanOptions());
  ASSERT_TRUE(roomy.ok());
  int64_t static2 = 0;
  for (const auto& c : roomy->candidates)
    if (c.dp_shard == 2) static2 = c.compiled.static_bytes;
  ASSERT_GT(static2, 0);
  auto tight = ChooseMesh(TwoPerNode(static2), shape, 4, PlanOptions());
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  EXPECT_EQ(tight->dp_shard, 4) << tight->reason;
  for (const auto& c : tight->candidates) {
    if (c.dp_shard < 4) {
      EXPECT_FALSE(c.fits) << c.dp_shard;
    }
  }
  // Nothing fits: the least memory, said so.
  auto none = ChooseMesh(TwoPerNode(1 << 20), shape, 4, PlanOptions());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->dp_shard, 4);
  EXPECT_NE(none->reason.find("no mesh fits the device's memory"), std::string::npos) << none->reason;
}

TEST(MeshChoice, MeshesTheProfileCannotBuildAreRejectedWithTheReason) {
  HardwareProfile one_node = TwoPerNode(int64_t{80} << 30);
  one_node.has_inter_node = false;
  // Every mesh of 4 ranks on nodes of 2 has groups that cross nodes: none can be built, and
  // the error names the profile and why.
  auto four = ChooseMesh(one_node, Tiny(), 4, PlanOptions());
  ASSERT_FALSE(four.ok());
  EXPECT_EQ(four.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(four.status().message().find("cannot build any mesh of 4 ranks"), std::string::npos)
      << four.status().message();
  EXPECT_NE(four.status().message().find("no inter_node link"), std::string::npos) << four.status().message();
  auto two = ChooseMesh(one_node, Tiny(), 2, PlanOptions());
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->candidates.size(), 2u);
  for (const auto& c : two->candidates) EXPECT_EQ(c.rejected, "") << c.dp_replicate << "x" << c.dp_shard;
  EXPECT_FALSE(ChooseMesh(one_node, Tiny(), 0, PlanOptions()).ok());
}

}  // namespace
}  // namespace meshwork::compiler
