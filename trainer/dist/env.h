// Where this process sits in the job: rank, world size and master address, read from the
// environment. Accepts torchrun's variables and Meshwork's own, so the trainer also runs by
// hand or under other launchers.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "common/status.h"

namespace meshwork::dist {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_generation = 0;  // bumped by the operator on every gang restart
  // Rank 0's store binds this address; empty: the one master_addr resolves to.
  std::string store_bind_addr;
  // Every rank presents it to the store, which admits only the same token. Empty: no token.
  std::string rendezvous_token;
};

// Reads, for each field, Meshwork's variable and torchrun's:
//   MESHWORK_RANK / RANK, MESHWORK_WORLD_SIZE / WORLD_SIZE, MESHWORK_LOCAL_RANK / LOCAL_RANK,
//   MESHWORK_LOCAL_WORLD_SIZE / LOCAL_WORLD_SIZE, MESHWORK_MASTER_ADDR / MASTER_ADDR,
//   MESHWORK_MASTER_PORT / MASTER_PORT,
//   MESHWORK_RESTART_GENERATION / TORCHELASTIC_RESTART_COUNT,
// and, Meshwork's only: MESHWORK_RENDEZVOUS_BIND_ADDR (else POD_IP, which the operator sets
// from the Pod's status) for store_bind_addr, MESHWORK_RENDEZVOUS_TOKEN for rendezvous_token.
// An empty variable counts as unset. Both set to different values, a non-integer, a negative
// value, rank >= world size, local rank >= local world size, local world size > world size or
// a port outside 1..65535 is kInvalidConfig naming the variable(s) and value(s). Nothing set
// gives the single-process defaults above.
Result<DistEnv> ReadDistEnv(const std::function<const char*(const char*)>& getenv = ::getenv);

}  // namespace meshwork::dist
