// The control plane's HTTP/1.1 server (see http_server.h): an accept thread, one thread per
// connection (bounded by max_connections), requests parsed by hand with every limit checked
// before the bytes are buffered. Stop() shuts every socket down so blocked reads, writes and
// streams return at once.
#include "controlplane/net/http_server.h"

#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <iostream>
#include <mutex>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace meshwork::controlplane {

// ---- small helpers ------------------------------------------------------------------------

std::string StatusJson(int code, const std::string& reason, const std::string& message) {
  nlohmann::json j = {{"kind", "Status"},           {"apiVersion", "v1"},
                      {"metadata", nlohmann::json::object()},
                      {"status", "Failure"},        {"message", message},
                      {"reason", reason},           {"code", code}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const char* HttpReasonPhrase(int code) {
  switch (code) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

std::string Lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// True when the comma-separated header value holds `token` (case-insensitive).
bool HasToken(const std::string& value, const std::string& token) {
  size_t start = 0;
  std::string v = Lower(value);
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    if (Trim(v.substr(start, comma - start)) == token) return true;
    start = comma + 1;
  }
  return false;
}

std::string HttpDate() {
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

bool SendAll(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // EPIPE, ECONNRESET, EAGAIN after SO_SNDTIMEO, shut down by Stop()
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// An error answered with a Status body, after which the connection is closed.
struct RequestError {
  int code;
  std::string reason;
  std::string message;
};

}  // namespace

bool PercentDecode(std::string_view in, std::string* out, bool plus_is_space) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      int hi = HexValue(in[i + 1]);
      int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

std::string HttpRequest::Query(const std::string& name, const std::string& fallback) const {
  for (const auto& [k, v] : query)
    if (k == name) return v;
  return fallback;
}

bool HttpRequest::HasQuery(const std::string& name) const {
  for (const auto& kv : query)
    if (kv.first == name) return true;
  return false;
}

std::string HttpRequest::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

// ---- the server ---------------------------------------------------------------------------

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)), handler_(std::move(handler)) {}
  ~Impl() { Stop(); }

  Status Listen();
  void Stop();
  void Log(const std::string& message) const {
    if (options_.log) {
      options_.log(message);
    } else {
      std::cerr << "[meshwork-http] " << message << std::endl;
    }
  }

  bool stopping() const { return stopping_.load(); }

  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;

 private:
  struct Connection {
    int fd;
    std::thread thread;
  };

  void AcceptLoop();
  void ReapFinished();
  void Serve(uint64_t id, int fd, std::string remote);

  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::mutex stop_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::vector<std::thread> finished_;
  uint64_t next_id_ = 1;

  friend class HttpServer;
  friend class ConnectionIO;
};

// Reads, parses and answers requests on one connection.
class ConnectionIO {
 public:
  ConnectionIO(HttpServer::Impl* server, int fd, std::string remote)
      : server_(server), opts_(server->options_), fd_(fd), remote_(std::move(remote)) {}

  void Run();

 private:
  enum class Got { kOk, kEof, kTimeout, kError };

  Got Fill();
  // Reads one line (without its CR LF) into *line; at most `limit` bytes.
  std::optional<RequestError> ReadLine(std::string* line, size_t limit, int too_long_code, bool* closed);
  std::optional<RequestError> ReadExactly(size_t n, std::string* out, bool* closed);
  // kOk with *req filled; *closed when the peer left (nothing to answer).
  std::optional<RequestError> ReadRequest(HttpRequest* req, bool* closed);
  std::optional<RequestError> ParseTarget(const std::string& target, HttpRequest* req);
  std::optional<RequestError> ReadBody(HttpRequest* req, bool* closed);
  bool SendResponse(const HttpRequest& req, HttpResponse& resp, bool keep_alive);
  void SendError(const RequestError& e, const std::string& method);
  // After an error answer: half-close and discard what the client is still sending (bounded),
  // so closing with unread bytes does not reset the connection before the client reads it.
  void LingerAndDrain();

