// What the compiler's passes and the simulator believe things cost: collectives as
// latency + (n-1)/n · bytes / bus bandwidth (all-reduce twice the bandwidth term), per mesh
// group; compute from the module table in the IR (traced, or modelled from FLOPs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/compiler/ir.h"

namespace meshwork::compiler {

// Communication lanes: the collectives of one lane run one at a time in issue order, and the
// lanes run concurrently. The runtime gives each lane its own communicator: all-gathers and
// reduce-scatters each on their own dp_shard group, all-reduces on dp_replicate.
enum Lane { kAllGatherLane = 0, kReduceScatterLane, kAllReduceLane };
inline constexpr int kNumLanes = 3;
// Row gathers and row reduces run on the all-gather lane: a row_reduce follows the last
// backward, when the reduce-scatter lane still carries the last layers' gradients and the
// all-gather lane has nothing left to do.
inline Lane LaneOf(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kRowGather:
    case OpKind::kRowReduce: return kAllGatherLane;
    case OpKind::kReduceScatter: return kReduceScatterLane;
    default: return kAllReduceLane;
  }
}

struct LinkCost {
  double latency_seconds = 0;
  double bus_bytes_per_second = 1e9;
};

struct CostModel {
  LinkCost shard_link;      // the dp_shard group's collectives (all-gathers; reduce-scatters too
                            // unless shard_reduce_scatter_link is set)
  // Reduce-scatters on dp_shard, when measured apart: a backend may implement them
  // differently from all-gathers (Gloo: an all-to-all and a sum).
  std::optional<LinkCost> shard_reduce_scatter_link;
  LinkCost replicate_link;  // the dp_replicate group's (HSDP all-reduce)
  // The tp group's collectives (Graph::tp > 1): a link of its own, apart from the data parallel
  // groups' (a tp group lives inside one node, on its fastest links; the data parallel groups
  // span nodes), so tensor parallelism's exchanges and FSDP's collectives do not share bandwidth.
  LinkCost tp_link;
  int tp = 1;
  // The all-gather and reduce-scatter lanes share the dp_shard link: while both run, each goes
  // at this fraction of its own speed. 0.5 = they split the bandwidth (what one link gives two
  // transfers); up to 1 where the link has room one collective does not use (measured at
  // start-up by timing the two alone and together).
  double shard_lanes_share = 0.5;
  int dp_shard = 1;
  int dp_replicate = 1;
  // CPU ranks (Gloo): communication runs on the cores that compute, so while both are busy
  // compute goes at 1 / (1 + lanes x interference) of its own speed (lanes: the communication
  // lanes busy, each a thread beside it), and communication at
  // 1 / (1 + comm_interference) of its own (negative: the same as interference); 0 (GPUs,
  // NCCL) = they do not slow each other. Measured at start-up apart: matmuls timed with and
  // without collectives in flight, and collectives with and without matmuls running. (On a
  // shaped link communication is wire time: compute slows it far less than it slows compute.)
  double interference = 0;
  double comm_interference = -1;
  double CommInterference() const { return comm_interference >= 0 ? comm_interference : interference; }
  // Host memory work around collectives, at this rate on the compute lane; 0 = free (GPU
  // kernels). With the flat layout the only one left is Gloo's reduce-scatter summing the
  // all-to-all's chunks into the shard at its wait.
  double host_copy_bytes_per_second = 0;
  // Host time each step spends outside its last micro-batch's forward-to-reduction (the
  // gradient norm, the optimizer's update, the loss's average, the next batch), charged at
  // optimizer_step, so that a simulated step is a whole step as the trainer times it. Measured
  // on the eager steps before the plan; 0 = not modelled (the simulator's GPU profiles).
  double step_overhead_seconds = 0;

  // all_gather: `bytes` = the gathered output; reduce_scatter: the full input; all_reduce: the
  // reduced shard; row_gather (a reduce-scatter of every rank's rows, each owner filling in its
  // part) and row_reduce (an all-gather of every rank's row gradients): every rank's rows
  // together. A group of one moves nothing and costs nothing. `calls`: how many collectives
  // the runtime issues for it back to back (one per flat group), each paying the latency.
  double CollectiveSeconds(OpKind kind, int64_t bytes, int calls = 1) const;
  // How many collectives the runtime issues for `op`: one per flat group among its parameters
  // (ParamInfo::group), the parameters without a group together one more; an all_reduce as many
  // as its `source` reduce-scatter; a row_gather or row_reduce two per parameter (the token ids
  // first, then the rows).
  static int CollectiveCalls(const Graph& g, const Op& op, const Op* source = nullptr);
  // Bytes a collective moves, from the IR's parameter table: an all_gather's output, a
  // reduce_scatter's full input; an all_reduce moves its `source` reduce_scatter's output shard;
  // a row_gather or row_reduce dp_shard times its parameters' row_bytes.
  int64_t CollectiveBytes(const Graph& g, const Op& op, const Op* source = nullptr) const;
  // The exchange of a module that splits parameters by vocabulary (ModuleInfo::vocab), inside
  // its compute and blocking it (so all of it is exposed): forward all-gathers every rank's
  // hidden states (dp_shard x the parameter's rows=) and three small all-gathers (the targets,
  // the boundary rows' missing parts, the softmax statistics); backward one small all-gather
  // (every rank's loss scale), a reduce-scatter of the hidden states' gradient, one small
  // all-gather (the boundary rows' gradients). 0 for a module without vocab.
  double VocabSeconds(const Graph& g, const ModuleInfo& m, Phase phase) const;
  static constexpr int kVocabForwardCollectives = 4, kVocabBackwardCollectives = 3;
  // A module's tensor-parallel exchanges in `phase` (ModuleInfo::tp_fwd/tp_bwd) on the tp link,
  // alone: each collective's latency plus (tp-1)/tp of the bus bytes at its bandwidth (times the
  // chunks' extra latencies when overlapped). 0 at tp 1.
  double TpSeconds(const ModuleInfo& m, Phase phase) const;
  // What those exchanges add to the module's compute of `compute_seconds`: all of TpSeconds when
  // not overlapped (each blocks the matmul after it). Overlapped in k chunks (ModuleInfo::tp_chunks),
  // the matmuls next to them (tp_gemm_share of the compute) and the exchanges form a two-stage
  // pipeline: (gemm + comm) / k + (k - 1) / k x max(gemm, comm) in place of gemm + comm; what
  // that leaves above the matmuls is exposed. On CPU ranks the overlapped stages pay the
  // interference: a chunk's matmul goes at 1 / (1 + interference) while the next chunk's
  // exchange runs beside it, and the exchange at 1 / (1 + CommInterference()), so on a fast link
  // chunking can cost more than it hides (and the async_tp pass keeps the exchanges whole).
  double TpExposedSeconds(const ModuleInfo& m, Phase phase, double compute_seconds) const;
  // Seconds of host copying for `bytes` (0 when copies are free).
  double CopySeconds(int64_t bytes) const {
    return host_copy_bytes_per_second > 0 ? static_cast<double>(bytes) / host_copy_bytes_per_second : 0;
  }
};

// Fits latency and bus bandwidth to measured (bytes, seconds) pairs of one collective kind on
// a group of `group_size` (least squares on t = a + b · (n-1)/n · bytes; a clamped at >= 0,
// bandwidth positive). Needs at least two distinct sizes.
Result<LinkCost> FitLink(const std::vector<std::pair<int64_t, double>>& samples, int group_size);

}  // namespace meshwork::compiler
