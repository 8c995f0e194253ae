// Rendezvous: every rank joins one key-value store (a c10d::Store) hosted by rank 0 and learns that all
// the others have joined. The store then carries the communicators' own bootstrapping.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "common/status.h"
#include "trainer/dist/env.h"

namespace meshwork::dist {

// Rank 0 hosts the store (StoreServer) on env.master_port, bound to env.store_bind_addr (the
// Pod's own address) or, when that is empty, to the address env.master_addr resolves to; every
// rank, rank 0 included, connects as a client (StoreClient) and presents
// env.rendezvous_token, which the server checks. A master address that does not resolve yet
// (a pod's DNS name appears after the pod starts), refuses connections, or a port still held
// by the last gang's rank 0, is retried with backoff (100 ms doubling to 2 s) until `timeout`.
// Then a barrier on "rendezvous/<restart_generation>/joined" makes sure all world_size ranks
// are in. Failure to join (a refused token included) or an incomplete barrier is kUnavailable
// naming address:port and the wait. world_size 1 gets an in-process HashStore and opens no
// port. Rank 0's store hosts the server: keep it alive until every rank is done with the store.
Result<c10::intrusive_ptr<c10d::Store>> Rendezvous(const DistEnv& env,
                                                   std::chrono::milliseconds timeout);

}  // namespace meshwork::dist
