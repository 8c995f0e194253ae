// The resource types the control plane serves: the built-in kinds and the ones each CRD adds,
// with what discovery (/api, /apis, APIResourceList) and /openapi/v3 say about them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/schema/openapi.h"
#include "controlplane/schema/printer_columns.h"

namespace meshwork::controlplane {

struct ResourceInfo {
  std::string group;     // "" for core
  std::string version;   // served version
  std::string resource;  // plural, lower case
  std::string singular;
  std::string kind;
  std::string list_kind;
  bool namespaced = true;
  std::vector<std::string> short_names;
  std::vector<std::string> categories;
  bool status_subresource = false;
  bool scale_subresource = false;
  // The scale subresource's paths (".spec.replicas", ".status.replicas", ".status.selector").
  std::string scale_spec_path;
  std::string scale_status_path;
  std::string scale_selector_path;
  // Custom resources only: the CRD's name, the schema and columns of this version, the storage
  // version (objects are kept with its apiVersion and converted with strategy None).
  bool custom = false;
  std::string crd_name;
  nlohmann::json schema;
  std::vector<schema::PrinterColumn> columns;
  std::string storage_version;

  std::string GroupVersion() const { return group.empty() ? version : group + "/" + version; }
  // Store key prefix part: "pods", "leases.coordination.k8s.io", "trainingjobs.meshwork.dev".
  std::string StoreResource() const { return group.empty() ? resource : resource + "." + group; }
  // "TrainingJob.meshwork.dev" / "Pod": what Status messages call the kind.
  std::string QualifiedKind() const { return group.empty() ? kind : kind + "." + group; }
  std::string QualifiedResource() const { return group.empty() ? resource : resource + "." + group; }
};

// Built-ins plus CRD-defined resources; thread-safe. CRD changes swap in at once.
class ResourceRegistry {
 public:
  ResourceRegistry();

  // The resource served at group/version/plural, if any.
  std::optional<ResourceInfo> Find(const std::string& group, const std::string& version,
                                   const std::string& resource) const;
  // Replaces every resource of CRD `crd_name` by those its spec defines (none when `crd` is
  // null: the CRD is gone).
  void SetCustomResources(const std::string& crd_name, const nlohmann::json* crd);
  // Every resource (all versions) of a CRD, for deleting its objects.
  std::vector<ResourceInfo> CustomResources(const std::string& crd_name) const;

  // Discovery documents.
  nlohmann::json CoreVersions() const;                 // /api
  nlohmann::json Groups() const;                       // /apis
  std::optional<nlohmann::json> ResourceList(const std::string& group,
                                             const std::string& version) const;
  // /openapi/v3 (index) and /openapi/v3/<api/v1|apis/g/v> (a minimal document that tells
  // kubectl which kinds exist and that the server validates fields itself).
  nlohmann::json OpenApiV3Index() const;
  std::optional<nlohmann::json> OpenApiV3Document(const std::string& path) const;

  // ResourceInfo for any built-in resource by plural (used by controllers).
  ResourceInfo Builtin(const std::string& resource) const;
  // Every built-in resource (fixed at construction).
  const std::vector<ResourceInfo>& Builtins() const { return builtins_; }

 private:
  std::vector<ResourceInfo> AllLocked() const;

  mutable std::mutex mu_;
  std::vector<ResourceInfo> builtins_;
  std::map<std::string, std::vector<ResourceInfo>> custom_;  // CRD name -> its served versions
};

// Whether `crd` (a CustomResourceDefinition) is well formed; empty = fine. Causes carry the field
// path and message as kube-apiserver words them. Fills in defaulted names (singular, listKind).
std::vector<schema::FieldCause> ValidateCrd(nlohmann::json& crd);

// Kubernetes name rules; each returns "" when valid, else kube-apiserver's message.
std::string CheckDns1123Subdomain(const std::string& name);  // most object names
std::string CheckDns1123Label(const std::string& name);      // namespaces, services

}  // namespace meshwork::controlplane
