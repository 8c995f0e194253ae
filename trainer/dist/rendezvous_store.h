// The rendezvous key-value store: a c10d::Store over TCP whose server binds one address and
// admits only clients that present the job's token. c10d's own TCPStore listens on every
// address and has no authentication, so any process that can reach rank 0 could read or write
// the keys that bootstrap Gloo and NCCL (or stall a gang by answering in its place).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace meshwork::dist {

// What a store operation throws (inside the c10d::Store interface, whose callers expect
// exceptions): the server's address, the operation and key, and what went wrong.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The server: a map of keys to byte values, one thread per connection, waits on a condition
// variable. Destroying it closes the listener and every connection and wakes every waiter.
class StoreServer {
 public:
  // Binds `host` (a numeric address or a name, resolved once) on `port`; port 0 picks a free
  // one. An empty `token` admits every client that presents an empty token. Fails kUnavailable
  // naming host:port and the OS error (address in use, not an address of this machine).
  static Result<std::unique_ptr<StoreServer>> Start(const std::string& host, int port,
                                                    std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const std::string& bound_host() const { return bound_host_; }  // numeric, as bound
  int port() const { return port_; }

 private:
  StoreServer(int listen_fd, int wake_read, int wake_write, std::string host, int port,
              std::string token);
  void AcceptLoop();
  void Serve(int fd);
  bool Admit(int fd);  // the hello: protocol magic and token, with a deadline

  const int listen_fd_;
  const int wake_read_, wake_write_;  // a pipe that wakes the accept loop on shutdown
  const std::string bound_host_;
  const int port_;
  const std::string token_;

  std::mutex mu_;
  std::condition_variable changed_;  // a key was set, or the server is stopping
  std::map<std::string, std::vector<uint8_t>> data_;
  bool stopping_ = false;
  std::vector<int> connections_;  // open client sockets, shut down on stop
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

// The client: one connection, one request at a time (c10d stores are used from several
// threads: a mutex serialises them). Blocking operations (get, wait) are bounded by the
// store's timeout, or the one given; kNoTimeout waits until the key comes or the server goes.
class StoreClient : public c10d::Store {
 public:
  // Connects to host:port and presents `token`, within `timeout` (name lookup, TCP connect and
  // the hello). Fails kUnavailable naming host:port and why (refused, no answer, token refused:
  // see token_refused()). `server`, when given, is kept alive as long as this client (rank 0
  // hosts the store it uses).
  static Result<c10::intrusive_ptr<StoreClient>> Connect(const std::string& host, int port,
                                                         const std::string& token,
                                                         std::chrono::milliseconds timeout,
                                                         std::shared_ptr<StoreServer> server = nullptr);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR >= 2
  // A second connection to the same server (PyTorch 2.x process groups clone their store).
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

  const std::string& where() const { return where_; }

  // Takes a connected, admitted socket; use Connect (public for c10::make_intrusive).
  StoreClient(int fd, std::string host, int port, std::string token, std::shared_ptr<StoreServer> server);

 private:
  // Sends one request and reads the reply's status byte (and an error message), holding mu_.
  // `wait_for` bounds the operation (zero: no bound); the reply must come within it plus a
  // grace period. Throws StoreError naming `what`.
  std::string Call(const std::string& request, std::chrono::milliseconds wait_for, const std::string& what);

  int fd_;
  const std::string host_;
  const int port_;
  const std::string where_;  // "host:port"
  const std::string token_;
  const std::shared_ptr<StoreServer> server_;
  std::mutex mu_;
};

}  // namespace meshwork::dist
