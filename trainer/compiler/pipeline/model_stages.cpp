#include "trainer/compiler/pipeline/model_stages.h"

#include <algorithm>
#include <map>
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

Result<std::vector<FsdpGroup>> FsdpGroupsOf(const Graph& g, const StagePartition& partition, const CostModel& fsdp_cost) {
  const int stages = static_cast<int>(partition.first_layer.size()) - 1;
  // Group key: -1 the embedding (what precedes the layers), a decoder layer's index, or
  // kRest (what follows them).
  constexpr int kRest = 1 << 30;
  std::map<int, std::set<int>> members;
  int layer = 0;
  for (const ModuleInfo& m : g.modules) {
    const bool is_layer = m.name.rfind("layers.", 0) == 0;
    const int key = is_layer ? layer++ : (layer == 0 ? -1 : kRest);
    for (const std::vector<int>* list : {&m.params, &m.rows, &m.vocab}) members[key].insert(list->begin(), list->end());
  }
  if (stages < 1 || partition.first_layer.back() != layer) {
    return InvalidConfig("pipeline: a cut of " + std::to_string(partition.first_layer.back()) + " decoder layers into " +
                         std::to_string(stages) + " stages, but the model has " + std::to_string(layer));
  }
  std::map<int, int> groups_of_param;
  for (const auto& [key, params] : members) {
    for (int p : params) ++groups_of_param[p];
  }
  std::vector<FsdpGroup> out;
  for (const auto& [key, params] : members) {
    FsdpGroup group;
    if (key == -1) {
      group.stage = 0;
      group.at = 0;
    } else if (key == kRest) {
      group.stage = stages - 1;
      group.at = 1;
    } else {
      while (group.stage + 1 < stages && key >= partition.first_layer[static_cast<size_t>(group.stage) + 1]) ++group.stage;
      const int first = partition.first_layer[static_cast<size_t>(group.stage)];
      const int count = partition.first_layer[static_cast<size_t>(group.stage) + 1] - first;
      group.at = static_cast<double>(key - first) / count;
    }
    int64_t gathered = 0, grads = 0;
    for (int p : params) {
      gathered += g.params[static_cast<size_t>(p)].gathered_bytes;
      grads += g.params[static_cast<size_t>(p)].grad_bytes;
      group.after_program = group.after_program || groups_of_param[p] > 1;
    }
    group.gather_seconds = fsdp_cost.CollectiveSeconds(OpKind::kAllGather, gathered);
    group.scatter_seconds = fsdp_cost.CollectiveSeconds(OpKind::kReduceScatter, grads);
    out.push_back(group);
  }
  return out;
}

std::vector<RankFsdp> OverlapFsdp(const Program& p, const PipelineResult& r, const std::vector<FsdpGroup>& groups) {
  struct Span {
    double start = -1, end = -1;
  };
  const int ranks = p.shape.pp;
  std::vector<Span> first_forward(static_cast<size_t>(p.shape.stages())), last_backward(first_forward.size());
  std::vector<double> program_end(static_cast<size_t>(ranks), 0);
  for (const TimelineEntry& e : r.entries) {
    program_end[static_cast<size_t>(e.rank)] = std::max(program_end[static_cast<size_t>(e.rank)], e.end);
    const size_t s = static_cast<size_t>(e.action.stage);
    if (s >= first_forward.size()) continue;
    if (e.action.kind == ActionKind::kForward && (first_forward[s].start < 0 || e.start < first_forward[s].start)) {
      first_forward[s] = {e.start, e.end};
    }
    if ((e.action.kind == ActionKind::kBackward || e.action.kind == ActionKind::kBackwardWeight) &&
        e.end > last_backward[s].end) {
      last_backward[s] = {e.start, e.end};
    }
  }
  std::vector<RankFsdp> out(static_cast<size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    // The rank's groups in the order of its stages, and within a stage of their place: the
    // order they are gathered in.
    std::vector<const FsdpGroup*> mine;
    for (const FsdpGroup& g : groups) {
      if (p.shape.RankOf(g.stage) == rank) mine.push_back(&g);
    }
    std::stable_sort(mine.begin(), mine.end(), [](const FsdpGroup* a, const FsdpGroup* b) {
      return a->stage != b->stage ? a->stage < b->stage : a->at < b->at;
    });
    RankFsdp& o = out[static_cast<size_t>(rank)];
    double gathered = 0;
    std::vector<std::pair<double, double>> scatters;  // (ready, seconds)
    for (const FsdpGroup* g : mine) {
      const Span& f = first_forward[static_cast<size_t>(g->stage)];
      const Span& b = last_backward[static_cast<size_t>(g->stage)];
      gathered += g->gather_seconds;
      if (f.start >= 0) o.delay = std::max(o.delay, gathered - (f.start + g->at * (f.end - f.start)));
      const double ready = g->after_program || b.start < 0 ? program_end[static_cast<size_t>(rank)]
                                                           : b.start + (1 - g->at) * (b.end - b.start);
      scatters.emplace_back(ready, g->scatter_seconds);
    }
    std::sort(scatters.begin(), scatters.end());
    double link = 0;
    for (const auto& [ready, seconds] : scatters) link = std::max(link, ready) + seconds;
    o.end = std::max(program_end[static_cast<size_t>(rank)], link) + o.delay;
  }
  return out;
}

}  // namespace meshwork::compiler::pipeline
