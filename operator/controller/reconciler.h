// The executor of Decide(): observes one job and its children in the informers' caches (and
// scrapes rank 0's progress), decides once, then creates and deletes what the plan says, writes
// the status once and records the Events, in an order that is safe to interrupt at any point
// (docs/trainingjob.md, "How the operator reconciles"). What the job's spec turns on beside that
// (Kueue, its gang backend) is an integration (integration.h), called at fixed points. Idempotent: every name is deterministic,
// creates that find the object there and deletes that find it gone are fine, and the status is
// written with the cached resourceVersion, so a concurrent writer makes this attempt fail with
// Conflict and retry.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/controller/expectations.h"
#include "operator/controller/gang.h"
#include "operator/controller/integration.h"
#include "operator/controller/pod_index.h"
#include "operator/controller/training_runtime.h"
#include "operator/k8s/informer.h"
#include "operator/k8s/object_api.h"

namespace meshwork::op {

struct ReconcilerOptions {
  std::chrono::seconds report_interval{10};          // scrape rank 0 and requeue this often
  std::chrono::milliseconds scrape_timeout{1000};
  std::optional<int64_t> pod_delete_grace_seconds;  // nullopt = the Pod's own
  // How long a created Pod may stay unseen by the cache before the reconciler stops waiting.
  std::chrono::milliseconds expectation_timeout{30000};
  // Where gang admission counts the Pods that take capacity: the namespace the operator watches
  // ("" = all). Nodes are always listed cluster-wide.
  std::string pods_namespace;
};

struct ReconcilerHooks {
  // An Event about `job` (the involved object); must not block for long.
  std::function<void(const nlohmann::json& job, const EventToRecord& event)> record_event;
  std::function<void()> pod_created;
  std::function<void()> pod_deleted;
  std::function<void(const std::string& line)> log;
};


class Reconciler {
 public:
  // `api` (k8s::Client in the operator) makes every call beyond the caches; it and the caches
  // must outlive the reconciler.
  Reconciler(k8s::ObjectApi* api, const k8s::Store* jobs, const k8s::Store* pods, const k8s::Store* services,
             const PodIndex* index, ReconcilerOptions options, ReconcilerHooks hooks);

  // Gang admission reads the room the Pods take (not Succeeded or Failed, any owner) from this
  // ledger, kept by an informer one Pod event at a time, instead of listing the Pods on every
  // admission (a list per admission made a burst of 2,000 jobs quadratic; a copy of the cache
  // per admission still grew with the Pods). Unset: it lists.
  void SetRoomLedger(const RoomLedger* room) { shared_.room = room; }
  // The Nodes, kept by an informer: a rank on a node that is NotReady or gone is lost
  // (policy/node_loss.cpp), and gang admission reads their room from it. Unset: nodes are not
  // judged, and admission lists them.
  void SetNodes(const k8s::Store* nodes) { shared_.nodes = nodes; }

  ReconcileOutcome Reconcile(const std::string& key);
  // The nodes of `pods`, and `lost_nodes` (an elastic job's status.elastic.lostNodes), that are
  // not Ready or no longer exist (from SetNodes' cache).
  // A lost node counts as back once Ready for `back_after`, schedulable and untainted.
  std::map<std::string, NodeHealth> UnhealthyNodes(const std::vector<nlohmann::json>& pods,
                                                   const nlohmann::json& lost_nodes,
                                                   std::chrono::seconds back_after) const;
  // Forget per-job memory (last scrape time) of a deleted job.
  void Forget(const std::string& key);

 private:
  // Reconcile's work; Reconcile adds the ReconcileError Event.
  ReconcileOutcome ReconcileJob(const std::string& key);
  // The job's Pods in the cache: labelled with its name and owned by its `uid`. Their uids go to
  // `seen_uids`.
  std::vector<nlohmann::json> OwnedPods(const std::string& key, const std::string& uid,
                                        std::set<std::string>* seen_uids) const;
  // Rank 0's /metrics, at most once per report interval.
  std::optional<TrainerReport> Scrape(const std::string& key, const nlohmann::json& job, const JobSpec& spec,
                                      const std::vector<nlohmann::json>& pods);
  // Each carries out one part of a plan; nullopt when it went through, else the failed outcome.
  std::optional<ReconcileOutcome> DeleteJob(const std::string& key, const nlohmann::json& job);
  // The Service and ConfigMap the plan needs (children.h); then, after the integrations'
  // BeforeCreate, the rendezvous Secret and the plan's Pods.
  std::optional<ReconcileOutcome> CreateChildren(const std::string& key, const nlohmann::json& job,
                                                 const Result<JobSpec>& spec, const Plan& plan);
  std::optional<ReconcileOutcome> CreatePods(const std::string& key, const nlohmann::json& job, const Plan& plan,
                                             Applied* created);
  std::optional<ReconcileOutcome> DeletePods(const std::string& ns, const std::vector<PodView>& pods);
  // Records `events` (and logs them); an InvalidSpec one marks `out`.
  void RecordEvents(const std::string& key, const nlohmann::json& job, const std::vector<EventToRecord>& events,
                    ReconcileOutcome* out);
  // Writes `status` unless the cached job already has it.
  std::optional<ReconcileOutcome> WriteStatus(const std::string& key, const nlohmann::json& job,
                                              const nlohmann::json& status);
  void Log(const std::string& line) const;

  k8s::ObjectApi* api_;
  const k8s::Store* jobs_;
  const k8s::Store* pods_;
  const k8s::Store* services_;
  const PodIndex* index_;
  ReconcilerOptions options_;
  ReconcilerHooks hooks_;
  IntegrationShared shared_;  // what the integrations keep across reconciles (integration.h)
  Expectations expectations_;
  RuntimeCopies runtimes_;

  std::mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> last_scrape_;
};

}  // namespace meshwork::op
