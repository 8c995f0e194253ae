// Integrations: what a job's spec turns on beside the reconcile's own work, each behind this one
// interface and in a file of its own under integrations/: Kueue (the job's Workload, its queueing
// and its ResourceFlavors), and the gang backends of spec.runPolicy.schedulingPolicy.gangAdmission
// (Operator: the operator's scheduling gate; PodGroup, Volcano, Coscheduling: a PodGroup of that
// scheduler's API; None). The reconciler (reconciler.h) calls each integration of a job at fixed
// points of one reconcile: Observe before Decide, BeforeCreate before the plan's children are
// made, AfterApply once its Pods are created and deleted. Each declares the RBAC rules it needs
// (the Helm chart must grant them: integration_test checks), and a gang backend the Pods' marks,
// its PodGroup and the schedulingPolicy fields it owns.
//
// Adding a gang scheduler is one file under integrations/ plus its line in GangBackendFor
// (integrations/registry.cpp) and its GangAdmission value (spec.h).
#pragma once

#include <any>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/controller/gang.h"
#include "operator/k8s/informer.h"
#include "operator/k8s/object_api.h"

namespace meshwork::op {

struct ReconcileOutcome {
  bool ok = true;
  // When !ok: conflict | api | other (for the errors metric) and a message.
  std::string error_reason;
  std::string message;
  std::optional<std::chrono::seconds> requeue_after;
  std::string phase;  // the job's phase after this reconcile; "" when the job is gone
  bool invalid_spec = false;  // this reconcile failed the job with InvalidSpec
};

// A failed outcome for an API error `e` while doing `what`.
ReconcileOutcome Failed(const k8s::Error& e, const std::string& what);

// Whether `object` has an ownerReference with `uid`.
bool OwnedBy(const nlohmann::json& object, const std::string& uid);
// An object of the job's child's name that the job does not own: an error naming it (and its API
// version, `detail`, where the kind alone is ambiguous). Children are never taken over.
k8s::Error NotOwned(const std::string& kind, const nlohmann::json& object, const std::string& detail = "");

// What applying a plan found, for the status write and the Events.
struct Applied {
  bool all = false;                                   // every Pod of the plan was created
  std::vector<EventToRecord> events;                  // PodNameTaken, GangWaiting, GangAdmitted
  std::optional<std::chrono::seconds> requeue_after;  // look again this soon
  // The API server refused a Pod as invalid (422, 400): no retry can fix the spec that made it.
  std::optional<std::string> refused;
  std::optional<std::string> gang_waiting;  // the GangWaiting reason of `events`, remembered once recorded
  // Sets requeue_after to `after` unless it is already sooner.
  void RequeueWithin(std::chrono::seconds after) {
    if (!requeue_after || after < *requeue_after) requeue_after = after;
  }
};

// What the integrations share across reconciles, owned by the reconciler.
struct IntegrationShared {
  k8s::ObjectApi* api = nullptr;
  const k8s::Store* pods = nullptr;   // the job-labelled Pods' cache
  const k8s::Store* nodes = nullptr;  // the Nodes' cache (null: list them)
  const RoomLedger* room = nullptr;   // the room Pods take (null: list the Pods)
  std::string pods_namespace;         // where admission counts the Pods that take room ("" = all)
  std::mutex admission_mu;            // one gang admission at a time
  std::mutex mu;                      // gang_waiting
  std::map<std::string, std::string> gang_waiting;  // job key -> the GangWaiting reason last recorded
};

// One reconcile of one job, as the integrations see it.
struct ReconcileScope {
  IntegrationShared* shared = nullptr;
  std::string key;                   // "ns/name"
  const nlohmann::json* job = nullptr;  // as cached (the status is written on it)
  const Observed* in = nullptr;      // the job merged with its runtime, its Pods, the time
  const Result<JobSpec>* spec = nullptr;
  bool finished = false;             // Succeeded or Failed before this reconcile
  // An integration's own notes between its calls in this reconcile (Kueue: the Workload read).
  std::map<std::string, std::any> notes;
  const std::string& ns() const;
};

// An RBAC rule an integration needs, as a Role's rule says it: in the namespaces the operator
// watches, or cluster-wide (the chart's clusterScopedRules).
struct RbacRule {
  std::string api_group;  // "" for the core group
  std::string resource;
  std::vector<std::string> verbs;
  bool cluster_scoped = false;
};

class Integration {
 public:
  virtual ~Integration() = default;
  virtual std::string Name() const = 0;
  virtual std::vector<RbacRule> Rbac() const { return {}; }

