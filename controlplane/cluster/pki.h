// The local cluster's certificates and keys (docs/cluster.md, "Credentials"): one CA,
// the API server's serving certificate, a client certificate per component, and the
// service-account signing key pair, made once with the openssl command and kept in a folder.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace meshwork::controlplane::cluster {

// A client identity: the API server reads the user from CN and the groups from O.
struct ClientIdentity {
  std::string file;                 // "admin" -> admin.crt, admin.key
  std::string common_name;          // "meshwork-admin"
  std::vector<std::string> groups;  // {"system:masters"}
};

// Makes what is missing under `dir` (created 0700): ca.{crt,key}; apiserver.{crt,key} for
// 127.0.0.1, localhost, the kubernetes Service's names and `api_ips` (the Service's address, the
// host's on the Pods' bridge); kubelet.{crt,key} for the node agent's kubelet API on 127.0.0.1;
// one pair per identity; sa.key and sa.pub. Files already there are kept, so a restart keeps its
// credentials, unless a certificate's names changed (another bridge address): that one is made again.
// Errors name the file and openssl's message.
Status EnsurePki(const std::string& dir, const std::vector<std::string>& api_ips,
                 const std::vector<ClientIdentity>& identities);

}  // namespace meshwork::controlplane::cluster
