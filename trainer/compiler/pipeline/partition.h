// Stages of a pipeline: the decoder layers in contiguous runs, one run per stage, balanced by the
// cost model's per-layer compute and memory rather than by layer counts (the embedding rides
// with the first layer and the head with the last, so the first and last stages are charged
// for them and usually get fewer layers).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace meshwork::compiler::pipeline {

struct LayerCost {
  double seconds = 0;     // forward + backward
  int64_t bytes = 0;      // what the layer holds per micro-batch in flight (activations)
};

struct StagePartition {
  // Stage s runs layers [first_layer[s], first_layer[s + 1]); first_layer has stages + 1 entries.
  std::vector<int> first_layer;
  double max_seconds = 0;  // the slowest stage's compute: the pipeline's beat
  int64_t max_bytes = 0;   // the largest stage's held bytes per micro-batch
};

// The split of `layers` into `stages` non-empty contiguous runs whose slowest stage is the
// fastest possible; among those, the one whose largest stage holds the fewest bytes.
// InvalidConfig naming both counts when there are fewer layers than stages.
Result<StagePartition> PartitionLayers(const std::vector<LayerCost>& layers, int stages);

}  // namespace meshwork::compiler::pipeline
