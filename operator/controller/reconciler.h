// The executor of Decide(): observes one job and its children in the informers' caches (and
// scrapes rank 0's progress), decides once, then creates and deletes what the plan says, writes
// the status once and records the Events, in an order that is safe to interrupt at any point
// (docs/trainingjob.md, "How the operator reconciles"). Idempotent: every name is deterministic,
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
#include "operator/controller/gang.h"
#include "operator/k8s/informer.h"
#include "operator/k8s/object_api.h"

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
  // `api` (k8s::Client in the operator) makes every call beyond the caches; it and the caches
  // must outlive the reconciler.
  Reconciler(k8s::ObjectApi* api, const k8s::Store* jobs, const k8s::Store* pods, const k8s::Store* services,
             const PodIndex* index, ReconcilerOptions options, ReconcilerHooks hooks);

  // Gang admission reads the room the Pods take (not Succeeded or Failed, any owner) from this
  // ledger, kept by an informer one Pod event at a time, instead of listing the Pods on every
  // admission (a list per admission made a burst of 2,000 jobs quadratic; a copy of the cache
  // per admission still grew with the Pods). Unset: it lists.
  void SetRoomLedger(const RoomLedger* room) { room_ = room; }
  // The Nodes, kept by an informer: a rank on a node that is NotReady or gone is lost
  // (policy/node_loss.cpp), and gang admission reads their room from it. Unset: nodes are not
  // judged, and admission lists them.
  void SetNodes(const k8s::Store* nodes) { nodes_ = nodes; }

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
  // What creating the plan's children found, for the status write and the Events.
  struct Created {
    bool all = false;                                   // every Pod of the plan was created
    std::vector<EventToRecord> events;                  // PodNameTaken
    std::optional<std::chrono::seconds> requeue_after;  // a Pod name is still taken
    // The API server refused a Pod as invalid (422, 400): no retry can fix the spec that made it.
    std::optional<std::string> refused;
    std::optional<std::string> gang_waiting;  // the GangWaiting reason of `events`, remembered once recorded
  };

  // The job's Pods in the cache: labelled with its name and owned by its `uid`. Their uids go to
  // `seen_uids`.
  std::vector<nlohmann::json> OwnedPods(const std::string& key, const std::string& uid,
                                        std::set<std::string>* seen_uids) const;
  std::optional<TrainerReport> Scrape(const std::string& key, const nlohmann::json& job, const JobSpec& spec,
                                      const std::vector<nlohmann::json>& pods);
  // The reads Decide makes only when a decision needs them.
  ConfigCheck CheckConfig(const std::string& key, const nlohmann::json& job, const JobSpec& spec);
  std::optional<FinalReport> ReadFinalReport(const nlohmann::json& job);
  // Each carries out one part of a plan; nullopt when it went through, else the failed outcome.
  std::optional<ReconcileOutcome> DeleteJob(const std::string& key, const nlohmann::json& job);
  std::optional<ReconcileOutcome> CreateChildren(const std::string& key, const nlohmann::json& job,
                                                 const Result<JobSpec>& spec, const Plan& plan, Created* created);
  std::optional<ReconcileOutcome> DeletePods(const std::string& ns, const std::vector<PodView>& pods);
  // Gang admission (gang.h): once every Pod of the current gang is in the cache, all behind the
  // gang gate, releases them together if they fit, else says why in `created` (an Event, once per
  // reason) and asks to look again.
  std::optional<ReconcileOutcome> AdmitGang(const std::string& key, const nlohmann::json& job, const JobSpec& spec,
                                            const std::vector<nlohmann::json>& pods, Created* created);
  // Records `events` (and logs them); an InvalidSpec one marks `out`.
  void RecordEvents(const std::string& key, const nlohmann::json& job, const std::vector<EventToRecord>& events,
                    ReconcileOutcome* out);
  // Writes `status` unless the cached job already has it.
  std::optional<ReconcileOutcome> WriteStatus(const std::string& key, const nlohmann::json& job,
                                              const nlohmann::json& status);
  // The job's headless Service and its inline config's ConfigMap: made, or kept in step with the
  // spec when the job owns them; one of the same name that it does not own is an error naming it
  // (never taken over: a user's ConfigMap is not overwritten, a foreign Service would leave the
  // ranks' names unresolved).
  k8s::Error EnsureService(const nlohmann::json& job, const JobSpec& spec);
  k8s::Error EnsureConfigMap(const nlohmann::json& job, const JobSpec& spec);
  // Creates the job's PodGroup, or sets its minCount to the gang's size; one of the same name
  // that the job does not own is an error, not taken over.
  k8s::Error EnsurePodGroup(const nlohmann::json& job, const JobSpec& spec);
  // Creates the rendezvous Secret with a fresh random token, once; a Secret of that name that
  // the job does not own, or that has no token, is an error naming it (never taken over).
  k8s::Error EnsureRendezvousSecret(const nlohmann::json& job);
  // Creates the job's Kueue Workload (kueue.h, DesiredWorkload) for the spec merged with its
  // runtime, with the priority of its class; an error (a missing class, no Kueue API) fails.
  std::optional<ReconcileOutcome> CreateWorkload(const std::string& key, const nlohmann::json& job,
                                                 const nlohmann::json& merged, const JobSpec& spec, int64_t generation);
  // A job with spec.managedBy kueue.x-k8s.io/multikueue and a queue: its Workload, made once.
  std::optional<ReconcileOutcome> ReconcileForMultiKueue(const std::string& key, const nlohmann::json& job);
  // Puts the Pods about to be created on the ResourceFlavors Kueue admitted the job's Workload
  // on (kueue.h, PlaceOnFlavors); an unreadable flavor or a conflict fails the reconcile.
  std::optional<ReconcileOutcome> PlaceOnAdmittedFlavors(const std::string& key, const nlohmann::json& workload,
                                                         std::vector<nlohmann::json>* pods);
  void Log(const std::string& line) const;
  bool CacheBehindOwnWrite(const std::string& key, const std::string& cached_rv);
  void WroteStatus(const std::string& key, const std::string& based_on_rv);
  void Expect(const std::string& key, const std::string& pod_uid);
  bool ExpectationsMet(const std::string& key, const std::set<std::string>& seen_uids);

  k8s::ObjectApi* api_;
  const k8s::Store* jobs_;
  const k8s::Store* pods_;
  const k8s::Store* services_;
  const RoomLedger* room_ = nullptr;
  const k8s::Store* nodes_ = nullptr;
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
  // One gang admitted at a time, so two never count the same free room.
  std::mutex admission_mu_;
  std::map<std::string, std::string> gang_waiting_;  // job key -> the last reason given
  // Job key -> the TrainingRuntime its spec was last merged with (job uid, runtime name, the
  // object): a runtime deleted under a job leaves the job this copy to go on with, in this
  // process (a restarted operator has none, and the job waits).
  struct RuntimeCopy {
    std::string job_uid, name, read_at;
    nlohmann::json runtime;
  };
  std::mutex runtimes_mu_;
  std::map<std::string, RuntimeCopy> last_runtime_;
};

}  // namespace meshwork::op
