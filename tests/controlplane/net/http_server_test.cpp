// Tests for the control plane's HTTP/1.1 server, driven by a raw socket client so malformed
// requests can be sent byte for byte.
#include "controlplane/net/http_server.h"

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace meshwork::controlplane {
namespace {

using namespace std::chrono_literals;

struct RawResponse {
  int status = 0;
  std::string status_line;
  std::map<std::string, std::string> headers;  // lower-cased
  std::string body;                            // de-chunked
  bool chunked = false;
};

// A blocking TCP client with bounded waits.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }

  bool Send(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads more bytes into buf_; false on EOF, error or timeout.
  bool Fill(std::chrono::milliseconds timeout = 5000ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  bool ReadLine(std::string* line) {
    while (true) {
      size_t nl = buf_.find("\r\n");
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 2);
        return true;
      }
      if (!Fill()) return false;
    }
  }

  bool ReadN(size_t n, std::string* out) {
    while (buf_.size() < n)
      if (!Fill()) return false;
    out->append(buf_, 0, n);
    buf_.erase(0, n);
    return true;
  }

  // One response; false when the connection ended or stalled first.
  bool ReadResponse(RawResponse* r, bool head = false) {
    *r = RawResponse{};
    if (!ReadLine(&r->status_line)) return false;
    if (r->status_line.size() < 12) return false;
    r->status = std::stoi(r->status_line.substr(9, 3));
    std::string line;
    while (true) {
      if (!ReadLine(&line)) return false;
      if (line.empty()) break;
      size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      r->headers[name] = line.substr(v);
    }
    if (head) return true;
    if (r->headers.count("transfer-encoding")) {
      r->chunked = true;
      while (true) {
        if (!ReadLine(&line)) return false;
        size_t size = std::stoul(line, nullptr, 16);
        if (size == 0) return ReadLine(&line);
        if (!ReadN(size, &r->body)) return false;
        if (!ReadLine(&line)) return false;
      }
    }
    if (r->headers.count("content-length")) return ReadN(std::stoul(r->headers["content-length"]), &r->body);
    return true;
  }

  // True when the server closed the connection (EOF) within the timeout.
  bool WaitClosed(std::chrono::milliseconds timeout = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char tmp[4096];
        ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
        if (n <= 0) return true;
        buf_.append(tmp, static_cast<size_t>(n));
      }
    }
    return false;
  }

  const std::string& pending() const { return buf_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

// A server whose handler echoes the request as JSON, with a few special paths.
class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    options.log = [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(log_mu_);
      logs_.push_back(m);
    };
    auto r = HttpServer::Start(options, [this](const HttpRequest& req) { return Handle(req); });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    server_ = std::move(r).value();
  }

  HttpResponse Handle(const HttpRequest& req) {
    ++handled_;
    HttpResponse resp;
    if (req.path == "/throw") throw std::runtime_error("boom from the handler");
    if (req.path == "/stream") {
      int n = std::stoi(req.Query("n", "3"));
      resp.headers.emplace_back("Content-Type", "application/json");
      resp.stream = [n](ResponseStream& out) {
        for (int i = 0; i < n; ++i) {
          if (!out.Write("{\"i\":" + std::to_string(i) + "}\n")) return;
        }
      };
      return resp;
    }
    if (req.path == "/forever") {
      resp.stream = [this](ResponseStream& out) {
        stream_started_ = true;
        // Bounded so a broken Stop() fails the test instead of hanging it.
        for (int i = 0; i < 3000 && out.Write("tick\n"); ++i) std::this_thread::sleep_for(10ms);
        stream_saw_end_ = !out.Open();
        stream_returned_ = true;
      };
      return resp;
    }
    if (req.path == "/wait-gone") {
      resp.stream = [this](ResponseStream& out) {
        out.Write("hello\n");
        stream_started_ = true;
        for (int i = 0; i < 1000 && out.Open(); ++i) std::this_thread::sleep_for(10ms);
        stream_saw_end_ = !out.Open();
        stream_returned_ = true;
      };
      return resp;
    }
    nlohmann::json q = nlohmann::json::array();
    for (const auto& [k, v] : req.query) q.push_back({k, v});
    nlohmann::json j = {{"method", req.method}, {"path", req.path}, {"query", q},
                        {"body", req.body}, {"headers", req.headers}};
    resp.headers.emplace_back("Content-Type", "application/json");
    resp.body = j.dump();
    return resp;
  }

  RawResponse Roundtrip(const std::string& raw) {
    RawClient c(server_->port());
    EXPECT_TRUE(c.connected());
    c.Send(raw);
    RawResponse r;
    EXPECT_TRUE(c.ReadResponse(&r)) << "no response to " << raw.substr(0, 80);
    return r;
  }

  void ExpectServerHealthy() {
    RawResponse r = Roundtrip("GET /healthy HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(nlohmann::json::parse(r.body)["path"], "/healthy");
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> handled_{0};
  std::atomic<bool> stream_started_{false}, stream_saw_end_{false}, stream_returned_{false};
  std::mutex log_mu_;
  std::vector<std::string> logs_;
};

struct MalformedCase {
  const char* name;
  std::string raw;
  int code;
};

TEST_F(HttpServerTest, MalformedRequestsGetStatusBodiesAndTheServerSurvives) {
  HttpServerOptions o;
  o.max_body_bytes = 1024;
  o.max_header_bytes = 2048;
  StartServer(o);
  const std::vector<MalformedCase> cases = {
      {"garbage request line", "GARBAGE\r\n\r\n", 400},
      {"extra field in request line", "GET / HTTP/1.1 extra\r\n\r\n", 400},
      {"not HTTP", "GET / FTP/1.0\r\n\r\n", 400},
      {"HTTP/2 preface version", "GET / HTTP/2.0\r\n\r\n", 505},
      {"method not a token", "G(T / HTTP/1.1\r\n\r\n", 400},
      {"target without slash", "GET nopath HTTP/1.1\r\n\r\n", 400},
      {"bad percent escape in path", "GET /a%zzb HTTP/1.1\r\n\r\n", 400},
      {"truncated percent escape in query", "GET /?a=%2 HTTP/1.1\r\n\r\n", 400},
      {"header without colon", "GET / HTTP/1.1\r\nNoColonHere\r\n\r\n", 400},
      {"header name with space", "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400},
      {"obsolete line folding", "GET / HTTP/1.1\r\nA: b\r\n  folded\r\n\r\n", 400},
      {"control char in header value", std::string("GET / HTTP/1.1\r\nA: b\x01c\r\n\r\n"), 400},
      {"huge header", "GET / HTTP/1.1\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n", 431},
      {"huge request line", "GET /" + std::string(4096, 'a') + " HTTP/1.1\r\n\r\n", 431},
      {"huge body", "POST / HTTP/1.1\r\nContent-Length: 4096\r\n\r\n", 413},
      {"non-numeric content length", "POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400},
      {"negative content length", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"conflicting content lengths", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
      {"both transfer-encoding and length",
       "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400},
      {"unsupported transfer-encoding", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"bad chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400},
      {"chunk without CRLF after data",
       "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY\r\n0\r\n\r\n", 400},
      {"chunks over the body limit",
       "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n300\r\n" + std::string(0x300, 'a') +
           "\r\n300\r\n" + std::string(0x300, 'a') + "\r\n0\r\n\r\n",
       413},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawClient client(server_->port());
    ASSERT_TRUE(client.connected());
    client.Send(c.raw);
    RawResponse r;
    ASSERT_TRUE(client.ReadResponse(&r));
    EXPECT_EQ(r.status, c.code) << r.status_line << " " << r.body;
    EXPECT_EQ(r.headers["content-type"], "application/json");
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.body;
    EXPECT_EQ(j["kind"], "Status");
    EXPECT_EQ(j["apiVersion"], "v1");
    EXPECT_EQ(j["status"], "Failure");
    EXPECT_EQ(j["code"], c.code);
    EXPECT_FALSE(j["message"].get<std::string>().empty());
    EXPECT_EQ(r.headers["connection"], "close");
    EXPECT_TRUE(client.WaitClosed()) << "the server should close after a malformed request";
  }
  EXPECT_EQ(handled_.load(), 0) << "no malformed request may reach the handler";
  ExpectServerHealthy();
}

TEST_F(HttpServerTest, TooLargeBodyNamesTheLimitInAKubernetesStatus) {
  HttpServerOptions o;
  o.max_body_bytes = 100;
  StartServer(o);
  RawResponse r = Roundtrip("PUT /api/v1/x HTTP/1.1\r\nContent-Length: 101\r\n\r\n");
  EXPECT_EQ(r.status, 413);
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["reason"], "RequestEntityTooLarge");
  EXPECT_NE(j["message"].get<std::string>().find("100"), std::string::npos) << j.dump();
}

TEST_F(HttpServerTest, ClientsThatLeaveMidRequestDoNotHurtTheServer) {
  StartServer();
  const std::vector<std::string> partials = {
      "GET / HT",
      "GET / HTTP/1.1\r\nHost: x\r\n",
      "POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-some",
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
  };
  for (const auto& p : partials) {
    RawClient c(server_->port());
    ASSERT_TRUE(c.connected());
    c.Send(p);
    c.Close();
  }
  ExpectServerHealthy();
  EXPECT_EQ(handled_.load(), 1);
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  StartServer();
  RawClient c(server_->port());
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.Send("GET /api/v1/namespaces/default/pods?labelSelector=app%3Dweb&watch=1&x=a+b&x=2 HTTP/1.1\r\n"
                       "Host: 127.0.0.1\r\nX-Mixed-Case: Value\r\n\r\n"));
    RawResponse r;
    ASSERT_TRUE(c.ReadResponse(&r)) << "request " << i;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.headers.count("connection"), 0u);
    auto j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["path"], "/api/v1/namespaces/default/pods");
    EXPECT_EQ(j["query"], nlohmann::json::parse(R"([["labelSelector","app=web"],["watch","1"],["x","a b"],["x","2"]])"));
    EXPECT_EQ(j["headers"]["x-mixed-case"], "Value");
  }
  EXPECT_EQ(handled_.load(), 5);
}

TEST_F(HttpServerTest, ContentLengthAndChunkedBodiesReachTheHandler) {
  StartServer();
  RawClient c(server_->port());
  c.Send("POST /a%20b HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world");
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r));
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["path"], "/a b");
  EXPECT_EQ(j["body"], "hello world");
  c.Send("PUT /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n");
  ASSERT_TRUE(c.ReadResponse(&r));
  j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["method"], "PUT");
  EXPECT_EQ(j["body"], "hello world");
  // Expect: 100-continue gets its interim response before the body is sent.
  c.Send("POST /d HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_TRUE(c.ReadResponse(&r, /*head=*/true));
  EXPECT_EQ(r.status, 100);
  c.Send("ok");
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(nlohmann::json::parse(r.body)["body"], "ok");
}

