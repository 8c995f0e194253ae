// kubeconfig and in-cluster config loading.
#include "common/base64.h"
#include "operator/k8s/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/k8s/client.h"
#include "tests/operator/k8s/test_util.h"

namespace meshwork::k8s {
namespace {

using ::testing::HasSubstr;
using ::meshwork::Base64Encode;
using testing::ReadTestdata;
using testing::ScopedEnv;
using testing::TempDir;

const char* kTokenConfig = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority: ca.crt
contexts:
- name: dev
  context: {cluster: local, user: alice, namespace: team-a}
- name: other
  context: {cluster: local, user: bob}
users:
- name: alice
  user: {token: s3cret}
- name: bob
  user: {tokenFile: tokens/bob}
)";

TEST(KubeconfigTest, TokenUserAndCaFileRelativeToTheKubeconfig) {
  TempDir dir;
  dir.Write("ca.crt", "CA-PEM");
  std::string path = dir.Write("config", kTokenConfig);
  auto cfg = LoadKubeconfig(path);
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->server, "https://127.0.0.1:6443");
  EXPECT_EQ(cfg->token, "s3cret");
  EXPECT_EQ(cfg->ca_pem, "CA-PEM");
  EXPECT_EQ(cfg->default_namespace, "team-a");
  EXPECT_FALSE(cfg->insecure_skip_tls_verify);
  EXPECT_THAT(cfg->source, HasSubstr("context dev"));
}

TEST(KubeconfigTest, ExplicitContextWithTokenFile) {
  TempDir dir;
  dir.Write("ca.crt", "CA-PEM");
  dir.Write("tokens/bob", "bob-token\n");
  std::string path = dir.Write("config", kTokenConfig);
  auto cfg = LoadKubeconfig(path, "other");
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->token, "bob-token");
  EXPECT_EQ(cfg->token_file, dir.path() + "/tokens/bob");
  EXPECT_EQ(cfg->default_namespace, "default");
}

TEST(KubeconfigTest, MissingTokenFileIsAnErrorNamingTheKey) {
  TempDir dir;
  dir.Write("ca.crt", "CA-PEM");
  std::string path = dir.Write("config", kTokenConfig);
  auto cfg = LoadKubeconfig(path, "other");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.error().kind(), ErrorKind::kInvalidConfig);
  EXPECT_THAT(cfg.error().message(), HasSubstr("tokenFile"));
  EXPECT_THAT(cfg.error().message(), HasSubstr("tokens/bob"));
}

TEST(KubeconfigTest, ClientCertificatesFromData) {
  TempDir dir;
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://10.0.0.1\n"
                     "    certificate-authority-data: " + Base64Encode("CA") + "\n"
                     "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
                     "users:\n- name: u\n  user:\n    client-certificate-data: " + Base64Encode("CERT") +
                     "\n    client-key-data: " + Base64Encode("KEY") + "\n";
  auto cfg = LoadKubeconfig(dir.Write("kc", yaml));
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->ca_pem, "CA");
  EXPECT_EQ(cfg->client_cert_pem, "CERT");
  EXPECT_EQ(cfg->client_key_pem, "KEY");
  EXPECT_TRUE(cfg->token.empty());
}

TEST(KubeconfigTest, ClientCertificatesFromFiles) {
  TempDir dir;
  dir.Write("pki/c.crt", "CERTFILE");
  dir.Write("pki/c.key", "KEYFILE");
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://h:1'}\n"
                     "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
                     "users:\n- name: u\n  user: {client-certificate: pki/c.crt, client-key: " +
                     dir.path() + "/pki/c.key}\n";
  auto cfg = LoadKubeconfig(dir.Write("kc", yaml));
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->client_cert_pem, "CERTFILE");
  EXPECT_EQ(cfg->client_key_pem, "KEYFILE");
}

TEST(KubeconfigTest, CertificateWithoutKeyIsRefused) {
  TempDir dir;
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://h:1'}\n"
                     "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
                     "users:\n- name: u\n  user: {client-certificate-data: " + Base64Encode("C") + "}\n";
  auto cfg = LoadKubeconfig(dir.Write("kc", yaml));
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.error().message(), HasSubstr("users[u].user"));
  EXPECT_THAT(cfg.error().message(), HasSubstr("client-key"));
}

TEST(KubeconfigTest, BadBase64NamesTheKey) {
  TempDir dir;
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://h\n"
                     "    certificate-authority-data: 'not*base64'\n"
                     "contexts:\n- name: c\n  context: {cluster: k}\n";
  auto cfg = LoadKubeconfig(dir.Write("kc", yaml));
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.error().message(), HasSubstr("clusters[k].cluster.certificate-authority-data"));
}

TEST(KubeconfigTest, InsecureSkipTlsVerify) {
  TempDir dir;
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://h', "
                     "insecure-skip-tls-verify: true}\ncontexts:\n- name: c\n  context: {cluster: k}\n";
  auto cfg = LoadKubeconfig(dir.Write("kc", yaml));
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_TRUE(cfg->insecure_skip_tls_verify);
}

