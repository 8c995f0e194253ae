#include "trainer/compiler/cost_model.h"

#include <algorithm>
#include <set>

namespace meshwork::compiler {

double CostModel::CollectiveSeconds(OpKind kind, int64_t bytes, int calls) const {
  const bool replicate = kind == OpKind::kAllReduce;
  const int n = replicate ? dp_replicate : dp_shard;
  if (n <= 1) return 0;
  // A row_gather is a reduce-scatter, a row_reduce an all-gather (CollectiveBytes).
  const bool reduces = kind == OpKind::kReduceScatter || kind == OpKind::kRowGather;
  const LinkCost& link = replicate                                ? replicate_link
                         : reduces && shard_reduce_scatter_link ? *shard_reduce_scatter_link
                                                                  : shard_link;
  const double factor = (replicate ? 2.0 : 1.0) * (n - 1) / n;
  return std::max(1, calls) * link.latency_seconds + factor * static_cast<double>(bytes) / link.bus_bytes_per_second;
}

int CostModel::CollectiveCalls(const Graph& g, const Op& op, const Op* source) {
  if (op.kind == OpKind::kRowGather || op.kind == OpKind::kRowReduce) return 2 * static_cast<int>(op.params.size());
  const Op& of = op.kind == OpKind::kAllReduce && source != nullptr ? *source : op;
  std::set<int> groups;
  bool ungrouped = false;
  for (int p : of.params) {
    if (g.params[p].group >= 0) {
      groups.insert(g.params[p].group);
    } else {
      ungrouped = true;
    }
  }
  return std::max(1, static_cast<int>(groups.size()) + (ungrouped ? 1 : 0));
}

int64_t CostModel::CollectiveBytes(const Graph& g, const Op& op, const Op* source) const {
  int64_t bytes = 0;
  switch (op.kind) {
    case OpKind::kAllGather:
      for (int p : op.params) bytes += g.params[p].gathered_bytes;
      break;
    case OpKind::kReduceScatter:
      for (int p : op.params) bytes += g.params[p].grad_bytes;
      break;
    case OpKind::kAllReduce:
      if (source != nullptr) bytes = CollectiveBytes(g, *source) / std::max(1, dp_shard);
      break;
    case OpKind::kRowGather:
    case OpKind::kRowReduce:
      for (int p : op.params) bytes += g.params[p].row_bytes * std::max(1, dp_shard);
      break;
    default:
      break;
  }
  return bytes;
}

double CostModel::VocabSeconds(const Graph& g, const ModuleInfo& m, Phase phase) const {
  if (m.vocab.empty()) return 0;
  int64_t hidden = 0;
  for (int p : m.vocab) hidden += g.params[p].row_bytes * std::max(1, dp_shard);
  if (phase == Phase::kForward)
    return CollectiveSeconds(OpKind::kAllGather, hidden) + (kVocabForwardCollectives - 1) * CollectiveSeconds(OpKind::kAllGather, 0);
  return CollectiveSeconds(OpKind::kReduceScatter, hidden) +
         (kVocabBackwardCollectives - 1) * CollectiveSeconds(OpKind::kAllGather, 0);
}

double CostModel::TpSeconds(const ModuleInfo& m, Phase phase) const {
  const TpExchange& x = phase == Phase::kForward ? m.tp_fwd : m.tp_bwd;
  if (tp <= 1 || x.calls == 0) return 0;
  const double bandwidth_term = static_cast<double>(tp - 1) / tp * static_cast<double>(x.bytes) /
                                std::max(1.0, tp_link.bus_bytes_per_second);
  return x.calls * std::max(1, m.tp_chunks) * tp_link.latency_seconds + bandwidth_term;
}

double CostModel::TpExposedSeconds(const ModuleInfo& m, Phase phase, double compute_seconds) const {
  const double comm = TpSeconds(m, phase);
  const int k = std::max(1, m.tp_chunks);
  if (comm <= 0 || k == 1) return comm;
  const double gemm = std::clamp(m.tp_gemm_share, 0.0, 1.0) * std::max(0.0, compute_seconds);
  // The first chunk's exchange and the last chunk's matmul run alone; the k - 1 stages between
  // run one chunk's matmul beside the next chunk's exchange, each slowed while the other runs.
  const double g = gemm / k, c = comm / k;
  const double slow_gemm = 1 + std::max(0.0, interference), slow_comm = 1 + std::max(0.0, CommInterference());
  double stage;
  if (g * slow_gemm <= c * slow_comm) {
    const double together = g * slow_gemm;  // until the matmul ends, the exchange at 1 / slow_comm
    stage = together + (c - together / slow_comm);
  } else {
    const double together = c * slow_comm;
    stage = together + (g - together / slow_gemm);
  }
  return std::max(0.0, c + g + (k - 1) * stage - gemm);
}

Result<LinkCost> FitLink(const std::vector<std::pair<int64_t, double>>& samples, int group_size) {
  std::set<int64_t> sizes;
  for (const auto& s : samples) sizes.insert(s.first);
  if (sizes.size() < 2) return InvalidInput("collective calibration needs at least two message sizes");
  const double f = group_size > 1 ? static_cast<double>(group_size - 1) / group_size : 1.0;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(samples.size());
  for (const auto& [bytes, seconds] : samples) {
    const double x = f * static_cast<double>(bytes);
    sx += x;
    sy += seconds;
    sxx += x * x;
    sxy += x * seconds;
  }
  const double denom = n * sxx - sx * sx;
  double slope = denom > 0 ? (n * sxy - sx * sy) / denom : 0;
  double intercept = (sy - slope * sx) / n;
  if (slope <= 0) {
    // Noise swamped the size dependence: take the largest message's mean rate.
    int64_t big = *sizes.rbegin();
    double t = 0;
    int k = 0;
    for (const auto& [bytes, seconds] : samples)
      if (bytes == big) t += seconds, ++k;
    slope = (t / k) / (f * static_cast<double>(big));
    intercept = 0;
  }
  if (intercept < 0) {
    // Through the origin instead.
    intercept = 0;
    slope = sxy / sxx;
  }
  LinkCost link;
  link.latency_seconds = intercept;
  link.bus_bytes_per_second = 1.0 / slope;
  return link;
}

}  // namespace meshwork::compiler
