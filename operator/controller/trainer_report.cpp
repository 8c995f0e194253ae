#include "operator/controller/trainer_report.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace meshwork::op {
namespace {

using Clock = std::chrono::steady_clock;

// "name value" or "name{labels} value"; the value of the first sample named `name`.
std::optional<double> Sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    size_t pos = name.size();
    if (next == '{') {
      pos = line.find('}', pos);
      if (pos == std::string::npos) continue;
      ++pos;
    }
    try {
      return std::stod(line.substr(pos));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// The value of `label` on the first sample of `name` ("" when there is none).
std::string Label(const std::string& text, const std::string& name, const std::string& label) {
  std::istringstream in(text);
  std::string line;
  const std::string key = label + "=\"";
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + "{") != 0) continue;
    const size_t end = line.find('}');
    size_t at = line.find(key, name.size());
    // A label name, not the tail of a longer one ("amesh="): preceded by '{' or ','.
    while (at != std::string::npos && at < end && line[at - 1] != '{' && line[at - 1] != ',') at = line.find(key, at + 1);
    if (at == std::string::npos || at > end) return "";
    const size_t value = at + key.size();
    const size_t close = line.find('"', value);
    return close == std::string::npos ? "" : line.substr(value, close - value);
  }
  return "";
}

}  // namespace

std::optional<TrainerReport> ParseTrainerMetrics(const std::string& text) {
  const auto step = Sample(text, "meshwork_trainer_step");
  if (!step) return std::nullopt;
  TrainerReport r;
  r.step = static_cast<int64_t>(*step);
  r.total_steps = static_cast<int64_t>(Sample(text, "meshwork_trainer_total_steps").value_or(0));
  r.loss = Sample(text, "meshwork_trainer_loss").value_or(0);
  r.tokens_per_second = Sample(text, "meshwork_trainer_tokens_per_second").value_or(0);
  r.mesh = Label(text, "meshwork_trainer_info", "mesh");
  if (auto resumed = Sample(text, "meshwork_trainer_resumed_from_step")) r.resumed_from_step = static_cast<int64_t>(*resumed);
  // 0 until the trainer has advised (dist.advise_after_steps).
  const auto fitted = Sample(text, "meshwork_trainer_plan_fitted_mfu");
  if (fitted && *fitted > 0 && *fitted <= 1) {
    r.plan_fitted_mfu = *fitted;
    r.plan_predicted_speedup = Sample(text, "meshwork_trainer_plan_predicted_speedup");
  }
  return r;
}

std::optional<FinalReport> ParseFinalLine(const std::string& log) {
  const size_t done = log.rfind("done: ");
  if (done == std::string::npos) return std::nullopt;
  const std::string line = log.substr(done, log.find('\n', done) - done);
  const size_t loss_at = line.find("| final loss ");
  const size_t tps_end = line.find(" tok/s");
  if (loss_at == std::string::npos || tps_end == std::string::npos) return std::nullopt;
  const size_t tps_start = line.rfind("| ", tps_end);
  if (tps_start == std::string::npos) return std::nullopt;
  try {
    FinalReport r;
    r.loss = std::stod(line.substr(loss_at + 13));
    r.tokens_per_second = std::stod(line.substr(tps_start + 2, tps_end - tps_start - 2));
    // "done: N steps (resumed at step R), ...": the run ended at step N + R.
    long long steps = 0, resumed = 0;
    if (std::sscanf(line.c_str(), "done: %lld steps", &steps) == 1) {
      const size_t at = line.find("(resumed at step ");
      if (at != std::string::npos) std::sscanf(line.c_str() + at, "(resumed at step %lld)", &resumed);
      r.last_step = steps + resumed;
    }
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

Result<std::string> HttpGet(const std::string& ip, int port, const std::string& path,
                            std::chrono::milliseconds timeout) {
  const std::string where = "http://" + ip + ":" + std::to_string(port) + path;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (port <= 0 || port > 65535 || ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return InvalidConfig(where + ": not an IPv4 address and port");
  }
  const auto deadline = Clock::now() + timeout;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(where + ": socket: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    return Unavailable(where + ": connect: " + std::strerror(errno));
  }
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, RemainingMs(deadline)) <= 0) return Unavailable(where + ": connect timed out");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return Unavailable(where + ": connect: " + std::strerror(err));

  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + ip + "\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    p = {fd, POLLOUT, 0};
    if (::poll(&p, 1, RemainingMs(deadline)) <= 0) return Unavailable(where + ": send timed out");
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return Unavailable(where + ": send: " + std::strerror(errno));
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[16384];
  while (true) {
    p = {fd, POLLIN, 0};
    if (::poll(&p, 1, RemainingMs(deadline)) <= 0) return Unavailable(where + ": no complete answer in time");
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return Unavailable(where + ": recv: " + std::strerror(errno));
    }
    response.append(buf, static_cast<size_t>(n));
    if (response.size() > (16u << 20)) return Unavailable(where + ": answer larger than 16 MiB");
  }
  const size_t head_end = response.find("\r\n\r\n");
  if (response.compare(0, 5, "HTTP/") != 0 || head_end == std::string::npos) {
    return Unavailable(where + ": not an HTTP answer");
  }
  const size_t sp = response.find(' ');
  const std::string code = response.substr(sp + 1, 3);
  if (code != "200") return Unavailable(where + ": HTTP " + code);
  return response.substr(head_end + 4);
}

}  // namespace meshwork::op
