// dist.mesh: auto: rank 0 chooses the mesh (dp_replicate x dp_shard) with the compiler's cost
// model (compiler::ChooseMesh: every factorisation of the world planned and simulated, the
// fastest that fits the device's memory) and hands it to every rank through the rendezvous
// store, before any group exists.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ostream>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/dist/env.h"

namespace meshwork::train {

// Collective over the store: rank 0 chooses, logs the candidates and the choice to `log`, and
// publishes it (or its error) under a key of this restart generation; the other ranks wait for
// it (up to dist.timeout_seconds). Every rank returns the same shape or the same error.
Result<dist::MeshShape> AgreeOnAutoMesh(c10d::Store& store, const dist::DistEnv& env, const config::TrainConfig& cfg,
                                        bool cuda, std::ostream& log);

}  // namespace meshwork::train
