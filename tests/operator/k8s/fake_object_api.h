// An in-memory k8s::ObjectApi for tests, in the way of client-go's fake clientset: objects by
// resource, namespace and name. A create fills in uid and resourceVersion (and answers
// AlreadyExists for a taken name), every write bumps the resourceVersion, an update or status
// write with a stale one answers Conflict, and so does a delete whose uid precondition fails.
// Every call is recorded ("create pods ml/tiny-0"), and the next call of a verb on a resource can
// be made to fail. Test-only; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/k8s/object_api.h"

namespace meshwork::k8s::testing {

class FakeObjectApi : public ObjectApi {
 public:
  // Stores `obj` as it is (metadata.namespace and name must be set); not recorded as a call.
  void Add(const ResourceRef& ref, nlohmann::json obj) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto& meta = obj["metadata"];
    objects_[{ref.resource, meta.value("namespace", ""), meta.value("name", "")}] = std::move(obj);
  }
  std::optional<nlohmann::json> Find(const ResourceRef& ref, const std::string& ns, const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find({ref.resource, ns, name});
    if (it == objects_.end()) return std::nullopt;
    return it->second;
  }
  // The log GetLog answers for `pod` (NotFound when none is set).
  void SetLog(const std::string& ns, const std::string& pod, std::string text) {
    std::lock_guard<std::mutex> lock(mu_);
    logs_[{ns, pod}] = std::move(text);
  }
  // The next call of `verb` (get, create, update, update-status, delete, log) on `resource`
  // answers `error`.
  void FailNext(const std::string& verb, const std::string& resource, Error error) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[{verb, resource}] = std::move(error);
  }
  // From now on a status write keeps the object's resourceVersion, as kube-apiserver does for an
  // update it finds equal to what it stores (after pruning, say, a null the writer sent).
  void StatusWritesKeepTheVersion() {
    std::lock_guard<std::mutex> lock(mu_);
    status_writes_keep_version_ = true;
  }
  // "verb resource ns/name", in order.
  std::vector<std::string> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  void ClearCalls() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }

  Result<nlohmann::json> Get(const ResourceRef& ref, const std::string& ns, const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto e = Call("get", ref.resource, ns, name)) return *e;
    auto it = objects_.find({ref.resource, ns, name});
    if (it == objects_.end()) return NotFound(ref, name);
    return it->second;
  }

  Result<nlohmann::json> Create(const ResourceRef& ref, const std::string& ns, const nlohmann::json& obj) override {
    std::lock_guard<std::mutex> lock(mu_);
    nlohmann::json made = obj;
    auto& meta = made["metadata"];
    const std::string where = ns.empty() ? meta.value("namespace", "") : ns;
    const std::string name = meta.value("name", "");
    if (auto e = Call("create", ref.resource, where, name)) return *e;
    if (objects_.count({ref.resource, where, name})) {
      return Error(ErrorKind::kAlreadyExists, ref.resource + " \"" + name + "\" already exists").set_http_code(409);
    }
    meta["namespace"] = where;
    meta["uid"] = "uid-" + ref.resource + "-" + name + "-" + std::to_string(++serial_);
    meta["resourceVersion"] = std::to_string(++serial_);
    objects_[{ref.resource, where, name}] = made;
    return made;
  }

  Result<nlohmann::json> Update(const ResourceRef& ref, const std::string& ns, const nlohmann::json& obj) override {
    return Write("update", ref, ns, obj, /*status_only=*/false);
  }

  Result<nlohmann::json> UpdateStatus(const ResourceRef& ref, const std::string& ns,
                                      const nlohmann::json& obj) override {
    return Write("update-status", ref, ns, obj, /*status_only=*/true);
  }

  Result<nlohmann::json> Delete(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                const DeleteOptions& opts) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto e = Call("delete", ref.resource, ns, name)) return *e;
    auto it = objects_.find({ref.resource, ns, name});
    if (it == objects_.end()) return NotFound(ref, name);
    if (!opts.precondition_uid.empty() && it->second["metadata"].value("uid", "") != opts.precondition_uid) {
      return Error(ErrorKind::kConflict, "precondition failed: uid " + opts.precondition_uid).set_http_code(409);
    }
    nlohmann::json gone = it->second;
    objects_.erase(it);
    return gone;
  }

  Result<nlohmann::json> List(const ResourceRef& ref, const std::string& ns, const ListOptions&) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto e = Call("list", ref.resource, ns, "")) return *e;
    nlohmann::json items = nlohmann::json::array();
    for (const auto& [key, obj] : objects_) {
      if (std::get<0>(key) == ref.resource && (ns.empty() || std::get<1>(key) == ns)) items.push_back(obj);
    }
    return nlohmann::json{{"kind", "List"}, {"items", items}};
  }

  Result<nlohmann::json> MergePatch(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                    const nlohmann::json& patch, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto e = Call("patch", ref.resource, ns, name)) return *e;
    auto it = objects_.find({ref.resource, ns, name});
    if (it == objects_.end()) return NotFound(ref, name);
    it->second.merge_patch(patch);
    it->second["metadata"]["resourceVersion"] = std::to_string(++serial_);
    return it->second;
  }

  Result<std::string> GetLog(const std::string& ns, const std::string& pod, const LogOptions& opts) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto e = Call("log", "pods", ns, pod)) return *e;
    auto it = logs_.find({ns, pod});
    if (it == logs_.end()) return Error(ErrorKind::kNotFound, "no log of pod " + pod).set_http_code(404);
    return it->second;
  }

 private:
  using Key = std::tuple<std::string, std::string, std::string>;  // resource, namespace, name

  // Records the call; the error it was made to fail with, if any. mu_ held.
  std::optional<Error> Call(const std::string& verb, const std::string& resource, const std::string& ns,
                            const std::string& name) {
    calls_.push_back(verb + " " + resource + " " + ns + "/" + name);
    auto it = failures_.find({verb, resource});
    if (it == failures_.end()) return std::nullopt;
    Error e = it->second;
    failures_.erase(it);
    return e;
  }

  static Error NotFound(const ResourceRef& ref, const std::string& name) {
    return Error(ErrorKind::kNotFound, ref.resource + " \"" + name + "\" not found").set_http_code(404);
  }

  Result<nlohmann::json> Write(const std::string& verb, const ResourceRef& ref, const std::string& ns,
                               const nlohmann::json& obj, bool status_only) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string name = obj["metadata"].value("name", "");
    if (auto e = Call(verb, ref.resource, ns, name)) return *e;
    auto it = objects_.find({ref.resource, ns, name});
    if (it == objects_.end()) return NotFound(ref, name);
    const std::string rv = obj["metadata"].value("resourceVersion", "");
    if (!rv.empty() && rv != it->second["metadata"].value("resourceVersion", "")) {
      return Error(ErrorKind::kConflict, "the object has been modified").set_http_code(409);
    }
    nlohmann::json next = status_only ? it->second : obj;
    if (status_only) next["status"] = obj.value("status", nlohmann::json::object());
    if (!(status_only && status_writes_keep_version_)) next["metadata"]["resourceVersion"] = std::to_string(++serial_);
    it->second = next;
    return next;
  }

  mutable std::mutex mu_;
  std::map<Key, nlohmann::json> objects_;
  std::map<std::pair<std::string, std::string>, std::string> logs_;
  std::map<std::pair<std::string, std::string>, Error> failures_;
  std::vector<std::string> calls_;
  int64_t serial_ = 0;
  bool status_writes_keep_version_ = false;
};

}  // namespace meshwork::k8s::testing