TEST_F(HttpServerTest, LargeChunkedBodyOfManySmallChunksArrivesWhole) {
  StartServer();
  std::string body, wire = "POST /big HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; body.size() < 2'000'000; ++i) {
    std::string chunk(1000 + i % 37, static_cast<char>('a' + i % 26));
    body += chunk;
    char head[16];
    std::snprintf(head, sizeof(head), "%zx\r\n", chunk.size());
    wire += head + chunk + "\r\n";
  }
  wire += "0\r\n\r\n";
  RawClient c(server_->port());
  std::thread sender([&] { c.Send(wire); });
  RawResponse r;
  bool got = c.ReadResponse(&r);
  sender.join();
  ASSERT_TRUE(got);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(nlohmann::json::parse(r.body)["body"] == body) << "the de-chunked body differs";
}

TEST_F(HttpServerTest, RequestSentOneByteAtATimeIsParsed) {
  StartServer();
  RawClient c(server_->port());
  const std::string wire =
      "POST /slow?a=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n";
  for (char ch : wire) {
    ASSERT_TRUE(c.Send(std::string(1, ch)));
    std::this_thread::sleep_for(1ms);
  }
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r));
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["body"], "abcdef");
  EXPECT_EQ(j["path"], "/slow");
}

TEST_F(HttpServerTest, ManySmallHeadersArrivingSlowlyStillHitTheHeaderLimit) {
  HttpServerOptions o;
  o.max_header_bytes = 2048;
  StartServer(o);
  RawClient c(server_->port());
  c.Send("GET /first HTTP/1.1\r\n\r\n");  // a first request, so the second starts mid-buffer
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r));
  c.Send("GET /second HTTP/1.1\r\n");
  for (int i = 0; i < 100; ++i) {
    if (!c.Send("X-Header-" + std::to_string(i) + ": " + std::string(40, 'v') + "\r\n")) break;
    std::this_thread::sleep_for(1ms);
  }
  c.Send("\r\n");
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(handled_.load(), 1);
}

