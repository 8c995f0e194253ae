#include "operator/controller/expectations.h"

namespace meshwork::op {

void Expectations::ExpectPod(const std::string& key, const std::string& pod_uid) {
  if (pod_uid.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  pods_[key][pod_uid] = std::chrono::steady_clock::now() + timeout_;
}

bool Expectations::PodsSeen(const std::string& key, const std::set<std::string>& seen_uids) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pods_.find(key);
  if (it == pods_.end()) return true;
  const auto now = std::chrono::steady_clock::now();
  for (auto e = it->second.begin(); e != it->second.end();) {
    // Seen, or given up on (deleted before the cache ever showed it, or a lost watch event
    // that the informer's relist will bring).
    if (seen_uids.count(e->first) || now >= e->second) {
      e = it->second.erase(e);
    } else {
      ++e;
    }
  }
  if (!it->second.empty()) return false;
  pods_.erase(it);
  return true;
}

void Expectations::WroteStatus(const std::string& key, const std::string& based_on) {
  std::lock_guard<std::mutex> lock(mu_);
  written_from_[key] = based_on;
}

bool Expectations::BehindOwnWrite(const std::string& key, const std::string& cached_rv) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = written_from_.find(key);
  if (it == written_from_.end()) return false;
  if (it->second == cached_rv) return true;
  written_from_.erase(it);  // the cache has moved on (our write, or a later one)
  return false;
}

void Expectations::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  pods_.erase(key);
  written_from_.erase(key);
}

}  // namespace meshwork::op
