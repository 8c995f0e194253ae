// The Kubernetes REST client: typed calls over cpprestsdk, with timeouts, a bounded retry for
// connection errors and 429 (respecting Retry-After), and streaming watch. Objects travel as
// nlohmann::json; errors come back as k8s::Error (see error.h). Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/k8s/config.h"
#include "operator/k8s/error.h"
#include "operator/k8s/object_api.h"
#include "operator/k8s/resource.h"
#include "operator/k8s/watch.h"

namespace meshwork::k8s {

struct ClientOptions {
  std::chrono::milliseconds request_timeout{30000};  // per attempt, every non-watch request
  int max_retries = 3;                               // extra attempts after connection errors / 429
  std::chrono::milliseconds retry_backoff{100};      // first wait after a connection error; doubles
  std::chrono::seconds max_retry_after{10};          // cap on an honoured Retry-After
  std::string user_agent = "meshwork-operator/0.1";
  // A client-side limit (client-go's QPS and Burst): each attempt and each watch start takes a
  // token from a bucket refilled at `qps` a second and holding `burst` (<= 0: 1.5 x qps, at
  // least 1), and waits for it. qps <= 0: no limit, the default, as controller-runtime's since
  // v0.21 (the API server's Priority and Fairness protects it).
  double qps = 0;
  int burst = 0;
  // Called after a request waited for its token, with the seconds it waited (outside any lock).
  std::function<void(double)> on_throttled;
};

// Called for every watch event; return false to end the watch (Watch then returns OK).
using WatchHandler = std::function<bool(const WatchEvent&)>;

class Client : public ObjectApi {
 public:
  // Checks the config (server URL, PEMs) and builds the client; no request is made.
  static Result<std::unique_ptr<Client>> FromConfig(Config config, ClientOptions options = {});
  ~Client() override;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Config& config() const;

  Result<nlohmann::json> Get(const ResourceRef& ref, const std::string& ns, const std::string& name) override;
  // One page. metadata.continue of the answer names the next page ("" at the end).
  Result<nlohmann::json> ListPage(const ResourceRef& ref, const std::string& ns, const ListOptions& opts = {});
  // Every page (opts.limit is the page size; 0 = one request), items concatenated into one List
  // whose metadata.resourceVersion is the last page's. Items get apiVersion/kind filled in. If a
  // continue token expires (410), lists again without pagination, as client-go's pager does.
  Result<nlohmann::json> List(const ResourceRef& ref, const std::string& ns, const ListOptions& opts = {}) override;
  // POST. The namespace is `ns`, or the object's metadata.namespace when `ns` is "".
  Result<nlohmann::json> Create(const ResourceRef& ref, const std::string& ns, const nlohmann::json& obj) override;
  // PUT to metadata.name. Carries metadata.resourceVersion: a stale one answers Conflict.
  Result<nlohmann::json> Update(const ResourceRef& ref, const std::string& ns, const nlohmann::json& obj) override;
  // PUT .../status: only the status is written.
  Result<nlohmann::json> UpdateStatus(const ResourceRef& ref, const std::string& ns,
                                      const nlohmann::json& obj) override;
  // POST to a subresource of one object, e.g. serviceaccounts/{name}/token (a TokenRequest).
  Result<nlohmann::json> CreateSubresource(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                           const std::string& subresource, const nlohmann::json& body);
  // PATCH with application/merge-patch+json (RFC 7386); `subresource` e.g. "status".
  Result<nlohmann::json> MergePatch(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                    const nlohmann::json& patch, const std::string& subresource = "") override;
  // DELETE; the answer is the object (still there with a deletionTimestamp, e.g. finalizers) or a
  // Status. Deleting what is not there answers NotFound.
  Result<nlohmann::json> Delete(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                const DeleteOptions& opts = {}) override;
  // GET pods/{name}/log as text.
  Result<std::string> GetLog(const std::string& ns, const std::string& pod, const LogOptions& opts = {}) override;

  // Streams events of `ref` in `ns` ("" = all namespaces for namespaced kinds) from
  // `resource_version` ("" = the server's choice: synthetic ADDED events for what exists),
  // calling `handler` for each as soon as its line arrives, until one of:
  //  - the server ends the stream (timeoutSeconds): returns OK; the caller re-watches from the
  //    last resourceVersion it saw;
  //  - the handler returns false: OK;
  //  - `cancel` is cancelled (from any thread): kCancelled, promptly;
  //  - an ERROR event (delivered to the handler first): its error, e.g. kGone for 410;
  //  - an HTTP error (410 -> kGone) or a broken connection (kUnavailable).
  // The watch is not retried here; Informer does that.
  Error Watch(const ResourceRef& ref, const std::string& ns, const std::string& resource_version,
              const WatchOptions& opts, const WatchHandler& handler, const CancelToken& cancel = CancelToken());

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshwork::k8s