TEST_F(HttpServerTest, PipelinedRequestSplitAcrossReadsIsParsed) {
  StartServer();
  RawClient c(server_->port());
  c.Send("GET /one HTTP/1.1\r\n\r\nGET /tw");
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(nlohmann::json::parse(r.body)["path"], "/one");
  std::this_thread::sleep_for(20ms);
  c.Send("o HTTP/1.1\r\nA: b\r\n");
  std::this_thread::sleep_for(20ms);
  c.Send("C: d\r\n\r\n");
  ASSERT_TRUE(c.ReadResponse(&r));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body)["path"], "/two");
  EXPECT_EQ(nlohmann::json::parse(r.body)["headers"]["c"], "d");
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  StartServer();
  RawClient c(server_->port());
  c.Send("GET /one HTTP/1.1\r\n\r\nPOST /two HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /three HTTP/1.1\r\n\r\n");
  for (const char* want : {"/one", "/two", "/three"}) {
    RawResponse r;
    ASSERT_TRUE(c.ReadResponse(&r)) << want;
    EXPECT_EQ(nlohmann::json::parse(r.body)["path"], want);
  }
}

TEST_F(HttpServerTest, ConnectionCloseAndHttp10CloseAfterTheResponse) {
  StartServer();
  {
    RawClient c(server_->port());
    c.Send("GET /x HTTP/1.1\r\nConnection: close\r\n\r\n");
    RawResponse r;
    ASSERT_TRUE(c.ReadResponse(&r));
    EXPECT_EQ(r.headers["connection"], "close");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    RawClient c(server_->port());
    c.Send("GET /x HTTP/1.0\r\n\r\n");
    RawResponse r;
    ASSERT_TRUE(c.ReadResponse(&r));
    EXPECT_EQ(r.status_line.substr(0, 8), "HTTP/1.0");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    RawClient c(server_->port());
    c.Send("HEAD /x HTTP/1.1\r\n\r\n");
    RawResponse r;
    ASSERT_TRUE(c.ReadResponse(&r, /*head=*/true));
    EXPECT_EQ(r.status, 200);
    EXPECT_NE(std::stoul(r.headers["content-length"]), 0u);
    EXPECT_TRUE(c.pending().empty()) << "HEAD must not carry a body";
  }
}

