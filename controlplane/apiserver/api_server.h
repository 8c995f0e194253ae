// The Kubernetes REST API layer of the local control plane (docs/controlplane.md): routing,
// discovery, generic CRUD with kube-apiserver's metadata semantics, the status subresource,
// CRDs and their custom resources, list/watch with selectors, deletion with finalizers, and
// pods/log. One handler function, HttpRequest in, HttpResponse out, so it is tested without
// sockets; the binary (main.cpp) puts it behind HttpServer.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/apiserver/audit_log.h"
#include "controlplane/apiserver/resources.h"
#include "controlplane/net/http_server.h"
#include "controlplane/store/store.h"
#include "common/status.h"

namespace meshwork::controlplane {

// Where pods/log finds a container's log (set by the node agent's controller).
struct PodLogSource {
  // (pod uid, container, previous) -> log file path, "" when there is none.
  std::function<std::string(const std::string&, const std::string&, bool)> path;
};

struct ApiServerOptions {
  std::string token;  // bearer token every request but /healthz, /livez, /readyz, /version needs;
                      // empty: no authentication (in-process tests)
  std::chrono::milliseconds bookmark_interval{5000};  // watch BOOKMARK cadence
  std::string server_address = "127.0.0.1";           // what /api reports
  // Where the API logs (bad requests are answered, not logged). Empty: stderr.
  std::function<void(const std::string&)> log;
  // Not owned; when set, every request on a resource is recorded with the code it was answered
  // (streams when they start), after it is handled.
  AuditLog* audit_log = nullptr;
};

// The outcome of an internal operation, as the API would answer it.
struct ApiError {
  int code = 500;
  std::string reason;   // "NotFound", "Conflict", "Invalid", ...
  std::string message;
  nlohmann::json details;  // Status.details, or null
};

template <class T>
struct ApiResult {
  std::optional<T> value;
  ApiError error;
  bool ok() const { return value.has_value(); }
};

struct DeleteOptions {
  std::optional<int> grace_period_seconds;
  std::string propagation_policy;  // "", Orphan, Background, Foreground
  std::string precondition_uid;
  std::string precondition_resource_version;
  bool dry_run = false;
};

class ApiServer {
 public:
  ApiServer(Store* store, ApiServerOptions options);
  ~ApiServer();

  // Creates the default namespaces when missing and loads the CRDs already in the store.
  Status Bootstrap();
  // The HTTP handler: every request gets a response; errors are Kubernetes Status objects.
  HttpResponse Handle(const HttpRequest& request);
  // Streams (watch, log follow) end promptly after this.
  void Shutdown();

  ResourceRegistry& registry() { return registry_; }
  Store& store() { return *store_; }
  void SetPodLogSource(PodLogSource source);
  // Whether a node agent runs pods: then a pod bound to a node is deleted gracefully (the agent
  // removes it once its processes are gone); without one, at once.
  void SetPodsHaveAgent(bool v) { pods_have_agent_ = v; }

  // The API's create, for controllers (the Deployment controller's pods): the same defaults,
  // validation and admission checks as a POST of `obj` to the collection in `ns`.
  ApiResult<nlohmann::json> CreateObject(const ResourceInfo& info, const std::string& ns,
                                         const nlohmann::json& obj);
  // The API's delete, for controllers (garbage collector, namespace cleanup).
  ApiResult<nlohmann::json> DeleteObject(const ResourceInfo& info, const std::string& ns,
                                         const std::string& name, const DeleteOptions& options);
  // Read-modify-write of one stored object with compare-and-swap retries; `mutate` returns
  // false to leave it unchanged. Removes the object when it is being deleted and its
  // finalizers become empty. Returns the stored result (or the removed object).
  ApiResult<nlohmann::json> Mutate(const std::string& key,
                                   const std::function<bool(nlohmann::json&)>& mutate);

  // Every resource (built-in and custom, storage version) for garbage collection.
  std::vector<ResourceInfo> AllStorageResources() const;

 private:
  struct Request;
  HttpResponse Route(const HttpRequest& http);
  HttpResponse HandleResource(const HttpRequest& http, Request& req);
  HttpResponse Get(Request& req);
  HttpResponse List(Request& req);
  HttpResponse Watch(Request& req);
  HttpResponse Create(Request& req);
  HttpResponse Update(Request& req, const nlohmann::json& body);
  HttpResponse Patch(Request& req);
  HttpResponse Delete(Request& req);
  HttpResponse DeleteCollection(Request& req);
  HttpResponse PodLog(Request& req);
  HttpResponse Scale(Request& req);

  ApiResult<nlohmann::json> UpdateObject(Request& req, nlohmann::json incoming);
  std::optional<ApiError> PrepareCreate(const ResourceInfo& info, nlohmann::json& obj);
  // `old` is the stored object on an update (x-kubernetes-validations transition rules).
  std::optional<ApiError> ValidateCustom(const ResourceInfo& info, nlohmann::json& obj,
                                         const nlohmann::json* old = nullptr);
  void AfterWrite(const ResourceInfo& info, const nlohmann::json& stored, bool removed);
  ApiResult<nlohmann::json> RemoveFromStore(const ResourceInfo& info, const std::string& key,
                                            uint64_t expected_revision);
  nlohmann::json ToVersion(const ResourceInfo& info, nlohmann::json obj) const;
  std::string NewUid();
  std::string RandomSuffix(size_t n);
  std::string AllocateClusterIp();
  void Log(const std::string& line);

  Store* store_;
  ApiServerOptions options_;
  ResourceRegistry registry_;
  PodLogSource pod_logs_;
  std::atomic<bool> pods_have_agent_{false};
  std::atomic<bool> shutting_down_{false};
  std::mutex random_mu_;
  uint64_t random_state_;
};

// RFC 3339 UTC with seconds ("2026-01-02T03:04:05Z").
std::string Rfc3339(std::chrono::system_clock::time_point t);
// A JSON response with the Status body for an error.
HttpResponse ErrorResponse(const ApiError& error);

}  // namespace meshwork::controlplane
