#include "trainer/compiler/pipeline/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace meshwork::compiler::pipeline {
namespace {

// The best split of prefix sums `cost` (n + 1 entries) into `stages` non-empty runs by the
// largest run's cost, using only runs that `allowed(j, i)` (layers [j, i)); first_layer of the
// best, or empty where no split is allowed.
template <typename T, typename Allowed>
std::vector<int> MinMaxSplit(const std::vector<T>& cost, int stages, const Allowed& allowed, T* best_max) {
  const int n = static_cast<int>(cost.size()) - 1;
  const T none = std::numeric_limits<T>::max();
  // best[s][i]: the least largest run over splits of the first i layers into s runs; cut[s][i]:
  // where the last of those runs begins.
  std::vector<std::vector<T>> best(stages + 1, std::vector<T>(n + 1, none));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  best[0][0] = T{};
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= n - (stages - s); ++i) {
      for (int j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == none || !allowed(j, i)) continue;
        const T here = std::max(best[s - 1][j], cost[i] - cost[j]);
        if (here < best[s][i]) {
          best[s][i] = here;
          cut[s][i] = j;
        }
      }
    }
  }
  if (best[stages][n] == none) return {};
  std::vector<int> first(stages + 1, 0);
  first[stages] = n;
  for (int s = stages, i = n; s >= 1; --s) {
    i = cut[s][i];
    first[s - 1] = i;
  }
  *best_max = best[stages][n];
  return first;
}

}  // namespace

Result<StagePartition> PartitionLayers(const std::vector<LayerCost>& layers, int stages) {
  const int n = static_cast<int>(layers.size());
  if (stages < 1 || n < stages) {
    return InvalidConfig("pipeline: " + std::to_string(n) + " decoder layers cannot fill " + std::to_string(stages) +
                         " stages (each stage needs at least one layer)");
  }
  std::vector<double> seconds(n + 1, 0);
  std::vector<int64_t> bytes(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    seconds[i + 1] = seconds[i] + std::max(0.0, layers[i].seconds);
    bytes[i + 1] = bytes[i] + std::max<int64_t>(0, layers[i].bytes);
  }
  // First the fastest slowest stage; then, among the splits whose every stage is within it (a
  // relative 1e-9, so that sums taken in another order tie), the smallest largest stage.
  StagePartition p;
  MinMaxSplit(seconds, stages, [](int, int) { return true; }, &p.max_seconds);
  const double limit = p.max_seconds * (1 + 1e-9) + 1e-300;
  p.first_layer = MinMaxSplit(bytes, stages, [&](int j, int i) { return seconds[i] - seconds[j] <= limit; }, &p.max_bytes);
  // The largest stage of that split by seconds (within the limit of the first).
  p.max_seconds = 0;
  for (int s = 0; s < stages; ++s)
    p.max_seconds = std::max(p.max_seconds, seconds[p.first_layer[s + 1]] - seconds[p.first_layer[s]]);
  return p;
}

}  // namespace meshwork::compiler::pipeline
