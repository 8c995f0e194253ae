// REST paths and query strings (see resource.h).
#include "operator/k8s/resource.h"

namespace meshwork::k8s {

namespace resources {
ResourceRef Pods() { return {"", "v1", "pods", true}; }
ResourceRef Nodes() { return {"", "v1", "nodes", false}; }
ResourceRef Services() { return {"", "v1", "services", true}; }
ResourceRef ConfigMaps() { return {"", "v1", "configmaps", true}; }
ResourceRef Secrets() { return {"", "v1", "secrets", true}; }
ResourceRef Events() { return {"", "v1", "events", true}; }
ResourceRef Namespaces() { return {"", "v1", "namespaces", false}; }
ResourceRef Leases() { return {"coordination.k8s.io", "v1", "leases", true}; }
ResourceRef CustomResourceDefinitions() { return {"apiextensions.k8s.io", "v1", "customresourcedefinitions", false}; }
ResourceRef Custom(std::string group, std::string version, std::string plural, bool namespaced) {
  return {std::move(group), std::move(version), std::move(plural), namespaced};
}
}  // namespace resources

namespace {

Error BadArg(std::string m) { return Error(ErrorKind::kBadRequest, std::move(m)); }

// A path segment must be non-empty, have no '/', '?', '#' or '%' and not be "." or "..".
Error CheckSegment(const char* what, const std::string& v) {
  if (v.empty()) return BadArg(std::string(what) + " is empty");
  if (v == "." || v == ".." || v.find_first_of("/?#% ") != std::string::npos) {
    return BadArg(std::string(what) + " \"" + v + "\" is not a valid path segment");
  }
  return Error::Ok();
}

}  // namespace

Result<std::string> ResourcePath(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                 const std::string& subresource) {
  MW_RETURN_IF_ERROR(CheckSegment("resource version", ref.version));
  MW_RETURN_IF_ERROR(CheckSegment("resource plural", ref.resource));
  if (!ref.group.empty()) MW_RETURN_IF_ERROR(CheckSegment("resource group", ref.group));
  std::string path = ref.group.empty() ? "/api/" + ref.version : "/apis/" + ref.group + "/" + ref.version;
  if (ref.namespaced) {
    if (!ns.empty()) {
      MW_RETURN_IF_ERROR(CheckSegment("namespace", ns));
      path += "/namespaces/" + ns;
    } else if (!name.empty()) {
      return BadArg("namespace is required to address " + ref.resource + " \"" + name + "\"");
    }
  } else if (!ns.empty()) {
    return BadArg(ref.resource + " are cluster-scoped; got namespace \"" + ns + "\"");
  }
  path += "/" + ref.resource;
  if (!name.empty()) {
    MW_RETURN_IF_ERROR(CheckSegment("name", name));
    path += "/" + name;
  }
  if (!subresource.empty()) {
    if (name.empty()) return BadArg("subresource \"" + subresource + "\" needs an object name");
    MW_RETURN_IF_ERROR(CheckSegment("subresource", subresource));
    path += "/" + subresource;
  }
  return path;
}

std::string UrlEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

namespace {
void Param(std::string* q, const char* key, const std::string& value) {
  if (value.empty()) return;
  *q += (q->empty() ? "?" : "&");
  *q += key;
  *q += "=" + UrlEncode(value);
}
}  // namespace

std::string ListQuery(const ListOptions& o) {
  std::string q;
  Param(&q, "labelSelector", o.label_selector);
  Param(&q, "fieldSelector", o.field_selector);
  if (o.limit > 0) Param(&q, "limit", std::to_string(o.limit));
  Param(&q, "continue", o.continue_token);
  Param(&q, "resourceVersion", o.resource_version);
  if (o.timeout_seconds > 0) Param(&q, "timeoutSeconds", std::to_string(o.timeout_seconds));
  return q;
}

std::string WatchQuery(const WatchOptions& o, const std::string& resource_version) {
  std::string q = "?watch=1";
  if (o.allow_bookmarks) q += "&allowWatchBookmarks=true";
  Param(&q, "resourceVersion", resource_version);
  if (o.timeout_seconds > 0) Param(&q, "timeoutSeconds", std::to_string(o.timeout_seconds));
  Param(&q, "labelSelector", o.label_selector);
  Param(&q, "fieldSelector", o.field_selector);
  return q;
}

std::string LogQuery(const LogOptions& o) {
  std::string q;
  Param(&q, "container", o.container);
  if (o.tail_lines) Param(&q, "tailLines", std::to_string(*o.tail_lines));
  if (o.previous) Param(&q, "previous", "true");
  return q;
}

nlohmann::json DeleteBody(const DeleteOptions& o) {
  nlohmann::json b = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (!o.propagation_policy.empty()) b["propagationPolicy"] = o.propagation_policy;
  if (o.grace_period_seconds) b["gracePeriodSeconds"] = *o.grace_period_seconds;
  if (!o.precondition_uid.empty()) b["preconditions"]["uid"] = o.precondition_uid;
  if (!o.precondition_resource_version.empty()) {
    b["preconditions"]["resourceVersion"] = o.precondition_resource_version;
  }
  return b;
}

namespace {
std::string MetaString(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto m = obj.find("metadata");
  if (m == obj.end() || !m->is_object()) return "";
  auto v = m->find(key);
  if (v == m->end() || !v->is_string()) return "";
  return v->get<std::string>();
}
}  // namespace

std::string ObjectKey(const nlohmann::json& obj) {
  std::string ns = MetaString(obj, "namespace");
  std::string name = MetaString(obj, "name");
  return ns.empty() ? name : ns + "/" + name;
}

std::pair<std::string, std::string> SplitKey(const std::string& key) {
  size_t slash = key.find('/');
  if (slash == std::string::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

std::string ResourceVersionOf(const nlohmann::json& obj) { return MetaString(obj, "resourceVersion"); }

}  // namespace meshwork::k8s
