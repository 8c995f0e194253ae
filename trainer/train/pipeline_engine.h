// The training engine for pipeline parallelism (mesh.pp > 1): the model cut into stages over the
// world's ranks (trainer/pp), each step one program of the configured schedule
// (pipeline.schedule, over training.grad_accum micro-batches) run by the executor. Not composed
// with data or tensor parallelism yet (the config refuses them), so the world is the pipeline.
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

// `comm`: the group of all env.world_size ranks, which must be mesh.pp. InvalidConfig where the
// world is not mesh.pp, the schedule cannot run the shape (pipeline.schedule with mesh.pp,
// pipeline.virtual_stages and training.grad_accum micro-batches), or the model has fewer layers
// than stages; Unavailable on a device whose communicator has no point-to-point transfers (NCCL).
Result<std::unique_ptr<Engine>> MakePipelineEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                                   const dist::DistEnv& env, std::unique_ptr<dist::Communicator> comm,
                                                   const torch::Device& device, std::ostream& log);

}  // namespace meshwork::train
