// A hardware profile: what one device computes and holds, and what its links move, read from a
// YAML file (bench/profiles/*.yaml). The simulator turns it into a CostModel for a mesh and
// into the achieved FLOP rate that models compute from FLOPs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"

namespace meshwork::compiler {

struct HardwareProfile {
  std::string name;
  double peak_flops_per_second = 0;  // per device; dense bf16 on GPUs
  double achieved_mfu = 0;           // fraction of peak the model's matmuls reach, in (0, 1]
  int64_t memory_bytes = 0;          // per device
  int gpus_per_node = 1;             // devices that share the intra-node link
  LinkCost intra_node;
  // Absent in single-node profiles; a mesh whose groups cross nodes then fails to build.
  bool has_inter_node = false;
  LinkCost inter_node;
  // CPU ranks: CostModel::interference and host_copy_bytes_per_second (0 for GPUs).
  double interference = 0;
  double host_copy_bytes_per_second = 0;

  double AchievedFlopsPerSecond() const { return peak_flops_per_second * achieved_mfu; }
};

// Keys (all required unless marked):
//   name: "..."                    peak_flops_per_second: 989e12     achieved_mfu: 0.4
//   memory_bytes: 80e9             gpus_per_node: 8
//   intra_node: {latency_seconds: 25e-6, bus_bytes_per_second: 360e9}
//   inter_node: {latency_seconds: ..., bus_bytes_per_second: ...}   (optional)
//   interference: 0.3   host_copy_bytes_per_second: 5e9               (optional, CPU ranks)
// A missing file is kNotFound; bad YAML, an unknown or missing key or a bad value is
// kInvalidInput naming the file, the key and the value.
Result<HardwareProfile> LoadHardwareProfile(const std::string& path);
// The same from text; `source` names it in errors (a path, or "<string>").
Result<HardwareProfile> ParseHardwareProfile(const std::string& yaml_text, const std::string& source);

// The profiles of bench/profiles/, built into the binary, by file name without .yaml
// ("h100-ib-400g"); an unknown name is kNotFound listing the built-in ones.
std::vector<std::string> BuiltinProfileNames();
Result<HardwareProfile> BuiltinProfile(const std::string& name);
// A path (it contains '/' or ends in .yaml) is loaded as a file, anything else is a built-in name.
Result<HardwareProfile> FindHardwareProfile(const std::string& name_or_path);

// Whether every group of a mesh dimension stays inside one node. A group is `group_size` ranks
// `stride` apart (1: consecutive), the groups together every rank of `world`, which fills nodes
// of `gpus_per_node` in order.
bool GroupsWithinNode(int group_size, int stride, int world, int gpus_per_node);

// The cost model of a dp_replicate x dp_shard x tp mesh (tp innermost, as DeviceMesh lays ranks
// out): each dimension's collectives run at the intra-node link when all its groups fit within a
// node, else at the inter-node link (a ring that crosses nodes runs at its slowest hop).
// kInvalidConfig when a dimension is < 1 or a group crosses nodes in a profile without an
// inter-node link.
Result<CostModel> MakeCostModel(const HardwareProfile& profile, int dp_replicate, int dp_shard, int tp = 1);

}  // namespace meshwork::compiler