  HttpServer::Impl* server_;
  const HttpServerOptions& opts_;
  int fd_;
  std::string remote_;
  std::string buf_;
  size_t pos_ = 0;  // parse position in buf_ (Fill() may compact buf_ and move it)
  size_t last_line_bytes_ = 0;  // what the last ReadLine consumed, terminator included
  bool started_ = false;  // bytes of the current request have arrived
  std::string version_ = "HTTP/1.1";
};

class ChunkedStream : public ResponseStream {
 public:
  ChunkedStream(HttpServer::Impl* server, int fd, bool chunked) : server_(server), fd_(fd), chunked_(chunked) {}
  bool Write(std::string_view chunk) override {
    if (broken_ || server_->stopping()) return false;
    if (chunk.empty()) return Open();
    std::string framed;
    if (chunked_) {
      char head[32];
      std::snprintf(head, sizeof(head), "%zx\r\n", chunk.size());
      framed.reserve(chunk.size() + 40);
      framed.append(head);
      framed.append(chunk.data(), chunk.size());
      framed.append("\r\n");
    } else {
      framed.assign(chunk.data(), chunk.size());
    }
    if (!SendAll(fd_, framed)) broken_ = true;
    return !broken_;
  }
  bool Open() const override {
    if (broken_ || server_->stopping()) return false;
    pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
    int r = ::poll(&p, 1, 0);
    if (r < 0) return errno == EINTR;
    if (r == 0) return true;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return false;
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
  }
  bool Finish() {
    if (broken_ || server_->stopping()) return false;
    if (!chunked_) return true;
    if (!SendAll(fd_, "0\r\n\r\n")) broken_ = true;
    return !broken_;
  }
  bool broken() const { return broken_; }

 private:
  HttpServer::Impl* server_;
  int fd_;
  bool chunked_;
  bool broken_ = false;
};

ConnectionIO::Got ConnectionIO::Fill() {
  while (true) {
    if (server_->stopping()) return Got::kError;
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, opts_.idle_timeout_seconds * 1000);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Got::kError;
    }
    if (r == 0) return Got::kTimeout;
    char tmp[16384];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Got::kError;
    }
    if (n == 0) return Got::kEof;
    // Compact what has been consumed before growing.
    if (pos_ > 0 && pos_ >= buf_.size() / 2) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    started_ = true;
    return Got::kOk;
  }
}

std::optional<RequestError> ConnectionIO::ReadLine(std::string* line, size_t limit, int too_long_code,
                                                   bool* closed) {
  size_t scanned = 0;  // bytes after pos_ already searched; relative, as Fill() may compact buf_
  while (true) {
    size_t nl = buf_.find('\n', pos_ + scanned);
    if (nl != std::string::npos) {
      if (nl - pos_ > limit) break;
      size_t end = nl;
      if (end > pos_ && buf_[end - 1] == '\r') --end;
      line->assign(buf_, pos_, end - pos_);
      last_line_bytes_ = nl + 1 - pos_;
      pos_ = nl + 1;
      return std::nullopt;
    }
    scanned = buf_.size() - pos_;
    if (scanned > limit) break;
    Got g = Fill();
    if (g == Got::kTimeout && started_) {
      return RequestError{408, "Timeout", "the request was not completed within " +
                                              std::to_string(opts_.idle_timeout_seconds) + "s"};
    }
    if (g != Got::kOk) {
      *closed = true;
      return std::nullopt;
    }
  }
  if (too_long_code == 431) {
    return RequestError{431, "RequestHeaderFieldsTooLarge",
                        "the request line and headers exceed " + std::to_string(opts_.max_header_bytes) +
                            " bytes (max_header_bytes)"};
  }
  return RequestError{too_long_code, "BadRequest", "a line of the request is longer than " +
                                                       std::to_string(limit) + " bytes"};
}

