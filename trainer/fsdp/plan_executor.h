// The compiled FSDP schedule: replays a compiler plan's ops (all-gathers, reduce-scatters,
// all-reduces, waits, frees) in order, advancing to each compute the model reaches; the plan,
// not autograd's hooks, decides when every collective runs, and which decoder layers run
// checkpointed (the modules with ws= in its IR).
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/compiler/ir.h"
#include "trainer/fsdp/embedding_rows.h"
#include "trainer/fsdp/step_schedule.h"
#include "trainer/fsdp/vocab_head.h"

namespace meshwork::fsdp {

class PlanExecutor : public StepSchedule {
 public:
  // Binds `plan` (already checked against the model: same parameters, modules and mesh, and
  // valid) to `state`'s parameters: one unit per all-gather and per reduce-scatter value. Only
  // the embedding may be read by rows, and only the head may split it by vocabulary
  // (FullyShardedLlama::UsePlan checks).
  PlanExecutor(ShardedState& state, const compiler::Graph& plan);

  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& targets) override;
  void FinishBackward() override;

 private:
  // What a wait op waits for, resolved once when the plan is bound.
  enum class WaitFor { kNone, kGather, kReduce, kReduceThenAllReduce, kAllReduce, kRowGather, kRowReduce };

  // Runs the plan's ops up to the compute of `module` in `phase` (an empty module: to the end)
  // and checks that compute's parameters are gathered. Throws StatusError on a mismatch.
  void RunUntil(compiler::Phase phase, const std::string& module);
  void RunOp(size_t at);

  ShardedState& state_;
  compiler::Graph graph_;
  std::map<std::string, std::unique_ptr<Unit>> buckets_;  // %ag / %rs id -> its parameters
  // Per op, resolved once so the per-step replay does no lookups: the unit it acts on (an
  // all_reduce and its wait: the source reduce-scatter's), and what a wait waits for.
  std::vector<Unit*> unit_;
  // The embedding, when the plan reads it by rows (row_gather / row_reduce ops act on it).
  std::unique_ptr<EmbeddingRows> embed_rows_;
  // The tied head, when the plan splits it by vocabulary (its exchange runs inside its compute).
  std::unique_ptr<VocabParallelHead> vocab_head_;
  torch::Tensor tokens_;  // the micro-batch in flight (what a row_gather fetches rows for)
  std::vector<WaitFor> wait_for_;
  std::vector<std::vector<ShardedParam*>> module_params_;
  std::vector<bool> recompute_;  // per decoder layer: the plan checkpoints it
  size_t pc_ = 0;
  // The compute the plan last let run (for the trace): its label and start time.
  std::string open_compute_;
  double open_compute_start_ = 0;
};

}  // namespace meshwork::fsdp
