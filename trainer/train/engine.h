// How the training loop runs the model: on one process (LocalEngine) or sharded with FSDP over
// a device mesh (FsdpEngine), tensor parallel or in pipeline stages. The loop in trainer.cpp only
// sees the Engine interface (engine_interface.h), so the step reads the same top to bottom
// whatever the parallelism; this file makes the engines.
#pragma once

#include <torch/types.h>

#include <memory>
#include <ostream>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/model/llama.h"
#include "trainer/train/engine_interface.h"

namespace meshwork::train {

// checkpoint_every: decoder layers 0, N, 2N, ... run checkpointed (0: none, 1: every layer).
std::unique_ptr<Engine> MakeLocalEngine(model::LlamaForCausalLM model, int64_t checkpoint_every = 0);

// Reads the rendezvous environment (RANK, WORLD_SIZE, ...); when WORLD_SIZE > 1, joins the
// rendezvous, builds the mesh (mesh.*) and shards `model` (fsdp.*); else a LocalEngine.
Result<std::unique_ptr<Engine>> MakeEngine(const config::TrainConfig& cfg, model::LlamaForCausalLM model,
                                           const torch::Device& device, std::ostream& log);

// Every rank learns whether all succeeded (one all-reduce, which also waits for the slowest): a
// rank that failed returns its own error, the others `code` saying that a peer failed. Collective.
Status AgreeAcrossRanks(Engine& engine, const Status& local, StatusCode code, const std::string& what);

}  // namespace meshwork::train
