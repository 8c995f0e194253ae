// The audit log of the local control plane (--audit-log, docs/controlplane.md "Audit log"): one
// JSON line per resource request answered, with the request's authorization attributes, so that
// tests can check a chart's RBAC against the calls a client really makes (RBAC is not enforced).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "controlplane/net/http_server.h"
#include "common/status.h"

namespace meshwork::controlplane {

// What Kubernetes' authorizer would be asked about a request (its RequestInfo), read from the
// method, path and query alone, as the router splits paths:
// /api/<v>/ or /apis/<group>/<v>/, then [namespaces/<ns>/]<resource>[/<name>[/<subresource>]].
struct RequestAttributes {
  std::string verb;         // get list watch create update patch delete deletecollection
  std::string api_group;    // "" for the core group
  std::string api_version;  // "v1", "v1alpha1" (without the group)
  std::string resource;     // plural: "pods"
  std::string subresource;  // "status", "log", "scale", or ""
  std::string ns;           // "" for cluster-scoped resources and all-namespace collections
  std::string name;         // "" for collections
};

// The attributes of a request on a resource; nullopt for everything else (health checks,
// /version, /openapi, discovery documents under /api and /apis).
std::optional<RequestAttributes> ResourceRequestAttributes(const HttpRequest& http);

// An append-only JSON Lines file. Record is thread-safe; each line is written with one write(2)
// on a file opened O_APPEND, so it reaches the file before the call returns.
class AuditLog {
 public:
  // Opens (creates, mode 0600) `path` for appending.
  static Result<std::unique_ptr<AuditLog>> Open(const std::string& path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends the line for `http` answered with `code`; does nothing for a request that is not on
  // a resource. An error says why the line could not be written.
  Status Record(const HttpRequest& http, int code);

  const std::string& path() const { return path_; }

 private:
  AuditLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  std::mutex mu_;
  int fd_;
};

}  // namespace meshwork::controlplane
