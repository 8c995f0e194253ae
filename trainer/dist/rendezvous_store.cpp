// The rendezvous store's wire protocol, server and client.
//
// Every message is framed. A client opens with a hello, "MWRS" + u32 length + token; the server
// answers with a reply. A request is one op byte + u32 field count + fields (u32 length +
// bytes); integers travel as decimal text. A reply is a status byte + u32 length + payload:
// kOk (the result), kTimedOut, kError (a message) or kRefused (the token did not match; the
// server then closes the connection). Lengths are big-endian.
#include "trainer/dist/rendezvous_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

namespace meshwork::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kMagic[4] = {'M', 'W', 'R', 'S'};
constexpr uint32_t kMaxTokenBytes = 4096;     // before the token is checked, read little
constexpr uint32_t kMaxFields = 1u << 20;
constexpr uint32_t kMaxFieldBytes = 1u << 30;
// A hello must arrive this soon after connecting: a port scanner holds no thread for long.
constexpr milliseconds kHelloDeadline(10000);
// A blocking operation's reply may trail its bound by this much (the server's wake-up, the wire).
constexpr milliseconds kReplyGrace(10000);

enum Op : char {
  kSet = 'S', kGet = 'G', kAdd = 'A', kCompareSet = 'C', kDelete = 'D', kCheck = 'K',
  kNumKeys = 'N', kWait = 'W',
};
enum Reply : uint8_t { kOk = 0, kTimedOut = 1, kError = 2, kRefused = 3 };

std::string Errno(int err) { return std::strerror(err); }

void PutU32(std::string* out, uint32_t v) {
  const uint32_t be = htonl(v);
  out->append(reinterpret_cast<const char*>(&be), 4);
}

void PutField(std::string* out, const void* data, size_t size) {
  PutU32(out, static_cast<uint32_t>(size));
  out->append(static_cast<const char*>(data), size);
}
void PutField(std::string* out, const std::string& s) { PutField(out, s.data(), s.size()); }
void PutField(std::string* out, const std::vector<uint8_t>& v) { PutField(out, v.data(), v.size()); }

std::string Request(Op op, const std::vector<std::string>& fields) {
  std::string out(1, static_cast<char>(op));
  PutU32(&out, static_cast<uint32_t>(fields.size()));
  for (const std::string& f : fields) PutField(&out, f);
  return out;
}

std::string Framed(Reply status, const std::string& payload) {
  std::string out(1, static_cast<char>(status));
  PutField(&out, payload);
  return out;
}

// Sends all of `data`; false when the peer is gone.
bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `size` bytes. With a deadline, waits for each piece at most until then.
// Returns "" on success, else what went wrong ("closed", "timed out", the OS error).
std::string RecvAll(int fd, void* buf, size_t size, std::optional<Clock::time_point> deadline) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < size) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return "timed out";
      pollfd pfd{fd, POLLIN, 0};
      int rc = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return Errno(errno);
      if (rc == 0) return "timed out";
    }
    ssize_t n = ::recv(fd, p + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "timed out";
    if (n < 0) return Errno(errno);
    if (n == 0) return "closed";
    got += static_cast<size_t>(n);
  }
  return "";
}

std::string RecvU32(int fd, uint32_t* v, std::optional<Clock::time_point> deadline) {
  uint32_t be = 0;
  std::string err = RecvAll(fd, &be, 4, deadline);
  *v = ntohl(be);
  return err;
}

std::string RecvField(int fd, uint32_t limit, std::string* out, std::optional<Clock::time_point> deadline) {
  uint32_t size = 0;
  std::string err = RecvU32(fd, &size, deadline);
  if (!err.empty()) return err;
  if (size > limit) return "a field of " + std::to_string(size) + " bytes (more than " + std::to_string(limit) + ")";
  out->resize(size);
  return size == 0 ? "" : RecvAll(fd, out->data(), size, deadline);
}

// Compares without an early exit, so the time taken does not say how much of a token matched.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::optional<int64_t> ParseInt64(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

std::string ToString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> ToBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string NumericHost(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST];
  if (::getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return host;
}

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

