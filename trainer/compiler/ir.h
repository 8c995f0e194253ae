// The schedule IR of compiled FSDP: one training step as a linear program of collectives,
// waits, frees and compute, in the order the host issues them. Collectives are asynchronous
// (issue, then `wait`); compute is a sync point where the model runs one module's forward or
// backward. The FSDP front end declares what is communicated (one all-gather and one
// reduce-scatter per parameter, in the naive order); passes decide grouping and order.
//
// Text form (print -> parse -> print is the identity; tests keep passes on golden text):
//
//   meshwork-ir 1
//   mesh dp_shard=2 dp_replicate=1          (then tp=<n> when > 1, rs_recv=full if set)
//   param 0 model.embed_tokens.weight gathered=65536 grad=65536 shard=32768   (then group=<n>, rows=<bytes> if set)
//   module embed fwd=0.0001 bwd=0.0002 act=0 params=[0]   (ws=, ckpt=, tmp=, tr=, vtr=, tp=, gemm=, atp=,
//                                                           rows=[..], vocab=[..] before params= if set)
//   ...
//   %ag0 = all_gather [0]
//   wait %ag0
//   compute fwd embed
//   free %ag0
//   %rs0 = reduce_scatter [1,2]
//   %ar0 = all_reduce %rs0
//   wait %ar0
//   %rg0 = row_gather [0]        (a module reading [0] by rows; then %rr0 = row_reduce [0])
//   optimizer_step
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshwork::compiler {

struct ParamInfo {
  std::string name;            // HF name
  int64_t gathered_bytes = 0;  // the full tensor in param dtype (all-gather output)
  int64_t grad_bytes = 0;      // the full gradient in reduce dtype (reduce-scatter input)
  int64_t shard_bytes = 0;     // this rank's fp32 master shard, padded
  // The flat group the parameter is sharded in (printed as group=, only when set): the
  // parameters of one group are laid out back to back and sharded as one flat vector, so they
  // are always gathered, freed and reduce-scattered together (the runtime's FlatGroup). -1: a
  // group of its own.
  int group = -1;
  // Bytes of the rows one rank reads of this parameter per micro-batch when a module reads it by
  // rows (an embedding: one row per token, fp32), printed as rows=, only when set; 0: the
  // parameter cannot be read by rows. What a row_gather or row_reduce of it moves per rank.
  int64_t row_bytes = 0;
};

// What a module's tensor-parallel regions exchange over the tp group in one phase of its compute:
// bus bytes (an all-gather's output plus a reduce-scatter's input; an all-reduce counted twice,
// its reduce-scatter and all-gather halves) and how many collectives carry them.
struct TpExchange {
  int64_t bytes = 0;
  int calls = 0;
  bool operator==(const TpExchange& o) const { return bytes == o.bytes && calls == o.calls; }
};

// A module the runtime can stop at: "embed", "layers.<i>", "head" (final norm + output head).
struct ModuleInfo {
  std::string name;
  std::vector<int> params;       // indices into Graph::params
  // Parameters it reads only by rows (printed as rows=[..] before params=, only when set): the
  // embedding in a compiled plan reads the rows of its tokens, fetched by a row_gather, and
  // its gradient is those rows', summed into the owners' shards by a row_reduce. No all-gather
  // or reduce-scatter is needed for them on its account.
  std::vector<int> rows;
  // Parameters it splits by vocabulary row (printed as vocab=[..] after rows=, only when set): a
  // tied output head in a compiled plan computes, on each rank, the logits of the table rows that
  // rank's shard owns for every rank's tokens, and those rows' gradient straight into the shard.
  // The exchange (every rank's hidden states and softmax statistics forward, the hidden states'
  // gradient back) happens inside the module's compute; no all-gather or reduce-scatter of the
  // parameter is needed on its account. Such a parameter needs rows= (the hidden states of one
  // rank's micro-batch are as large as its rows).
  std::vector<int> vocab;
  double fwd_seconds = 0;        // traced or modelled compute time
  double bwd_seconds = 0;
  int64_t activation_bytes = 0;  // kept from forward until this module's backward
  // Held only while its backward runs: with activation checkpointing, the activations the
  // backward recomputes (printed as ws=, only when non-zero).
  int64_t backward_workspace_bytes = 0;
  // A module that activation checkpointing can apply to: what it keeps when checkpointed (its
  // input), printed as ckpt=; 0 = not a candidate, or already checkpointed.
  int64_t checkpoint_input_bytes = 0;
  // Held only while its backward runs, checkpointed or not: gradients of intermediates the
  // backward makes and drops (attention's score gradients when attention is not fused). Printed
  // as tmp=, only when non-zero.
  int64_t backward_temp_bytes = 0;
  // Held for a moment inside its compute, forward or backward, over what it keeps: the output
  // head's chunk of fp32 logits (printed as tr=, only when non-zero). When the module splits a
  // parameter by vocabulary, vocab_transient_bytes replaces it (vtr=): the chunk of logits over
  // this rank's rows for every rank's tokens, which forward holds twice (the logits and
  // log-sum-exp's exponentials).
  int64_t transient_bytes = 0;
  int64_t vocab_transient_bytes = 0;
  // Tensor parallelism (Graph::tp > 1): the exchanges between the module's matmuls, inside its
  // compute, forward and backward (printed tp=<fwd bytes>x<fwd calls>/<bwd bytes>x<bwd calls>,
  // only when set). They sit between the matmuls of one module, where the runtime cannot stop, so
  // they are the module's, like a vocabulary split's exchange: they block its compute unless
  // overlapped.
  TpExchange tp_fwd, tp_bwd;
  // The share of the module's compute in the matmuls next to those exchanges, which overlapped
  // TP can run beside them (gemm=, only with tp=).
  double tp_gemm_share = 0;
  // Overlapped (async) TP: each exchange and its matmul split into this many chunks, chunk i's
  // communication beside chunk i-1's matmul (atp=, only when > 1; set by the async_tp pass).
  int tp_chunks = 1;
};

// Activation checkpointing applied to `m` (a candidate): it keeps only its input from forward,
// its backward recomputes the forward first (bwd += fwd, and its tensor-parallel exchanges with
// it) and holds the recomputed activations while it runs (ws = what act was). No-op on a module
// that is not a candidate.
void Checkpoint(ModuleInfo& m);
inline bool IsCheckpointed(const ModuleInfo& m) { return m.backward_workspace_bytes > 0; }

// row_gather [p]: the rows of this micro-batch's tokens of parameter p, from the ranks that own
// them (before the forward of the module that reads them by rows); row_reduce [p]: those rows'
// gradients from every rank, summed into the owners' shards (after that module's backward).
enum class OpKind { kAllGather, kReduceScatter, kAllReduce, kWait, kFree, kCompute, kOptimizerStep, kRowGather, kRowReduce };
const char* OpKindName(OpKind k);  // "all_gather", ...

enum class Phase { kForward, kBackward };

struct Op {
  OpKind kind = OpKind::kCompute;
  // all_gather / reduce_scatter / all_reduce: the value it defines ("%ag3");
  // wait / free: the value it refers to; all_reduce also refers to `source` (its reduce-scatter).
  std::string id;
  std::string source;
  std::vector<int> params;  // all_gather, reduce_scatter, row_gather, row_reduce
  Phase phase = Phase::kForward;  // compute
  int module = -1;                // compute

  bool is_collective() const {
    return kind == OpKind::kAllGather || kind == OpKind::kReduceScatter || kind == OpKind::kAllReduce ||
           kind == OpKind::kRowGather || kind == OpKind::kRowReduce;
  }
  bool operator==(const Op& o) const {
    return kind == o.kind && id == o.id && source == o.source && params == o.params && phase == o.phase &&
           module == o.module;
  }
};

struct Graph {
  int dp_shard = 1;
  int dp_replicate = 1;
  // Tensor parallel ranks each FSDP rank is one of (the parameters' sizes are a tp rank's slices;
  // modules carry their exchanges, ModuleInfo::tp_fwd/tp_bwd). Printed tp=<n> when > 1.
  int tp = 1;
  // A reduce-scatter in flight also holds a receive buffer as large as its input (Gloo's, which
  // all-to-alls the input and sums the chunks at the wait; NCCL receives only the shard).
  // Printed as rs_recv=full on the mesh line.
  bool reduce_scatter_receives_input = false;
  std::vector<ParamInfo> params;
  std::vector<ModuleInfo> modules;  // forward order
  std::vector<Op> ops;              // program order

  int FindModule(std::string_view name) const;  // -1 when absent
  // Whether a module exchanges over the tp group (tp= on its line), priced on CostModel::tp_link.
  bool CarriesTpExchanges() const;
};

std::string Print(const Graph& g);
// Errors are kInvalidInput naming the line number and the offending text.
Result<Graph> Parse(std::string_view text);

// The shortest text that parses back to the same double (how the IR writes its figures).
std::string ShortestText(double v);

// The rules every program must keep (checked after every pass, and by the executor before it
// runs a plan): ids defined once; a wait after its collective and at most once per issue; a
// compute's parameters gathered and waited for, not freed, before it; every parameter
// reduce-scattered once, after the last backward that uses it, and waited for; frees after
// the wait of the all-gather they free; an all-reduce after its reduce-scatter's wait; every
// collective waited for before optimizer_step, which comes last; a parameter a module reads by
// rows row-gathered (and waited for) before that module's forward and row-reduced once after its
// backward; a parameter a module splits by vocabulary has rows=. kInternal naming the op.
Status Validate(const Graph& g);

}  // namespace meshwork::compiler
