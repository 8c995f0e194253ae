#include "trainer/compiler/plan_estimate.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {

CheckpointChoice ChooseCheckpointing(const std::vector<LayerMemory>& layers, int64_t budget_bytes, int granules) {
  CheckpointChoice out;
  const size_t n = layers.size();
  out.checkpointed.assign(n, false);
  // Every layer that saves memory checkpointed is the least that can be held; keeping layer i
  // whole instead costs extra_i bytes and saves its recompute. So: the most recompute saved by
  // layers kept whole whose extras fit what the all-checkpointed choice leaves.
  int64_t floor_bytes = 0;
  std::vector<int64_t> extra(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const LayerMemory& l = layers[i];
    floor_bytes += std::min(l.keep_bytes, l.checkpoint_bytes);
    extra[i] = std::max<int64_t>(0, l.keep_bytes - l.checkpoint_bytes);
  }
  const int64_t room = budget_bytes - floor_bytes;
  if (room < 0) {
    for (size_t i = 0; i < n; ++i) {
      out.checkpointed[i] = extra[i] > 0;
      out.recompute_seconds += extra[i] > 0 ? layers[i].recompute_seconds : 0;
    }
    out.held_bytes = floor_bytes;
    return out;
  }
  const int64_t step = std::max<int64_t>(1, (room + granules - 1) / std::max(1, granules));
  const size_t capacity = static_cast<size_t>(room / step);
  // best[c]: the most recompute saved within c steps; keep[i][c]: layer i kept whole there.
  std::vector<double> best(capacity + 1, 0.0);
  std::vector<std::vector<bool>> keep(n, std::vector<bool>(capacity + 1, false));
  for (size_t i = 0; i < n; ++i) {
    if (extra[i] == 0) continue;  // checkpointing it saves nothing: it stays whole, for free
    const size_t w = static_cast<size_t>((extra[i] + step - 1) / step);
    if (w > capacity) continue;
    for (size_t c = capacity; c >= w; --c) {
      const double with = best[c - w] + layers[i].recompute_seconds;
      if (with > best[c]) {
        best[c] = with;
        keep[i][c] = true;
      }
      if (c == w) break;
    }
  }
  size_t c = capacity;
  std::vector<bool> whole(n, false);
  for (size_t i = n; i-- > 0;) {
    if (extra[i] == 0) {
      whole[i] = true;
      continue;
    }
    if (keep[i][c]) {
      whole[i] = true;
      c -= static_cast<size_t>((extra[i] + step - 1) / step);
    }
  }
  out.fits = true;
  out.held_bytes = floor_bytes;
  for (size_t i = 0; i < n; ++i) {
    out.checkpointed[i] = !whole[i];
    if (whole[i]) {
      out.held_bytes += extra[i];
    } else {
      out.recompute_seconds += layers[i].recompute_seconds;
    }
  }
  return out;
}

