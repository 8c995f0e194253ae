// A small HTTP/1.1 server on POSIX sockets for the node agent's kubelet API (docs/cluster.md):
// loopback only, keep-alive, Content-Length and chunked request bodies, chunked streaming
// responses (watch), one thread per connection with a bounded connection count.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace meshwork::controlplane {

struct HttpRequest {
  std::string method;                                      // GET POST PUT PATCH DELETE ... (as sent)
  std::string path;                                        // percent-decoded, no query string
  std::string raw_target;                                  // the request-target exactly as sent
  std::vector<std::pair<std::string, std::string>> query;  // decoded ('+' is a space), in order, repeats allowed
  std::map<std::string, std::string> headers;              // names lower-cased; repeated headers joined with ", "
  std::string body;                                        // de-chunked
  std::string version;                                     // "HTTP/1.1" or "HTTP/1.0"
  std::string remote_address;                              // the peer, "127.0.0.1:54321"

  // The first value of query parameter `name`, or `fallback` when absent.
  std::string Query(const std::string& name, const std::string& fallback = "") const;
  bool HasQuery(const std::string& name) const;
  // The header's value, or "" when absent. `lower_name` must be lower case.
  std::string Header(const std::string& lower_name) const;
};

// A chunked response body being written; one per streaming response, used only on the
// connection's thread.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Sends one chunk and flushes it; false once the client is gone or the server stops.
  // An empty chunk sends nothing and returns Open().
  virtual bool Write(std::string_view chunk) = 0;
  // False once the client is gone (closed or reset its side) or the server stops.
  virtual bool Open() const = 0;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // Content-Type etc.; the server adds
                                                             // Content-Length / Transfer-Encoding,
                                                             // Date and Connection itself
  std::string body;
  // If set: the server sends status+headers with Transfer-Encoding: chunked, then calls
  // stream(out) on the connection's own thread; the response ends when it returns. `body` is
  // ignored. A stream that throws is logged and its connection closed.
  std::function<void(ResponseStream&)> stream;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string address = "127.0.0.1";  // only loopback addresses are accepted (127.0.0.0/8, ::1,
                                       // "localhost"); anything else is an error naming the value
  int port = 0;                        // 0: the kernel picks; port() tells which
  size_t max_body_bytes = 3 * 1024 * 1024;  // larger: 413 with a Kubernetes Status JSON body
  size_t max_header_bytes = 64 * 1024;      // request line + headers (and chunk trailers) larger: 431
  int max_connections = 1024;               // more at once: 503 Status, then closed
  int idle_timeout_seconds = 120;           // a connection silent this long (between or inside
                                            // requests) is closed; also bounds a blocked send
  // Where the server logs (handler exceptions, refused connections). Empty: stderr.
  std::function<void(const std::string&)> log;
};

class HttpServer {
 public:
  // Binds and listens, then serves on its own threads until Stop(). InvalidConfig names a bad
  // option and its value; Unavailable when the address/port cannot be bound.
  static Result<std::unique_ptr<HttpServer>> Start(HttpServerOptions options, HttpHandler handler);

  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  const std::string& address() const;
  // Connections currently open (for tests and metrics).
  int open_connections() const;
  // Closes the listener and every connection (shutdown(2)), waits for the connection threads;
  // running streams see Write()==false / Open()==false and must return. Idempotent; also run by
  // the destructor. Must not be called from a handler or stream.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A Kubernetes metav1 Status body:
// {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":...,"reason":...,"code":...}
std::string StatusJson(int code, const std::string& reason, const std::string& message);

// The standard reason phrase for an HTTP status code ("Not Found"), "Unknown" when unlisted.
const char* HttpReasonPhrase(int code);

// Percent-decodes `in` into `out`; false on a malformed escape. `plus_is_space` for query strings.
bool PercentDecode(std::string_view in, std::string* out, bool plus_is_space);

}  // namespace meshwork::controlplane