std::optional<RequestError> ConnectionIO::ReadExactly(size_t n, std::string* out, bool* closed) {
  while (buf_.size() - pos_ < n) {
    Got g = Fill();
    if (g == Got::kTimeout) {
      return RequestError{408, "Timeout", "the request body was not completed within " +
                                              std::to_string(opts_.idle_timeout_seconds) + "s"};
    }
    if (g != Got::kOk) {
      *closed = true;
      return std::nullopt;
    }
  }
  out->append(buf_, pos_, n);
  pos_ += n;
  return std::nullopt;
}

std::optional<RequestError> ConnectionIO::ParseTarget(const std::string& raw, HttpRequest* req) {
  std::string target = raw;
  // Absolute form (a proxy style request): drop scheme and authority.
  for (const char* scheme : {"http://", "https://"}) {
    if (target.rfind(scheme, 0) == 0) {
      size_t slash = target.find('/', std::strlen(scheme));
      target = slash == std::string::npos ? "/" : target.substr(slash);
    }
  }
  if (target.empty() || target[0] != '/') {
    return RequestError{400, "BadRequest", "the request target \"" + raw + "\" does not start with '/'"};
  }
  size_t q = target.find('?');
  std::string path_part = target.substr(0, q);
  size_t hash = path_part.find('#');
  if (hash != std::string::npos) path_part.resize(hash);
  if (!PercentDecode(path_part, &req->path, false) || req->path.find('\0') != std::string::npos) {
    return RequestError{400, "BadRequest", "the request path \"" + path_part + "\" has a malformed percent escape"};
  }
  if (q == std::string::npos) return std::nullopt;
  std::string query = target.substr(q + 1);
  size_t qh = query.find('#');
  if (qh != std::string::npos) query.resize(qh);
  size_t start = 0;
  while (start <= query.size()) {
    size_t amp = query.find('&', start);
    if (amp == std::string::npos) amp = query.size();
    std::string part = query.substr(start, amp - start);
    if (!part.empty()) {
      size_t eq = part.find('=');
      std::string k, v;
      bool ok = PercentDecode(part.substr(0, eq), &k, true);
      if (ok && eq != std::string::npos) ok = PercentDecode(part.substr(eq + 1), &v, true);
      if (!ok) {
        return RequestError{400, "BadRequest", "the query parameter \"" + part + "\" has a malformed percent escape"};
      }
      req->query.emplace_back(std::move(k), std::move(v));
    }
    start = amp + 1;
  }
  return std::nullopt;
}

