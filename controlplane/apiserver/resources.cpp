// Built-in resource table, CRD-defined resources, discovery and /openapi/v3 documents.
#include "controlplane/apiserver/resources.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <set>

namespace meshwork::controlplane {
namespace {

using nlohmann::json;

const std::vector<std::string> kAllVerbs = {"create", "delete", "deletecollection", "get",
                                            "list",   "patch",  "update",           "watch"};

ResourceInfo MakeBuiltin(std::string group, std::string resource, std::string singular,
                         std::string kind, bool namespaced, std::vector<std::string> short_names,
                         std::vector<std::string> categories, bool status) {
  ResourceInfo r;
  r.group = std::move(group);
  r.version = "v1";
  r.resource = std::move(resource);
  r.singular = std::move(singular);
  r.kind = std::move(kind);
  r.list_kind = r.kind + "List";
  r.namespaced = namespaced;
  r.short_names = std::move(short_names);
  r.categories = std::move(categories);
  r.status_subresource = status;
  r.storage_version = "v1";
  return r;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

json ResourceEntry(const ResourceInfo& r) {
  json e = {{"name", r.resource},       {"singularName", r.singular}, {"namespaced", r.namespaced},
            {"kind", r.kind},           {"verbs", kAllVerbs}};
  if (!r.short_names.empty()) e["shortNames"] = r.short_names;
  if (!r.categories.empty()) e["categories"] = r.categories;
  return e;
}

json SubresourceEntry(const ResourceInfo& r, const std::string& sub, const std::string& kind,
                      std::vector<std::string> verbs, const std::string& group = "",
                      const std::string& version = "") {
  json e = {{"name", r.resource + "/" + sub}, {"singularName", ""}, {"namespaced", r.namespaced},
            {"kind", kind},                   {"verbs", verbs}};
  if (!group.empty()) {
    e["group"] = group;
    e["version"] = version;
  }
  return e;
}

std::string PascalGroup(const std::string& group) {
  if (group.empty()) return "Core";
  std::string out;
  bool up = true;
  for (char c : group) {
    if (c == '.' || c == '-') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out;
}

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

std::string CheckDns1123Label(const std::string& name) {
  const std::string rule =
      "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
      "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
      "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
  if (name.size() > 63) return "must be no more than 63 characters";
  if (name.empty() || !IsLowerAlnum(name.front()) || !IsLowerAlnum(name.back())) return rule;
  for (char c : name) {
    if (!IsLowerAlnum(c) && c != '-') return rule;
  }
  return "";
}

std::string CheckDns1123Subdomain(const std::string& name) {
  const std::string rule =
      "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
      "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
      "for validation is "
      "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
  if (name.size() > 253) return "must be no more than 253 characters";
  if (name.empty()) return rule;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    std::string label = name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (label.empty() || !IsLowerAlnum(label.front()) || !IsLowerAlnum(label.back())) return rule;
    for (char c : label) {
      if (!IsLowerAlnum(c) && c != '-') return rule;
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return "";
}

ResourceRegistry::ResourceRegistry() {
  builtins_ = {
      MakeBuiltin("", "namespaces", "namespace", "Namespace", false, {"ns"}, {}, true),
      MakeBuiltin("", "nodes", "node", "Node", false, {"no"}, {}, true),
      MakeBuiltin("", "pods", "pod", "Pod", true, {"po"}, {"all"}, true),
      MakeBuiltin("", "services", "service", "Service", true, {"svc"}, {"all"}, true),
      MakeBuiltin("", "configmaps", "configmap", "ConfigMap", true, {"cm"}, {}, false),
      MakeBuiltin("", "events", "event", "Event", true, {"ev"}, {}, false),
      MakeBuiltin("", "serviceaccounts", "serviceaccount", "ServiceAccount", true, {"sa"}, {}, false),
      MakeBuiltin("coordination.k8s.io", "leases", "lease", "Lease", true, {}, {}, false),
      // Stored and served, not enforced: the local control plane has one token with full access.
      MakeBuiltin("rbac.authorization.k8s.io", "roles", "role", "Role", true, {}, {}, false),
      MakeBuiltin("rbac.authorization.k8s.io", "rolebindings", "rolebinding", "RoleBinding", true, {}, {},
                  false),
      MakeBuiltin("rbac.authorization.k8s.io", "clusterroles", "clusterrole", "ClusterRole", false, {}, {},
                  false),
      MakeBuiltin("rbac.authorization.k8s.io", "clusterrolebindings", "clusterrolebinding",
                  "ClusterRoleBinding", false, {}, {}, false),
      MakeBuiltin("apps", "deployments", "deployment", "Deployment", true, {"deploy"}, {"all"}, true),
      MakeBuiltin("apiextensions.k8s.io", "customresourcedefinitions",
                  "customresourcedefinition", "CustomResourceDefinition", false, {"crd", "crds"},
                  {"api-extensions"}, true),
  };
  for (ResourceInfo& r : builtins_) {
    if (r.resource != "deployments") continue;
    // The Scale's status.selector is computed from spec.selector (api_server.cpp).
    r.scale_subresource = true;
    r.scale_spec_path = ".spec.replicas";
    r.scale_status_path = ".status.replicas";
  }
}

ResourceInfo ResourceRegistry::Builtin(const std::string& resource) const {
  for (const ResourceInfo& r : builtins_) {
    if (r.resource == resource) return r;
  }
  return {};
}

std::vector<ResourceInfo> ResourceRegistry::AllLocked() const {
  std::vector<ResourceInfo> all = builtins_;
  for (const auto& [name, list] : custom_) all.insert(all.end(), list.begin(), list.end());
  return all;
}

std::optional<ResourceInfo> ResourceRegistry::Find(const std::string& group,
                                                   const std::string& version,
                                                   const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ResourceInfo& r : AllLocked()) {
    if (r.group == group && r.version == version && r.resource == resource) return r;
  }
  return std::nullopt;
}

void ResourceRegistry::SetCustomResources(const std::string& crd_name, const json* crd) {
  std::vector<ResourceInfo> list;
  if (crd != nullptr) {
    const json& spec = (*crd)["spec"];
    const json& names = spec["names"];
    std::string storage;
    for (const json& v : spec.value("versions", json::array())) {
      if (v.value("storage", false)) storage = v.value("name", "");
    }
    for (const json& v : spec.value("versions", json::array())) {
      if (!v.value("served", false)) continue;
      ResourceInfo r;
      r.group = spec.value("group", "");
      r.version = v.value("name", "");
      r.resource = names.value("plural", "");
      r.kind = names.value("kind", "");
      r.singular = names.value("singular", Lower(r.kind));
      r.list_kind = names.value("listKind", r.kind + "List");
      r.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
      r.short_names = names.value("shortNames", std::vector<std::string>{});
      r.categories = names.value("categories", std::vector<std::string>{});
      const json subs = v.value("subresources", json::object());
      r.status_subresource = subs.contains("status");
      r.scale_subresource = subs.contains("scale") && subs["scale"].is_object();
      if (r.scale_subresource) {
        r.scale_spec_path = subs["scale"].value("specReplicasPath", "");
        r.scale_status_path = subs["scale"].value("statusReplicasPath", "");
        r.scale_selector_path = subs["scale"].value("labelSelectorPath", "");
        if (r.scale_spec_path.empty()) r.scale_subresource = false;
      }
      r.custom = true;
      r.crd_name = crd_name;
      if (v.contains("schema") && v["schema"].contains("openAPIV3Schema")) {
        r.schema = v["schema"]["openAPIV3Schema"];
      }
      r.columns = schema::ParsePrinterColumns(v);
      r.storage_version = storage;
      list.push_back(std::move(r));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (list.empty()) {
    custom_.erase(crd_name);
  } else {
    custom_[crd_name] = std::move(list);
  }
}

std::vector<ResourceInfo> ResourceRegistry::CustomResources(const std::string& crd_name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = custom_.find(crd_name);
  return it == custom_.end() ? std::vector<ResourceInfo>{} : it->second;
}

json ResourceRegistry::CoreVersions() const {
  return {{"kind", "APIVersions"},
          {"versions", {"v1"}},
          {"serverAddressByClientCIDRs",
           json::array({{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1"}}})}};
}

json ResourceRegistry::Groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  // group -> versions in first-seen order, preferred = storage version when served.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> versions;
  std::map<std::string, std::string> preferred;
  for (const ResourceInfo& r : AllLocked()) {
    if (r.group.empty()) continue;
    if (!versions.count(r.group)) order.push_back(r.group);
    auto& vs = versions[r.group];
    if (std::find(vs.begin(), vs.end(), r.version) == vs.end()) vs.push_back(r.version);
    if (r.version == r.storage_version || !preferred.count(r.group)) preferred[r.group] = r.version;
  }
  json groups = json::array();
  for (const std::string& g : order) {
    json vs = json::array();
    for (const std::string& v : versions[g]) vs.push_back({{"groupVersion", g + "/" + v}, {"version", v}});
    groups.push_back({{"name", g},
                      {"versions", vs},
                      {"preferredVersion",
                       {{"groupVersion", g + "/" + preferred[g]}, {"version", preferred[g]}}}});
  }
  return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}};
}

std::optional<json> ResourceRegistry::ResourceList(const std::string& group,
                                                   const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  json resources = json::array();
  bool found = false;
  for (const ResourceInfo& r : AllLocked()) {
    if (r.group != group || r.version != version) continue;
    found = true;
    resources.push_back(ResourceEntry(r));
    if (r.status_subresource) {
      resources.push_back(SubresourceEntry(r, "status", r.kind, {"get", "patch", "update"}));
    }
    if (r.scale_subresource) {
      resources.push_back(SubresourceEntry(r, "scale", "Scale", {"get", "patch", "update"},
                                           "autoscaling", "v1"));
    }
    if (r.resource == "pods" && r.group.empty()) {
      resources.push_back(SubresourceEntry(r, "log", "Pod", {"get"}));
    }
  }
  if (!found) return std::nullopt;
  return json{{"kind", "APIResourceList"},
              {"apiVersion", "v1"},
              {"groupVersion", group.empty() ? version : group + "/" + version},
              {"resources", resources}};
}

std::optional<json> ResourceRegistry::OpenApiV3Document(const std::string& path) const {
  // path: "api/v1" or "apis/<group>/<version>"
  std::string group, version;
  if (path == "api/v1") {
    version = "v1";
  } else if (path.rfind("apis/", 0) == 0) {
    std::string rest = path.substr(5);
    auto slash = rest.find('/');
    if (slash == std::string::npos) return std::nullopt;
    group = rest.substr(0, slash);
    version = rest.substr(slash + 1);
  } else {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mu_);
  json paths = json::object();
  bool found = false;
  for (const ResourceInfo& r : AllLocked()) {
    if (r.group != group || r.version != version) continue;
    found = true;
    std::string base = group.empty() ? "/api/v1" : "/apis/" + group + "/" + version;
    std::string item = base + (r.namespaced ? "/namespaces/{namespace}/" : "/") + r.resource + "/{name}";
    std::string op = "patch" + PascalGroup(group) +
                     static_cast<char>(std::toupper(static_cast<unsigned char>(version[0]))) +
                     version.substr(1) + (r.namespaced ? "Namespaced" : "") + r.kind;
    // A PATCH with the kind's x-kubernetes-group-version-kind and a fieldValidation parameter is
    // what kubectl looks for to learn that the server validates fields (then it skips client-side
    // schema validation). No request body is listed, so kubectl builds patches without a schema.
    json params = json::array({{{"name", "fieldValidation"},
                                {"in", "query"},
                                {"schema", {{"type", "string"}, {"uniqueItems", true}}}}});
    paths[item] = {
        {"parameters", params},
        {"patch",
         {{"operationId", op},
          {"parameters", params},
          {"responses", {{"200", {{"description", "OK"}}}}},
          {"x-kubernetes-action", "patch"},
          {"x-kubernetes-group-version-kind",
           {{"group", group}, {"version", version}, {"kind", r.kind}}}}}};
  }
  if (!found) return std::nullopt;
  return json{{"openapi", "3.0.0"},
              {"info", {{"title", "Kubernetes"}, {"version", "meshwork-controlplane"}}},
              {"paths", paths},
              {"components", {{"schemas", json::object()}}}};
}

json ResourceRegistry::OpenApiV3Index() const {
  std::set<std::string> gvs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ResourceInfo& r : AllLocked()) {
      gvs.insert(r.group.empty() ? "api/v1" : "apis/" + r.group + "/" + r.version);
    }
  }
  json paths = json::object();
  for (const std::string& gv : gvs) {
    auto doc = OpenApiV3Document(gv);
    size_t hash = std::hash<std::string>()(doc ? doc->dump() : "");
    char buf[32];
    snprintf(buf, sizeof(buf), "%016zX", hash);
    paths[gv] = {{"serverRelativeURL", "/openapi/v3/" + gv + "?hash=" + buf}};
  }
  return {{"paths", paths}};
}

std::vector<schema::FieldCause> ValidateCrd(json& crd) {
  std::vector<schema::FieldCause> causes;
  auto add = [&](const std::string& reason, const std::string& field, const std::string& msg) {
    causes.push_back({reason, field, msg});
  };
  auto required = [&](const std::string& field) { add("FieldValueRequired", field, "Required value"); };
  auto invalid = [&](const std::string& field, const json& value, const std::string& why) {
    add("FieldValueInvalid", field, "Invalid value: " + value.dump() + ": " + why);
  };
  if (!crd.contains("spec") || !crd["spec"].is_object()) {
    required("spec");
    return causes;
  }
  json& spec = crd["spec"];
  std::string group = spec.value("group", "");
  if (group.empty()) {
    required("spec.group");
  } else if (group.find('.') == std::string::npos) {
    invalid("spec.group", group, "should be a domain with at least one dot");
  } else if (std::string m = CheckDns1123Subdomain(group); !m.empty()) {
    invalid("spec.group", group, m);
  }
  if (!spec.contains("names") || !spec["names"].is_object()) {
    required("spec.names");
    return causes;
  }
  json& names = spec["names"];
  std::string plural = names.value("plural", "");
  std::string kind = names.value("kind", "");
  if (plural.empty()) {
    required("spec.names.plural");
  } else if (std::string m = CheckDns1123Label(plural); !m.empty()) {
    invalid("spec.names.plural", plural, m);
  }
  if (kind.empty()) required("spec.names.kind");
  if (!names.contains("singular")) names["singular"] = Lower(kind);
  if (!names.contains("listKind")) names["listKind"] = kind + "List";
  std::string name = crd.contains("metadata") ? crd["metadata"].value("name", "") : "";
  if (!plural.empty() && !group.empty() && name != plural + "." + group) {
    invalid("metadata.name", name, "must be spec.names.plural+\".\"+spec.group");
  }
  std::string scope = spec.value("scope", "");
  if (scope != "Namespaced" && scope != "Cluster") {
    add("FieldValueNotSupported", "spec.scope",
        "Unsupported value: " + json(scope).dump() + ": supported values: \"Cluster\", \"Namespaced\"");
  }
  if (!spec.contains("versions") || !spec["versions"].is_array() || spec["versions"].empty()) {
    add("FieldValueInvalid", "spec.versions", "Invalid value: null: must have exactly one version marked as storage version");
    return causes;
  }
  int storage = 0;
  std::set<std::string> seen;
  for (size_t i = 0; i < spec["versions"].size(); ++i) {
    json& v = spec["versions"][i];
    std::string at = "spec.versions[" + std::to_string(i) + "]";
    if (!v.is_object()) {
      invalid(at, v, "must be an object");
      continue;
    }
    std::string vname = v.value("name", "");
    if (vname.empty()) {
      required(at + ".name");
    } else if (std::string m = CheckDns1123Label(vname); !m.empty()) {
      invalid(at + ".name", vname, m);
    } else if (!seen.insert(vname).second) {
      add("FieldValueDuplicate", at + ".name", "Duplicate value: " + json(vname).dump());
    }
    if (!v.contains("served") || !v["served"].is_boolean()) required(at + ".served");
    if (!v.contains("storage") || !v["storage"].is_boolean()) required(at + ".storage");
    if (v.value("storage", false)) ++storage;
    const json* s = nullptr;
    if (v.contains("schema") && v["schema"].is_object() && v["schema"].contains("openAPIV3Schema")) {
      s = &v["schema"]["openAPIV3Schema"];
    }
    if (s == nullptr) {
      required(at + ".schema.openAPIV3Schema");
    } else {
      for (auto& c : schema::CheckSchema(*s, at + ".schema.openAPIV3Schema")) causes.push_back(c);
    }
    if (v.contains("additionalPrinterColumns")) {
      const json& cols = v["additionalPrinterColumns"];
      if (!cols.is_array()) {
        invalid(at + ".additionalPrinterColumns", cols, "must be a list");
      } else {
        for (size_t c = 0; c < cols.size(); ++c) {
          std::string cat = at + ".additionalPrinterColumns[" + std::to_string(c) + "]";
          if (!cols[c].is_object() || cols[c].value("name", "").empty()) {
            required(cat + ".name");
            continue;
          }
          std::string path = cols[c].value("jsonPath", "");
          if (path.empty()) {
            required(cat + ".jsonPath");
          } else if (std::string m = schema::CheckJsonPath(path); !m.empty()) {
            invalid(cat + ".jsonPath", path, m);
          }
          std::string type = cols[c].value("type", "");
          static const std::set<std::string> kTypes = {"integer", "number", "string", "boolean", "date"};
          if (!kTypes.count(type)) {
            add("FieldValueNotSupported", cat + ".type",
                "Unsupported value: " + json(type).dump() +
                    ": supported values: \"boolean\", \"date\", \"integer\", \"number\", \"string\"");
          }
        }
      }
    }
  }
  if (storage != 1) {
    invalid("spec.versions", json(storage), "must have exactly one version marked as storage version");
  }
  return causes;
}

}  // namespace meshwork::controlplane
