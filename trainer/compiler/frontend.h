// The FSDP front end of the compiler: declares what is communicated and nothing about when.
// From the module table (which parameters each module uses, in forward order) it emits the
// naive program: before every compute that needs parameters not yet gathered, one all-gather
// per flat group (ParamInfo::group; a parameter without one is its own) and its wait; after
// the last backward use of a group's parameters, one reduce-scatter and its wait (and with HSDP
// one all-reduce and its wait); for a module that reads parameters by rows (ModuleInfo::rows),
// a row_gather and its wait before its forward and a row_reduce and its wait after its
// backward; optimizer_step last. With
// reshard_after_forward, every module but the last (the head, whose backward follows its
// forward directly) gathers again for backward; frees are left to the insert_frees pass.
#pragma once

#include "trainer/compiler/ir.h"
#include "trainer/model/llama_config.h"

namespace meshwork::compiler {

struct FrontEndOptions {
  bool reshard_after_forward = true;
};

// `skeleton` carries params, modules and mesh; its ops are replaced.
Graph BuildNaiveProgram(Graph skeleton, const FrontEndOptions& options);

// The first module (forward order) that uses a parameter that can be read by rows
// (ParamInfo::row_bytes: the embedding's table, first used by its lookup) reads it by rows
// instead of whole: ModuleInfo::rows. Later users (a tied output head) still use it whole. Then the naive program fetches only the
// micro-batch's rows (row_gather) before the module's forward and sums their gradients into the
// owners' shards (row_reduce) after its backward; a parameter no module uses whole any more (an
// untied embedding) is never all-gathered or reduce-scattered, and a tied one is gathered only
// for the head and reduce-scattered right after the head's backward. A module that now reads
// by rows takes no longer for its backward than for its forward: it scatters its rows'
// gradients as the forward gathered them, where the traced (eager) backward built the whole
// table's dense gradient (llama-100m on netlab: 0.21 s traced, 0.001 s by rows).
void ReadByRows(Graph& g);

// After ReadByRows: a later module that still uses a parameter read by rows whole (a tied output
// head) splits it by vocabulary row instead (ModuleInfo::vocab): each rank computes the logits of
// the rows its shard owns for every rank's tokens, exchanging hidden states and softmax
// statistics inside the head's compute, so the table is never all-gathered or reduce-scattered.
void SplitByVocabulary(Graph& g);

// FSDP's flat groups, as the runtime shards them: each parameter in the group of the first
// module (forward order) that uses it, numbered by that module. So a decoder layer is one
// group, the embedding one, and the final norm with an untied output head one (a tied head
// uses the embedding's group).
void GroupByOwner(Graph& g);

// The module table of a Llama model under FSDP (and tensor parallelism), with compute modelled
// from FLOPs: modules
// "embed", "layers.<i>", "head"; parameters in HF order with their byte sizes for the given
// dtypes and dp_shard; per-module forward time = forward FLOPs / flops_per_second and
// backward twice that; activations per layer from the standard estimate (bf16 or fp32).
struct LlamaShape {
  model::LlamaConfig config;
  int64_t batch = 1;      // per rank
  int64_t seq_len = 2048;
  int param_bytes = 2;    // per element, gathered (bf16 = 2)
  int reduce_bytes = 4;   // per element, gradient reduction (fp32 = 4)
  int activation_bytes = 2;
  // The residual stream's element size (training.residual_dtype): the layers' inputs and sums,
  // which the norms keep for backward and activation checkpointing keeps alone. 0: the same as
  // activation_bytes.
  int residual_bytes = 0;
  int dp_shard = 1;
  int dp_replicate = 1;
  // Tensor parallelism (trainer/tp): each rank holds 1/tp of the heads, the MLP width and the
  // vocabulary (`batch` is then the tp group's, which every rank of it computes a slice of), and
  // with sequence parallelism the residual stream and norms 1/tp of the tokens. The modules
  // carry their exchanges over the tp group (ModuleInfo::tp_fwd/tp_bwd).
  int tp = 1;
  bool sequence_parallel = true;
  double flops_per_second = 1e12;  // achieved, not peak
  // Per-layer activation checkpointing (what FSDP2 users apply to each block): a layer keeps
  // only its input; its backward recomputes the forward first (one more forward of compute)
  // and holds the layer's full activations while it runs.
  bool activation_checkpointing = false;
  // Attention without a fused kernel (libtorch 1.13 on the CPU) keeps its fp32 probabilities,
  // batch x heads x seq², and grouped-query k and v widened to every head, for backward.
  bool attention_keeps_probabilities = false;
  // The fused head + loss keeps the logits' gradient (tokens x vocab, activation_bytes each)
  // from its forward to its backward, which then needs no recompute (training.loss_gradient).
  bool head_stores_logit_grad = false;
};
Graph LlamaSkeleton(const LlamaShape& shape);

}  // namespace meshwork::compiler