TEST_F(HttpServerTest, HandlerThatThrowsBecomesA500StatusAndIsLogged) {
  StartServer();
  RawClient c(server_->port());
  c.Send("GET /throw HTTP/1.1\r\n\r\n");
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 500);
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["reason"], "InternalError");
  EXPECT_NE(j["message"].get<std::string>().find("boom"), std::string::npos);
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    ASSERT_FALSE(logs_.empty());
    EXPECT_NE(logs_.back().find("boom"), std::string::npos);
  }
  // The connection stays usable.
  c.Send("GET /after HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 200);
}

TEST_F(HttpServerTest, StreamingResponseIsChunkedAndTheConnectionIsReusable) {
  StartServer();
  RawClient c(server_->port());
  c.Send("GET /stream?n=4 HTTP/1.1\r\n\r\n");
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.chunked);
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(r.headers.count("content-length"), 0u);
  EXPECT_EQ(r.body, "{\"i\":0}\n{\"i\":1}\n{\"i\":2}\n{\"i\":3}\n");
  c.Send("GET /after HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(nlohmann::json::parse(r.body)["path"], "/after");
}

TEST_F(HttpServerTest, StopWhileAStreamIsOpenReturnsPromptly) {
  StartServer();
  RawClient c(server_->port());
  c.Send("GET /forever HTTP/1.1\r\n\r\n");
  RawResponse r;
  ASSERT_TRUE(c.ReadResponse(&r, /*head=*/true));
  ASSERT_TRUE(c.Fill());  // a first tick arrived: the stream is running
  RawClient idle(server_->port());  // and an idle keep-alive connection
  ASSERT_TRUE(idle.connected());
  auto stopped = std::async(std::launch::async, [&] { server_->Stop(); });
  ASSERT_EQ(stopped.wait_for(10s), std::future_status::ready) << "Stop() hung";
  EXPECT_TRUE(stream_returned_.load());
  EXPECT_TRUE(stream_saw_end_.load());
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_TRUE(idle.WaitClosed());
  server_->Stop();  // idempotent
  EXPECT_FALSE(RawClient(server_->port()).connected()) << "the listener should be closed";
}

