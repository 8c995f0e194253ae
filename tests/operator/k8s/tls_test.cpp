// TLS: the CA from the config is trusted and nothing else, the server name is checked,
// insecure-skip-tls-verify turns that off, and client certificates are presented. The server is
// cpprest's own listener with the test-only certificates in testdata/.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cpprest/http_listener.h>

#include <boost/asio/ssl.hpp>

#include "tests/common/free_port.h"
#include "operator/k8s/client.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::k8s {
namespace {

using testing::ReadTestdata;
namespace listener = web::http::experimental::listener;

using ::meshwork::testing::FreePort;

// An HTTPS server on 127.0.0.1 answering every GET with a ConfigMap.
class TlsServer {
 public:
  explicit TlsServer(bool require_client_cert) : port_(FreePort()) {
    listener::http_listener_config cfg;
    std::string cert = ReadTestdata("server.crt"), key = ReadTestdata("server.key"), ca = ReadTestdata("ca.crt");
    cfg.set_ssl_context_callback([=](boost::asio::ssl::context& ctx) {
      ctx.set_options(boost::asio::ssl::context::default_workarounds);
      ctx.use_certificate_chain(boost::asio::buffer(cert));
      ctx.use_private_key(boost::asio::buffer(key), boost::asio::ssl::context::pem);
      if (require_client_cert) {
        ctx.add_certificate_authority(boost::asio::buffer(ca));
        ctx.set_verify_mode(boost::asio::ssl::verify_peer | boost::asio::ssl::verify_fail_if_no_peer_cert);
      }
    });
    listener_ = std::make_unique<listener::http_listener>(
        U("https://127.0.0.1:") + utility::conversions::to_string_t(std::to_string(port_)), cfg);
    listener_->support(web::http::methods::GET, [](web::http::http_request req) {
      req.reply(200, R"({"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"d"}})",
                "application/json");
    });
    listener_->open().wait();
  }
  ~TlsServer() { listener_->close().wait(); }
  int port() const { return port_; }

 private:
  int port_;
  std::unique_ptr<listener::http_listener> listener_;
};

Result<nlohmann::json> GetVia(Config c) {
  ClientOptions o;
  o.max_retries = 0;
  o.request_timeout = std::chrono::seconds(10);
  auto client = Client::FromConfig(std::move(c), o);
  if (!client.ok()) return client.error();
  return (*client)->Get(resources::ConfigMaps(), "d", "x");
}

TEST(TlsTest, TrustsTheConfiguredCaOnly) {
  TlsServer server(/*require_client_cert=*/false);
  Config c;
  c.server = "https://127.0.0.1:" + std::to_string(server.port());
  c.ca_pem = ReadTestdata("ca.crt");
  auto ok = GetVia(c);
  EXPECT_TRUE(ok.ok()) << ok.error().ToString();

  c.server = "https://localhost:" + std::to_string(server.port());  // the certificate's DNS name
  auto by_name = GetVia(c);
  EXPECT_TRUE(by_name.ok()) << by_name.error().ToString();

  Config wrong_ca = c;
  wrong_ca.ca_pem = ReadTestdata("other-ca.crt");
  auto refused = GetVia(wrong_ca);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(IsUnavailable(refused.error())) << refused.error().ToString();

  Config system_roots = c;
  system_roots.ca_pem.clear();
  EXPECT_FALSE(GetVia(system_roots).ok());
}

TEST(TlsTest, InsecureSkipTlsVerifyAcceptsAnUnknownCa) {
  TlsServer server(/*require_client_cert=*/false);
  Config c;
  c.server = "https://127.0.0.1:" + std::to_string(server.port());
  c.ca_pem = ReadTestdata("other-ca.crt");
  c.insecure_skip_tls_verify = true;
  auto r = GetVia(c);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
}

TEST(TlsTest, ClientCertificateIsPresented) {
  TlsServer server(/*require_client_cert=*/true);
  Config c;
  c.server = "https://127.0.0.1:" + std::to_string(server.port());
  c.ca_pem = ReadTestdata("ca.crt");
  EXPECT_FALSE(GetVia(c).ok()) << "the server requires a client certificate";
  c.client_cert_pem = ReadTestdata("client.crt");
  c.client_key_pem = ReadTestdata("client.key");
  auto r = GetVia(c);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
}

}  // namespace
}  // namespace meshwork::k8s
