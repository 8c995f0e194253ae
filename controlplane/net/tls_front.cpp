// The TLS-terminating relay (see tls_front.h).
#include "controlplane/net/tls_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace meshwork::controlplane {
namespace {

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

struct TlsFront::Impl {
  SSL_CTX* ctx = nullptr;
  int listen_fd = -1;
  int backend_port = 0;
  std::atomic<bool> stop{false};
  std::thread acceptor;
  std::mutex mu;
  struct Conn {
    std::atomic<bool> done{false};
    std::thread thread;
  };
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<int> open_fds;

  void Relay(int client_fd);
  void Track(int fd, bool add) {
    std::lock_guard<std::mutex> lock(mu);
    if (add) {
      open_fds.push_back(fd);
    } else {
      open_fds.erase(std::remove(open_fds.begin(), open_fds.end(), fd), open_fds.end());
    }
  }
};

void TlsFront::Impl::Relay(int client_fd) {
  timeval tv{15, 0};
  setsockopt(client_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, client_fd);
  int backend = -1;
  if (SSL_accept(ssl) == 1) {
    timeval none{0, 0};
    setsockopt(client_fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
    backend = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(backend_port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(backend, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (backend >= 0 && ::connect(backend, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      Track(backend, true);
      char buf[16384];
      while (!stop) {
        if (SSL_pending(ssl) == 0) {
          pollfd fds[2] = {{client_fd, POLLIN, 0}, {backend, POLLIN, 0}};
          int r = ::poll(fds, 2, 500);
          if (r < 0 && errno != EINTR) break;
          if (r <= 0) continue;
          if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = ::recv(backend, buf, sizeof(buf), 0);
            if (n <= 0) break;
            if (SSL_write(ssl, buf, static_cast<int>(n)) <= 0) break;
          }
          if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        }
        int n = SSL_read(ssl, buf, sizeof(buf));
        if (n <= 0) {
          int err = SSL_get_error(ssl, n);
          if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) continue;
          break;
        }
        if (!WriteAll(backend, buf, static_cast<size_t>(n))) break;
      }
      Track(backend, false);
    }
    if (backend >= 0) ::close(backend);
    SSL_shutdown(ssl);
  }
  SSL_free(ssl);
  Track(client_fd, false);
  ::close(client_fd);
}

Result<std::unique_ptr<TlsFront>> TlsFront::Start(int port, const TlsMaterial& material, int backend_port) {
  auto impl = std::make_unique<Impl>();
  impl->backend_port = backend_port;
  impl->ctx = SSL_CTX_new(TLS_server_method());
  if (impl->ctx == nullptr) return Internal("SSL_CTX_new: " + OpenSslError());
  SSL_CTX_set_min_proto_version(impl->ctx, TLS1_2_VERSION);
  BIO* b = BIO_new_mem_buf(material.cert_pem.data(), static_cast<int>(material.cert_pem.size()));
  X509* cert = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  b = BIO_new_mem_buf(material.key_pem.data(), static_cast<int>(material.key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  if (cert == nullptr || key == nullptr || SSL_CTX_use_certificate(impl->ctx, cert) != 1 ||
      SSL_CTX_use_PrivateKey(impl->ctx, key) != 1) {
    X509_free(cert);
    EVP_PKEY_free(key);
    SSL_CTX_free(impl->ctx);
    return InvalidConfig("the serving certificate or key is unusable: " + OpenSslError());
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  if (!material.client_ca_pem.empty()) {
    BIO* ca_bio = BIO_new_mem_buf(material.client_ca_pem.data(), static_cast<int>(material.client_ca_pem.size()));
    X509* ca = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr);
    BIO_free(ca_bio);
    X509_STORE* trusted = SSL_CTX_get_cert_store(impl->ctx);
    if (ca == nullptr || X509_STORE_add_cert(trusted, ca) != 1) {
      X509_free(ca);
      SSL_CTX_free(impl->ctx);
      return InvalidConfig("the client CA certificate is unusable: " + OpenSslError());
    }
    X509_free(ca);
    SSL_CTX_set_verify(impl->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  impl->listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(impl->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(impl->listen_fd, 128) != 0) {
    std::string why = std::strerror(errno);
    ::close(impl->listen_fd);
    SSL_CTX_free(impl->ctx);
    return Unavailable("cannot listen on 127.0.0.1:" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof(addr);
  getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<TlsFront> front(new TlsFront());
  front->port_ = ntohs(addr.sin_port);
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] {
    while (!raw->stop) {
      pollfd p{raw->listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      int fd = ::accept(raw->listen_fd, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(raw->mu);
      // Join finished relays so the list stays as long as the open connections.
      for (auto it = raw->conns.begin(); it != raw->conns.end();) {
        if ((*it)->done) {
          (*it)->thread.join();
          it = raw->conns.erase(it);
        } else {
          ++it;
        }
      }
      raw->open_fds.push_back(fd);
      auto conn = std::make_unique<Impl::Conn>();
      Impl::Conn* c = conn.get();
      conn->thread = std::thread([raw, fd, c] {
        raw->Relay(fd);
        c->done = true;
      });
      raw->conns.push_back(std::move(conn));
    }
  });
  front->impl_ = std::move(impl);
  return front;
}

void TlsFront::Stop() {
  if (!impl_ || impl_->stop.exchange(true)) return;
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  ::close(impl_->listen_fd);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (int fd : impl_->open_fds) ::shutdown(fd, SHUT_RDWR);
  }
  std::vector<std::unique_ptr<Impl::Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    conns.swap(impl_->conns);
  }
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
  }
  SSL_CTX_free(impl_->ctx);
}

TlsFront::~TlsFront() { Stop(); }

}  // namespace meshwork::controlplane
