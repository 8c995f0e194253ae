// Where the API server is and how to authenticate to it: kubeconfig files (as kubectl reads
// them), the in-cluster service account, or whichever of the two applies.
#pragma once

#include <string>

#include "operator/k8s/error.h"

namespace meshwork::k8s {

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";
// Overrides kServiceAccountDir in AutoConfig. The local control plane's node agent sets it, since
// its Pods share one filesystem and each gets its own copy of the token; clusters never set it.
inline constexpr const char* kServiceAccountDirEnv = "MESHWORK_SERVICE_ACCOUNT_DIR";

struct Config {
  std::string server;                    // "https://host:port" (http:// allowed, for local use)
  std::string ca_pem;                    // CA bundle (PEM); empty: the system's roots
  bool insecure_skip_tls_verify = false;  // off by default: certificates are verified
  std::string token;                     // bearer token
  std::string token_file;                // re-read on every request when set (tokens rotate)
  std::string client_cert_pem;           // client certificate chain (PEM)
  std::string client_key_pem;            // its private key (PEM)
  std::string default_namespace = "default";
  std::string source;                    // where this came from, for error messages
};

// Reads a kubeconfig. `path` may name several files joined by ':' (as KUBECONFIG does): maps
// are merged by name and the first file to set a name or current-context wins; files that do
// not exist are skipped, unless none exists. `context` "" means current-context.
Result<Config> LoadKubeconfig(const std::string& path, const std::string& context = "");

// LoadKubeconfig($KUBECONFIG, or $HOME/.kube/config when KUBECONFIG is unset or empty).
Result<Config> LoadKubeconfigFromEnv(const std::string& context = "");

// The pod's service account: token, ca.crt and namespace under `root`, and
// KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT for the server.
Result<Config> InClusterConfig(const std::string& root = kServiceAccountDir);

// In-cluster config when KUBERNETES_SERVICE_HOST and _PORT are set (from $MESHWORK_SERVICE_ACCOUNT_DIR
// when that is set, else kServiceAccountDir), else LoadKubeconfigFromEnv().
Result<Config> AutoConfig();

// Standard base64 (padding optional; whitespace ignored), as kubeconfig "-data" keys use.
Result<std::string> DecodeBase64(const std::string& in);

}  // namespace meshwork::k8s
