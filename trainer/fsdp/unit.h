// An FSDP unit (internal to trainer/fsdp): parameters all-gathered before use, freed after, and
// whose gradients are reduce-scattered together. Both schedules (eager hooks, compiled plan) drive
// the same units; only when each step happens differs.
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

// A gathered parameter keeps one TensorImpl and one StorageImpl for the whole run; freeing and
// re-gathering swap the memory under the storage (what FSDP2 does with storage resize). Tensors
// that autograd saved in forward (the weight, views of it) hold that storage, so after the
// re-gather in backward they read the right values without recomputing the layer.
void ReleaseStorage(const torch::Tensor& t);
void AllocateStorage(const torch::Tensor& t);

// What every unit of one model reports into and reads; owned by FullyShardedLlama.
struct UnitContext {
  dist::Communicator* group = nullptr;         // dp_shard: all-gathers
  dist::Communicator* reduce_group = nullptr;  // dp_shard's ranks: reduce-scatters
  const FsdpOptions* options = nullptr;
  FsdpStats* stats = nullptr;
  ChromeTrace* const* tracer = nullptr;  // the model's tracer: null unless tracing a step
  int64_t* gathered_bytes = nullptr;     // the model's count of allocated parameter storage
};

struct Unit {
  Unit(std::string name, const UnitContext& context, torch::Device device);

  // Appends `p`'s shard to the unit's flat shard.
  void AddParam(ShardedParam* p);

  std::string name;
  std::vector<ShardedParam*> params;  // owned by FullyShardedLlama
  std::vector<int64_t> offsets;       // of each parameter's shard in the unit's flat shard
  int64_t shard_numel = 0;  // this rank's flat shard length (the same on every rank)
  UnitContext context;
  torch::Device device = torch::kCPU;

  bool gathered = false;
  torch::Tensor gather_out;
  std::unique_ptr<dist::Work> gather_work;
  double gather_issued = 0;

  std::vector<torch::Tensor> grad_accum;  // full gradients held back while sync is off
  torch::Tensor reduce_out;
  std::unique_ptr<dist::Work> reduce_work;
  const char* reduce_kind = "";  // what reduce_work is: "reduce_scatter" or "all_reduce"
  double reduce_issued = 0;
  int64_t reduce_bytes = 0;      // its logical size (a reduce-scatter's input)
  const dist::Communicator* reduce_group = nullptr;  // the group it runs on

  // Copy-in of the shards and an async all-gather into one flat buffer.
  void StartGather();
  // Waits for the all-gather and copies every rank's rows into the parameters' own storage
  // (re-allocated if freed), so tensors autograd saved from an earlier forward see them again.
  void WaitGather();
  void Free();

  // After this unit's backward: its parameters' full gradients (accumulated by autograd) go to
  // the reduce-scatter, or are held back while sync is off; then the unit is freed.
  void PostBackward(bool sync);
  // Takes this unit's full gradients (accumulated by autograd) for one micro-batch: held back
  // without sync, else laid out rank-major and reduce-scattered (async).
  void ReduceGrads(bool sync);
  bool PendingGrads() const;

  // Waits for the reduce-scatter; with HSDP, starts averaging the reduced shard across replicas
  // (one all-reduce per unit), else adds it to the shards' gradients.
  void FinishReduce(dist::Communicator* replicate);
  // Plan mode: wait for the reduce-scatter; add the result now unless an all-reduce follows.
  void WaitReduce(bool all_reduce_follows);
  void StartReplicaReduce(dist::Communicator* replicate);
  void FinishReplicaReduce();

 private:
  // Waits for `work` (issued at `issued`), counting the time blocked as exposed communication.
  // When tracing: the collective from issue to completion, and the time blocked.
  void Await(std::unique_ptr<dist::Work>& work, const char* collective, double issued, int64_t bytes,
             const dist::Communicator& on);
  void CountGathered(int64_t delta);
  int64_t GatheredBytes() const;
  void AddReducedGrads();
};

}  // namespace meshwork::fsdp