TEST(KubeconfigTest, MissingCurrentContextIsAnError) {
  TempDir dir;
  std::string yaml = "clusters:\n- name: k\n  cluster: {server: 'https://h'}\n"
                     "contexts:\n- name: c1\n  context: {cluster: k}\n";
  std::string path = dir.Write("kc", yaml);
  auto cfg = LoadKubeconfig(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.error().kind(), ErrorKind::kInvalidConfig);
  EXPECT_THAT(cfg.error().message(), HasSubstr("current-context"));
  EXPECT_THAT(cfg.error().message(), HasSubstr(path));
  EXPECT_THAT(cfg.error().message(), HasSubstr("c1"));  // lists the contexts there are
}

TEST(KubeconfigTest, UnknownContextAndClusterAreNamed) {
  TempDir dir;
  std::string yaml = "current-context: c\ncontexts:\n- name: c\n  context: {cluster: gone}\n";
  std::string path = dir.Write("kc", yaml);
  auto missing_ctx = LoadKubeconfig(path, "nope");
  ASSERT_FALSE(missing_ctx.ok());
  EXPECT_THAT(missing_ctx.error().message(), HasSubstr("context \"nope\" not found"));
  auto missing_cluster = LoadKubeconfig(path);
  ASSERT_FALSE(missing_cluster.ok());
  EXPECT_THAT(missing_cluster.error().message(), HasSubstr("cluster \"gone\""));
}

TEST(KubeconfigTest, MissingFileIsAnErrorNamingIt) {
  auto cfg = LoadKubeconfig("/nonexistent/dir/kubeconfig");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.error().kind(), ErrorKind::kInvalidConfig);
  EXPECT_THAT(cfg.error().message(), HasSubstr("/nonexistent/dir/kubeconfig"));
}

TEST(KubeconfigTest, MalformedYamlAndBadServerAreErrors) {
  TempDir dir;
  auto bad_yaml = LoadKubeconfig(dir.Write("a", "clusters: [unclosed\n"));
  ASSERT_FALSE(bad_yaml.ok());
  EXPECT_THAT(bad_yaml.error().message(), HasSubstr("not valid YAML"));
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'ftp://h'}\n"
                     "contexts:\n- name: c\n  context: {cluster: k}\n";
  auto bad_server = LoadKubeconfig(dir.Write("b", yaml));
  ASSERT_FALSE(bad_server.ok());
  EXPECT_THAT(bad_server.error().message(), HasSubstr("ftp://h"));
  EXPECT_THAT(bad_server.error().message(), HasSubstr("clusters[k].cluster"));
}

TEST(KubeconfigTest, ExecCredentialsAreRefusedClearly) {
  TempDir dir;
  std::string yaml = "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://h'}\n"
                     "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
                     "users:\n- name: u\n  user: {exec: {command: aws}}\n";
  auto cfg = LoadKubeconfig(dir.Write("kc", yaml));
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.error().message(), HasSubstr("exec"));
}

// KUBECONFIG=a:b: maps merge by name, the first file to define a name (or current-context) wins,
// missing files are skipped.
TEST(KubeconfigTest, KubeconfigEnvMergesFilesFirstWins) {
  TempDir dir;
  std::string a = dir.Write("a", "current-context: from-a\n"
                                 "clusters:\n- name: shared\n  cluster: {server: 'https://a:1'}\n"
                                 "contexts:\n- name: from-a\n  context: {cluster: shared, user: ub}\n");
  std::string b = dir.Write("b", "current-context: from-b\n"
                                 "clusters:\n- name: shared\n  cluster: {server: 'https://b:1'}\n"
                                 "- name: only-b\n  cluster: {server: 'https://onlyb:1'}\n"
                                 "contexts:\n- name: from-b\n  context: {cluster: only-b, user: ub}\n"
                                 "users:\n- name: ub\n  user: {token: tok-b}\n");
  ScopedEnv env("KUBECONFIG", (a + ":" + dir.path() + "/missing:" + b).c_str());
  auto cfg = LoadKubeconfigFromEnv();
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->server, "https://a:1");  // a's current-context, a's "shared"
  EXPECT_EQ(cfg->token, "tok-b");         // the user exists only in b
  auto cfg_b = LoadKubeconfigFromEnv("from-b");
  ASSERT_TRUE(cfg_b.ok()) << cfg_b.error().ToString();
  EXPECT_EQ(cfg_b->server, "https://onlyb:1");
}

TEST(KubeconfigTest, KubeconfigEnvWithOnlyMissingFilesNamesThem) {
  ScopedEnv env("KUBECONFIG", "/nope/one:/nope/two");
  auto cfg = LoadKubeconfigFromEnv();
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.error().message(), HasSubstr("/nope/one"));
  EXPECT_THAT(cfg.error().message(), HasSubstr("/nope/two"));
}

