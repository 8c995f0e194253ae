#include "trainer/tp/tensor_parallel.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "trainer/model/compat.h"
#include "trainer/model/linear_cross_entropy.h"

namespace meshwork::tp {

// What the autograd functions collect over: the tp communicator and the time the calling thread
// blocked in its collectives (exposed communication, where waits block the host: Gloo). It
// travels through autograd's saved data as an integer: the TensorParallelLlama owning it
// outlives every graph that uses it (a step's graph is gone by the step's end).
struct TpGroup {
  explicit TpGroup(dist::Communicator& c) : comm(&c) {}
  dist::Communicator* comm;
  std::atomic<int64_t> blocked_ns{0};        // since the last TakeBlockedSeconds
  std::atomic<int64_t> total_blocked_ns{0};  // since Create
  void Blocked(std::chrono::steady_clock::time_point start) {
    const int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    blocked_ns += ns;
    total_blocked_ns += ns;
  }
};

namespace {

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t Handle(TpGroup& group) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&group)); }
TpGroup& GroupOf(int64_t handle) { return *reinterpret_cast<TpGroup*>(static_cast<intptr_t>(handle)); }
TpGroup& GroupOf(AutogradContext* ctx) { return GroupOf(ctx->saved_data["group"].toInt()); }

// Issues and waits for one collective. A failure (a peer gone, a timeout) is thrown as a
// StatusError from inside forward or backward, keeping its code (kUnavailable: the trainer's exit
// code for a lost peer) and naming what was exchanged.
void Run(TpGroup& group, Result<std::unique_ptr<dist::Work>> work, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  auto fail = [&](const Status& s) {
    ThrowIfError(Status(s.code(), std::string("tensor parallel ") + what + " over " + group.comm->group_name() + ": " +
                                      s.message()));
  };
  if (!work.ok()) fail(work.status());
  if (const Status s = (*work)->Wait(); !s.ok()) fail(s);
  group.Blocked(start);
}

// Issues one collective (async); a failure is thrown as Run's are.
std::unique_ptr<dist::Work> Issue(TpGroup& group, Result<std::unique_ptr<dist::Work>> work, const char* what) {
  if (!work.ok()) {
    ThrowIfError(Status(work.status().code(), std::string("tensor parallel ") + what + " over " +
                                                  group.comm->group_name() + ": " + work.status().message()));
  }
  return std::move(work).value();
}

// Collectives in flight over buffers of the calling frame: should an error leave the frame before
// they were waited for (a later Issue or Await throws), they are waited for first (their errors
// ignored: the first one is already on its way up), so that the communicator's thread never writes
// into freed memory. Awaited ones are reset.
struct InFlight {
  std::vector<std::unique_ptr<dist::Work>> works;
  explicit InFlight(size_t n) : works(n) {}
  ~InFlight() {
    for (auto& w : works)
      if (w != nullptr) (void)w->Wait();
  }
};

// Waits for one issued collective, counting the time blocked.
void Await(TpGroup& group, dist::Work& work, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  if (const Status s = work.Wait(); !s.ok()) {
    ThrowIfError(Status(s.code(), std::string("tensor parallel ") + what + " over " + group.comm->group_name() + ": " +
                                      s.message()));
  }
  group.Blocked(start);
}

torch::Tensor AllReduceSum(TpGroup& group, const torch::Tensor& x, const char* what) {
  torch::Tensor y = x.clone(at::MemoryFormat::Contiguous);
  Run(group, group.comm->AllReduce(y, dist::ReduceOp::kSum), what);
  return y;
}

// [n...] from every rank -> [size, n...] in rank order.
torch::Tensor AllGather(TpGroup& group, const torch::Tensor& x, const char* what) {
  const torch::Tensor in = x.contiguous();
  std::vector<int64_t> shape = {group.comm->size()};
  for (int64_t d : in.sizes()) shape.push_back(d);
  torch::Tensor out = torch::empty(shape, in.options());
  Run(group, group.comm->AllGatherInto(out.view({-1}), in.view({-1})), what);
  return out;
}

