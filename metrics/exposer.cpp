// MetricsServer: wraps prometheus::Exposer, turning its constructor's exceptions into a Status.
#include "metrics/exposer.h"

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <exception>
#include <utility>
#include <vector>

#if MESHWORK_HAVE_CIVETWEB_HEADERS
#include <CivetServer.h>
#endif

namespace meshwork::metrics {
namespace {

#if MESHWORK_HAVE_CIVETWEB_HEADERS
// civetweb reports why it could not bind only through its log callback, on the thread that
// starts it; the exception CivetServer then throws says just "problem binding to port".
thread_local std::string* civetweb_errors = nullptr;

int CaptureCivetwebError(const mg_connection*, const char* message) {
  if (civetweb_errors == nullptr) return 0;  // a serving thread: let civetweb log as usual
  if (!civetweb_errors->empty()) *civetweb_errors += "; ";
  *civetweb_errors += message;
  return 1;
}
#endif

std::unique_ptr<prometheus::Exposer> MakeExposer(const std::string& bind_address,
                                                 std::string* error) {
#if MESHWORK_HAVE_CIVETWEB_HEADERS
  CivetCallbacks callbacks;  // copied by civetweb, so a local is enough
  callbacks.log_message = &CaptureCivetwebError;
  civetweb_errors = error;
  struct Reset {
    ~Reset() { civetweb_errors = nullptr; }
  } reset;
  return std::make_unique<prometheus::Exposer>(bind_address, 2, &callbacks);
#else
  return std::make_unique<prometheus::Exposer>(bind_address);
#endif
}

// civetweb reads suffixes on the port ("9400s" = TLS, "9400r" = redirect) and a bare port as
// "all interfaces"; checking the shape here keeps a typo from silently meaning something else.
Status ValidateBindAddress(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidConfig("metrics bind address '" + address +
                         "' is not host:port (e.g. 0.0.0.0:9400)");
  }
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return InvalidConfig("metrics bind address '" + address + "': port '" + port +
                         "' is not a number in [0, 65535]");
  }
  return Status::Ok();
}

}  // namespace

MetricsServer::MetricsServer(std::string bind_address,
                             std::shared_ptr<prometheus::Registry> registry,
                             std::unique_ptr<prometheus::Exposer> exposer, int port)
    : bind_address_(std::move(bind_address)),
      registry_(std::move(registry)),
      exposer_(std::move(exposer)),
      port_(port) {}

MetricsServer::~MetricsServer() = default;

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind_address) {
  MW_RETURN_IF_ERROR(ValidateBindAddress(bind_address));
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string civetweb_error;
  try {
    // civetweb throws CivetException (a std::runtime_error) when it cannot bind.
    exposer = MakeExposer(bind_address, &civetweb_error);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  "cannot serve metrics on '" + bind_address + "': " +
                      (civetweb_error.empty() ? e.what() : civetweb_error) +
                      " (is the port taken or the host not a local address? metrics.port: -1 "
                      "disables the metrics server)");
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return Status(StatusCode::kUnavailable,
                  "metrics server on '" + bind_address + "' reports no listening port");
  }
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(bind_address, std::move(registry), std::move(exposer), ports.front()));
}

}  // namespace meshwork::metrics
