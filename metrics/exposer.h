// The process's Prometheus endpoint: one civetweb-backed prometheus::Exposer serving one shared
// Registry at /metrics. Components register their metrics in registry(); nothing else is global.
#pragma once

#include <memory>
#include <string>

#include "trainer/common/status.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace meshwork::metrics {

class MetricsServer {
 public:
  // Listens on `bind_address`, "host:port" ("0.0.0.0:9400", "127.0.0.1:0"; port 0 picks a free
  // port, read it back with port()). A malformed address (no port, port not a number in
  // [0, 65535]) is kInvalidConfig; one that cannot be bound (port in use, host not local) is
  // kUnavailable. Both messages name the address.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& bind_address);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port actually listened on (differs from the requested one when that was 0).
  int port() const { return port_; }
  const std::string& bind_address() const { return bind_address_; }
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  MetricsServer(std::string bind_address, std::shared_ptr<prometheus::Registry> registry,
                std::unique_ptr<prometheus::Exposer> exposer, int port);

  std::string bind_address_;
  // Declared before exposer_ so the server stops before the registry it reads goes away.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace meshwork::metrics