// [size · n...] -> this rank's [n...] of the sum over ranks.
torch::Tensor ReduceScatterSum(TpGroup& group, const torch::Tensor& x, std::vector<int64_t> shape, const char* what) {
  const torch::Tensor in = x.contiguous();
  torch::Tensor out = torch::empty(shape, in.options());
  Run(group, group.comm->ReduceScatter(out.view({-1}), in.view({-1}), dist::ReduceOp::kSum), what);
  return out;
}

// Enter without sequence parallelism: every rank has the whole input; its gradient is the sum
// of every rank's (each rank's heads or vocabulary rows contribute a part).
struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {AllReduceSum(GroupOf(ctx), grad[0], "all-reduce of a region's input gradient"), torch::Tensor()};
  }
};

// Exit without sequence parallelism, and any value every rank then uses alike: the sum over
// ranks of each rank's part. Every rank computes the same loss from it, so its gradient is
// already whole on each rank.
struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, int64_t group) {
    return AllReduceSum(GroupOf(group), x, "all-reduce of a region's output");
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], torch::Tensor()}; }
};

// Enter with sequence parallelism: this rank's tokens [1, n/size, hidden] -> the whole stream
// (`shape`); backward sums every rank's gradient and keeps this rank's tokens.
struct GatherTokens : torch::autograd::Function<GatherTokens> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group, std::vector<int64_t> shape) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["local"] = x.sizes().vec();
    auto& g = GroupOf(ctx);
    return AllGather(g, x, "all-gather of the tokens entering a region").view(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {ReduceScatterSum(GroupOf(ctx), grad[0], ctx->saved_data["local"].toIntVector(),
                             "reduce-scatter of a region's input gradient"),
            torch::Tensor(), torch::Tensor()};
  }
};

// Exit with sequence parallelism: the whole stream's partial sum [batch, seq, hidden] -> this
// rank's tokens of the sum, [1, n/size, hidden]; backward gathers every rank's gradient.
struct ScatterTokens : torch::autograd::Function<ScatterTokens> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["whole"] = x.sizes().vec();
    auto& g = GroupOf(ctx);
    const int64_t tokens = x.numel() / x.size(-1);
    return ReduceScatterSum(g, x, {1, tokens / g.comm->size(), x.size(-1)}, "reduce-scatter of a region's output");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {AllGather(GroupOf(ctx), grad[0], "all-gather of a region's output gradient")
                .view(ctx->saved_data["whole"].toIntVector()),
            torch::Tensor()};
  }
};

