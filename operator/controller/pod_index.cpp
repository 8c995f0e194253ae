#include "operator/controller/pod_index.h"

#include "operator/controller/spec.h"

namespace meshwork::op {

using nlohmann::json;

void PodIndex::Set(const std::string& job_key, const std::string& pod_key) {
  std::lock_guard<std::mutex> lock(mu_);
  by_job_[job_key].insert(pod_key);
}

void PodIndex::Remove(const std::string& job_key, const std::string& pod_key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_job_.find(job_key);
  if (it == by_job_.end()) return;
  it->second.erase(pod_key);
  if (it->second.empty()) by_job_.erase(it);
}

std::set<std::string> PodIndex::Get(const std::string& job_key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_job_.find(job_key);
  return it == by_job_.end() ? std::set<std::string>() : it->second;
}

std::string PodIndex::JobKeyOf(const json& pod) {
  const json& meta = pod.contains("metadata") ? pod["metadata"] : json::object();
  const json labels = meta.value("labels", json::object());
  if (!labels.is_object() || !labels.contains(kJobLabel) || !labels[kJobLabel].is_string()) return "";
  return meta.value("namespace", "default") + "/" + labels[kJobLabel].get<std::string>();
}

}  // namespace meshwork::op
