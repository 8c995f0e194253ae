// Resource addressing: which REST path serves a kind of object, for the built-ins the operator
// uses and for custom resources by group/version/plural; plus the query strings of list/watch.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/k8s/error.h"

namespace meshwork::k8s {

struct ResourceRef {
  std::string group;     // "" for the core group
  std::string version;   // "v1", "v1alpha1", ...
  std::string resource;  // lower-case plural: "pods", "trainingjobs"
  bool namespaced = true;

  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  bool operator==(const ResourceRef& o) const {
    return group == o.group && version == o.version && resource == o.resource && namespaced == o.namespaced;
  }
};

namespace resources {
ResourceRef Pods();
ResourceRef Services();
ResourceRef ConfigMaps();
ResourceRef Secrets();
ResourceRef Events();          // core/v1 events
ResourceRef Namespaces();      // cluster-scoped
ResourceRef Nodes();           // cluster-scoped
ResourceRef Leases();          // coordination.k8s.io/v1
ResourceRef CustomResourceDefinitions();  // apiextensions.k8s.io/v1, cluster-scoped
ResourceRef Custom(std::string group, std::string version, std::string plural, bool namespaced = true);
}  // namespace resources

// "/api/v1/namespaces/{ns}/pods/{name}/{subresource}", "/apis/{g}/{v}/{plural}", ...
// `ns` "" on a namespaced resource means all namespaces (only without a name); a cluster-scoped
// resource takes no namespace. Names and namespaces are checked (no '/', not "." or "..").
Result<std::string> ResourcePath(const ResourceRef& ref, const std::string& ns, const std::string& name = "",
                                 const std::string& subresource = "");

struct ListOptions {
  std::string label_selector;   // "app=x,tier!=db"
  std::string field_selector;   // "metadata.name=x,status.phase=Running"
  int64_t limit = 0;            // page size; 0 = no pagination
  std::string continue_token;   // from the previous page's metadata.continue
  std::string resource_version; // "" = most recent
  int timeout_seconds = 0;      // server-side limit; 0 = server default
};

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  bool allow_bookmarks = true;
  int timeout_seconds = 300;    // the server ends the stream after this; the caller re-watches
};

struct DeleteOptions {
  std::string propagation_policy;             // "Background", "Foreground", "Orphan"; "" = server default
  std::optional<int64_t> grace_period_seconds;
  std::string precondition_uid;               // delete only if the object still has this uid
  std::string precondition_resource_version; // ... and this resourceVersion
};

struct LogOptions {
  std::string container;          // required when the pod has several containers
  std::optional<int64_t> tail_lines;
  bool previous = false;          // the previous (crashed) instance's log
};

// Percent-encodes a query value (RFC 3986 unreserved characters pass through).
std::string UrlEncode(const std::string& s);
// "?labelSelector=...&limit=..." or "" when nothing is set.
std::string ListQuery(const ListOptions& o);
// "?watch=1&allowWatchBookmarks=true&resourceVersion=...&timeoutSeconds=..."
std::string WatchQuery(const WatchOptions& o, const std::string& resource_version);
std::string LogQuery(const LogOptions& o);
// The DeleteOptions body the API expects.
nlohmann::json DeleteBody(const DeleteOptions& o);

// "namespace/name", or "name" for a cluster-scoped object (client-go's MetaNamespaceKeyFunc).
std::string ObjectKey(const nlohmann::json& obj);
// Splits a key made by ObjectKey into namespace ("" if none) and name.
std::pair<std::string, std::string> SplitKey(const std::string& key);
// metadata.resourceVersion, or "".
std::string ResourceVersionOf(const nlohmann::json& obj);

}  // namespace meshwork::k8s