// The vocabulary-split head and its loss in one, a chunk of rows at a time, as
// model::LinearCrossEntropy's kRecompute does for the whole vocabulary: this rank's
// [tokens, vocab / tp] logits never exist whole. Forward keeps one log-sum-exp per token over the
// whole vocabulary (every slice's, all-gathered) and backward recomputes each chunk's logits.
// h: [n, d], the same tokens on every rank; w: [rows, d], this rank's rows of the vocabulary;
// local: [n], each target's row in this rank's slice, -1 where another rank owns it. The mean
// loss over the n tokens; h's gradient is this slice's part (the region's exit sums them).
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& local, int64_t group, int64_t chunk_rows) {
    TpGroup& g = GroupOf(group);
    const auto dtype = compat::MatmulDtype(h);
    const auto stats = model::LossStatsDtype(h);
    const torch::Tensor hd = h.to(dtype), wd = w.to(dtype);
    const int64_t n = hd.size(0);
    const torch::Tensor owned = local.ge(0), row = local.clamp_min(0);
    torch::Tensor lse = torch::empty({n}, h.options().dtype(stats));
    torch::Tensor picked = torch::empty({n}, h.options().dtype(stats));
    for (int64_t r = 0; r < n; r += chunk_rows) {
      const int64_t m = std::min(chunk_rows, n - r);
      const torch::Tensor logits = torch::mm(hd.narrow(0, r, m), wd.t()).to(stats);
      lse.narrow(0, r, m).copy_(logits.logsumexp(-1));
      picked.narrow(0, r, m).copy_(logits.gather(1, row.narrow(0, r, m).unsqueeze(1)).squeeze(1));
    }
    picked.masked_fill_(owned.logical_not(), 0);
    const torch::Tensor whole_lse = AllGather(g, lse, "all-gather of the vocabulary slices' log-sum-exp").logsumexp(0);
    const torch::Tensor target = AllReduceSum(g, picked, "all-reduce of the targets' logits");
    ctx->save_for_backward({h, w, local, whole_lse});
    ctx->saved_data["group"] = group;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    // Backward recomputes the logits in forward's dtype: autocast, which chose it, is off by then.
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return (whole_lse - target).mean();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &h = saved[0], &w = saved[1], &local = saved[2], &whole_lse = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto stats = model::LossStatsDtype(h);
    const torch::Tensor hd = h.to(dtype), wd = w.to(dtype);
    const int64_t n = hd.size(0);
    const torch::Tensor scale = grad[0].to(stats) / static_cast<double>(n);
    const torch::Tensor owned = local.ge(0), row = local.clamp_min(0);
    torch::Tensor gh = torch::empty({n, hd.size(1)}, hd.options());
    torch::Tensor gw = torch::zeros(w.sizes(), w.options().dtype(stats));
    for (int64_t r = 0; r < n; r += chunk_rows) {
      const int64_t m = std::min(chunk_rows, n - r);
      // softmax over the whole vocabulary of this slice's logits, less the one-hot target where
      // this slice owns it, times the loss's gradient over n.
      torch::Tensor p = torch::mm(hd.narrow(0, r, m), wd.t()).to(stats);
      p.sub_(whole_lse.narrow(0, r, m).unsqueeze(1)).exp_();
      p.scatter_add_(1, row.narrow(0, r, m).unsqueeze(1), owned.narrow(0, r, m).to(stats).neg().unsqueeze(1));
      p.mul_(scale);
      const torch::Tensor pd = p.to(dtype);
      gh.narrow(0, r, m).copy_(torch::mm(pd, wd));
      gw.add_(torch::mm(pd.t(), hd.narrow(0, r, m)).to(stats));
    }
    return {gh.to(h.scalar_type()), gw.to(w.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Overlapped tensor parallelism (TensorParallelOptions::async_chunks): a region's entering fused
// with its first projection, and its last projection with its leaving, each split into `chunks`
// chunks of every rank's tokens so that one chunk's exchange runs (on the communicator's thread)
// while the previous chunk's matmul computes. Tokens: rank r holds the stream's tokens
// [r n_l, (r + 1) n_l); chunk j of each rank is its tokens [j m, (j + 1) m), m = n_l / chunks. The
// matmuls run in the autocast dtype (compat::MatmulDtype), the gradients come back in the inputs'.

// x: this rank's tokens [1, n_l, h]; w: [out, h] -> the whole stream times w^T, `shape` [b, t] + out.
struct AllGatherMatmul : torch::autograd::Function<AllGatherMatmul> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w, int64_t group,
                               int64_t chunks, std::vector<int64_t> shape) {
    TpGroup& g = GroupOf(group);
    const int64_t size = g.comm->size();
    const auto dtype = compat::MatmulDtype(x);
    const torch::Tensor xl = x.reshape({-1, x.size(-1)}).to(dtype).contiguous();
    const torch::Tensor wd = w.to(dtype);
    const int64_t h = xl.size(1), m = xl.size(0) / chunks, out = wd.size(0);
    // Every rank's chunk j at full[j]: [size, m, h], contiguous, as the all-gather writes it.
    torch::Tensor full = torch::empty({chunks, size, m, h}, xl.options());
    torch::Tensor y = torch::empty({chunks, size, m, out}, xl.options());
    InFlight flight(chunks);
    auto issue = [&](int64_t j) {
      flight.works[j] = Issue(g, g.comm->AllGatherInto(full[j].view({-1}), xl.narrow(0, j * m, m).view({-1})),
                              "all-gather of a chunk of the tokens entering a region");
    };
    issue(0);
    for (int64_t j = 0; j < chunks; ++j) {
      Await(g, *flight.works[j], "all-gather of a chunk of the tokens entering a region");
      flight.works[j].reset();
      if (j + 1 < chunks) issue(j + 1);
      y[j].view({size * m, out}).copy_(torch::mm(full[j].view({size * m, h}), wd.t()));
    }
    ctx->save_for_backward({full, wd});
    ctx->saved_data["group"] = group;
    ctx->saved_data["chunks"] = chunks;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    shape.push_back(out);
    return y.permute({1, 0, 2, 3}).reshape(shape);  // token order: rank, chunk, position
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& full = saved[0];
    const torch::Tensor& wd = saved[1];
    TpGroup& g = GroupOf(ctx);
    const int64_t chunks = ctx->saved_data["chunks"].toInt(), size = full.size(1), m = full.size(2), h = full.size(3);
    const int64_t out = wd.size(0);
    // The gradient in the forward's chunk layout: [chunks, size, m, out].
    const torch::Tensor gy = grad[0].to(wd.scalar_type()).reshape({size, chunks, m, out}).permute({1, 0, 2, 3});
    // Only what autograd asks for: a split backward (trainer/pp/split_backward.h) asks for the
    // input's gradient and the weight's apart. Every tp rank asks alike (one graph), so the
    // collectives still pair up.
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    torch::Tensor local = need_x ? torch::empty({chunks, m, h}, full.options()) : torch::Tensor();
    std::vector<torch::Tensor> parts;
    InFlight flight(need_x ? chunks : 0);
    for (int64_t j = 0; need_x && j < chunks; ++j) {
      // Chunk j's input gradient for every rank's tokens, summed into each rank's own.
      parts.push_back(torch::mm(gy[j].reshape({size * m, out}), wd));
      flight.works[j] = Issue(g, g.comm->ReduceScatter(local[j].view({-1}), parts.back().view({-1}), dist::ReduceOp::kSum),
                              "reduce-scatter of a chunk of a region's input gradient");
    }
    const torch::Tensor gw = need_w ? torch::mm(gy.reshape({-1, out}).t(), full.view({-1, h})) : torch::Tensor();
    for (auto& w : flight.works) {
      Await(g, *w, "reduce-scatter of a chunk of a region's input gradient");
      w.reset();
    }
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    return {need_x ? local.view(ctx->saved_data["x_shape"].toIntVector()).to(x_dtype) : torch::Tensor(),
            need_w ? gw.to(w_dtype) : torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// y: the whole stream [b, t, in] (this rank's columns); w: [h, in] -> this rank's tokens of the
// sum over ranks of y w^T, [1, n_l, h].
struct MatmulReduceScatter : torch::autograd::Function<MatmulReduceScatter> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& y, const torch::Tensor& w, int64_t group,
                               int64_t chunks) {
    TpGroup& g = GroupOf(group);
    const int64_t size = g.comm->size();
    const auto dtype = compat::MatmulDtype(y);
    const torch::Tensor yd = y.reshape({-1, y.size(-1)}).to(dtype).contiguous();
    const torch::Tensor wd = w.to(dtype);
    const int64_t in = yd.size(1), n_l = yd.size(0) / size, m = n_l / chunks, h = wd.size(0);
    const torch::Tensor by_chunk = yd.view({size, chunks, m, in});
    torch::Tensor local = torch::empty({chunks, m, h}, yd.options());
    std::vector<torch::Tensor> parts;
    InFlight flight(chunks);
    for (int64_t j = 0; j < chunks; ++j) {
      parts.push_back(torch::mm(by_chunk.select(1, j).reshape({size * m, in}), wd.t()));
      flight.works[j] = Issue(g, g.comm->ReduceScatter(local[j].view({-1}), parts.back().view({-1}), dist::ReduceOp::kSum),
                              "reduce-scatter of a chunk of a region's output");
    }
    for (auto& w : flight.works) {
      Await(g, *w, "reduce-scatter of a chunk of a region's output");
      w.reset();
    }
    ctx->save_for_backward({yd, wd});
    ctx->saved_data["group"] = group;
    ctx->saved_data["chunks"] = chunks;
    ctx->saved_data["y_shape"] = y.sizes().vec();
    ctx->saved_data["y_dtype"] = static_cast<int64_t>(y.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return local.view({1, n_l, h});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& yd = saved[0];
    const torch::Tensor& wd = saved[1];
    TpGroup& g = GroupOf(ctx);
    const int64_t chunks = ctx->saved_data["chunks"].toInt(), size = g.comm->size();
    const int64_t in = yd.size(1), n_l = yd.size(0) / size, m = n_l / chunks, h = wd.size(0);
    const torch::Tensor gl = grad[0].to(wd.scalar_type()).reshape({chunks, m, h}).contiguous();
    torch::Tensor full = torch::empty({chunks, size, m, h}, gl.options());
    // Both gradients need the gathered output gradient; each is computed only when asked for
    // (a split backward asks for them apart and gathers twice).
    const bool need_y = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    torch::Tensor gy = need_y ? torch::empty({size, chunks, m, in}, gl.options()) : torch::Tensor();
    InFlight flight(chunks);
    auto issue = [&](int64_t j) {
      flight.works[j] = Issue(g, g.comm->AllGatherInto(full[j].view({-1}), gl[j].view({-1})),
                              "all-gather of a chunk of a region's output gradient");
    };
    issue(0);
    for (int64_t j = 0; j < chunks; ++j) {
      Await(g, *flight.works[j], "all-gather of a chunk of a region's output gradient");
      flight.works[j].reset();
      if (j + 1 < chunks) issue(j + 1);
      if (need_y) gy.select(1, j).copy_(torch::mm(full[j].view({size * m, h}), wd).view({size, m, in}));
    }
    const auto y_dtype = static_cast<c10::ScalarType>(ctx->saved_data["y_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    torch::Tensor gw;
    if (need_w) {
      // The whole stream's output gradient in token order, for the weight's.
      const torch::Tensor g_tokens = full.permute({1, 0, 2, 3}).reshape({-1, h});
      gw = torch::mm(g_tokens.t(), yd).to(w_dtype);
    }
    return {need_y ? gy.view(ctx->saved_data["y_shape"].toIntVector()).to(y_dtype) : torch::Tensor(), gw,
            torch::Tensor(), torch::Tensor()};
  }
};

// HF names of the parameters split by rows and by columns (suffixes).
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
Split SplitOf(const std::string& name) {
  for (const char* rows : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                           "embed_tokens.weight", "lm_head.weight"}) {
    if (EndsWith(name, rows)) return Split::kRows;
  }
  for (const char* columns : {"o_proj.weight", "down_proj.weight"}) {
    if (EndsWith(name, columns)) return Split::kColumns;
  }
  return Split::kReplicated;
}

}  // namespace


Result<std::unique_ptr<TensorParallelLlama>> TensorParallelLlama::Create(model::LlamaForCausalLM model,
                                                                         dist::Communicator& group,
                                                                         TensorParallelOptions options) {
  if (std::string why = WhyNotSplittable(model->config(), group.size()); !why.empty()) return InvalidConfig(why);
  std::unique_ptr<TensorParallelLlama> tp(new TensorParallelLlama(std::move(model), group, options));
  tp->Shard();
  return tp;
}

TensorParallelLlama::TensorParallelLlama(model::LlamaForCausalLM model, dist::Communicator& group,
                                         TensorParallelOptions options)
    : model_(std::move(model)), group_(group), tp_group_(std::make_unique<TpGroup>(group)), options_(options) {}

TensorParallelLlama::~TensorParallelLlama() {
  // The regions call into this object: a model that outlives it runs unsplit code again.
  for (size_t i = 0; i < model_->model->layers->size(); ++i) {
    model_->model->layers[i]->as<model::DecoderLayer>()->region = {};
  }
}

void TensorParallelLlama::Shard() {
  torch::NoGradGuard no_grad;
  const int64_t size = group_.size(), rank = group_.rank();
  for (auto& item : model_->named_parameters()) {
    torch::Tensor& p = item.value();
    LocalParam local{item.key(), p.sizes().vec(), SplitOf(item.key()), 0, p};
    if (local.split != Split::kReplicated) {
      const int64_t dim = local.split == Split::kRows ? 0 : 1;
      const int64_t n = p.size(dim) / size;
      local.begin = rank * n;
      // The same Variable, now holding only this rank's slice: the modules, the optimizer and
      // autograd see one parameter, as before.
      p.set_data(p.detach().narrow(dim, local.begin, n).clone(at::MemoryFormat::Contiguous));
    }
    params_.push_back(local);
  }
  vocab_rows_ = model_->config().vocab_size / size;
  vocab_begin_ = rank * vocab_rows_;

  const int64_t handle = Handle(*tp_group_);
  model::ParallelRegion region;
  region.enter = [this, handle](const torch::Tensor& x) {
    return split_tokens_ ? GatherTokens::apply(x, handle, stream_shape_) : CopyToRegion::apply(x, handle);
  };
  region.exit = [this, handle](const torch::Tensor& y) {
    return split_tokens_ ? ScatterTokens::apply(y, handle) : ReduceFromRegion::apply(y, handle);
  };
  const size_t layers = model_->model->layers->size();
  layer_chunks_.assign(layers, options_.async_chunks);
  for (size_t i = 0; i < layers; ++i) {
    // Each layer's own chunk count (SetLayerChunks), where this forward's tokens divide into it.
    region.overlapped = [this, i] {
      return split_tokens_ && layer_chunks_[i] > 1 && tokens_per_rank_ % layer_chunks_[i] == 0;
    };
    region.enter_project = [this, handle, i](const torch::Tensor& x, const torch::Tensor& w) {
      return AllGatherMatmul::apply(x, w, handle, static_cast<int64_t>(layer_chunks_[i]),
                                    std::vector<int64_t>{stream_shape_[0], stream_shape_[1]});
    };
    region.project_exit = [this, handle, i](const torch::Tensor& y, const torch::Tensor& w) {
      return MatmulReduceScatter::apply(y, w, handle, static_cast<int64_t>(layer_chunks_[i]));
    };
    model_->model->layers[i]->as<model::DecoderLayer>()->region = region;
  }
}

Status TensorParallelLlama::SetLayerChunks(const std::vector<int>& chunks) {
  if (chunks.size() != layer_chunks_.size()) {
    return InvalidInput("tensor parallel: chunk counts for " + std::to_string(chunks.size()) + " decoder layers, the model has " +
                        std::to_string(layer_chunks_.size()));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] < 1) {
      return InvalidInput("tensor parallel: decoder layer " + std::to_string(i) + " split into " +
                          std::to_string(chunks[i]) + " chunks");
    }
  }
  layer_chunks_ = chunks;
  return Status::Ok();
}

torch::Tensor TensorParallelLlama::EmbedTokens(const torch::Tensor& tokens) {
  const torch::Tensor local = tokens - vocab_begin_;
  const torch::Tensor foreign = local.lt(0).logical_or(local.ge(vocab_rows_));
  // Tokens another rank owns look up row 0 and are zeroed (their gradient too).
  torch::Tensor rows = F::embedding(local.masked_fill(foreign, 0), model_->model->embed_tokens->weight);
  rows = rows.masked_fill(foreign.unsqueeze(-1), 0);
  const int64_t handle = Handle(*tp_group_);
  return split_tokens_ ? ScatterTokens::apply(rows, handle) : ReduceFromRegion::apply(rows, handle);
}

torch::Tensor TensorParallelLlama::VocabParallelLoss(const torch::Tensor& hidden, const torch::Tensor& targets) {
  const int64_t handle = Handle(*tp_group_);
  const torch::Tensor h = split_tokens_ ? GatherTokens::apply(hidden, handle, stream_shape_)
                                        : CopyToRegion::apply(hidden, handle);
  const torch::Tensor& weight = model_->lm_head ? model_->lm_head->weight : model_->model->embed_tokens->weight;
  // Each target's row in this rank's slice of the vocabulary, -1 where another rank owns it.
  const torch::Tensor local = targets.reshape({-1}) - vocab_begin_;
  const torch::Tensor foreign = local.lt(0).logical_or(local.ge(vocab_rows_));
  // Chunks of as many bytes of logits as the whole vocabulary's (model.loss_chunk_mib): a slice's
  // rows are tp times narrower.
  const int64_t chunk_rows = model_->loss_chunk_rows() * group_.size();
  return VocabParallelCrossEntropy::apply(h.reshape({-1, h.size(-1)}), weight, local.masked_fill(foreign, -1), handle,
                                          chunk_rows);
}

void TensorParallelLlama::BeginForward(const torch::Tensor& tokens) {
  const int64_t size = group_.size();
  // Sequence parallelism where the tokens divide by tp; the norms' weights are whole on every
  // rank, so a batch that does not divide (an evaluation's last) runs the plain regions alike.
  split_tokens_ = options_.sequence_parallel && tokens.numel() % size == 0;
  // Overlapped layer by layer where each rank's tokens divide into its chunks (else the plain split regions).
  tokens_per_rank_ = tokens.numel() / size;
  stream_shape_ = {tokens.size(0), tokens.size(1), model_->config().hidden_size};
  if (torch::GradMode::is_enabled()) {
    // The replicated parameters' gradients are partial sums after a split forward and whole after
    // a plain one: one step's micro-batches must all be one or the other (FinishBackward).
    if (step_split_tokens_ && *step_split_tokens_ != split_tokens_) {
      ThrowIfError(InvalidInput("tensor parallel: a micro-batch of " + std::to_string(tokens.numel()) +
                                " tokens " + (split_tokens_ ? "splits" : "does not split") + " over mesh.tp=" +
                                std::to_string(size) + " where an earlier one of the same step did " +
                                (split_tokens_ ? "not" : "") + "; every micro-batch of a step must have as many tokens"));
    }
    step_split_tokens_ = split_tokens_;
  }
}

model::EmbedRunner TensorParallelLlama::Embedding() {
  return [this](const torch::Tensor& t) { return EmbedTokens(t); };
}

model::LossRunner TensorParallelLlama::LossHead() {
  return [this](const torch::Tensor& h, const torch::Tensor& t) { return VocabParallelLoss(h, t); };
}

torch::Tensor TensorParallelLlama::Loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                                        const model::LayerRunner& run_layer) {
  TORCH_CHECK(targets.defined(), "tensor parallel training computes the loss: targets are needed");
  BeginForward(tokens);
  static const model::LayerRunner plain = [](int64_t, model::DecoderLayerImpl& layer, const torch::Tensor& h,
                                             const model::RopeTables& rope) { return layer.forward(h, rope); };
  return model_->ForwardWithLayerRunner(tokens, run_layer ? run_layer : plain, targets, Embedding(), LossHead());
}

