// The reconciler's decisions as a pure function: from what the cache shows (the job, its Pods,
// its Service) and the time, compute what to create, what to delete, the status to write and
// the Events to record. Decide runs the lifecycle policies of docs/trainingjob.md ("Lifecycle"),
// one per file under policy/, in a fixed order; no I/O happens here beyond the two reads an
// Observed may offer, so every rule is unit-tested on plain JSON, and the executor
// (reconciler.h) stays thin.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/plan_choice.h"
#include "operator/controller/spec.h"

namespace meshwork::op {

using SystemTime = std::chrono::system_clock::time_point;

// RFC 3339 in UTC with whole seconds ("2026-11-21T07:30:00Z"), as metav1.Time.
std::string FormatTime(SystemTime t);
std::optional<SystemTime> ParseTime(const std::string& s);

// What rank 0 last reported on its /metrics (trainer_report.h scrapes it).
struct TrainerReport {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_second = 0;  // rank 0's; the job's is about world_size times this
  std::string mesh;  // "RxSxT" from meshwork_trainer_info's mesh label ("" when absent)
  // meshwork_trainer_resumed_from_step: the checkpoint's step the run resumed from (0: a fresh
  // start); absent from trainers older than the series.
  std::optional<int64_t> resumed_from_step;
  // The plan advice (trainer/train/plan_advice.h), once given: the hardware profile's achieved MFU
  // refitted to the measured steps, and the best plan's predicted speed over the running one's.
  std::optional<double> plan_fitted_mfu;
  std::optional<double> plan_predicted_speedup;
};

// The run's summary from rank 0's last log line (trainer_report.h parses it): the final loss and
// the run's mean throughput, all ranks' tokens.
struct FinalReport {
  double loss = 0;
  double tokens_per_second = 0;
  int64_t last_step = 0;  // the step the run ended at: its steps plus the step it resumed at (0: unknown)
};

// What checking the trainer config found: nothing, a problem that fails the job (InvalidSpec), or
// why it cannot be read yet (a ConfigMap that does not exist: the job waits).
struct ConfigCheck {
  std::optional<std::string> error;
  std::optional<std::string> wait;
  // status.pipeline of a config with pipeline stages (ValidateTrainerConfig), else null: the
  // gang about to start records it.
  nlohmann::json pipeline;
  // An elastic job's global batch (ValidateTrainerConfig), which its Pods are started with.
  int64_t global_batch_size = 0;
  // spec.mesh.auto: the whole plan chosen for the gang about to start (ChoosePlan).
  std::optional<AdmissionPlan> plan;
};

// One Pod as the decisions see it.
struct PodView {
  std::string name;
  std::string uid;
  int index = -1;           // meshwork.dev/replica-index, -1 when missing or malformed
  int64_t generation = -1;  // meshwork.dev/restart-generation, -1 when missing or malformed
  int64_t world_size = -1;  // meshwork.dev/world-size, -1 when missing or malformed
  std::string mesh;         // meshwork.dev/mesh, "" when missing
  std::string phase;        // Pending, Running, Succeeded, Failed, Unknown
  bool ready = false;
  bool terminating = false;              // has a deletionTimestamp
  std::string node;                      // spec.nodeName, "" while unscheduled
  // The Pod's node is lost (NotReady past spec.runPolicy.nodeLossGraceSeconds, or deleted): the
  // rank is gone whatever its phase says, and a delete must not wait for a kubelet (grace 0).
  // Set by Decide from Observed::unhealthy_nodes; node_lost_why says how, for messages.
  bool node_lost = false;
  std::string node_lost_why;
  std::optional<int> exit_code;          // the trainer container's, once terminated
  std::string reason;                    // why it ended or waits (OOMKilled, StartError, ...)
  std::string message;
  bool gang_gated = false;               // still behind the operator's gang gate (kGangGate)
  // The reason of a True DisruptionTarget condition (PreemptionByScheduler, EvictionByEvictionAPI,
  // DeletionByTaintManager, TerminationByKubelet): the Pod was stopped by the cluster, not by
  // its own failure. "" when there is none.
  std::string disruption;
  // Every condition that is True on the Pod: (type, reason). failurePolicy rules match these.
  std::vector<std::pair<std::string, std::string>> true_conditions;
  // What the Pod and its trainer container said about how it ended, one per line: the Pod's
  // reason and message, the container's terminated reason and message (with the container's
  // terminationMessagePolicy FallbackToLogsOnError, the tail of its log). failurePolicy's
  // onMessagePattern searches this; at most 4 KiB.
  std::string failure_text;
};
PodView ViewPod(const nlohmann::json& pod);

// A node one of the job's Pods is bound to that is not Ready, as the Node informer shows it.
struct NodeHealth {
  // No such Node in the operator's cache: deleted, or one so new that the cache has not shown it
  // yet. `since` is then when the Pod was bound to it: its ranks are lost once they have been
  // bound for the grace (at once when that time is unknown), so a new Node is never taken for a
  // deleted one.
  bool deleted = false;
  // Ready's status (False, or Unknown: the node lifecycle controller's mark of a kubelet that
  // stopped reporting), since its lastTransitionTime. A node without a readable Ready condition or
  // time is not judged (the node lifecycle controller always writes both).
  std::string ready;
  std::optional<SystemTime> since;
  std::string reason;  // Ready's reason, e.g. NodeStatusUnknown
};

struct Observed {
  nlohmann::json job;
  std::vector<nlohmann::json> pods;   // Pods labelled with the job's name, any generation
  // The nodes of `pods` that are not Ready or do not exist, by name (Ready ones are absent).
  std::map<std::string, NodeHealth> unhealthy_nodes;
  bool service_exists = false;
  // The trainer config is checked only when Pods are about to be created (an edit applies to the
  // next gang and must not fail a running one). The problem found by ValidateTrainerConfig (or a
  // missing ConfigMap key), when there is one: permanent, the job fails with InvalidSpec.
  std::optional<std::string> config_error;
  // Why the config cannot be read yet (a ConfigMap that does not exist): no Pods are created,
  // the job waits.
  std::optional<std::string> config_wait;
  // Why the job's TrainingRuntime (spec.runtimeRef) cannot be read: the job waits, its Pods
  // untouched (a running gang runs on), until it can.
  std::optional<std::string> runtime_wait;
  // RuntimeNotFound (it cannot be read), or RuntimeInvalid (merged under a running gang's spec it
  // makes a spec that does not parse: the gang runs on, no new one starts).
  std::string runtime_wait_reason = "RuntimeNotFound";
  // Why Kueue holds the job (its Workload is not admitted, or was evicted): the job is suspended
  // as with runPolicy.suspend, its Suspended condition saying this (reason Queued).
  std::optional<std::string> queued;
  // The Pods Kueue admitted the job's Workload with (podSetAssignments[0].count), when it is
  // admitted: an elastic job runs at most that many replicas (partial admission).
  std::optional<int> admitted_replicas;
  // An elastic job shrunk by a node loss: when the gang at spec.replicas fits the cluster's free
  // room now, without the lost nodes (the Operator gang backend's fit, the job's own Pods not
  // counted), what fits, for the ElasticGrow Event. The job then grows back without waiting for
  // its own nodes. Unset: no room, or a backend that cannot tell (PodGroup schedulers).
  std::optional<std::string> room_for_spec;
  // When set, makes the check (the reconciler's reads a ConfigMap) and its answer replaces the two
  // fields above. Decide calls it at most once, and only when it is about to create Pods.
  std::function<ConfigCheck()> check_config;
  std::optional<TrainerReport> report;
  // Rank 0's final log line. Decide calls it at most once, and only when the job has just
  // succeeded and has a status.trainer to complete (the reconciler's reads the Pod's log).
  std::function<std::optional<FinalReport>()> final_report;
  SystemTime now;
  std::chrono::seconds report_interval{10};  // requeue period while Pods run
};

struct EventToRecord {
  std::string type;  // Normal or Warning
  std::string reason;
  std::string message;
};

struct Plan {
  nlohmann::json status;                 // what status should be; written when it differs
  bool status_first = false;             // write status before deleting (a gang restart)
  bool ensure_service = false;
  bool ensure_config_map = false;
  bool ensure_pod_group = false;  // Pods of the gang are made: a PodGroup backend makes or sizes its PodGroup
  std::vector<nlohmann::json> create;    // Pods to create
  std::vector<PodView> remove;           // Pods to delete (by name, with their uid as precondition)
  std::vector<EventToRecord> events;
  std::optional<std::chrono::seconds> requeue_after;
  bool delete_job = false;               // ttlSecondsAfterFinished has passed
  std::string phase;                     // status.phase after this plan
  // The replicas of the gang that should run: spec.replicas, or fewer for an elastic job that
  // lost nodes (policy::ElasticReplicas). 0 when the spec does not parse. Gang admission and the
  // PodGroup size the gang by it.
  int gang_replicas = 0;
};

// Everything the reconciler does for one job, decided. The job must not be being deleted.
// `spec` is ParseSpec(in.job), parsed once by the caller; the first form parses it.
Plan Decide(const Observed& in);
Plan Decide(const Observed& in, const Result<JobSpec>& spec);

// The job's status conditions helper: sets `type` to `status` with reason and message;
// lastTransitionTime changes only when the status value does. Returns true if anything changed.
bool SetCondition(nlohmann::json& status, const std::string& type, const std::string& value,
                  const std::string& reason, const std::string& message, SystemTime now);
// True when condition `type` has status "True".
bool ConditionTrue(const nlohmann::json& status, const std::string& type);

}  // namespace meshwork::op