TEST_F(HttpServerTest, StreamSeesTheClientLeave) {
  StartServer();
  {
    RawClient c(server_->port());
    c.Send("GET /wait-gone HTTP/1.1\r\n\r\n");
    RawResponse r;
    ASSERT_TRUE(c.ReadResponse(&r, /*head=*/true));
    for (int i = 0; i < 50 && c.pending().find("hello") == std::string::npos; ++i) c.Fill(100ms);
    ASSERT_NE(c.pending().find("hello"), std::string::npos);
  }
  for (int i = 0; i < 500 && !stream_returned_; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(stream_returned_.load()) << "Open() never turned false after the client closed";
  EXPECT_TRUE(stream_saw_end_.load());
}

TEST_F(HttpServerTest, StalledClientDoesNotBlockOthersAndTimesOut) {
  HttpServerOptions o;
  o.idle_timeout_seconds = 1;
  StartServer(o);
  RawClient stalled(server_->port());
  stalled.Send("GET /slow HTTP/1.1\r\nHost: x\r\n");  // never finishes its headers
  ExpectServerHealthy();
  ExpectServerHealthy();
  RawResponse r;
  ASSERT_TRUE(stalled.ReadResponse(&r));
  EXPECT_EQ(r.status, 408);
  EXPECT_TRUE(stalled.WaitClosed());
  RawClient idle(server_->port());  // an idle keep-alive connection is closed quietly
  EXPECT_TRUE(idle.WaitClosed(5000ms));
  EXPECT_TRUE(idle.pending().empty());
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  HttpServerOptions o;
  o.max_connections = 2;
  StartServer(o);
  RawClient a(server_->port()), b(server_->port());
  for (int i = 0; i < 500 && server_->open_connections() < 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(server_->open_connections(), 2);
  RawClient third(server_->port());
  RawResponse r;
  ASSERT_TRUE(third.ReadResponse(&r));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(nlohmann::json::parse(r.body)["reason"], "ServiceUnavailable");
  a.Close();
  for (int i = 0; i < 500 && server_->open_connections() > 1; ++i) std::this_thread::sleep_for(10ms);
  ExpectServerHealthy();
}

TEST_F(HttpServerTest, RandomBytesNeverCrashTheServer) {
  StartServer();
  std::mt19937 rng(1234);
  const std::string prefixes[] = {"", "GET / HTTP/1.1\r\n", "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                                  "PUT / HTTP/1.1\r\nContent-Length: 5\r\n"};
  for (int i = 0; i < 150; ++i) {
    std::string junk = prefixes[i % 4];
    size_t n = rng() % 300;
    for (size_t k = 0; k < n; ++k) junk.push_back(static_cast<char>(rng() % 256));
    if (i % 2 == 0) junk += "\r\n\r\n";
    RawClient c(server_->port());
    c.Send(junk);
    c.ShutdownWrite();
    c.WaitClosed(5000ms);
  }
  ExpectServerHealthy();
}

TEST(HttpServerOptionsTest, NonLoopbackAddressesAreRefusedByName) {
  for (const char* address : {"0.0.0.0", "10.1.2.3", "192.168.0.1", "::", "example.com", ""}) {
    HttpServerOptions o;
    o.address = address;
    auto r = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse{}; });
    ASSERT_FALSE(r.ok()) << address;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
    EXPECT_NE(r.status().message().find(std::string("\"") + address + "\""), std::string::npos)
        << r.status().message();
  }
  for (const char* address : {"127.0.0.1", "127.0.0.2", "localhost"}) {
    HttpServerOptions o;
    o.address = address;
    auto r = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse{}; });
    EXPECT_TRUE(r.ok()) << address << ": " << r.status().ToString();
    if (r.ok()) {
      EXPECT_GT(r.value()->port(), 0);
    }
  }
}

TEST(HttpServerOptionsTest, BadLimitsAreRefusedByName) {
  HttpServerOptions o;
  o.max_connections = 0;
  auto r = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_connections"), std::string::npos);
  o = HttpServerOptions{};
  o.port = 70000;
  r = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("70000"), std::string::npos);
}

TEST(HttpServerOptionsTest, BusyPortIsUnavailable) {
  auto first = HttpServer::Start({}, [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_TRUE(first.ok());
  HttpServerOptions o;
  o.port = first.value()->port();
  auto second = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

TEST(StatusJsonTest, IsAKubernetesStatus) {
  auto j = nlohmann::json::parse(StatusJson(404, "NotFound", "pods \"x\" not found"));
  EXPECT_EQ(j, nlohmann::json::parse(R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
      "message":"pods \"x\" not found","reason":"NotFound","code":404})"));
}

TEST(PercentDecodeTest, DecodesAndRejects) {
  std::string out;
  EXPECT_TRUE(PercentDecode("a%2Fb+c", &out, false));
  EXPECT_EQ(out, "a/b+c");
  EXPECT_TRUE(PercentDecode("a%2fb+c", &out, true));
  EXPECT_EQ(out, "a/b c");
  EXPECT_FALSE(PercentDecode("%", &out, false));
  EXPECT_FALSE(PercentDecode("%4", &out, false));
  EXPECT_FALSE(PercentDecode("%g0", &out, false));
}

}  // namespace
}  // namespace meshwork::controlplane
