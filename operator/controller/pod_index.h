// The index from a job to its Pods in the informer cache (the Pod informer keeps it).
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace meshwork::op {

// Job key ("ns/name") -> keys of the Pods labelled with it; kept by the Pod informer's handlers,
// so a reconcile looks at its own Pods and not at every Pod in the cache. Thread-safe.
class PodIndex {
 public:
  void Set(const std::string& job_key, const std::string& pod_key);
  void Remove(const std::string& job_key, const std::string& pod_key);
  std::set<std::string> Get(const std::string& job_key) const;
  // The job key of a Pod object ("" when it has no meshwork.dev/job label).
  static std::string JobKeyOf(const nlohmann::json& pod);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::set<std::string>> by_job_;
};

}  // namespace meshwork::op
