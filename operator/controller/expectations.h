// What a reconcile must not decide on yet, as client-go's controllers keep it: the Pods this
// process created that the cache has not shown ("expectations": deciding before they appear would
// take them for deleted ones), and a status write the cache has not caught up with (deciding on
// the object it replaced would only end in a Conflict). Per job key; thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace meshwork::op {

class Expectations {
 public:
  explicit Expectations(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // A Pod of `key` created with `pod_uid`: expected in the cache until seen, or for the timeout.
  void ExpectPod(const std::string& key, const std::string& pod_uid);
  // Whether every Pod expected for `key` is among `seen_uids` (or was given up on).
  bool PodsSeen(const std::string& key, const std::set<std::string>& seen_uids);
  // The status of `key` was written over resourceVersion `based_on`.
  void WroteStatus(const std::string& key, const std::string& based_on);
  // Whether the cache still shows the object that write replaced (`cached_rv`).
  bool BehindOwnWrite(const std::string& key, const std::string& cached_rv);
  void Forget(const std::string& key);

 private:
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  // Job key -> uid of each Pod created and not yet seen -> when to stop waiting for it.
  std::map<std::string, std::map<std::string, std::chrono::steady_clock::time_point>> pods_;
  // Job key -> the resourceVersion our last status write replaced, until the cache shows another.
  std::map<std::string, std::string> written_from_;
};

}  // namespace meshwork::op