std::string Seconds(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

// ---- Server ------------------------------------------------------------------------------

Result<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port, std::string token) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) return Unavailable("rendezvous store: cannot resolve the address to bind, " + where + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, ::freeaddrinfo);

  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = Errno(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      last_error = Errno(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int bound_port = bound.ss_family == AF_INET6
                               ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC) != 0) {
      last_error = Errno(errno);
      ::close(fd);
      continue;
    }
    return std::unique_ptr<StoreServer>(new StoreServer(
        fd, wake[0], wake[1], NumericHost(reinterpret_cast<sockaddr*>(&bound), len), bound_port, std::move(token)));
  }
  return Unavailable("rendezvous store: cannot listen on " + where + ": " + last_error);
}

StoreServer::StoreServer(int listen_fd, int wake_read, int wake_write, std::string host, int port, std::string token)
    : listen_fd_(listen_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      bound_host_(std::move(host)),
      port_(port),
      token_(std::move(token)) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

StoreServer::~StoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    // Connection threads blocked in recv() return at once; those waiting for keys wake below.
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
  }
  changed_.notify_all();
  const char byte = 0;
  (void)!::write(wake_write_, &byte, 1);
  acceptor_.join();
  // The acceptor has stopped, so threads_ no longer grows.
  for (std::thread& t : threads_) t.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void StoreServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 || (fds[1].revents & POLLIN) != 0) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up already, or out of descriptors for a moment
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    connections_.push_back(fd);
    threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

namespace {

// Answers a client that will not be served, then lets it read the answer: closing a socket
// with unread input resets the connection, and the client could lose the reply.
void Goodbye(int fd, Reply status, const std::string& message) {
  SendAll(fd, Framed(status, message));
  ::shutdown(fd, SHUT_WR);
  const Clock::time_point deadline = Clock::now() + milliseconds(1000);
  char sink[4096];
  size_t drained = 0;
  while (drained < (1u << 20) && RecvAll(fd, sink, 1, deadline).empty()) {
    ++drained;
    ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0) drained += static_cast<size_t>(n);
  }
}

}  // namespace

bool StoreServer::Admit(int fd) {
  const Clock::time_point deadline = Clock::now() + kHelloDeadline;
  char magic[4];
  if (!RecvAll(fd, magic, sizeof(magic), deadline).empty()) return false;
  if (std::memcmp(magic, kMagic, sizeof(magic)) != 0) {
    Goodbye(fd, kError, "not a Meshwork rendezvous client (no MWRS hello)");
    return false;
  }
  std::string token;
  if (!RecvField(fd, kMaxTokenBytes, &token, deadline).empty()) return false;
  if (!SameToken(token, token_)) {
    Goodbye(fd, kRefused, "the token does not match this job's");
    return false;
  }
  return SendAll(fd, Framed(kOk, ""));
}