std::optional<RequestError> ConnectionIO::ReadRequest(HttpRequest* req, bool* closed) {
  started_ = pos_ < buf_.size();
  size_t header_used = 0;  // counted, not taken from positions: Fill() may compact buf_
  auto header_budget = [&]() -> size_t {
    return header_used >= opts_.max_header_bytes ? 0 : opts_.max_header_bytes - header_used;
  };
  std::string line;
  // Tolerate empty lines before the request line (RFC 9112 section 2.2).
  do {
    if (auto e = ReadLine(&line, header_budget(), 431, closed)) return e;
    if (*closed) return std::nullopt;
    header_used += last_line_bytes_;
  } while (line.empty() && header_budget() > 0);

  size_t s1 = line.find(' ');
  size_t s2 = s1 == std::string::npos ? std::string::npos : line.find(' ', s1 + 1);
  if (s1 == std::string::npos || s2 == std::string::npos || line.find(' ', s2 + 1) != std::string::npos) {
    return RequestError{400, "BadRequest", "malformed request line \"" + line.substr(0, 200) +
                                               "\": want METHOD SP target SP HTTP-version"};
  }
  req->method = line.substr(0, s1);
  req->raw_target = line.substr(s1 + 1, s2 - s1 - 1);
  req->version = line.substr(s2 + 1);
  if (req->method.empty()) return RequestError{400, "BadRequest", "empty method in the request line"};
  for (char c : req->method) {
    if (!IsTokenChar(c)) {
      return RequestError{400, "BadRequest", "the method \"" + req->method.substr(0, 50) + "\" is not an HTTP token"};
    }
  }
  if (req->version != "HTTP/1.1" && req->version != "HTTP/1.0") {
    if (req->version.rfind("HTTP/", 0) == 0 && req->version.size() == 8 && req->version[5] >= '2' &&
        req->version[5] <= '9') {
      return RequestError{505, "HTTPVersionNotSupported", "HTTP version " + req->version + " is not supported; use HTTP/1.1"};
    }
    return RequestError{400, "BadRequest", "malformed HTTP version \"" + req->version.substr(0, 50) + "\""};
  }
  version_ = req->version;
  for (char c : req->raw_target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return RequestError{400, "BadRequest", "the request target contains a control character"};
    }
  }
  if (auto e = ParseTarget(req->raw_target, req)) return e;

  while (true) {
    if (auto e = ReadLine(&line, header_budget(), 431, closed)) return e;
    if (*closed) return std::nullopt;
    header_used += last_line_bytes_;
    if (line.empty()) break;
    if (line[0] == ' ' || line[0] == '\t') {
      return RequestError{400, "BadRequest", "obsolete header line folding is not allowed"};
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) {
      return RequestError{400, "BadRequest", "malformed header line \"" + line.substr(0, 200) + "\": want name: value"};
    }
    std::string name = line.substr(0, colon);
    for (char c : name) {
      if (!IsTokenChar(c)) {
        return RequestError{400, "BadRequest", "malformed header name \"" + name.substr(0, 100) + "\""};
      }
    }
    std::string value = Trim(line.substr(colon + 1));
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return RequestError{400, "BadRequest", "the header \"" + name + "\" has a control character in its value"};
      }
    }
    name = Lower(name);
    auto it = req->headers.find(name);
    if (it == req->headers.end()) {
      req->headers.emplace(name, value);
    } else if (name == "content-length") {
      if (it->second != value) {
        return RequestError{400, "BadRequest", "conflicting Content-Length headers \"" + it->second + "\" and \"" + value + "\""};
      }
    } else {
      it->second += ", " + value;
    }
  }
  return ReadBody(req, closed);
}

