// The audit log: request attributes as Kubernetes' authorizer names them, one JSON line each.
#include "controlplane/apiserver/audit_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file.h"

namespace meshwork::controlplane {

namespace {

std::vector<std::string> PathSegments(const std::string& path) {
  std::vector<std::string> segs;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) segs.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return segs;
}

// The router's reading of ?watch= (api_server.cpp).
bool WatchQuery(const HttpRequest& http) {
  if (!http.HasQuery("watch")) return false;
  std::string v = http.Query("watch");
  return v == "1" || v == "true" || v == "True";
}

}  // namespace

std::optional<RequestAttributes> ResourceRequestAttributes(const HttpRequest& http) {
  std::vector<std::string> segs = PathSegments(http.path);
  RequestAttributes a;
  size_t first;  // the first segment after the group/version
  if (segs.size() >= 3 && segs[0] == "api") {
    a.api_version = segs[1];
    first = 2;
  } else if (segs.size() >= 4 && segs[0] == "apis") {
    a.api_group = segs[1];
    a.api_version = segs[2];
    first = 3;
  } else {
    return std::nullopt;  // not under /api or /apis, or a discovery document
  }
  // The deprecated /watch/ prefix (kube-apiserver still accepts it; this server answers 404).
  bool watch_prefix = segs[first] == "watch";
  if (watch_prefix && ++first == segs.size()) return std::nullopt;
  std::vector<std::string> rest(segs.begin() + static_cast<long>(first), segs.end());
  // As the router: namespaces/<ns>/<resource>..., except a namespace's own subresources
  // (namespaces/<name>/status|finalize), which are cluster-scoped like the namespace.
  if (rest[0] == "namespaces" && rest.size() >= 3 &&
      !(rest.size() == 3 && (rest[2] == "status" || rest[2] == "finalize"))) {
    rest.erase(rest.begin());
    a.ns = rest[0];
    rest.erase(rest.begin());
  }
  a.resource = rest[0];
  if (rest.size() >= 2) a.name = rest[1];
  if (rest.size() >= 3) a.subresource = rest[2];

  const std::string& m = http.method;
  if (watch_prefix) {
    a.verb = "watch";
  } else if (m == "GET" || m == "HEAD") {
    a.verb = !a.name.empty() ? "get" : WatchQuery(http) ? "watch" : "list";
  } else if (m == "POST") {
    a.verb = "create";
  } else if (m == "PUT") {
    a.verb = "update";
  } else if (m == "PATCH") {
    a.verb = "patch";
  } else if (m == "DELETE") {
    a.verb = a.name.empty() ? "deletecollection" : "delete";
  } else {
    // Not an authorization verb; the router answers 405. Logged as sent, lower-cased.
    for (char c : m) a.verb += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return a;
}

Result<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return IOError("cannot open for appending: " + std::string(std::strerror(errno)));
  return std::unique_ptr<AuditLog>(new AuditLog(path, fd));
}

AuditLog::~AuditLog() { ::close(fd_); }

Status AuditLog::Record(const HttpRequest& http, int code) {
  std::optional<RequestAttributes> a = ResourceRequestAttributes(http);
  if (!a) return Status::Ok();
  // Field names of audit.k8s.io Event's objectRef, in a fixed order for people reading it.
  nlohmann::ordered_json line = {
      {"verb", a->verb},           {"apiGroup", a->api_group},
      {"apiVersion", a->api_version}, {"resource", a->resource},
      {"subresource", a->subresource}, {"namespace", a->ns},
      {"name", a->name},           {"userAgent", http.Header("user-agent")},
      {"code", code},              {"requestURI", http.raw_target}};
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  return WriteAll(fd_, text.data(), text.size(), "audit log " + path_);
}

}  // namespace meshwork::controlplane
