// MetricsServer: serves the registry over HTTP, and reports a taken port as kUnavailable.
#include "metrics/exposer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "metrics/trainer_metrics.h"

namespace meshwork::metrics {
namespace {

class Socket {
 public:
  Socket() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// HTTP/1.0 so the server closes the connection and end of stream marks the end of the body.
HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse response;
  Socket sock;
  if (sock.fd() < 0) return response;
  timeval timeout{5, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(sock.fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return response;
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(sock.fd(), request.data(), request.size(), 0) !=
      static_cast<ssize_t>(request.size())) {
    return response;
  }
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(sock.fd(), buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, n);
  // "HTTP/1.1 200 OK\r\n..."
  const auto space = raw.find(' ');
  if (space == std::string::npos) return response;
  response.status = std::atoi(raw.c_str() + space + 1);
  const auto header_end = raw.find("\r\n\r\n");
  if (header_end != std::string::npos) response.body = raw.substr(header_end + 4);
  return response;
}

TEST(MetricsServerTest, ServesRegistryOnEphemeralPort) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_GT((*server)->port(), 0);
  TrainerMetrics metrics(*(*server)->registry(), {{"job", "llama-test"}, {"rank", "3"}});
  StepSample sample;
  sample.step = 7;
  metrics.RecordStep(sample);

  const HttpResponse response = HttpGet((*server)->port(), "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_NE(response.body.find("meshwork_trainer_steps_total{"), std::string::npos)
      << response.body;
  EXPECT_NE(response.body.find("meshwork_trainer_memory_peak_bytes{"), std::string::npos);
  EXPECT_NE(response.body.find("job=\"llama-test\""), std::string::npos);
  EXPECT_NE(response.body.find("rank=\"3\""), std::string::npos);
  EXPECT_NE(response.body.find("meshwork_trainer_step{job=\"llama-test\",rank=\"3\"} 7"),
            std::string::npos)
      << response.body;
}

TEST(MetricsServerTest, PortInUseIsUnavailableAndNamesTheAddress) {
  auto first = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());

  auto second = MetricsServer::Start(address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ExitCodeFor(second.status().code()), exit_code::kUnavailable);
  EXPECT_NE(second.status().message().find(address), std::string::npos)
      << second.status().message();
}

TEST(MetricsServerTest, HostThatIsNotLocalIsUnavailable) {
  // 192.0.2.0/24 is TEST-NET-1: never assigned to a local interface.
  auto server = MetricsServer::Start("192.0.2.1:0");
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(server.status().message().find("192.0.2.1:0"), std::string::npos);
}

TEST(MetricsServerTest, MalformedAddressIsInvalidConfigNamingIt) {
  for (const std::string address : {"9400", "localhost", ":9400", "0.0.0.0:", "0.0.0.0:94o0",
                                    "0.0.0.0:65536", "0.0.0.0:9400s", "0.0.0.0:-1"}) {
    auto server = MetricsServer::Start(address);
    ASSERT_FALSE(server.ok()) << address;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidConfig) << address;
    EXPECT_NE(server.status().message().find("'" + address + "'"), std::string::npos)
        << server.status().message();
  }
}

TEST(MetricsServerTest, StoppingFreesThePort) {
  int port = 0;
  {
    auto server = MetricsServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    port = (*server)->port();
  }
  auto again = MetricsServer::Start("127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST(MetricsServerTest, AddedHandlerAnswersWithItsCodeAndBody) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int code = 503;
  ASSERT_TRUE((*server)->AddHandler("/readyz", [&] { return std::make_pair(code, std::string("not ready: x\n")); }).ok());
  HttpResponse r = HttpGet((*server)->port(), "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: x\n");
  code = 200;
  EXPECT_EQ(HttpGet((*server)->port(), "/readyz?verbose=1").status, 200);  // the query is ignored
  // Replacing a handler.
  ASSERT_TRUE((*server)->AddHandler("/readyz", [] { return std::make_pair(200, std::string("ok\n")); }).ok());
  EXPECT_EQ(HttpGet((*server)->port(), "/readyz").body, "ok\n");
  // /metrics and the index still answer; unknown paths are 404.
  EXPECT_EQ(HttpGet((*server)->port(), "/metrics").status, 200);
  HttpResponse index = HttpGet((*server)->port(), "/");
  EXPECT_EQ(index.status, 200);
  EXPECT_NE(index.body.find("/readyz"), std::string::npos) << index.body;
  EXPECT_EQ(HttpGet((*server)->port(), "/healthz").status, 404);
  EXPECT_EQ(HttpGet((*server)->port(), "/readyz/x").status, 404);
}

TEST(MetricsServerTest, HandlerThatThrowsAnswers500AndTheServerGoesOn) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*server)
                  ->AddHandler("/boom", []() -> std::pair<int, std::string> { throw std::runtime_error("bad"); })
                  .ok());
  HttpResponse r = HttpGet((*server)->port(), "/boom");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("bad"), std::string::npos) << r.body;
  EXPECT_EQ(HttpGet((*server)->port(), "/metrics").status, 200);
}

TEST(MetricsServerTest, AddHandlerRefusesReservedAndRelativePaths) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto ok = [] { return std::make_pair(200, std::string("ok\n")); };
  for (const std::string path : {"/metrics", "/", "healthz", ""}) {
    Status s = (*server)->AddHandler(path, ok);
    EXPECT_EQ(s.code(), StatusCode::kInvalidConfig) << path;
    EXPECT_NE(s.message().find("'" + path + "'"), std::string::npos) << s.message();
  }
  EXPECT_EQ((*server)->AddHandler("/x", nullptr).code(), StatusCode::kInvalidConfig);
}

TEST(MetricsServerTest, WithoutHandlersOnlyMetricsAndIndexAnswer) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(HttpGet((*server)->port(), "/healthz").status, 404);
  HttpResponse index = HttpGet((*server)->port(), "/");
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.body, "Meshwork metrics: /metrics\n");  // the trainer's index, unchanged
}

}  // namespace
}  // namespace meshwork::metrics