Status TensorParallelLlama::FinishBackward() {
  std::vector<torch::Tensor> grads;
  for (const LocalParam& p : params_) {
    if (p.split == Split::kReplicated && p.value.grad().defined()) grads.push_back(p.value.mutable_grad());
  }
  return ReduceReplicatedGrads(grads);
}

Status TensorParallelLlama::ReduceReplicatedGrads(const std::vector<torch::Tensor>& grads) {
  const bool split = step_split_tokens_.value_or(false);
  step_split_tokens_.reset();
  if (group_.size() == 1 || grads.empty()) return Status::Ok();
  torch::NoGradGuard no_grad;
  // One all-reduce for every norm's gradient (they are small). After split forwards each rank's
  // holds its tokens' part: summed. After plain ones every rank computed the whole gradient from
  // the same values: averaged, which leaves it as it is, so that the replicated weights cannot
  // drift apart should a kernel ever round differently on one rank.
  std::vector<torch::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}));
  torch::Tensor all = torch::cat(flat);
  MW_ASSIGN_OR_RETURN(auto work, group_.AllReduce(all, split ? dist::ReduceOp::kSum : dist::ReduceOp::kAvg));
  MW_RETURN_IF_ERROR(work->Wait());
  int64_t at = 0;
  for (const auto& g : grads) {
    g.view({-1}).copy_(all.narrow(0, at, g.numel()));
    at += g.numel();
  }
  return Status::Ok();
}

