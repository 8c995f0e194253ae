// Rendezvous over Meshwork's store (rendezvous_store.h): bind or connect with retries, then a
// store barrier.
#include "trainer/dist/rendezvous.h"

#include "trainer/dist/rendezvous_store.h"

#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace meshwork::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string Seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

milliseconds Remaining(Clock::time_point deadline) {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

// getaddrinfo(host) bounded by `limit`: a resolver that hangs (no DNS reachable) must not
// outlast the rendezvous timeout, so the lookup runs on a detached thread. Returns "" when the
// name resolves, else the resolver's error.
std::string ResolveWithin(const std::string& host, int port, milliseconds limit) {
  struct Lookup {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string error;
  };
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host, port] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* result = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
    if (result != nullptr) ::freeaddrinfo(result);
    std::lock_guard<std::mutex> lock(lookup->mu);
    lookup->done = true;
    if (rc != 0) lookup->error = ::gai_strerror(rc);
    lookup->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(lookup->mu);
  if (!lookup->cv.wait_for(lock, limit, [&] { return lookup->done; })) {
    return "name lookup did not answer within " + Seconds(limit);
  }
  return lookup->error;
}

// Sleeps for the current backoff (never past the deadline) and doubles it up to 2 s.
void Backoff(milliseconds* delay, Clock::time_point deadline) {
  std::this_thread::sleep_for(std::min(*delay, Remaining(deadline)));
  *delay = std::min(*delay * 2, milliseconds(2000));
}

Result<c10::intrusive_ptr<c10d::Store>> ConnectStore(const DistEnv& env, milliseconds timeout,
                                                     Clock::time_point start) {
  const Clock::time_point deadline = start + timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  // Rank 0 binds the Pod's own address (POD_IP), or the one named, else what master_addr is.
  const std::string bind_host = !env.store_bind_addr.empty() ? env.store_bind_addr : env.master_addr;
  std::shared_ptr<StoreServer> server;  // rank 0's, once bound
  milliseconds delay(100);
  std::string last_error;
  int attempts = 0;
  while (true) {
    ++attempts;
    if (env.rank == 0 && server == nullptr) {
      // A name to bind resolves like the master's (bounded); a port still held by the previous
      // gang's rank 0 is retried.
      last_error = ResolveWithin(bind_host, env.master_port, Remaining(deadline));
      if (last_error.empty()) {
        auto started = StoreServer::Start(bind_host, env.master_port, env.rendezvous_token);
        if (started.ok()) {
          server = std::shared_ptr<StoreServer>(std::move(*started));
        } else {
          last_error = started.status().message();
        }
      } else {
        last_error = "cannot resolve the address to bind, " + bind_host + ": " + last_error;
      }
    }
    // Rank 0 reaches its own server by the address it bound: no name lookup.
    const std::string host = server != nullptr ? server->bound_host() : env.master_addr;
    if (env.rank != 0) {
      last_error = ResolveWithin(host, env.master_port, Remaining(deadline));
      if (!last_error.empty()) last_error = "cannot resolve host: " + last_error;
    }
    if (last_error.empty()) {
      auto client = StoreClient::Connect(host, env.master_port, env.rendezvous_token,
                                         std::max(Remaining(deadline), milliseconds(1)), server);
      if (client.ok()) {
        (*client)->setTimeout(timeout);
        return c10::intrusive_ptr<c10d::Store>(std::move(*client));
      }
      last_error = client.status().message();
    }
    if (Clock::now() >= deadline) break;
    Backoff(&delay, deadline);
    // An attempt with (almost) no time left could only replace the last error with a timeout.
    if (Remaining(deadline) < milliseconds(10)) break;
  }
  return Unavailable("rank " + std::to_string(env.rank) + " could not join the rendezvous at " + where +
                    (env.rank == 0 ? " (hosting it on " + bind_host + ")" : "") + " after waiting " +
                    Seconds(Clock::now() - start) + " (" + std::to_string(attempts) +
                    " attempts): " + last_error);
}

}  // namespace

Result<c10::intrusive_ptr<c10d::Store>> Rendezvous(const DistEnv& env, milliseconds timeout) {
  if (env.world_size == 1) {
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>());
  }
  const Clock::time_point start = Clock::now();
  MW_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, ConnectStore(env, timeout, start));

  // Barrier: the rank that brings the count to world_size publishes "done"; the rest wait on it.
  const std::string prefix = "rendezvous/" + std::to_string(env.restart_generation) + "/";
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    int64_t joined = store->add(prefix + "joined", 1);
    if (joined == env.world_size) store->set(prefix + "done", std::vector<uint8_t>{'1'});
    store->wait({prefix + "done"}, std::max(Remaining(start + timeout), milliseconds(1)));
  } catch (const std::exception& e) {
    std::string joined = "?";
    try {
      joined = std::to_string(store->add(prefix + "joined", 0));
    } catch (const std::exception&) {
      // The server itself is gone; "?" says so.
    }
    std::string what = e.what();
    // Rank 0 hosts the store: it stays a moment past the deadline, so that ranks timing out
    // at the same instant can still read how many joined instead of finding the server gone.
    if (env.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    return Unavailable("rendezvous at " + where + ": only " + joined + " of " +
                      std::to_string(env.world_size) + " ranks joined generation " +
                      std::to_string(env.restart_generation) + " after waiting " +
                      Seconds(Clock::now() - start) + " (rank " + std::to_string(env.rank) +
                      "): " + what.substr(0, what.find('\n')));
  }
  return store;
}

}  // namespace meshwork::dist
