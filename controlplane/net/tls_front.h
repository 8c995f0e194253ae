// HTTPS for the control plane: a self-signed serving certificate kept in the data directory, and
// a TLS front on 127.0.0.1 that terminates TLS (OpenSSL) and relays each connection to the
// plain-HTTP API server on a loopback port. kubectl sends bearer tokens only over TLS, so this is
// what makes token authentication usable with kubectl.
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
  std::string cert_pem;  // also the CA a client trusts (certificate-authority-data)
  std::string key_pem;
  // Set: every client must present a certificate this CA (PEM) signed, or the handshake fails
  // (the kubelet API: only the API server, with its kubelet client certificate, gets in).
  std::string client_ca_pem;
};

// Loads <dir>/tls.crt and <dir>/tls.key, or creates them: an ECDSA P-256 self-signed
// certificate for 127.0.0.1, ::1 and localhost, valid 10 years. IOError names the file.
Result<TlsMaterial> LoadOrCreateServingCert(const std::string& dir);

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