TEST(InClusterConfigTest, ReadsServiceAccountFromRoot) {
  TempDir dir;
  dir.Write("token", "sa-token\n");
  dir.Write("ca.crt", "SA-CA");
  dir.Write("namespace", "jobs\n");
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "10.96.0.1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "443");
  auto cfg = InClusterConfig(dir.path());
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->server, "https://10.96.0.1:443");
  EXPECT_EQ(cfg->token, "sa-token");
  EXPECT_EQ(cfg->token_file, dir.path() + "/token");
  EXPECT_EQ(cfg->ca_pem, "SA-CA");
  EXPECT_EQ(cfg->default_namespace, "jobs");
}

TEST(InClusterConfigTest, Ipv6HostIsBracketed) {
  TempDir dir;
  dir.Write("token", "t");
  dir.Write("ca.crt", "C");
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "fd00::1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "443");
  auto cfg = InClusterConfig(dir.path());
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->server, "https://[fd00::1]:443");
  EXPECT_EQ(cfg->default_namespace, "default");
}

TEST(InClusterConfigTest, MissingEnvOrTokenIsAnError) {
  TempDir dir;
  {
    ScopedEnv host("KUBERNETES_SERVICE_HOST", nullptr);
    auto cfg = InClusterConfig(dir.path());
    ASSERT_FALSE(cfg.ok());
    EXPECT_THAT(cfg.error().message(), HasSubstr("KUBERNETES_SERVICE_HOST"));
  }
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "10.0.0.1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "443");
  auto cfg = InClusterConfig(dir.path());
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.error().message(), HasSubstr(dir.path() + "/token"));
}

TEST(AutoConfigTest, FallsBackToKubeconfigOutsideACluster) {
  TempDir dir;
  std::string kc = dir.Write("kc", "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'http://127.0.0.1:9'}\n"
                                   "contexts:\n- name: c\n  context: {cluster: k}\n");
  ScopedEnv host("KUBERNETES_SERVICE_HOST", nullptr);
  ScopedEnv env("KUBECONFIG", kc.c_str());
  auto cfg = AutoConfig();
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->server, "http://127.0.0.1:9");
}

TEST(AutoConfigTest, InAPodReadsTheServiceAccountDirFromTheEnvironment) {
  TempDir dir;
  dir.Write("token", "local-sa\n");
  dir.Write("ca.crt", "LOCAL-CA");
  dir.Write("namespace", "meshwork-system");
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "127.0.0.1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "6443");
  ScopedEnv sa(kServiceAccountDirEnv, dir.path().c_str());
  auto cfg = AutoConfig();
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  EXPECT_EQ(cfg->server, "https://127.0.0.1:6443");
  EXPECT_EQ(cfg->token, "local-sa");
  EXPECT_EQ(cfg->default_namespace, "meshwork-system");
  {
    // Without the variable, the standard mount point is read (and missing here).
    ScopedEnv unset(kServiceAccountDirEnv, nullptr);
    auto standard = AutoConfig();
    ASSERT_FALSE(standard.ok());
    EXPECT_THAT(standard.error().message(), HasSubstr(std::string(kServiceAccountDir) + "/token"));
  }
}

TEST(Base64Test, DecodesWithAndWithoutPadding) {
  EXPECT_EQ(DecodeBase64("aGVsbG8=").value(), "hello");
  EXPECT_EQ(DecodeBase64("aGVsbG8").value(), "hello");
  EXPECT_EQ(DecodeBase64("aGVs\nbG8h").value(), "hello!");
  EXPECT_FALSE(DecodeBase64("a$==").ok());
}

// The client checks PEMs when built, so a wrong file fails at start-up with a clear message.
TEST(ClientConfigTest, RealPemsAreAcceptedAndGarbageIsRefused) {
  Config good;
  good.server = "https://127.0.0.1:1";
  good.ca_pem = ReadTestdata("ca.crt");
  good.client_cert_pem = ReadTestdata("client.crt");
  good.client_key_pem = ReadTestdata("client.key");
  good.source = "test config";
  auto client = Client::FromConfig(good);
  EXPECT_TRUE(client.ok()) << client.error().ToString();

  Config bad_ca = good;
  bad_ca.ca_pem = "not a certificate";
  auto r1 = Client::FromConfig(bad_ca);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().kind(), ErrorKind::kInvalidConfig);
  EXPECT_THAT(r1.error().message(), HasSubstr("certificate-authority"));

  Config wrong_key = good;
  wrong_key.client_key_pem = ReadTestdata("server.key");
  auto r2 = Client::FromConfig(wrong_key);
  ASSERT_FALSE(r2.ok());
  EXPECT_THAT(r2.error().message(), HasSubstr("client-key"));

  Config bad_server = good;
  bad_server.server = "127.0.0.1:6443";
  auto r3 = Client::FromConfig(bad_server);
  ASSERT_FALSE(r3.ok());
  EXPECT_THAT(r3.error().message(), HasSubstr("127.0.0.1:6443"));
}

}  // namespace
}  // namespace meshwork::k8s