  // Before Decide: what the decisions must know (Kueue: whether the job is queued, how many
  // replicas it was admitted with). A failed outcome ends the reconcile.
  virtual std::optional<ReconcileOutcome> Observe(ReconcileScope& scope, Observed* in) const {
    (void)scope, (void)in;
    return std::nullopt;
  }
  // Before the plan's children are made: what its Pods need first (a PodGroup), where they go
  // (Kueue's flavors), and their marks (a gang backend's, MarkPod).
  virtual std::optional<ReconcileOutcome> BeforeCreate(ReconcileScope& scope, Plan* plan) const {
    (void)scope, (void)plan;
    return std::nullopt;
  }
  // Once the plan's Pods are created and deleted (not for a plan that deletes the job): the gang
  // released (Operator), the Workload's status (Kueue). Events and requeues go to `applied`.
  virtual std::optional<ReconcileOutcome> AfterApply(ReconcileScope& scope, const Plan& plan, Applied* applied) const {
    (void)scope, (void)plan, (void)applied;
    return std::nullopt;
  }
};

// A gang backend (spec.runPolicy.schedulingPolicy.gangAdmission). Its own schedulingPolicy
// fields (Volcano's queue and priorityClass, Coscheduling's scheduleTimeoutSeconds) are parsed and
// refused under another backend by ParseSpec (spec.cpp), with the rest of the spec.
class GangBackend : public Integration {
 public:
  // Marks a Pod of job `name` as this backend's (a gate, a PodGroup's name, a scheduler).
  virtual void MarkPod(const JobSpec& spec, const std::string& name, nlohmann::json* pod) const {
    (void)spec, (void)name, (void)pod;
  }
  // Every backend's BeforeCreate marks the plan's Pods; backends override MoreBeforeCreate.
  std::optional<ReconcileOutcome> BeforeCreate(ReconcileScope& scope, Plan* plan) const final;

 protected:
  virtual std::optional<ReconcileOutcome> MoreBeforeCreate(ReconcileScope& scope, const Plan& plan) const {
    (void)scope, (void)plan;
    return std::nullopt;
  }
};

// The gang the plan runs: spec.replicas, or fewer (Plan::gang_replicas: an elastic job after a
// node loss).
JobSpec GangSpec(const JobSpec& spec, const Plan& plan);

// The backend of a GangAdmission value.
const GangBackend& GangBackendFor(GangAdmission admission);

// Kueue (integrations/kueue.cpp): for a job labelled with a LocalQueue.
const Integration& KueueIntegration();
// A job with spec.managedBy kueue.x-k8s.io/multikueue and a queue: its Workload, made once (this
// cluster's whole part in it).
std::optional<ReconcileOutcome> ReconcileForMultiKueue(k8s::ObjectApi* api, const std::string& key,
                                                       const nlohmann::json& job);

// The integrations a job uses, in the order the reconciler calls them: its gang backend (when the
// spec parses), then Kueue (when queued: also when the spec does not parse, so that a failed
// job's Workload is marked Finished).
std::vector<const Integration*> IntegrationsOf(const nlohmann::json& job, const Result<JobSpec>& spec);
// Every integration there is (RBAC check).
std::vector<const Integration*> AllIntegrations();

}  // namespace meshwork::op