void StoreServer::Serve(int fd) {
  // Keys whose values are set, under mu_.
  auto have_all = [this](const std::vector<std::string>& keys) {
    return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) { return data_.count(k) > 0; });
  };
  // Waits until every key is set, the bound passes (false) or the server stops (nullopt).
  auto wait_for = [&](std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                      int64_t timeout_ms) -> std::optional<bool> {
    auto ready = [&] { return stopping_ || have_all(keys); };
    if (timeout_ms <= 0) {
      changed_.wait(lock, ready);
    } else if (!changed_.wait_for(lock, milliseconds(timeout_ms), ready)) {
      return false;
    }
    if (stopping_) return std::nullopt;
    return true;
  };

  if (Admit(fd)) {
    while (true) {
      char op = 0;
      uint32_t count = 0;
      if (!RecvAll(fd, &op, 1, std::nullopt).empty() || !RecvU32(fd, &count, std::nullopt).empty() ||
          count > kMaxFields) {
        break;
      }
      std::vector<std::string> f(count);
      bool ok = true;
      for (std::string& field : f) ok = ok && RecvField(fd, kMaxFieldBytes, &field, std::nullopt).empty();
      if (!ok) break;

      std::string reply;
      auto need = [&](size_t n) {
        if (f.size() >= n) return true;
        reply = Framed(kError, std::string("malformed request '") + op + "': " + std::to_string(f.size()) + " fields");
        return false;
      };
      std::unique_lock<std::mutex> lock(mu_);
      switch (op) {
        case kSet:
          if (!need(2)) break;
          data_[f[0]] = ToBytes(f[1]);
          changed_.notify_all();
          reply = Framed(kOk, "");
          break;
        case kGet: {
          if (!need(2)) break;
          std::optional<bool> got = wait_for(lock, {f[0]}, ParseInt64(f[1]).value_or(0));
          if (!got) break;
          reply = *got ? Framed(kOk, ToString(data_[f[0]])) : Framed(kTimedOut, "");
          break;
        }
        case kAdd: {
          if (!need(2)) break;
          std::optional<int64_t> delta = ParseInt64(f[1]);
          auto it = data_.find(f[0]);
          std::optional<int64_t> now = it == data_.end() ? std::optional<int64_t>(0) : ParseInt64(ToString(it->second));
          if (!delta || !now) {
            reply = Framed(kError, "key '" + f[0] + "' does not hold an integer");
            break;
          }
          const int64_t sum = *now + *delta;
          data_[f[0]] = ToBytes(std::to_string(sum));
          changed_.notify_all();
          reply = Framed(kOk, std::to_string(sum));
          break;
        }
        case kCompareSet: {
          if (!need(3)) break;
          // c10d's semantics: a missing key with an empty expected value is set; a key that
          // holds the expected value is replaced; the reply is the value the key holds after.
          auto it = data_.find(f[0]);
          if (it == data_.end()) {
            if (f[1].empty()) {
              data_[f[0]] = ToBytes(f[2]);
              changed_.notify_all();
              reply = Framed(kOk, f[2]);
            } else {
              reply = Framed(kOk, f[1]);
            }
          } else if (ToString(it->second) == f[1]) {
            it->second = ToBytes(f[2]);
            changed_.notify_all();
            reply = Framed(kOk, f[2]);
          } else {
            reply = Framed(kOk, ToString(it->second));
          }
          break;
        }
        case kDelete:
          if (!need(1)) break;
          reply = Framed(kOk, data_.erase(f[0]) > 0 ? "1" : "0");
          break;
        case kCheck:
          reply = Framed(kOk, have_all(f) ? "1" : "0");
          break;
        case kNumKeys:
          reply = Framed(kOk, std::to_string(data_.size()));
          break;
        case kWait: {
          if (!need(1)) break;
          const std::vector<std::string> keys(f.begin() + 1, f.end());
          std::optional<bool> got = wait_for(lock, keys, ParseInt64(f[0]).value_or(0));
          if (!got) break;
          reply = Framed(*got ? kOk : kTimedOut, "");
          break;
        }
        default:
          reply = Framed(kError, std::string("unknown operation '") + op + "'");
      }
      lock.unlock();
      if (reply.empty() || !SendAll(fd, reply)) break;  // stopping, or the client is gone
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), fd), connections_.end());
  ::close(fd);
}

// ---- Client ------------------------------------------------------------------------------

namespace {

// Connects to one address within `deadline`; returns the socket or -1 with `error` set.
int ConnectOne(const addrinfo* ai, Clock::time_point deadline, std::string* error) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    *error = Errno(errno);
    return -1;
  }
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd pfd{fd, POLLOUT, 0};
    rc = ::poll(&pfd, 1, static_cast<int>(std::max<long long>(left, 1)));
    if (rc == 0) {
      *error = "no answer (connect timed out)";
      ::close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    *error = Errno(errno);
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Reads a reply: status and payload. Returns "" or what went wrong.
std::string RecvReply(int fd, uint8_t* status, std::string* payload, std::optional<Clock::time_point> deadline) {
  std::string err = RecvAll(fd, status, 1, deadline);
  if (err.empty()) err = RecvField(fd, kMaxFieldBytes, payload, deadline);
  return err;
}

}  // namespace

