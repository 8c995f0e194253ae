// Mesh shape resolution and the per-dim groups of a DeviceMesh.
#include "trainer/dist/device_mesh.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <stdexcept>

namespace meshwork::dist {
namespace {

std::string ShapeText(int dp_replicate, int dp_shard, int tp) {
  return "dp_replicate=" + std::to_string(dp_replicate) + " x dp_shard=" +
         std::to_string(dp_shard) + " x tp=" + std::to_string(tp);
}

std::string KnownDims() {
  std::string s;
  for (const auto& d : DeviceMesh::DimNames()) s += (s.empty() ? "" : ", ") + d;
  return s;
}

}  // namespace

Result<MeshShape> ResolveMeshShape(int world_size, int dp_replicate, int dp_shard, int tp) {
  if (world_size < 1) {
    return InvalidConfig("world size must be at least 1, got " + std::to_string(world_size));
  }
  if (tp < 1) {
    return InvalidConfig("tp=" + std::to_string(tp) + ": tensor parallel ranks must be at least 1");
  }
  if (world_size % tp != 0) {
    return InvalidConfig("tp=" + std::to_string(tp) + " does not divide the world size " +
                         std::to_string(world_size));
  }
  if (dp_replicate < 0 || dp_shard < 0) {
    return InvalidConfig("mesh dims must be positive or 0 (auto): " +
                         ShapeText(dp_replicate, dp_shard, tp));
  }
  MeshShape shape;
  shape.tp = tp;
  // The data parallel ranks: what tp leaves of the world.
  const int dp = world_size / tp;
  const std::string dp_text = tp == 1 ? "the world size " + std::to_string(world_size)
                                      : "the world size " + std::to_string(world_size) + " / tp=" +
                                            std::to_string(tp) + " = " + std::to_string(dp);
  if (dp_replicate == 0 && dp_shard == 0) dp_replicate = 1;
  if (dp_shard == 0) {
    if (dp % dp_replicate != 0) {
      return InvalidConfig("dp_replicate=" + std::to_string(dp_replicate) + " does not divide " + dp_text +
                           " (dp_shard=0 is auto)");
    }
    dp_shard = dp / dp_replicate;
  } else if (dp_replicate == 0) {
    if (dp % dp_shard != 0) {
      return InvalidConfig("dp_shard=" + std::to_string(dp_shard) + " does not divide " + dp_text +
                           " (dp_replicate=0 is auto)");
    }
    dp_replicate = dp / dp_shard;
  }
  const long product = static_cast<long>(dp_replicate) * dp_shard * tp;
  if (product != world_size) {
    return InvalidConfig("mesh " + ShapeText(dp_replicate, dp_shard, tp) + " has " +
                         std::to_string(product) + " ranks but the world size is " +
                         std::to_string(world_size));
  }
  shape.dp_replicate = dp_replicate;
  shape.dp_shard = dp_shard;
  return shape;
}

const std::vector<std::string>& DeviceMesh::DimNames() {
  static const std::vector<std::string> names = {"world", "dp_replicate", "dp_shard", "dp_shard_reduce", "tp"};
  return names;
}

Result<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(c10::intrusive_ptr<c10d::Store> store,
                                                       int rank, MeshShape shape,
                                                       const CommunicatorFactory& factory,
                                                       const CommunicatorOptions& options) {
  const int world = shape.dp_replicate * shape.dp_shard * shape.tp;
  if (shape.tp < 1 || shape.dp_replicate < 1 || shape.dp_shard < 1) {
    return InvalidConfig("mesh " + ShapeText(shape.dp_replicate, shape.dp_shard, shape.tp) +
                         " is not resolved; use ResolveMeshShape");
  }
  if (rank < 0 || rank >= world) {
    return InvalidConfig("rank " + std::to_string(rank) + " is outside the mesh " +
                         ShapeText(shape.dp_replicate, shape.dp_shard, shape.tp));
  }
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh(rank, shape));
  for (const std::string& dim : DimNames()) {
    if (dim == "tp" && shape.tp == 1) {
      // No communicator for a group of one: nothing would use it, and under NCCL it would hold
      // a stream and buffers for every run without tensor parallelism.
      mesh->groups_.push_back(nullptr);
      continue;
    }
    // The group index is the position in the dims the group does not span, in layout order.
    const int tp_index = mesh->coordinate("tp");
    int group_index = 0;
    if (dim == "dp_replicate") group_index = mesh->coordinate("dp_shard") * shape.tp + tp_index;
    if (dim == "dp_shard" || dim == "dp_shard_reduce") group_index = mesh->coordinate("dp_replicate") * shape.tp + tp_index;
    if (dim == "tp") group_index = rank / shape.tp;
    const std::string prefix = "mesh/" + dim + "/" + std::to_string(group_index);
    CommunicatorOptions group_options = options;
    group_options.group_name = dim;
    auto group_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    Result<std::unique_ptr<Communicator>> comm =
        factory(group_store, mesh->coordinate(dim), mesh->size(dim), group_options);
    if (!comm.ok()) {
      return Status(comm.status().code(), "creating the " + dim + " group " +
                                              std::to_string(group_index) + " (size " +
                                              std::to_string(mesh->size(dim)) + ") on rank " +
                                              std::to_string(rank) + ": " +
                                              comm.status().message());
    }
    mesh->groups_.push_back(std::move(comm).value());
  }
  return mesh;
}

int DeviceMesh::DimIndex(const std::string& dim) const {
  const auto& names = DimNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == dim) return static_cast<int>(i);
  }
  return -1;
}

int DeviceMesh::size(const std::string& dim) const {
  switch (DimIndex(dim)) {
    case 0: return shape_.dp_replicate * shape_.dp_shard * shape_.tp;
    case 1: return shape_.dp_replicate;
    case 2:
    case 3: return shape_.dp_shard;
    case 4: return shape_.tp;
  }
  throw std::invalid_argument("unknown mesh dim '" + dim + "'; known: " + KnownDims());
}

int DeviceMesh::coordinate(const std::string& dim) const {
  switch (DimIndex(dim)) {
    case 0: return rank_;
    case 1: return rank_ / shape_.tp / shape_.dp_shard;
    case 2:
    case 3: return rank_ / shape_.tp % shape_.dp_shard;
    case 4: return rank_ % shape_.tp;
  }
  throw std::invalid_argument("unknown mesh dim '" + dim + "'; known: " + KnownDims());
}

Result<Communicator*> DeviceMesh::find_group(const std::string& dim) {
  int i = DimIndex(dim);
  if (i < 0 || i >= static_cast<int>(groups_.size())) {
    return InvalidConfig("unknown mesh dim '" + dim + "'; known: " + KnownDims());
  }
  if (groups_[i] == nullptr) return InvalidConfig("mesh dim '" + dim + "' has no group: it is 1 (only tp > 1 has one)");
  return groups_[i].get();
}

std::vector<Communicator*> DeviceMesh::groups() {
  std::vector<Communicator*> out;
  for (const auto& g : groups_)
    if (g != nullptr) out.push_back(g.get());
  return out;
}

Communicator& DeviceMesh::group(const std::string& dim) {
  Result<Communicator*> g = find_group(dim);
  if (!g.ok()) throw std::invalid_argument(g.status().message());
  return **g;
}

}  // namespace meshwork::dist
