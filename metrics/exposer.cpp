#include "metrics/exposer.h"

#include <netdb.h>
#include <poll.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace meshwork::metrics {
namespace {

constexpr int kPollMs = 100;              // how quickly the destructor is noticed
constexpr size_t kMaxRequestBytes = 8192;  // a scrape request is a few hundred bytes
constexpr int kClientTimeoutS = 2;        // a stalled client cannot hold the server longer

struct HostPort {
  std::string host;
  std::string port;
};

Result<HostPort> ParseBindAddress(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidConfig("metrics bind address '" + address + "' is not host:port (e.g. 0.0.0.0:9400)");
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535) {
    return InvalidConfig("metrics bind address '" + address + "': port '" + port +
                         "' is not a number in [0, 65535]");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return HostPort{host, port};
}

Status Unavailable(const std::string& address, const std::string& why) {
  return Status(StatusCode::kUnavailable,
                "cannot serve metrics on '" + address + "': " + why +
                    " (is the port taken or the host not a local address? metrics.port: -1 "
                    "disables the metrics server)");
}

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the client went away; nothing to report
    sent += static_cast<size_t>(n);
  }
}

std::string Response(int status, const char* reason, const std::string& content_type,
                     const std::string& body, bool head_only) {
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  r += "Content-Type: " + content_type + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : "Error";
  }
}

}  // namespace

Status MetricsServer::AddHandler(const std::string& path, Handler handler) {
  if (path.empty() || path.front() != '/') {
    return InvalidConfig("metrics server: handler path '" + path + "' does not start with '/'");
  }
  if (path == "/metrics" || path == "/") {
    return InvalidConfig("metrics server: path '" + path + "' is served by the server itself");
  }
  if (!handler) return InvalidConfig("metrics server: no handler for path '" + path + "'");
  std::lock_guard<std::mutex> lock(handlers_mu_);
  handlers_[path] = std::move(handler);
  return Status::Ok();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind_address) {
  MW_ASSIGN_OR_RETURN(HostPort hp, ParseBindAddress(bind_address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &found); rc != 0) {
    return Unavailable(bind_address, std::string("cannot resolve host: ") + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  std::string last_error = "no usable address";
  for (addrinfo* ai = addresses.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    // SO_REUSEADDR lets a restarted trainer take its port back from TIME_WAIT; a port another
    // process is listening on still fails with EADDRINUSE.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      last_error = std::string("cannot bind: ") + std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    const int port = local.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    return std::unique_ptr<MetricsServer>(new MetricsServer(bind_address, fd, port));
  }
  return Unavailable(bind_address, last_error);
}

MetricsServer::MetricsServer(std::string bind_address, int listen_fd, int port)
    : bind_address_(std::move(bind_address)),
      registry_(std::make_shared<prometheus::Registry>()),
      listen_fd_(listen_fd),
      port_(port),
      thread_([this] { Serve(); }) {}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

void MetricsServer::Serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    HandleConnection(fd);
    ::close(fd);
  }
}

// One request per connection, answered in full, then closed: all a Prometheus scrape needs.
void MetricsServer::HandleConnection(int fd) {
  timeval timeout{kClientTimeoutS, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buffer[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  const auto line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (line_end == std::string::npos || sp2 == std::string::npos) {
    SendAll(fd, Response(400, "Bad Request", "text/plain", "malformed request\n", false));
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    SendAll(fd, Response(405, "Method Not Allowed", "text/plain", "use GET\n", false));
    return;
  }
  if (path == "/metrics") {
    const std::string body = prometheus::TextSerializer().Serialize(registry_->Collect());
    SendAll(fd, Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, head));
    return;
  }
  Handler handler;
  std::string paths;
  {
    std::lock_guard<std::mutex> lock(handlers_mu_);
    auto it = handlers_.find(path);
    if (it != handlers_.end()) handler = it->second;
    for (const auto& entry : handlers_) paths += ", " + entry.first;
  }
  if (handler) {
    std::pair<int, std::string> answer;
    try {
      answer = handler();
    } catch (const std::exception& e) {
      answer = {500, std::string("handler failed: ") + e.what() + "\n"};
    } catch (...) {
      answer = {500, "handler failed\n"};
    }
    SendAll(fd, Response(answer.first, ReasonPhrase(answer.first), "text/plain; charset=utf-8", answer.second, head));
  } else if (path == "/") {
    SendAll(fd, Response(200, "OK", "text/plain", "Meshwork metrics: /metrics" + paths + "\n", head));
  } else {
    SendAll(fd, Response(404, "Not Found", "text/plain", "not found; try /metrics\n", head));
  }
}

}  // namespace meshwork::metrics