Result<c10::intrusive_ptr<StoreClient>> StoreClient::Connect(const std::string& host, int port,
                                                             const std::string& token, milliseconds timeout,
                                                             std::shared_ptr<StoreServer> server) {
  const std::string where = host + ":" + std::to_string(port);
  const Clock::time_point deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) return Unavailable("cannot resolve host: " + std::string(::gai_strerror(rc)));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, ::freeaddrinfo);

  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ConnectOne(ai, deadline, &error);
    if (fd < 0) continue;
    std::string hello(kMagic, sizeof(kMagic));
    PutField(&hello, token);
    uint8_t status = 0;
    std::string payload;
    std::string err = SendAll(fd, hello) ? RecvReply(fd, &status, &payload, deadline) : "closed";
    if (!err.empty()) {
      error = "the hello got no reply (" + err + ")";
      ::close(fd);
      continue;
    }
    if (status == kRefused) {
      ::close(fd);
      return Unavailable("the store at " + where + " refused this rank's token (MESHWORK_RENDEZVOUS_TOKEN): " +
                         payload + "; is another job's rank 0 at that address, or is the token from another job?");
    }
    if (status != kOk) {
      ::close(fd);
      error = "not a Meshwork rendezvous store: " + payload;
      continue;
    }
    return c10::intrusive_ptr<StoreClient>(c10::make_intrusive<StoreClient>(fd, host, port, token, std::move(server)));
  }
  return Unavailable(error);
}

StoreClient::StoreClient(int fd, std::string host, int port, std::string token, std::shared_ptr<StoreServer> server)
    : fd_(fd),
      host_(std::move(host)),
      port_(port),
      where_(host_ + ":" + std::to_string(port)),
      token_(std::move(token)),
      server_(std::move(server)) {}

StoreClient::~StoreClient() { ::close(fd_); }

std::string StoreClient::Call(const std::string& request, milliseconds wait_for, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string prefix = "rendezvous store at " + where_ + ": " + what + ": ";
  if (!SendAll(fd_, request)) throw StoreError(prefix + "the server closed the connection (rank 0 gone?)");
  std::optional<Clock::time_point> deadline;
  if (wait_for > milliseconds(0)) deadline = Clock::now() + wait_for + kReplyGrace;
  uint8_t status = 0;
  std::string payload;
  std::string err = RecvReply(fd_, &status, &payload, deadline);
  if (err == "closed") throw StoreError(prefix + "the server closed the connection (rank 0 gone?)");
  if (!err.empty()) throw StoreError(prefix + err);
  if (status == kTimedOut) throw StoreError(prefix + "timed out after " + Seconds(wait_for));
  if (status != kOk) throw StoreError(prefix + payload);
  return payload;
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  Call(Request(kSet, {key, ToString(value)}), timeout_, "set '" + key + "'");
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return ToBytes(Call(Request(kCompareSet, {key, ToString(expected), ToString(desired)}), timeout_,
                      "compareSet '" + key + "'"));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  const milliseconds timeout = timeout_;
  return ToBytes(Call(Request(kGet, {key, std::to_string(timeout.count())}), timeout, "get '" + key + "'"));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  const std::string reply = Call(Request(kAdd, {key, std::to_string(value)}), timeout_, "add '" + key + "'");
  std::optional<int64_t> sum = ParseInt64(reply);
  if (!sum) throw StoreError("rendezvous store at " + where_ + ": add '" + key + "': the reply '" + reply + "' is not an integer");
  return *sum;
}

bool StoreClient::deleteKey(const std::string& key) {
  return Call(Request(kDelete, {key}), timeout_, "deleteKey '" + key + "'") == "1";
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return Call(Request(kCheck, keys), timeout_, "check " + JoinKeys(keys)) == "1";
}

int64_t StoreClient::getNumKeys() {
  return ParseInt64(Call(Request(kNumKeys, {}), timeout_, "getNumKeys")).value_or(-1);
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  std::vector<std::string> fields{std::to_string(timeout.count())};
  fields.insert(fields.end(), keys.begin(), keys.end());
  Call(Request(kWait, fields), timeout, "wait for " + JoinKeys(keys));
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  auto client = Connect(host_, port_, token_, std::max(timeout_, milliseconds(1000)), server_);
  if (!client.ok()) throw StoreError("rendezvous store at " + where_ + ": clone: " + client.status().message());
  (*client)->setTimeout(timeout_);
  return *client;
}
#endif

}  // namespace meshwork::dist