std::optional<RequestError> ConnectionIO::ReadBody(HttpRequest* req, bool* closed) {
  std::string te = req->Header("transfer-encoding");
  std::string cl = req->Header("content-length");
  bool chunked = false;
  if (!te.empty()) {
    if (Lower(Trim(te)) != "chunked") {
      return RequestError{501, "NotImplemented", "Transfer-Encoding \"" + te + "\" is not supported (only chunked)"};
    }
    if (!cl.empty()) {
      return RequestError{400, "BadRequest", "a request may not carry both Transfer-Encoding and Content-Length"};
    }
    chunked = true;
  }
  size_t length = 0;
  if (!cl.empty()) {
    if (cl.size() > 19 || cl.find_first_not_of("0123456789") != std::string::npos) {
      return RequestError{400, "BadRequest", "malformed Content-Length \"" + cl.substr(0, 50) + "\""};
    }
    length = std::stoull(cl);
    if (length > opts_.max_body_bytes) {
      return RequestError{413, "RequestEntityTooLarge",
                          "the request body of " + cl + " bytes exceeds the limit of " +
                              std::to_string(opts_.max_body_bytes) + " bytes"};
    }
  }
  if ((chunked || length > 0) && HasToken(req->Header("expect"), "100-continue")) {
    if (!SendAll(fd_, req->version + " 100 Continue\r\n\r\n")) {
      *closed = true;
      return std::nullopt;
    }
  }
  if (!chunked) return ReadExactly(length, &req->body, closed);

  size_t trailer_bytes = 0;
  while (true) {
    std::string line;
    if (auto e = ReadLine(&line, 1024, 400, closed)) return e;
    if (*closed) return std::nullopt;
    std::string size_text = Trim(line.substr(0, line.find(';')));
    if (size_text.empty() || size_text.size() > 15) {
      return RequestError{400, "BadRequest", "malformed chunk size line \"" + line.substr(0, 100) + "\""};
    }
    size_t size = 0;
    for (char c : size_text) {
      int h = HexValue(c);
      if (h < 0) return RequestError{400, "BadRequest", "malformed chunk size \"" + size_text + "\""};
      size = size * 16 + static_cast<size_t>(h);
    }
    if (size == 0) break;
    if (req->body.size() + size > opts_.max_body_bytes) {
      return RequestError{413, "RequestEntityTooLarge",
                          "the chunked request body exceeds the limit of " +
                              std::to_string(opts_.max_body_bytes) + " bytes"};
    }
    if (auto e = ReadExactly(size, &req->body, closed)) return e;
    if (*closed) return std::nullopt;
    if (auto e = ReadLine(&line, 2, 400, closed)) return e;
    if (*closed) return std::nullopt;
    if (!line.empty()) return RequestError{400, "BadRequest", "chunk data is not followed by CRLF"};
  }
  // Trailer fields, ignored, bounded like headers.
  while (true) {
    std::string line;
    size_t budget = trailer_bytes >= opts_.max_header_bytes ? 0 : opts_.max_header_bytes - trailer_bytes;
    if (auto e = ReadLine(&line, budget, 431, closed)) return e;
    if (*closed) return std::nullopt;
    trailer_bytes += line.size() + 2;
    if (line.empty()) break;
  }
  return std::nullopt;
}

bool ConnectionIO::SendResponse(const HttpRequest& req, HttpResponse& resp, bool keep_alive) {
  bool http10 = req.version == "HTTP/1.0";
  bool stream = static_cast<bool>(resp.stream);
  if (stream && http10) keep_alive = false;  // no chunked framing in 1.0: the close ends the body
  int code = resp.status;
  if (code < 100 || code > 999) code = 500;
  std::string out = (http10 ? "HTTP/1.0 " : "HTTP/1.1 ") + std::to_string(code) + " " +
                    HttpReasonPhrase(code) + "\r\n";
  bool has_date = false;
  for (const auto& [name, value] : resp.headers) {
    std::string lname = Lower(name);
    if (lname == "content-length" || lname == "transfer-encoding" || lname == "connection") continue;
    if (lname == "date") has_date = true;
    // A handler's header must not be able to split the response.
    if (name.find_first_of("\r\n:") != std::string::npos || value.find_first_of("\r\n") != std::string::npos) continue;
    out += name + ": " + value + "\r\n";
  }
  if (!has_date) out += "Date: " + HttpDate() + "\r\n";
  bool no_body = code < 200 || code == 204 || code == 304;
  if (stream) {
    if (!http10) out += "Transfer-Encoding: chunked\r\n";
  } else if (!no_body) {
    out += "Content-Length: " + std::to_string(resp.body.size()) + "\r\n";
  }
  out += keep_alive ? (http10 ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n";
  out += "\r\n";
  if (!stream) {
    if (req.method != "HEAD" && !no_body) out += resp.body;
    return SendAll(fd_, out) && keep_alive;
  }
  if (!SendAll(fd_, out)) return false;
  ChunkedStream s(server_, fd_, !http10);
  try {
    resp.stream(s);
  } catch (const std::exception& e) {
    server_->Log("stream for " + req.method + " " + req.raw_target + " threw: " + e.what() +
                 "; closing the connection");
    return false;
  } catch (...) {
    server_->Log("stream for " + req.method + " " + req.raw_target + " threw a non-exception; closing the connection");
    return false;
  }
  return s.Finish() && keep_alive;
}

void ConnectionIO::SendError(const RequestError& e, const std::string& method) {
  HttpRequest req;
  req.method = method;
  req.version = version_;
  HttpResponse resp;
  resp.status = e.code;
  resp.headers.emplace_back("Content-Type", "application/json");
  resp.body = StatusJson(e.code, e.reason, e.message);
  SendResponse(req, resp, false);
}

void ConnectionIO::LingerAndDrain() {
  ::shutdown(fd_, SHUT_WR);
  size_t drained = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!server_->stopping() && drained < 8 * 1024 * 1024 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) return;  // quiet for 200ms: nothing more in flight
    char tmp[16384];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return;
    drained += static_cast<size_t>(n);
  }
}

