// The executor of Decide(): reads one job and its children from the informers' caches, checks
// the trainer config, scrapes rank 0's progress, then creates, deletes and writes what the plan
// says, in an order that is safe to interrupt at any point (docs/trainingjob.md, "How the
// operator reconciles"). Idempotent: every name is deterministic, creates that find the object
// there and deletes that find it gone are fine, and the status is written with the cached
// resourceVersion, so a concurrent writer makes this attempt fail with Conflict and retry.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/k8s/client.h"
#include "operator/k8s/informer.h"

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

struct ReconcilerOptions {
  std::chrono::seconds report_interval{10};          // scrape rank 0 and requeue this often
  std::chrono::milliseconds scrape_timeout{1000};
  std::optional<int64_t> pod_delete_grace_seconds;  // nullopt = the Pod's own
  // How long a created Pod may stay unseen by the cache before the reconciler stops waiting.
  std::chrono::milliseconds expectation_timeout{30000};
};

struct ReconcilerHooks {
  // An Event about `job` (the involved object); must not block for long.
  std::function<void(const nlohmann::json& job, const EventToRecord& event)> record_event;
  std::function<void()> pod_created;
  std::function<void()> pod_deleted;
  std::function<void(const std::string& line)> log;
};

struct ReconcileOutcome {
  bool ok = true;
  // When !ok: conflict | api | other (for the errors metric) and a message.
  std::string error_reason;
  std::string message;
  std::optional<std::chrono::seconds> requeue_after;
  std::string phase;  // the job's phase after this reconcile; "" when the job is gone
  bool invalid_spec = false;  // this reconcile failed the job with InvalidSpec
};

class Reconciler {
 public:
  Reconciler(k8s::Client* client, const k8s::Store* jobs, const k8s::Store* pods, const k8s::Store* services,
             const PodIndex* index, ReconcilerOptions options, ReconcilerHooks hooks);

  ReconcileOutcome Reconcile(const std::string& key);
  // Forget per-job memory (last scrape time) of a deleted job.
  void Forget(const std::string& key);

 private:
  std::optional<std::string> ConfigProblem(const nlohmann::json& job, const JobSpec* spec, bool* retry_later,
                                           std::string* wait_msg);
  std::optional<TrainerReport> Scrape(const std::string& key, const nlohmann::json& job, const JobSpec& spec,
                                      const std::vector<nlohmann::json>& pods);
  k8s::Error EnsureService(const nlohmann::json& job, const JobSpec& spec);
  k8s::Error EnsureConfigMap(const nlohmann::json& job, const JobSpec& spec);
  void Log(const std::string& line) const;
  bool CacheBehindOwnWrite(const std::string& key, const std::string& cached_rv);
  void WroteStatus(const std::string& key, const std::string& based_on_rv);
  void Expect(const std::string& key, const std::string& pod_uid);
  bool ExpectationsMet(const std::string& key, const std::set<std::string>& seen_uids);

  k8s::Client* client_;
  const k8s::Store* jobs_;
  const k8s::Store* pods_;
  const k8s::Store* services_;
  const PodIndex* index_;
  ReconcilerOptions options_;
  ReconcilerHooks hooks_;

  std::mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> last_scrape_;
  // Job key -> the resourceVersion our last status write replaced, until the cache shows another.
  std::map<std::string, std::string> written_from_;
  // Job key -> uid of each Pod created by this process and not yet seen in the cache -> when
  // to stop waiting for it.
  std::map<std::string, std::map<std::string, std::chrono::steady_clock::time_point>> expected_;
};

}  // namespace meshwork::op
