// A scripted HTTP/1.1 server on 127.0.0.1 for testing the client's transport: each request is
// handed to a test-supplied handler that writes whatever bytes it likes (plain or chunked
// responses, partial lines, delays, hung connections). One request per connection
// (Connection: close). Test-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace meshwork::k8s::testing {

struct FakeRequest {
  std::string method, target, path, query, body;
  std::map<std::string, std::string> headers;  // lower-case names
  // The decoded value of query parameter `name` ("" if absent).
  std::string Param(const std::string& name) const {
    std::stringstream ss(query);
    std::string kv;
    while (std::getline(ss, kv, '&')) {
      size_t eq = kv.find('=');
      if (kv.substr(0, eq) != name) continue;
      std::string v = eq == std::string::npos ? "" : kv.substr(eq + 1), out;
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '%' && i + 2 < v.size()) {
          out += static_cast<char>(std::stoi(v.substr(i + 1, 2), nullptr, 16));
          i += 2;
        } else {
          out += v[i];
        }
      }
      return out;
    }
    return "";
  }
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

class FakeConn {
 public:
  explicit FakeConn(int fd) : fd_(fd) {}
  bool Write(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  void Respond(int code, const std::string& body, const std::string& extra_headers = "",
               const std::string& content_type = "application/json") {
    Write("HTTP/1.1 " + std::to_string(code) + " X\r\nContent-Type: " + content_type +
          "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" + extra_headers +
          "\r\n" + body);
  }
  void StartChunked(int code = 200) {
    Write("HTTP/1.1 " + std::to_string(code) +
          " OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
  }
  bool Chunk(const std::string& data) {
    std::ostringstream ss;
    ss << std::hex << data.size() << "\r\n" << data << "\r\n";
    return Write(ss.str());
  }
  void EndChunked() { Write("0\r\n\r\n"); }
  // Waits until the peer closes the connection; true if it did within `timeout`.
  bool WaitPeerClosed(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        char c;
        ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
        if (p.revents & (POLLHUP | POLLERR)) return true;
      }
    }
    return false;
  }

 private:
  int fd_;
};

class FakeApiServer {
 public:
  using Handler = std::function<void(const FakeRequest&, FakeConn&)>;

  explicit FakeApiServer(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeApiServer() { Stop(); }

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  bool stopping() const { return stopping_.load(); }

  std::vector<FakeRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  void Stop() {
    if (stopping_.exchange(true)) return;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(conn_threads_);
    }
    for (auto& t : threads) t.join();
  }

 private:
  void AcceptLoop() {
    while (!stopping_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      open_fds_.push_back(fd);
      conn_threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    FakeRequest req;
    if (ReadRequest(fd, &req)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(req);
      }
      FakeConn conn(fd);
      handler_(req, conn);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
    }
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }

  static bool ReadRequest(int fd, FakeRequest* req) {
    std::string buf;
    char tmp[4096];
    size_t header_end;
    while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<size_t>(n));
    }
    std::istringstream head(buf.substr(0, header_end));
    std::string line;
    std::getline(head, line);
    std::istringstream rl(line);
    rl >> req->method >> req->target;
    size_t q = req->target.find('?');
    req->path = req->target.substr(0, q);
    req->query = q == std::string::npos ? "" : req->target.substr(q + 1);
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      req->headers[name] = value;
    }
    size_t length = req->headers.count("content-length") ? std::stoul(req->headers["content-length"]) : 0;
    req->body = buf.substr(header_end + 4);
    while (req->body.size() < length) {
      ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) return false;
      req->body.append(tmp, static_cast<size_t>(n));
    }
    return true;
  }

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  mutable std::mutex mu_;
  std::vector<int> open_fds_;
  std::vector<std::thread> conn_threads_;
  std::vector<FakeRequest> requests_;
};

}  // namespace meshwork::k8s::testing