void ConnectionIO::Run() {
  while (!server_->stopping()) {
    HttpRequest req;
    req.remote_address = remote_;
    bool closed = false;
    std::optional<RequestError> err = ReadRequest(&req, &closed);
    if (err) {
      SendError(*err, req.method);
      LingerAndDrain();
      return;
    }
    if (closed) return;
    bool keep_alive = req.version == "HTTP/1.1" ? !HasToken(req.Header("connection"), "close")
                                                : HasToken(req.Header("connection"), "keep-alive");
    HttpResponse resp;
    try {
      resp = server_->handler_(req);
    } catch (const std::exception& e) {
      server_->Log("handler for " + req.method + " " + req.raw_target + " threw: " + e.what());
      resp = HttpResponse{};
      resp.status = 500;
      resp.headers.emplace_back("Content-Type", "application/json");
      resp.body = StatusJson(500, "InternalError", std::string("Internal error occurred: ") + e.what());
    } catch (...) {
      server_->Log("handler for " + req.method + " " + req.raw_target + " threw a non-exception");
      resp = HttpResponse{};
      resp.status = 500;
      resp.headers.emplace_back("Content-Type", "application/json");
      resp.body = StatusJson(500, "InternalError", "Internal error occurred: the handler failed");
    }
    if (server_->stopping()) keep_alive = false;
    if (!SendResponse(req, resp, keep_alive)) return;
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
  }
}

Status HttpServer::Impl::Listen() {
  const HttpServerOptions& o = options_;
  if (o.port < 0 || o.port > 65535) return InvalidConfig("HttpServerOptions.port " + std::to_string(o.port) + " is not in 0..65535");
  if (o.max_body_bytes == 0) return InvalidConfig("HttpServerOptions.max_body_bytes must be > 0, got 0");
  if (o.max_header_bytes < 256) {
    return InvalidConfig("HttpServerOptions.max_header_bytes must be >= 256, got " + std::to_string(o.max_header_bytes));
  }
  if (o.max_connections < 1) {
    return InvalidConfig("HttpServerOptions.max_connections must be >= 1, got " + std::to_string(o.max_connections));
  }
  if (o.idle_timeout_seconds < 1) {
    return InvalidConfig("HttpServerOptions.idle_timeout_seconds must be >= 1, got " +
                         std::to_string(o.idle_timeout_seconds));
  }
  std::string address = o.address == "localhost" ? "127.0.0.1" : o.address;
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, address.c_str(), &a4) == 1) {
    if ((ntohl(a4.s_addr) >> 24) != 127) {
      return InvalidConfig("HttpServerOptions.address \"" + o.address +
                           "\" is not a loopback address: the local control plane only listens on "
                           "127.0.0.0/8 or ::1");
    }
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_addr = a4;
    sin->sin_port = htons(static_cast<uint16_t>(o.port));
    len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, address.c_str(), &a6) == 1) {
    if (!IN6_IS_ADDR_LOOPBACK(&a6)) {
      return InvalidConfig("HttpServerOptions.address \"" + o.address +
                           "\" is not a loopback address: the local control plane only listens on "
                           "127.0.0.0/8 or ::1");
    }
    family = AF_INET6;
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_addr = a6;
    sin6->sin6_port = htons(static_cast<uint16_t>(o.port));
    len = sizeof(sockaddr_in6);
  } else {
    return InvalidConfig("HttpServerOptions.address \"" + o.address +
                         "\" is not an IP address; use a loopback address such as 127.0.0.1 or ::1");
  }
  listen_fd_ = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (family == AF_INET6) ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return Unavailable("cannot bind " + o.address + ":" + std::to_string(o.port) + ": " + std::strerror(errno));
  }
  if (::listen(listen_fd_, 512) != 0) return Unavailable(std::string("listen: ") + std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &blen);
  port_ = family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                            : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  if (::pipe2(wake_, O_CLOEXEC) != 0) return Unavailable(std::string("pipe: ") + std::strerror(errno));
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void HttpServer::Impl::ReapFinished() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(finished_);
  }
  for (auto& t : done) t.join();
}