Result<torch::Tensor> TensorParallelLlama::GradNormSquared() {
  std::vector<torch::Tensor> split_grads, replicated_grads;
  for (const LocalParam& p : params_) {
    if (p.value.grad().defined()) (p.split == Split::kReplicated ? replicated_grads : split_grads).push_back(p.value.grad());
  }
  return GradNormSquared(split_grads, replicated_grads);
}

Result<torch::Tensor> TensorParallelLlama::GradNormSquared(const std::vector<torch::Tensor>& split_grads,
                                                           const std::vector<torch::Tensor>& replicated_grads) {
  torch::NoGradGuard no_grad;
  const torch::TensorOptions fp64 = torch::TensorOptions().dtype(torch::kDouble).device(params_.front().value.device());
  // One norm per gradient in one multi-tensor call (as one process does), squared and summed in
  // fp64: no fp64 copy of the gradients on this per-step path.
  auto squared = [&](const std::vector<torch::Tensor>& grads) {
    if (grads.empty()) return torch::zeros({1}, fp64);
    return torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).pow(2).sum().reshape({1});
  };
  torch::Tensor split = squared(split_grads);
  MW_ASSIGN_OR_RETURN(auto work, group_.AllReduce(split, dist::ReduceOp::kSum));
  MW_RETURN_IF_ERROR(work->Wait());
  // Replicated gradients are the same on every rank (FinishBackward made them so): counted once.
  return split + squared(replicated_grads);
}

