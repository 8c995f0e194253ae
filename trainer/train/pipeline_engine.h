// The training engine for pipeline parallelism (mesh.pp > 1): the model cut into stages over the
// pipeline's ranks (trainer/pp), each step one program of the configured schedule
// (pipeline.schedule, over training.grad_accum micro-batches) run by the executor; with
// mesh.dp_replicate > 1, that many replicas of the pipeline, each reading its own rows, their
// stages' gradients averaged over the replicas after the program (a stage's all-reduce overlaps the
// stages still computing). Not composed with FSDP or tensor parallelism yet (the config refuses them).
#pragma once

#include <memory>
#include <ostream>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/dist/communicator.h"
#include "trainer/dist/env.h"
#include "trainer/model/llama.h"
#include "trainer/train/engine.h"

namespace meshwork::train {

// A pipeline rank's groups: stage rank s of replica d is world rank s x dp_replicate + d.
struct PipelineGroups {
  std::unique_ptr<dist::Communicator> world;      // every rank: agreements, evaluation's average
  std::unique_ptr<dist::Communicator> pipeline;   // replica d's mesh.pp ranks, rank = stage rank
  std::unique_ptr<dist::Communicator> replicate;  // stage rank s's replicas; null with one replica
};

// InvalidConfig where the groups are not mesh.pp x mesh.dp_replicate ranks, the schedule cannot run
// the shape (pipeline.schedule with mesh.pp, pipeline.virtual_stages and training.grad_accum
// micro-batches), or the model has fewer layers than stages; Unavailable on a device whose
// communicator has no point-to-point transfers (NCCL).
Result<std::unique_ptr<Engine>> MakePipelineEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                                   const dist::DistEnv& env, PipelineGroups groups,
                                                   const torch::Device& device, std::ostream& log);

}  // namespace meshwork::train
