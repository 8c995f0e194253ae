// FSDP's flat groups and units (internal to trainer/fsdp).
//
// A flat group is the parameters one module owns (a decoder layer; the embedding; the final
// norm with an untied output head), laid out back to back in one flat vector, padded to a
// multiple of dp_shard and sharded as that vector: rank r holds elements [r S, (r + 1) S) as
// its fp32 master shard. So communication costs no copies:
//   - the all-gather reads the master shard (or its param_dtype cast) and writes straight into
//     the storage the module's parameters are views of;
//   - autograd accumulates the parameters' gradients into views of one flat buffer, which is
//     the reduce-scatter's input (cast once when the reduction runs in another dtype), and the
//     reduced shard's slices are the master shards' gradients.
//
// A unit is what one collective moves: one or more whole groups. Both schedules (eager hooks,
// compiled plan) drive units over the same groups; only when each step happens differs.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/chrome_trace.h"
#include "trainer/dist/communicator.h"
#include "trainer/fsdp/fully_shard.h"

namespace meshwork::fsdp {

// Steady-clock seconds (the trace's timeline).
double Now();

// A gathered group keeps one StorageImpl for the whole run; freeing and re-gathering swap the
// memory under the storage (what FSDP2 does with storage resize). Tensors that autograd saved
// in forward (the weights, views of them) hold that storage, so after the re-gather in backward
// they read the right values without recomputing the layer.
void ReleaseStorage(const torch::Tensor& t);
void AllocateStorage(const torch::Tensor& t);

// Writes through a second TensorImpl on the same storage: an in-place write to the parameter
// itself would bump its version counter and autograd would reject the tensors it saved.
torch::Tensor WriteAlias(const torch::Tensor& t);

// A Llama parameter's flat group (by its HF name) among a model's `layers` decoder layers: 0 the
// embedding, 1 + i decoder layer i, layers + 1 the rest (the final norm, an untied head).
size_t GroupOf(const std::string& name, int64_t layers);

struct FlatGroup;
// Shards `g` (its parameters listed, holding the full, identical-on-every-rank initial values)
// over `world` ranks as one flat vector: this rank's elements become the fp32 master shard, and
// the parameters become views of one param_dtype storage, allocated only while gathered (it is
// released on return). `group_index` is recorded in each parameter.
void ShardGroup(FlatGroup& g, int group_index, int world, int rank, torch::ScalarType param_dtype);

struct FlatGroup {
  std::string name;                   // "model.layers.3", "embed", "head"
  std::vector<ShardedParam*> params;  // owned by FullyShardedLlama, in layout order
  int64_t shard_numel = 0;            // S: this rank's flat shard length (the same on every rank)
  torch::Tensor master;   // [S] fp32: this rank's elements; the params' shards are views of it
  torch::Tensor storage;  // [world S] param_dtype: the params' storage, allocated while gathered
  torch::Tensor grad;     // [world S] param_dtype: the params' gradients (views), while accumulating
  torch::Tensor grad_accum;  // [world S] reduce dtype: earlier micro-batches, when it differs

  bool received = false;  // a gradient arrived since the last ReduceGrads

  // Before a gradient reaches one of the group's parameters (a hook on each): marks the group
  // received and makes sure of EnsureGrad.
  void OnGradient();
  // A zeroed buffer, with every parameter's .grad a view of it, so autograd adds into it. A
  // gradient a parameter already had is copied in; returns how many were.
  int EnsureGrad();
  int64_t StorageBytes() const;
};

// What every unit of one model reports into and reads; owned by FullyShardedLlama.
struct UnitContext {
  dist::Communicator* group = nullptr;         // dp_shard: all-gathers
  dist::Communicator* reduce_group = nullptr;  // dp_shard's ranks: reduce-scatters
  const FsdpOptions* options = nullptr;
  FsdpStats* stats = nullptr;
  ChromeTrace* const* tracer = nullptr;  // the model's tracer: null unless tracing a step
  int64_t* gathered_bytes = nullptr;     // the model's count of allocated parameter storage
};

// Waits for `works` (issued at `issued`), counting the time blocked as exposed communication.
// When tracing: "<collective> <what>" from issue to completion, and the time blocked. Clears
// `works`. `blocked_since` (>= 0): the host has been blocked on them since then, not just now.
void AwaitCollectives(const UnitContext& context, std::vector<std::unique_ptr<dist::Work>>& works,
                      const std::string& what, double issued, int64_t bytes, const dist::Communicator& on,
                      double blocked_since = -1);

struct Unit {
  Unit(std::string name, const UnitContext& context);

  void AddGroup(FlatGroup* g);

  std::string name;
  std::vector<FlatGroup*> groups;  // owned by FullyShardedLlama
  UnitContext context;

  bool gathered = false;
  std::vector<std::unique_ptr<dist::Work>> gather_works;  // one per group
  double gather_issued = 0;

  std::vector<torch::Tensor> reduce_out;  // per group: this rank's reduced shard
  std::vector<std::unique_ptr<dist::Work>> reduce_works;
  const char* reduce_kind = "";  // what reduce_works are: "reduce_scatter" or "all_reduce"
  double reduce_issued = 0;
  int64_t reduce_bytes = 0;      // their logical size (a reduce-scatter's input)
  const dist::Communicator* reduce_group = nullptr;  // the group they run on

  // Allocates the groups' storage and all-gathers into it (async).
  void StartGather();
  // Waits for the all-gather: the parameters hold their full values (tensors autograd saved
  // from an earlier forward see them again).
  void WaitGather();
  void Free();

  // After this unit's backward: its gradients go to the reduce-scatter, or are held back while
  // sync is off; then the unit is freed.
  void PostBackward(bool sync);
  // Takes this unit's gradients (accumulated by autograd into the groups' buffers) for one
  // micro-batch: held back without sync, else reduce-scattered (async).
  void ReduceGrads(bool sync);
  bool PendingGrads() const;

  // Waits for the reduce-scatter; with HSDP, starts averaging the reduced shard across replicas
  // (one all-reduce per group), else adds it to the shards' gradients.
  void FinishReduce(dist::Communicator* replicate);
  // Plan mode: wait for the reduce-scatter; add the result now unless an all-reduce follows.
  void WaitReduce(bool all_reduce_follows);
  void StartReplicaReduce(dist::Communicator* replicate);
  void FinishReplicaReduce();

 private:
  void Await(std::vector<std::unique_ptr<dist::Work>>& works, const char* collective, double issued, int64_t bytes,
             const dist::Communicator& on) {
    AwaitCollectives(context, works, std::string(collective) + " " + name, issued, bytes, on);
  }
  void CountGathered(int64_t delta);
  int64_t GatheredBytes() const;
  void AddReducedGrads();
};

}  // namespace meshwork::fsdp
