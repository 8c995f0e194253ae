#include "trainer/compiler/simulator.h"

#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <map>
#include <string>

namespace meshwork::compiler {
namespace {

// Walks the program in order and tracks dynamic bytes; `on_step(i, live)` after each op.
template <typename F>
int64_t WalkMemory(const Graph& g, F&& on_step) {
  std::map<std::string, int64_t> gathered;  // all-gather id -> bytes held
  std::map<std::string, const Op*> reduce_scatters;  // id -> op, once issued
  std::map<std::string, int64_t> receiving;          // id -> its receive buffer (rs_recv=full)
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
        // Split by vocabulary: every rank's hidden states and this rank's rows (in the
        // parameter's dtype) are kept from forward to backward; the backward also holds the
        // hidden states' gradient (as large) and the rows' fp32 gradient.
        int64_t vocab_kept = 0, vocab_temp = 0;
        for (int p : m.vocab) {
          const int64_t every_rank = g.params[p].row_bytes * std::max(1, g.dp_shard);
          vocab_kept += every_rank + g.params[p].gathered_bytes / std::max(1, g.dp_shard);
          vocab_temp += every_rank + g.params[p].shard_bytes;
        }
        // A moment's chunk of logits inside the compute (the head's).
        const int64_t transient = m.vocab.empty() ? m.transient_bytes : m.vocab_transient_bytes;
        if (op.phase == Phase::kForward) {
          live += m.activation_bytes + vocab_kept;
          peak = std::max(peak, live + (m.vocab.empty() ? 1 : 2) * transient);
        } else {
          peak = std::max(peak, live + vocab_temp + transient);
          live -= vocab_kept;
          int64_t grads = 0;
          for (int p : m.params) {
            if (grad_live[p] == 0) {  // the first backward use allocates the full gradient
              // Gradients accumulate in the parameters' dtype, in the buffer the
              // reduce-scatter reads (in the reduce dtype after a cast, if they differ).
              grad_live[p] = g.params[p].gathered_bytes;
              grads += grad_live[p];
            }
          }
          // At the end of the backward its activations, any recomputed ones (checkpointing)
          // and the new gradients are all held; then the activations go.
          peak = std::max(peak, live + m.backward_workspace_bytes + m.backward_temp_bytes + grads);
          live += grads - m.activation_bytes;
        }
        break;
      }
      case OpKind::kReduceScatter: {
        reduce_scatters[op.id] = &op;
        int64_t b = 0, cast = 0, uncast = 0;
        for (int p : op.params) {
          b += g.params[p].grad_bytes;
          // Gradients in another dtype than the reduction's are cast into a new input: for a
          // moment both are held, then the cast takes their place until the wait.
          if (g.params[p].grad_bytes != grad_live[p]) {
            cast += g.params[p].grad_bytes;
            uncast += grad_live[p];
            grad_live[p] = g.params[p].grad_bytes;
          }
        }
        // Otherwise the gradient buffer is the collective's input (no rank-major copy). A receive
        // buffer as large as the input (rs_recv=full) is held from the issue until the wait.
        const int64_t receive = g.reduce_scatter_receives_input ? b : 0;
        peak = std::max(peak, live + cast);
        live += cast - uncast;
        peak = std::max(peak, live + receive);
        if (receive > 0) {
          receiving[op.id] = receive;
          live += receive;
        }
        break;
      }
      case OpKind::kRowGather:
      case OpKind::kRowReduce: {
        // Every rank's rows are held for a moment (the owners' parts before the reduce-scatter;
        // the gathered row gradients before they are summed); what stays is one micro-batch's.
        int64_t b = 0;
        for (int p : op.params) b += g.params[p].row_bytes;
        peak = std::max(peak, live + static_cast<int64_t>(std::max(1, g.dp_shard)) * b);
        break;
      }
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
        if (auto r = receiving.find(op.id); r != receiving.end()) {
          live -= r->second;
          receiving.erase(r);
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

int64_t StaticBytes(const Graph& g) {
  int64_t bytes = 0;
  for (const auto& p : g.params) bytes += 4 * p.shard_bytes;
  return bytes;
}

int64_t PeakBytes(const Graph& g) {
  return WalkMemory(g, [](size_t, int64_t) {});
}

SimResult Simulate(const Graph& g, const CostModel& cost) {
  SimResult r;
  r.ops.resize(g.ops.size());
  const double comm_slow = 1.0 / (1.0 + std::max(0.0, cost.CommInterference()));
  const double share = std::clamp(cost.shard_lanes_share, 0.05, 1.0);
  std::map<std::string, double> done;       // collective id -> end time
  std::map<std::string, const Op*> issued;  // collective id -> its op (an all_reduce's source)
  struct Queued {
    size_t op;
    double work;  // seconds left at full speed
  };
  std::array<std::deque<Queued>, kNumLanes> lanes;  // FIFO each: the front is running
  double now = 0;
  double host_work = 0;     // seconds of host work left at full speed (compute, copies)
  size_t host_op = 0;       // the op whose host work is running (its end is set when it ends)
  bool host_busy = false;
  std::string blocked_on;   // a wait's collective id while the host is blocked
  double blocked_since = 0;
  size_t pc = 0;
  auto bytes_of = [&](const Op& op) { return cost.CollectiveBytes(g, op, nullptr); };
  // Host work of `seconds` for op `i`.
  auto start_host = [&](size_t i, double seconds) {
    r.ops[i].start = r.ops[i].end = now;
    if (seconds <= 0) return;
    host_work = seconds;
    host_op = i;
    host_busy = true;
  };
  auto start_front = [&](const std::deque<Queued>& lane) {
    if (!lane.empty()) r.ops[lane.front().op].start = now;
  };
  // Host work around a collective. The flat layout costs no copies: an all-gather reads the
  // master shard and writes the parameters' storage, a reduce-scatter reads the gradient buffer
  // and its shard is the gradient. What is left is the reduction a reduce-scatter on Gloo does
  // at its wait (the all-to-all's chunks summed into the shard: rs_recv=full).
  auto copy_out = [&](const Op* op) {
    if (op != nullptr && op->kind == OpKind::kReduceScatter && g.reduce_scatter_receives_input)
      return cost.CopySeconds(bytes_of(*op) / std::max(1, cost.dp_shard));
    return 0.0;
  };
  while (true) {
    // The host runs instantaneous ops until it has work, is blocked, or the program ends.
    while (!host_busy && blocked_on.empty() && pc < g.ops.size()) {
      const size_t i = pc++;
      const Op& op = g.ops[i];
      if (op.is_collective()) {
        issued[op.id] = &op;
        const Op* source = op.kind == OpKind::kAllReduce && issued.count(op.source) ? issued[op.source] : nullptr;
        const double d = cost.CollectiveSeconds(op.kind, cost.CollectiveBytes(g, op, source),
                                                CostModel::CollectiveCalls(g, op, source));
        r.comm_seconds += d;
        ++r.collectives;
        auto& lane = lanes[LaneOf(op.kind)];
        lane.push_back({i, d});
        if (lane.size() == 1) start_front(lane);
      } else if (op.kind == OpKind::kWait) {
        r.ops[i].start = now;
        r.ops[i].end = now;
        if (!done.count(op.id) && issued.count(op.id)) {
          blocked_on = op.id;
          blocked_since = now;
          host_op = i;
        } else {
          const double copy = copy_out(issued.count(op.id) ? issued[op.id] : nullptr);
          r.copy_seconds += copy;
          start_host(i, copy);
        }
      } else if (op.kind == OpKind::kCompute) {
        const ModuleInfo& m = g.modules[op.module];
        const double d = op.phase == Phase::kForward ? m.fwd_seconds : m.bwd_seconds;
        r.compute_seconds += d;
        // A module split by vocabulary exchanges inside its compute, blocking the host.
        const double vocab = cost.VocabSeconds(g, m, op.phase);
        if (!m.vocab.empty() && cost.dp_shard > 1) {
          r.comm_seconds += vocab;
          r.exposed_comm_seconds += vocab;
          r.collectives += op.phase == Phase::kForward ? CostModel::kVocabForwardCollectives
                                                       : CostModel::kVocabBackwardCollectives;
        }
        // Tensor parallelism's exchanges sit between the module's matmuls: they lengthen its
        // compute by what overlapping (atp=) does not hide.
        double tp_exposed = 0;
        if (g.tp > 1 && cost.tp > 1) {
          const double tp = cost.TpSeconds(m, op.phase);
          tp_exposed = cost.TpExposedSeconds(m, op.phase, d);
          r.tp_comm_seconds += tp;
          r.tp_exposed_seconds += tp_exposed;
          r.comm_seconds += tp;
          r.exposed_comm_seconds += tp_exposed;
          const TpExchange& x = op.phase == Phase::kForward ? m.tp_fwd : m.tp_bwd;
          r.collectives += x.calls * std::max(1, m.tp_chunks);
        }
        start_host(i, d + vocab + tp_exposed);
      } else if (op.kind == OpKind::kOptimizerStep) {
        start_host(i, std::max(0.0, cost.step_overhead_seconds));
      } else {
        r.ops[i].start = now;
        r.ops[i].end = now;
      }
    }
    bool comm_busy = false;
    for (const auto& lane : lanes) comm_busy = comm_busy || !lane.empty();
    if (!host_busy && !comm_busy) break;  // blocked with nothing in flight cannot happen
    // The rates: host work and communication slow each other on CPU ranks; the all-gather and
    // reduce-scatter lanes share the dp_shard link while both run.
    const bool shard_lanes_both = !lanes[kAllGatherLane].empty() && !lanes[kReduceScatterLane].empty();
    std::array<double, kNumLanes> rate{};
    for (int l = 0; l < kNumLanes; ++l) {
      if (lanes[l].empty()) continue;
      rate[l] = (host_busy ? comm_slow : 1.0) * (shard_lanes_both && l != kAllReduceLane ? share : 1.0);
    }
    // Each busy lane is a communication thread beside the host's work: two lanes slow it twice.
    int busy_lanes = 0;
    for (const auto& lane : lanes) busy_lanes += !lane.empty();
    const double host_rate = host_busy ? 1.0 / (1.0 + std::max(0.0, cost.interference) * busy_lanes) : 0.0;
    double dt = std::numeric_limits<double>::infinity();
    if (host_busy) dt = std::min(dt, host_work / host_rate);
    for (int l = 0; l < kNumLanes; ++l)
      if (!lanes[l].empty()) dt = std::min(dt, lanes[l].front().work / rate[l]);
    now += dt;
    if (host_busy) {
      host_work -= dt * host_rate;
      if (host_work <= 1e-15) {
        host_busy = false;
        r.ops[host_op].end = now;
      }
    }
    for (int l = 0; l < kNumLanes; ++l) {
      auto& lane = lanes[l];
      if (lane.empty()) continue;
      Queued& q = lane.front();
      q.work -= dt * rate[l];
      if (q.work > 1e-15) continue;
      const Op& op = g.ops[q.op];
      done[op.id] = now;
      r.ops[q.op].end = now;
      lane.pop_front();
      start_front(lane);
      if (blocked_on == op.id) {
        r.exposed_comm_seconds += now - blocked_since;
        r.ops[host_op].end = now;
        blocked_on.clear();
        // The wait's copy-out, now that the collective is done (the host was idle).
        const double copy = copy_out(&op);
        r.copy_seconds += copy;
        if (copy > 0) {
          host_work = copy;
          host_busy = true;
        }
      }
    }
  }
  r.step_seconds = now;
  r.peak_bytes = PeakBytes(g);
  r.static_bytes = StaticBytes(g);
  return r;
}

}  // namespace meshwork::compiler
