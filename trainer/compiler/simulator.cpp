#include "trainer/compiler/simulator.h"

#include <algorithm>
#include <map>

namespace meshwork::compiler {
namespace {

// Walks the program in order and tracks dynamic bytes; `on_step(i, live)` after each op.
template <typename F>
int64_t WalkMemory(const Graph& g, F&& on_step) {
  std::map<std::string, int64_t> gathered;  // all-gather id -> bytes held
  std::map<std::string, const Op*> reduce_scatters;  // id -> op, once issued
  std::vector<int64_t> grad_live(g.params.size(), 0);
  int64_t live = 0, peak = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    switch (op.kind) {
      case OpKind::kAllGather: {
        int64_t b = 0;
        for (int p : op.params) b += g.params[p].gathered_bytes;
        gathered[op.id] = b;
        live += b;
        break;
      }
      case OpKind::kFree: {
        auto it = gathered.find(op.id);
        if (it != gathered.end()) {
          live -= it->second;
          gathered.erase(it);
        }
        break;
      }
      case OpKind::kCompute: {
        const ModuleInfo& m = g.modules[op.module];
        if (op.phase == Phase::kForward) {
          live += m.activation_bytes;
        } else {
          live -= m.activation_bytes;
          for (int p : m.params) {
            if (grad_live[p] == 0) {  // the first backward use allocates the full gradient
              grad_live[p] = g.params[p].grad_bytes;
              live += grad_live[p];
            }
          }
        }
        break;
      }
      case OpKind::kReduceScatter:
        reduce_scatters[op.id] = &op;
        break;
      case OpKind::kWait: {
        auto it = reduce_scatters.find(op.id);
        if (it != reduce_scatters.end()) {
          // The reduce-scatter's input (the full gradients) is released once it is done.
          for (int p : it->second->params) {
            live -= grad_live[p];
            grad_live[p] = 0;
          }
          reduce_scatters.erase(it);
        }
        break;
      }
      default:
        break;
    }
    peak = std::max(peak, live);
    on_step(i, live);
  }
  return peak;
}

}  // namespace

int64_t PeakBytes(const Graph& g) {
  return WalkMemory(g, [](size_t, int64_t) {});
}

SimResult Simulate(const Graph& g, const CostModel& cost) {
  SimResult r;
  r.ops.resize(g.ops.size());
  double host = 0, comm_free = 0;
  std::map<std::string, double> done;  // collective id -> end time
  std::map<std::string, const Op*> issued;  // collective id -> its op (an all_reduce's source)
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    OpTiming& t = r.ops[i];
    t.start = host;
    t.end = host;
    if (op.is_collective()) {
      double ready = host;
      if (op.kind == OpKind::kAllReduce && done.count(op.source)) ready = std::max(ready, done[op.source]);
      issued[op.id] = &op;
      const Op* source = op.kind == OpKind::kAllReduce && issued.count(op.source) ? issued[op.source] : nullptr;
      const int64_t bytes = cost.CollectiveBytes(g, op, source);
      const double d = cost.CollectiveSeconds(op.kind, bytes);
      t.start = std::max(ready, comm_free);
      t.end = t.start + d;
      comm_free = t.end;
      done[op.id] = t.end;
      r.comm_seconds += d;
      ++r.collectives;
    } else if (op.kind == OpKind::kWait) {
      const double end = done.count(op.id) ? done[op.id] : host;
      if (end > host) {
        r.exposed_comm_seconds += end - host;
        host = end;
      }
      t.end = host;
    } else if (op.kind == OpKind::kCompute) {
      const ModuleInfo& m = g.modules[op.module];
      const double d = op.phase == Phase::kForward ? m.fwd_seconds : m.bwd_seconds;
      host += d;
      r.compute_seconds += d;
      t.end = host;
    }
  }
  r.step_seconds = std::max(host, comm_free);
  r.peak_bytes = PeakBytes(g);
  for (const auto& p : g.params) r.static_bytes += 4 * p.shard_bytes;
  return r;
}

}  // namespace meshwork::compiler
