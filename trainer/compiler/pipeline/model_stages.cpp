#include "trainer/compiler/pipeline/model_stages.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace meshwork::compiler::pipeline {

Result<ModelStages> StagesOf(const Graph& g, const CostModel& cost, int stages, int64_t boundary_bytes,
                             const LinkCost& link) {
  // Per decoder layer, in order; what precedes the first layer (the embedding) and follows the
  // last (the head) joins it.
  struct Part {
    double fwd = 0, bwd = 0;
    int64_t bytes = 0;
  };
  std::vector<Part> layers;
  Part before, after;
  for (const ModuleInfo& m : g.modules) {
    const double tp_fwd = g.tp > 1 ? cost.TpSeconds(m, Phase::kForward) : 0;
    const double tp_bwd = g.tp > 1 ? cost.TpSeconds(m, Phase::kBackward) : 0;
    const Part p{m.fwd_seconds + tp_fwd, m.bwd_seconds + tp_bwd, m.activation_bytes};
    const bool layer = m.name.rfind("layers.", 0) == 0;
    Part& into = layer ? layers.emplace_back() : (layers.empty() ? before : after);
    into.fwd += p.fwd;
    into.bwd += p.bwd;
    into.bytes += p.bytes;
  }
  if (layers.empty()) return InvalidConfig("pipeline: the model has no decoder layers to cut into stages");
  auto add = [](Part& into, const Part& extra) {
    into.fwd += extra.fwd;
    into.bwd += extra.bwd;
    into.bytes += extra.bytes;
  };
  add(layers.front(), before);
  add(layers.back(), after);
  std::vector<LayerCost> per_layer;
  for (const Part& p : layers) per_layer.push_back({p.fwd + p.bwd, p.bytes});
  ModelStages out;
  MW_ASSIGN_OR_RETURN(out.partition, PartitionLayers(per_layer, stages));
  out.cost.link = link;
  for (int s = 0; s < stages; ++s) {
    StageCost c;
    for (int i = out.partition.first_layer[s]; i < out.partition.first_layer[s + 1]; ++i) {
      c.forward_seconds += layers[i].fwd;
      c.backward_input_seconds += layers[i].bwd / 2;
      c.backward_weight_seconds += layers[i].bwd / 2;
      c.activation_bytes += layers[i].bytes;
    }
    c.weight_grad_bytes = c.activation_bytes / 2;
    c.output_bytes = boundary_bytes;
    out.cost.stages.push_back(c);
  }
  return out;
}

Result<std::vector<StageParams>> StageParamsOf(const Graph& g, const StagePartition& partition) {
  const int stages = static_cast<int>(partition.first_layer.size()) - 1;
  // Each module's stage: decoder layers by the cut, what precedes them with the first stage and
  // what follows with the last.
  std::vector<std::set<int>> params(static_cast<size_t>(std::max(stages, 0)));
  int layer = 0, stage = 0;
  for (const ModuleInfo& m : g.modules) {
    const bool is_layer = m.name.rfind("layers.", 0) == 0;
    if (is_layer) {
      while (stage + 1 < stages && layer >= partition.first_layer[static_cast<size_t>(stage) + 1]) ++stage;
      ++layer;
    }
    const int at = is_layer ? stage : (layer == 0 ? 0 : stages - 1);
    if (at < 0 || at >= stages) break;
    for (const std::vector<int>* list : {&m.params, &m.rows, &m.vocab}) {
      params[static_cast<size_t>(at)].insert(list->begin(), list->end());
    }
  }
  if (stages < 1 || partition.first_layer.back() != layer) {
    return InvalidConfig("pipeline: a cut of " + std::to_string(partition.first_layer.back()) + " decoder layers into " +
                         std::to_string(stages) + " stages, but the model has " + std::to_string(layer));
  }
  std::vector<StageParams> out(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    for (int p : params[static_cast<size_t>(s)]) {
      const ParamInfo& info = g.params[static_cast<size_t>(p)];
      out[static_cast<size_t>(s)].gathered_bytes += info.gathered_bytes;
      out[static_cast<size_t>(s)].grad_bytes += info.grad_bytes;
      out[static_cast<size_t>(s)].shard_bytes += info.shard_bytes;
    }
  }
  return out;
}

}  // namespace meshwork::compiler::pipeline
