// The device mesh: named dims over the world (data parallel: dp_replicate, dp_shard; tensor
// parallel: tp), this rank's coordinate in each, and the communicator for each group this rank
// belongs to.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/dist/communicator.h"

namespace meshwork::dist {

// world = dp_replicate · dp_shard · tp. FSDP shards over dp_shard and all-reduces over
// dp_replicate (HSDP); tensor parallelism splits each layer's weights over tp
// (trainer/tp/tensor_parallel.h).
struct MeshShape {
  int dp_replicate = 1;
  int dp_shard = 1;
  int tp = 1;
};

// dp_replicate or dp_shard 0 means "whatever makes the product the world size" (both 0: all
// ranks shard what tp leaves). tp < 1, a dim that does not divide the world, or a product other
// than the world size is kInvalidConfig naming the dims, their product and the world size.
Result<MeshShape> ResolveMeshShape(int world_size, int dp_replicate, int dp_shard, int tp);

// Builds the communicator of one group: (store scoped to the group, rank in group, group size,
// options with group_name set to the dim).
using CommunicatorFactory = std::function<Result<std::unique_ptr<Communicator>>(
    c10::intrusive_ptr<c10d::Store>, int rank, int size, const CommunicatorOptions&)>;

// Rank layout: rank = (replicate_index · dp_shard + shard_index) · tp + tp_index. tp innermost, so
// a tp group is a run of consecutive ranks (the GPUs of one node: its collectives are on the
// critical path of every layer), then dp_shard; with tp 1, a dp_shard group is such a run.
class DeviceMesh {
 public:
  // Names accepted by coordinate() and group(), in the order groups are created:
  // {"world", "dp_replicate", "dp_shard", "dp_shard_reduce", "tp"}. dp_shard_reduce spans the same
  // ranks as dp_shard with its own communicator: FSDP's reduce-scatter lane, so that
  // reduce-scatters and all-gathers never queue behind each other. At tp 1 there is no tp group
  // (group("tp") throws, find_group says so); coordinate("tp") and size("tp") are 0 and 1.
  static const std::vector<std::string>& DimNames();

  // Creates this rank's groups in DimNames() order (the same on every rank, so group set-up
  // cannot deadlock), each over PrefixStore("mesh/<dim>/<group index>", store): groups never
  // share keys. The group index numbers the group among those of its dim: the rank's position
  // in the dims the group does not span, in layout order (0 for world; with tp 1, a dp group's
  // index is the coordinate in the other dp dim).
  static Result<std::unique_ptr<DeviceMesh>> Create(c10::intrusive_ptr<c10d::Store> store,
                                                    int rank, MeshShape shape,
                                                    const CommunicatorFactory& factory,
                                                    const CommunicatorOptions& options);

  int rank() const { return rank_; }
  MeshShape shape() const { return shape_; }
  int size(const std::string& dim) const;  // ranks in the group of `dim`

  // Index of this rank along `dim` ("world": the rank itself). An unknown name is a bug in the
  // caller: both throw std::invalid_argument listing the known names. find_group is the
  // non-throwing form for names that come from a config.
  int coordinate(const std::string& dim) const;
  Communicator& group(const std::string& dim);
  Result<Communicator*> find_group(const std::string& dim);
  // Every group this rank has, in DimNames() order (for statistics over all of them).
  std::vector<Communicator*> groups();

 private:
  DeviceMesh(int rank, MeshShape shape) : rank_(rank), shape_(shape) {}
  int DimIndex(const std::string& dim) const;  // -1 when unknown

  int rank_;
  MeshShape shape_;
  std::vector<std::unique_ptr<Communicator>> groups_;  // indexed like DimNames(); null: no group
};

}  // namespace meshwork::dist
