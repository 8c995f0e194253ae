// What the parallel training tests (FSDP, tensor parallelism) share when they train a sharded
// model beside one process: the optimizer both sides use, and a count of the blocks activation
// checkpointing recomputes.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/dist/gloo_communicator.h"

namespace meshwork::testing {

// AdamW with weight decay on `decay` only. eps 1e-4 rather than 1e-8: with a tiny eps, Adam turns
// a gradient element of 1e-9 (rounding noise) into a full-size update, so reduction order alone
// would move single weights.
inline torch::optim::AdamW MakeOptimizer(std::vector<torch::Tensor> decay, std::vector<torch::Tensor> no_decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(1e-2).eps(1e-4).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(1e-2).eps(1e-4).weight_decay(0.0)));
  return torch::optim::AdamW(groups, torch::optim::AdamWOptions(1e-2));
}

// Runs `rank_main(rank, mesh)` for every rank of a mesh of `shape`, each a thread of this process
// with its own Gloo communicators over loopback (60 s timeout), and returns each rank's error:
// "" where it returned Ok, else its status or the exception it threw.
inline std::vector<std::string> RunMesh(const dist::MeshShape& shape,
                                        const std::function<Status(int rank, dist::DeviceMesh& mesh)>& rank_main) {
  const int world = shape.dp_replicate * shape.dp_shard * shape.tp;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        dist::CommunicatorOptions options;
        options.timeout = std::chrono::seconds(60);
        auto factory = [](c10::intrusive_ptr<c10d::Store> s, int r, int n, const dist::CommunicatorOptions& o) {
          return dist::MakeGlooCommunicator(s, r, n, o, "127.0.0.1");
        };
        auto mesh = dist::DeviceMesh::Create(store, rank, shape, factory, options);
        const Status status = mesh.ok() ? rank_main(rank, **mesh) : mesh.status();
        if (!status.ok()) errors[rank] = status.ToString();
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Checkpointed blocks (model::Recompute's autograd node) in the graph behind `loss`.
inline int RecomputeNodes(const torch::Tensor& loss) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find("RecomputeFunction") != std::string::npos) ++n;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return n;
}

}  // namespace meshwork::testing
