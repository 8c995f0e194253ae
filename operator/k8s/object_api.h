// The object calls of the Kubernetes API (get, list, create, update, update status, merge patch,
// delete, read a Pod's log) as an interface. k8s::Client implements it; code that makes only these calls (the
// reconciler) takes it, so that its tests run on an in-memory fake
// (tests/operator/k8s/fake_object_api.h), as client-go's kubernetes.Interface has its fake
// clientset.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "operator/k8s/error.h"
#include "operator/k8s/resource.h"

namespace meshwork::k8s {

class ObjectApi {
 public:
  virtual ~ObjectApi() = default;

  virtual Result<nlohmann::json> Get(const ResourceRef& ref, const std::string& ns, const std::string& name) = 0;
  // The namespace is `ns`, or the object's metadata.namespace when `ns` is "".
  virtual Result<nlohmann::json> Create(const ResourceRef& ref, const std::string& ns, const nlohmann::json& obj) = 0;
  // To metadata.name, with metadata.resourceVersion: a stale one answers Conflict.
  virtual Result<nlohmann::json> Update(const ResourceRef& ref, const std::string& ns, const nlohmann::json& obj) = 0;
  // Only the status is written.
  virtual Result<nlohmann::json> UpdateStatus(const ResourceRef& ref, const std::string& ns,
                                              const nlohmann::json& obj) = 0;
  // Every object of `ref` in `ns` ("" on a namespaced resource: all namespaces), as one List.
  virtual Result<nlohmann::json> List(const ResourceRef& ref, const std::string& ns, const ListOptions& opts) = 0;
  // RFC 7386 merge patch (a null deletes the key); `subresource` e.g. "status", "" for none.
  virtual Result<nlohmann::json> MergePatch(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                            const nlohmann::json& patch, const std::string& subresource) = 0;
  // Deleting what is not there answers NotFound; a failed precondition, Conflict.
  virtual Result<nlohmann::json> Delete(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                        const DeleteOptions& opts) = 0;
  virtual Result<std::string> GetLog(const std::string& ns, const std::string& pod, const LogOptions& opts) = 0;
};

}  // namespace meshwork::k8s
