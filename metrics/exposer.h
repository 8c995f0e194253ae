// The process's Prometheus endpoint: one shared prometheus::Registry served at /metrics in the
// text exposition format. Components register their metrics in registry(); nothing else is global.
//
// Why not prometheus::Exposer: prometheus-cpp's pull exposer runs civetweb, whose threads are
// created with a fixed 100 KiB stack. glibc refuses (EINVAL) to start a thread whose stack cannot
// hold the process's static TLS, and a process that loads libtorch with OpenBLAS already carries
// more than that (OpenBLAS 60 KiB, glog 30 KiB, libtorch 10 KiB, ...), so civetweb cannot start
// inside the trainer at all. This server is a single thread with a normal stack; the metric
// types, the registry and the text serialisation are still prometheus-cpp's.
//
// Other paths can be added (AddHandler): the operator serves /healthz and /readyz on the same
// port. The trainer adds none, and its server answers as it always has.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/status.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace meshwork::metrics {

class MetricsServer {
 public:
  // Listens on `bind_address`, "host:port" ("0.0.0.0:9400", "127.0.0.1:0", "[::1]:9400"; port 0
  // picks a free port, read it back with port()). A malformed address (no port, port not a
  // number in [0, 65535]) is kInvalidConfig; one that cannot be bound (port in use, host not
  // local, name that does not resolve) is kUnavailable. Both messages name the address.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& bind_address);

  // Stops serving and closes the socket; returns within one poll interval (100 ms).
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port actually listened on (differs from the requested one when that was 0).
  int port() const { return port_; }
  const std::string& bind_address() const { return bind_address_; }
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Answers a GET (or HEAD) of a path: HTTP status code and a text/plain body.
  using Handler = std::function<std::pair<int, std::string>()>;
  // Serves `path` (matched exactly; the query string is ignored) with `handler`, from now on.
  // Handlers run on the server's single thread, one request at a time: keep them quick, since a
  // slow one delays scrapes. A handler that throws answers 500. Adding a path again replaces
  // its handler. InvalidConfig for a path that does not start with '/', and for "/metrics" and
  // "/", which the server keeps.
  Status AddHandler(const std::string& path, Handler handler);

 private:
  MetricsServer(std::string bind_address, int listen_fd, int port);
  void Serve();
  void HandleConnection(int fd);

  std::string bind_address_;
  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_;
  int port_;
  std::atomic<bool> stopping_{false};
  std::mutex handlers_mu_;
  std::map<std::string, Handler> handlers_;
  std::thread thread_;  // last: started after everything it reads exists
};

}  // namespace meshwork::metrics
