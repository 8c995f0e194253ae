// The training engine for pipeline parallelism (mesh.pp > 1): the model cut into stages over the
// pipeline's ranks (trainer/pp), each step one program of the configured schedule
// (pipeline.schedule, over training.grad_accum micro-batches) run by the executor. With data
// parallelism beside it there are mesh.dp_replicate x mesh.dp_shard pipelines, each reading its own
// rows: with dp_shard > 1, FSDP inside each stage (a pipeline rank's parameters one flat group
// sharded over its dp_shard ranks, gathered once for the step, as torchtitan's FSDP keeps them
// through a pipeline step, and their gradients reduce-scattered after the program, then
// all-reduced over dp_replicate); with dp_replicate alone, the stages' gradients averaged over the
// replicas (a stage's all-reduce overlaps the stages still computing). Tensor parallelism inside
// each stage (mesh.tp) composes with both.
#pragma once

#include <memory>
#include <ostream>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/dist/communicator.h"
#include "trainer/dist/env.h"
#include "trainer/model/llama.h"
#include "trainer/train/engine_interface.h"

namespace meshwork::train {

// A pipeline rank's groups. There are dp_replicate x dp_shard x tp pipelines; stage rank s on data
// parallel rank d = replica x dp_shard + shard and tp rank t is world rank
// s x (dp_replicate x dp_shard x tp) + d x tp + t: tp innermost (a tp group is consecutive ranks,
// one node's), then the data parallel ranks, and the pipeline outermost, across nodes.
struct PipelineGroups {
  std::unique_ptr<dist::Communicator> world;      // every rank: agreements, evaluation's average
  std::unique_ptr<dist::Communicator> pipeline;   // the mesh.pp ranks of one (d, t), rank = stage rank
  std::unique_ptr<dist::Communicator> shard;      // stage rank s's dp_shard ranks (one replica, t); null at 1
  std::unique_ptr<dist::Communicator> replicate;  // stage rank s's replicas (one shard, t); null at 1
  std::unique_ptr<dist::Communicator> tp;         // stage rank s's tp ranks of one d; null at 1
};

// InvalidConfig where the groups do not make the mesh, the schedule cannot run
// the shape (pipeline.schedule with mesh.pp, pipeline.virtual_stages and training.grad_accum
// micro-batches), or the model has fewer layers than stages; Unavailable on a device whose
// communicator has no point-to-point transfers (NCCL).
Result<std::unique_ptr<Engine>> MakePipelineEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                                   const dist::DistEnv& env, PipelineGroups groups,
                                                   const torch::Device& device, std::ostream& log);

}  // namespace meshwork::train
