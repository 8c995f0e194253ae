// HTTPS for the node agent's kubelet API: a TLS front on 127.0.0.1 that terminates TLS (OpenSSL)
// with the certificate meshwork-cluster made, checks the client's certificate against the
// cluster CA, and relays each connection to the plain-HTTP server on a loopback port.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace meshwork::controlplane {

struct TlsMaterial {
  std::string cert_pem;  // the serving certificate (PEM)
  std::string key_pem;
  // Set: every client must present a certificate this CA (PEM) signed, or the handshake fails
  // (the kubelet API: only the API server, with its kubelet client certificate, gets in).
  std::string client_ca_pem;
};

class TlsFront {
 public:
  // Listens on 127.0.0.1:port (0: the kernel picks) and relays to 127.0.0.1:backend_port.
  static Result<std::unique_ptr<TlsFront>> Start(int port, const TlsMaterial& material, int backend_port);
  ~TlsFront();
  int port() const { return port_; }
  // Closes the listener and every relayed connection, waits for their threads. Idempotent.
  void Stop();

  struct Impl;

 private:
  TlsFront() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace meshwork::controlplane