Result<std::map<std::string, torch::Tensor>> TensorParallelLlama::GatherFullState() {
  std::map<std::string, torch::Tensor> local;
  for (const LocalParam& p : params_) local[p.name] = p.value.detach();
  return GatherFullState(local);
}

Result<std::map<std::string, torch::Tensor>> TensorParallelLlama::GatherFullState(
    const std::map<std::string, torch::Tensor>& local) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> state;
  const int64_t size = group_.size();
  for (const LocalParam& p : params_) {
    const auto it = local.find(p.name);
    // A parameter this rank does not hold (another pipeline stage's: released) is left out.
    if (it == local.end() && p.value.numel() == 0) continue;
    if (it == local.end()) return Internal("tensor parallel state: no local value of '" + p.name + "'");
    const torch::Tensor value = it->second.detach();
    if (p.split == Split::kReplicated) {
      state[p.name] = value.clone();
      continue;
    }
    torch::Tensor gathered = torch::empty({size * value.numel()}, value.options());
    MW_ASSIGN_OR_RETURN(auto work, group_.AllGatherInto(gathered, value.contiguous().view({-1})));
    MW_RETURN_IF_ERROR(work->Wait());
    if (p.split == Split::kRows) {
      state[p.name] = gathered.view(p.full_shape);
    } else {
      // [size, rows, columns / size] -> [rows, columns].
      state[p.name] = gathered.view({size, value.size(0), value.size(1)}).permute({1, 0, 2}).reshape(p.full_shape);
    }
  }
  return state;
}

Split TensorParallelLlama::SplitOf(const std::string& name) { return tp::SplitOf(name); }

double TensorParallelLlama::TakeBlockedSeconds() { return static_cast<double>(tp_group_->blocked_ns.exchange(0)) * 1e-9; }

double TensorParallelLlama::BlockedSecondsSoFar() const {
  return static_cast<double>(tp_group_->total_blocked_ns.load()) * 1e-9;
}

int64_t TensorParallelLlama::LocalBytes() const {
  int64_t bytes = 0;
  for (const LocalParam& p : params_) bytes += dist::TensorBytes(p.value);
  return bytes;
}

}  // namespace meshwork::tp
