#include "operator/controller/children.h"

#include <fstream>

#include "operator/controller/desired.h"
#include "operator/controller/integration.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

// 32 bytes from the kernel's generator as hex: the job's rendezvous token.
Result<std::string> RandomToken() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[32];
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return IOError("reading /dev/urandom failed");
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

}  // namespace

k8s::Error EnsureService(k8s::ObjectApi* api, const json& job, const JobSpec& spec) {
  const json want = DesiredService(job, spec);
  auto created = api->Create(k8s::resources::Services(), "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  auto have = api->Get(k8s::resources::Services(), want["metadata"]["namespace"], want["metadata"]["name"]);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("Service", *have);
  return k8s::Error::Ok();
}

k8s::Error EnsureConfigMap(k8s::ObjectApi* api, const json& job, const JobSpec& spec) {
  const json want = DesiredConfigMap(job, spec);
  auto created = api->Create(k8s::resources::ConfigMaps(), "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  const std::string ns = want["metadata"]["namespace"];
  auto have = api->Get(k8s::resources::ConfigMaps(), ns, want["metadata"]["name"]);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("ConfigMap", *have);
  if (have->value("data", json::object()) == want["data"]) return k8s::Error::Ok();
  json updated = *have;
  updated["data"] = want["data"];
  auto put = api->Update(k8s::resources::ConfigMaps(), ns, updated);
  return put.ok() ? k8s::Error::Ok() : put.error();
}

k8s::Error EnsureRendezvousSecret(k8s::ObjectApi* api, const json& job) {
  auto token = RandomToken();
  if (!token.ok()) return k8s::Error(k8s::ErrorKind::kInvalidConfig, token.status().message());
  const json want = DesiredRendezvousSecret(job, *token);
  auto created = api->Create(k8s::resources::Secrets(), "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  // Made for an earlier gang of this job (the token stays for the job's life), or not ours.
  const std::string ns = want["metadata"]["namespace"];
  const std::string name = want["metadata"]["name"];
  auto have = api->Get(k8s::resources::Secrets(), ns, name);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("Secret", *have);
  if (!have->value("data", json::object()).contains(kRendezvousTokenKey)) {
    return k8s::Error(k8s::ErrorKind::kInvalid, "Secret " + ns + "/" + name + " has no key '" + kRendezvousTokenKey +
                                                    "'; delete it and the operator makes a new one");
  }
  return k8s::Error::Ok();
}

}  // namespace meshwork::op