namespace plan {
namespace {

bool IsLayer(const ModuleInfo& m) { return m.name.rfind("layers.", 0) == 0; }

int64_t GatheredBytes(const Graph& g, const ModuleInfo& m) {
  int64_t b = 0;
  for (int p : m.params) b += g.params[static_cast<size_t>(p)].gathered_bytes;
  return b;
}
int64_t GradBytes(const Graph& g, const ModuleInfo& m) {
  int64_t b = 0;
  for (int p : m.params) b += g.params[static_cast<size_t>(p)].grad_bytes;
  return b;
}

// What tensor parallelism's exchanges add to a module's compute in one phase: whole, or
// `overlapped`, the better of whole and split in four (the async_tp pass of a single-program
// plan chooses by the same cost model; the pipeline trainer has no async TP).
double TpExposed(const CostModel& cost, ModuleInfo m, Phase phase, bool overlapped) {
  const double compute = phase == Phase::kForward ? m.fwd_seconds : m.bwd_seconds;
  m.tp_chunks = 1;
  const double whole = cost.TpExposedSeconds(m, phase, compute);
  if (!overlapped) return whole;
  m.tp_chunks = 4;
  return std::min(whole, cost.TpExposedSeconds(m, phase, compute));
}

// The schedule's idle share with stages alike (the formulas the schedules are known by; the
// pipeline simulator gives the finalists' exact bubble).
double BubbleOf(const ParallelPlan& p) {
  const double lag = p.pp - 1;
  const double m = p.microbatches;
  switch (p.schedule) {
    case pipeline::ScheduleKind::kInterleaved1F1B: return lag / (p.virtual_stages * m + lag);
    case pipeline::ScheduleKind::kZeroBubbleH1: return (lag / 3) / (m + lag / 3);
    default: return lag / (m + lag);
  }
}

// Micro-batches whose activations rank 0 (the fullest) holds at once, counted in its stages'
// passes over a whole rank's layers: GPipe every micro-batch; 1F1B and ZB-H1 pp of them; the
// interleaved order (Megatron's warm-up) 2 (pp - 1) + (v - 1) pp + 1 passes of one virtual stage.
double InFlightOnRankZero(const ParallelPlan& p) {
  switch (p.schedule) {
    case pipeline::ScheduleKind::kGPipe: return p.microbatches;
    case pipeline::ScheduleKind::kInterleaved1F1B:
      return std::min<double>(p.virtual_stages * p.microbatches,
                              2.0 * (p.pp - 1) + (p.virtual_stages - 1) * p.pp + 1) /
             p.virtual_stages;
    default: return std::min(p.microbatches, p.pp);
  }
}

}  // namespace

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }
std::string Fixed(double v, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

// Mixed precision as the trainer runs it on GPUs: bf16 parameters and activations, gradients
// reduced in fp32, fp32 master shards and AdamW state (meshwork-simulate's ShapeOf).
LlamaShape BaseShape(const SearchSpec& spec, const HardwareProfile& profile) {
  LlamaShape s;
  s.config = spec.config;
  s.seq_len = spec.seq_len;
  s.param_bytes = 2;
  s.reduce_bytes = 4;
  s.activation_bytes = 2;
  s.flops_per_second = profile.AchievedFlopsPerSecond();
  return s;
}

// A single-program plan's shape: a data parallel rank's batch at its mesh.
LlamaShape SingleProgramShape(const SearchSpec& spec, const HardwareProfile& profile, const ParallelPlan& p) {
  LlamaShape shape = BaseShape(spec, profile);
  shape.batch = p.microbatch;
  shape.tp = p.tp;
  shape.dp_shard = p.dp_shard;
  shape.dp_replicate = p.dp_replicate;
  return shape;
}

PlanScore Scored(double step, double tokens_per_gpu_step, int64_t peak, const SearchSpec& spec,
                 const HardwareProfile& profile) {
  PlanScore s;
  s.step_seconds = step;
  s.tokens_per_second = step > 0 ? tokens_per_gpu_step / step : 0;
  s.mfu = s.tokens_per_second * spec.config.TrainingFlopsPerToken(spec.seq_len) / profile.peak_flops_per_second;
  s.peak_bytes = peak;
  return s;
}

bool Faster(const PlanScore& a, const PlanScore& b) { return a.step_seconds < b.step_seconds; }

// The tokens one GPU's share of a step is: the global batch over every GPU.
double TokensPerGpu(const SearchSpec& spec) {
  return static_cast<double>(spec.global_batch) * static_cast<double>(spec.seq_len) / spec.gpus;
}

// The fast model of a single-program plan (pp 1): compute, checkpointing's recompute chosen by
// ChooseCheckpointing under what the device holds beyond the static shards and the gathered
// weights and gradients in flight, tensor parallelism's exposed exchanges, and FSDP's
// collectives overlapped with the compute but for the first gather and the last reduction.
void Estimate2d(const HardwareProfile& profile, const SearchSpec& spec, PlanCandidate& c) {
  const ParallelPlan& p = c.plan;
  const LlamaShape shape = SingleProgramShape(spec, profile, p);
  const Graph g = LlamaSkeleton(shape);
  auto cost = MakeCostModel(profile, p.dp_replicate, p.dp_shard, p.tp);
  if (!cost.ok()) {
    c.rejected = "mesh: " + cost.status().message();
    return;
  }
  double compute = 0, tp = 0, ag = 0, rs = 0, ar = 0, first_ag = 0, last_rs = 0;
  int64_t gathered_max = 0, gathered_all = 0, grad_max = 0, transient = 0, workspace = 0;
  std::vector<LayerMemory> layers;
  int64_t other_activations = 0;
  for (const ModuleInfo& m : g.modules) {
    compute += m.fwd_seconds + m.bwd_seconds;
    const double tp_f = TpExposed(*cost, m, Phase::kForward, true), tp_b = TpExposed(*cost, m, Phase::kBackward, true);
    tp += tp_f + tp_b;
    const int64_t gathered = GatheredBytes(g, m), grad = GradBytes(g, m);
    const double a = cost->CollectiveSeconds(OpKind::kAllGather, gathered);
    const double r = cost->CollectiveSeconds(OpKind::kReduceScatter, grad);
    ag += a * (p.reshard_after_forward && IsLayer(m) ? 2 : 1);
    rs += r;
    if (p.dp_replicate > 1) ar += cost->CollectiveSeconds(OpKind::kAllReduce, grad / std::max(1, p.dp_shard));
    if (first_ag == 0) first_ag = a;
    last_rs = r;
    gathered_max = std::max(gathered_max, gathered);
    gathered_all += gathered;
    grad_max = std::max(grad_max, grad);
    transient = std::max(transient, m.transient_bytes);
    if (IsLayer(m) && m.checkpoint_input_bytes > 0) {
      layers.push_back({m.activation_bytes, m.checkpoint_input_bytes, m.fwd_seconds + tp_f});
      workspace = std::max(workspace, m.activation_bytes);
    } else {
      other_activations += m.activation_bytes;
    }
  }
  // Gathered weights: two groups at a time (one in use, one prefetched), or every layer's from
  // its forward to its backward without resharding; full gradients until their reduce-scatter.
  const int64_t fixed = (p.reshard_after_forward ? 2 * gathered_max : gathered_all) + 2 * grad_max + transient +
                        other_activations + workspace;
  const int64_t static_bytes = StaticBytes(g);
  const CheckpointChoice ckpt = ChooseCheckpointing(layers, profile.memory_bytes - static_bytes - fixed);
  const int64_t peak = static_bytes + fixed + ckpt.held_bytes;
  const double busy = compute + ckpt.recompute_seconds + tp;
  const double step = std::max({busy, ag, rs + ar}) + first_ag + last_rs;
  c.estimate = Scored(step, TokensPerGpu(spec), peak, spec, profile);
  c.estimate.recompute_seconds = ckpt.recompute_seconds;
  if (!ckpt.fits) {
    c.rejected = "out of memory: " + Fixed(GiB(peak), 1) + " GiB a GPU with every layer checkpointed, the device holds " +
                 Fixed(GiB(profile.memory_bytes), 1);
  }
}

// The fast model of a pipeline plan: the rank with the most compute a micro-batch sets the pace
// (m of them, stretched by the schedule's bubble), FSDP inside the stages overlapped but for the
// first gather, the last reduce-scatter and the replicas' all-reduce; memory on rank 0 (the most
// micro-batches in flight, the embedding) and on the last rank (the head), each with its own
// checkpointing chosen by ChooseCheckpointing. The checkpointing kept is the trainer's
// selective every-N that covers both ranks' share.
void EstimatePipeline(const HardwareProfile& profile, const SearchSpec& spec, PlanCandidate& c) {
  ParallelPlan& p = c.plan;
  LlamaShape shape = BaseShape(spec, profile);
  shape.batch = p.microbatch;
  shape.tp = p.tp;
  auto tp_cost = MakeCostModel(profile, 1, 1, p.tp);
  auto fsdp_cost = MakeCostModel(profile, p.dp_replicate, p.dp_shard, p.tp);
  if (!tp_cost.ok() || !fsdp_cost.ok()) {
    c.rejected = "mesh: " + (tp_cost.ok() ? fsdp_cost.status() : tp_cost.status()).message();
    return;
  }
  const Graph g = LlamaSkeleton(shape);  // one micro-batch, weights whole
  LlamaShape sharded_shape = shape;
  sharded_shape.dp_shard = p.dp_shard;
  sharded_shape.dp_replicate = p.dp_replicate;
  const Graph sharded = LlamaSkeleton(sharded_shape);
  const int layers = static_cast<int>(spec.config.num_hidden_layers);
  // Rank 0 holds the embedding and layers [0, ceil(layers / pp)) as its share (with interleaving
  // the same count over its virtual stages); the last rank the head and the last share. The
  // busiest rank holds ceil(layers / pp), and sets the pace.
  const int per_rank = (layers + p.pp - 1) / p.pp;
  struct Rank {
    double compute = 0;
    std::vector<LayerMemory> layers;
    int64_t other = 0, gathered = 0, grads = 0, shards = 0, workspace = 0;
    double first_ag = 0, last_rs = 0, ar = 0;
  };
  std::vector<Rank> ranks(2);
  // The last rank runs each micro-batch's backward right after its forward, but under GPipe,
  // which runs every forward first.
  const double in_flight[2] = {InFlightOnRankZero(p),
                               p.schedule == pipeline::ScheduleKind::kGPipe ? p.microbatches : 1.0};
  for (size_t mi = 0; mi < g.modules.size(); ++mi) {
    const ModuleInfo& m = g.modules[mi];
    int index = -1;
    if (IsLayer(m)) {
      const int layer = std::stoi(m.name.substr(7));
      if (layer < per_rank) index = 0;
      if (layer >= layers - per_rank) index = p.pp == 1 ? 0 : 1;
    } else {
      index = m.name == "embed" ? 0 : 1;
    }
    if (index < 0) continue;
    Rank& r = ranks[static_cast<size_t>(index)];
    const double tp_f = TpExposed(*tp_cost, m, Phase::kForward, false),
                 tp_b = TpExposed(*tp_cost, m, Phase::kBackward, false);
    r.compute += m.fwd_seconds + m.bwd_seconds + tp_f + tp_b;
    const ModuleInfo& sm = sharded.modules[mi];
    const int64_t gathered = GatheredBytes(sharded, sm), grad = GradBytes(sharded, sm);
    r.gathered += gathered;
    r.grads += grad;
    for (int q : sm.params) r.shards += sharded.params[static_cast<size_t>(q)].shard_bytes;
    const double a = fsdp_cost->CollectiveSeconds(OpKind::kAllGather, gathered);
    if (r.first_ag == 0) r.first_ag = a;
    r.last_rs = fsdp_cost->CollectiveSeconds(OpKind::kReduceScatter, grad);
    const double held = in_flight[index];
    if (IsLayer(m) && m.checkpoint_input_bytes > 0) {
      r.layers.push_back({static_cast<int64_t>(held * static_cast<double>(m.activation_bytes)),
                          static_cast<int64_t>(held * static_cast<double>(m.checkpoint_input_bytes)),
                          (m.fwd_seconds + tp_f) * p.microbatches});
      r.workspace = std::max(r.workspace, m.activation_bytes);
    } else {
      r.other += static_cast<int64_t>(held * static_cast<double>(m.activation_bytes));
    }
  }
  double slowest = 0, recompute = 0, fsdp = 0;
  int64_t peak = 0;
  double share = 0;  // the largest share of a rank's layers its checkpointing needs
  bool fits = true;
  for (Rank& r : ranks) {
    if (r.layers.empty() && r.compute == 0) continue;
    r.ar = p.dp_replicate > 1 ? fsdp_cost->CollectiveSeconds(OpKind::kAllReduce, r.grads / p.dp_shard) : 0;
    const int64_t fixed = 4 * r.shards + r.gathered + r.grads + r.other + r.workspace;
    const CheckpointChoice ckpt = ChooseCheckpointing(r.layers, profile.memory_bytes - fixed);
    fits = fits && ckpt.fits;
    const int n = static_cast<int>(ckpt.checkpointed.size());
    const int k = static_cast<int>(std::count(ckpt.checkpointed.begin(), ckpt.checkpointed.end(), true));
    if (n > 0) share = std::max(share, static_cast<double>(k) / n);
    peak = std::max(peak, fixed + ckpt.held_bytes);
    slowest = std::max(slowest, r.compute * p.microbatches + ckpt.recompute_seconds);
    recompute = std::max(recompute, ckpt.recompute_seconds);
    fsdp = std::max(fsdp, r.first_ag + r.last_rs + r.ar);
  }
  p.checkpoint_every = share <= 0 ? 0 : std::max(1, static_cast<int>(std::floor(1.0 / share)));
  // Compute on the slowest rank per step; the bubble stretches it.
  const double bubble = BubbleOf(p);
  const double step = slowest / (1.0 - bubble) + fsdp;
  c.estimate = Scored(step, TokensPerGpu(spec), peak, spec, profile);
  c.estimate.bubble = bubble;
  c.estimate.recompute_seconds = recompute;
  if (!fits) {
    c.rejected = "out of memory: " + Fixed(GiB(peak), 1) + " GiB on the fullest rank with every layer checkpointed, "
                 "the device holds " + Fixed(GiB(profile.memory_bytes), 1);
  }
}

}  // namespace plan
}  // namespace meshwork::compiler