void HttpServer::Impl::AcceptLoop() {
  while (!stopping()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int r = ::poll(p, 2, 1000);
    ReapFinished();
    if (r < 0 && errno != EINTR) {
      Log(std::string("poll on the listener failed: ") + std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (stopping() || (p[1].revents & POLLIN)) break;
    if (r <= 0 || !(p[0].revents & POLLIN)) continue;
    sockaddr_storage peer{};
    socklen_t plen = sizeof(peer);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &plen, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        Log(std::string("accept: ") + std::strerror(errno) + "; backing off");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    int peer_port = 0;
    if (peer.ss_family == AF_INET) {
      auto* s = reinterpret_cast<sockaddr_in*>(&peer);
      ::inet_ntop(AF_INET, &s->sin_addr, host, sizeof(host));
      peer_port = ntohs(s->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      auto* s = reinterpret_cast<sockaddr_in6*>(&peer);
      ::inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof(host));
      peer_port = ntohs(s->sin6_port);
    }
    std::string remote = std::string(host) + ":" + std::to_string(peer_port);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval tv{options_.idle_timeout_seconds, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      Log("refusing a connection from " + remote + ": " + std::to_string(connections_.size()) +
          " connections are open (max_connections)");
      std::string body = StatusJson(503, "ServiceUnavailable",
                                    "too many open connections (" + std::to_string(options_.max_connections) + ")");
      std::string resp = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      ::send(fd, resp.data(), resp.size(), MSG_NOSIGNAL);
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
      continue;
    }
    uint64_t id = next_id_++;
    auto conn = std::make_unique<Connection>();
    conn->fd = fd;
    Connection* raw = conn.get();
    connections_.emplace(id, std::move(conn));
    raw->thread = std::thread([this, id, fd, remote] { Serve(id, fd, remote); });
  }
}

void HttpServer::Impl::Serve(uint64_t id, int fd, std::string remote) {
  try {
    ConnectionIO io(this, fd, std::move(remote));
    io.Run();
  } catch (const std::exception& e) {
    Log(std::string("connection failed: ") + e.what());
  } catch (...) {
    Log("connection failed with a non-exception");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(id);
  // Close under the lock so Stop() never shuts down a descriptor number reused elsewhere.
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  finished_.push_back(std::move(it->second->thread));
  connections_.erase(it);
  cv_.notify_all();
}

void HttpServer::Impl::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  if (wake_[1] >= 0) {
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& [id, conn] : connections_) ::shutdown(conn->fd, SHUT_RDWR);
    cv_.wait(lock, [&] { return connections_.empty(); });
  }
  ReapFinished();
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options, HttpHandler handler) {
  if (!handler) return InvalidConfig("HttpServer::Start: the handler is empty");
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  Status s = impl->Listen();
  if (!s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port_; }
const std::string& HttpServer::address() const { return impl_->options_.address; }
int HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return static_cast<int>(impl_->connections_.size());
}
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace meshwork::controlplane
