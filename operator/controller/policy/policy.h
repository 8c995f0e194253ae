// The lifecycle policies of a TrainingJob (docs/trainingjob.md, "Lifecycle"), one per file in
// this folder: each is a function of plain objects that has no opinion or returns a Decision.
// Decide (decide.cpp) runs them in a fixed order and applies their decisions to the Plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/controller/spec.h"

namespace meshwork::op::policy {

// A status condition to set (SetCondition: lastTransitionTime moves only when the value does).
struct ConditionChange {
  std::string type;
  std::string value;  // "True" or "False"
  std::string reason;
  std::string message;
};

// What one policy decided. A decision with a phase is final: Decide stops there. One without (a
// resume, a resize, a deadline still ahead) adjusts the plan, and the next policy decides.
struct Decision {
  std::string phase;                         // status.phase from now on; "" = an adjustment
  std::vector<ConditionChange> conditions;   // set in this order
  nlohmann::json status = nlohmann::json::object();  // top-level status fields to set; null removes one
  std::vector<PodView> remove;
  std::vector<nlohmann::json> create;
  bool ensure_service = false;
  bool ensure_config_map = false;
  bool ensure_pod_group = false;
  std::vector<EventToRecord> events;
  bool status_first = false;  // write the status before deleting anything
  std::optional<std::chrono::seconds> requeue_after;
  bool delete_job = false;
};

// What the policies after the spec check decide from. `status` is the plan's status as the
// policies before have left it (a resume or a resize starts a new generation there).
struct JobState {
  const Observed& in;
  const JobSpec& spec;
  const nlohmann::json& status;
  std::vector<PodView> pods;  // every Pod of the job, of any generation

  std::string name() const;            // metadata.name
  int64_t generation() const;          // status.restartGeneration: the gang that should run
  int64_t restarts() const;            // status.restarts: gang restarts after failures so far
  std::vector<PodView> Current() const;  // the Pods of that gang, with an index below replicas
  std::vector<int> Missing() const;      // replica indices without a Pod in that gang
};

// ---- Shared by Decide and the policies (policy.cpp).

// The one place a decision reaches the plan: conditions, status fields, phase (in status too),
// Pods, Events; a requeue never later than one asked for before.
void Apply(const Decision& d, Plan& plan, SystemTime now);
// The job ends: condition `type` (Succeeded or Failed) True, Running False, Restarting False if
// it was True, completionTime now, an Event, and the status written before any Pod is deleted.
Decision Finish(const nlohmann::json& status, const std::string& type, const std::string& reason,
                const std::string& message, SystemTime now);
// The Pods cleanPodPolicy removes once the job has finished (never one already terminating).
std::vector<PodView> Clean(CleanPodPolicy policy, const std::vector<PodView>& pods);
// The Pods a delete still has to reach: those not already being deleted, and those being deleted
// on a lost node (no kubelet will finish their graceful deletion; they are deleted at once).
std::vector<PodView> Deletable(const std::vector<PodView>& pods);
// Neither finished nor being deleted.
bool Active(const PodView& pod);
// status.replicas, readyReplicas, activeReplicas, succeededReplicas, failedReplicas and ready
// ("1/2") of the current gang.
nlohmann::json Counts(const JobState& job);
// A finished job's readyReplicas, activeReplicas and ready: its Pods (any gang) still running
// and not being removed, out of the `replicas` the status last showed. Its Pods only ever go
// away, so the counts fall with them (a Failed job showed 1/2 with one Pod left in Error).
// Empty when the status never had counts (a spec that failed before any gang).
nlohmann::json FinishedCounts(const nlohmann::json& status, const std::vector<PodView>& pods,
                              const std::vector<PodView>& removed);
// status.trainer from rank 0's report, rounded for `kubectl get` (tokens/s to 0.1, loss to 1e-4).
// The job's tokens/s is rank 0's times the world size: every rank processes the same batch.
nlohmann::json ReportJson(const TrainerReport& r, SystemTime now, int world_size);
// "42s", "3m05s", "2h07m": an ETA as a person reads it.
std::string FormatDuration(int64_t seconds);
// obj[key] when it is an integer, else `fallback`.
int64_t IntOr(const nlohmann::json& obj, const char* key, int64_t fallback);

// ---- The policies, in the order Decide runs them.

// finished.cpp: a job that has finished (status Succeeded or Failed) stays finished: nothing is
// created again, cleanPodPolicy still removes its Pods.
Decision Finished(const nlohmann::json& status, CleanPodPolicy clean, const std::vector<PodView>& pods);
// finished.cpp: ttlSecondsAfterFinished of `job` (read raw: a finished job's spec may no longer
// parse), counted from completionTime: delete the job once it has passed, else come back then.
// The reconcile that finishes a job passes may_delete false: its outcome is written first.
std::optional<Decision> Ttl(const nlohmann::json& job, const nlohmann::json& status, SystemTime now,
                            bool may_delete);
// node_loss.cpp: marks the Pods whose node is lost (PodView::node_lost): NotReady for
// spec.runPolicy.nodeLossGraceSeconds, or deleted. While a node of a rank is NotReady within its
// grace, an adjustment that looks again when the grace ends. Runs before the policies below.
std::optional<Decision> MarkNodeLoss(const Observed& in, const JobSpec& spec, std::vector<PodView>* pods);
// invalid_spec.cpp: a spec or trainer config the operator cannot run fails the job (InvalidSpec).
Decision InvalidSpec(const nlohmann::json& status, const std::vector<PodView>& pods, const std::string& message,
                     SystemTime now);
// suspend.cpp: runPolicy.suspend deletes the Pods; a resume starts a new gang.
std::optional<Decision> Suspend(const JobState& job);
std::optional<Decision> Resume(const JobState& job);
// deadline.cpp: activeDeadlineSeconds over the job's active time.
std::optional<Decision> Deadline(const JobState& job);
// resize.cpp: a gang whose shape (world size, mesh) is not the spec's: InvalidSpec with
// checkpoints on and no elasticPolicy, else a new gang (an elastic one's resize in status.elastic).
std::optional<Decision> ResizeWithCheckpoints(const JobState& job);
std::optional<Decision> Resize(const JobState& job);
// resize.cpp: status.elastic `elastic` with one more resize, from `from` to `to` replicas, by the
// gang of `generation` (reason "" for a change of spec.replicas, NodeLost for a shrink).
nlohmann::json WithResize(nlohmann::json elastic, int64_t from, int64_t to, int64_t generation,
                          const std::string& reason, SystemTime now);
// resize.cpp: the replicas an elastic job's gang runs at: spec.replicas, or fewer while nodes it
// lost with a gang (status.elastic.lostNodes, Failure's shrink) are not Ready again; `decision`
// ends the shrink (those nodes are back, with an ElasticGrow Event, or spec.replicas changed
// since). The reconciler looks the lost nodes up in Observed::unhealthy_nodes.
struct ElasticSize {
  int replicas = 1;
  std::optional<Decision> decision;
};
ElasticSize ElasticReplicas(const Observed& in, const JobSpec& spec, const nlohmann::json& status);
// resize.cpp: status.elastic of an elastic job (its range and size; the resizes Resize counts and
// the last one, which Launch completes with the step the new gang resumed from); none otherwise.
// `admitted`: the Pods Kueue admitted the job with (Observed::admitted_replicas), shown as
// status.elastic.admittedReplicas.
void RecordElastic(const JobSpec& spec, std::optional<int> admitted, nlohmann::json& status);
// stale_gang.cpp: Pods of an older gang, or beyond the replica count, go before anything starts.
std::optional<Decision> StaleGang(const JobState& job);
// success.cpp: every rank of the current gang exited 0 (successPolicy AllRanks), or rank 0's
// Pod did (Rank0).
std::optional<Decision> Success(const JobState& job);
// failure.cpp: a failed or deleted rank restarts the gang, up to backoffLimit, unless
// failurePolicy's rules, a disruption, restartPolicy or permanentExitCodes say otherwise.
std::optional<Decision> Failure(const JobState& job);
// launch.cpp: the trainer config cannot be read yet (`why`): the gang waits.
Decision AwaitConfig(const JobState& job, const std::string& why);
// launch.cpp: the job's TrainingRuntime cannot be read (`why`): nothing changes until it can; a
// job with no gang yet shows Running=False/RuntimeNotFound.
Decision AwaitRuntime(const nlohmann::json& status, const std::string& reason, const std::string& why);
// launch.cpp: the Service, the config and every missing rank; the gang's progress in the status.
Decision Launch(const JobState& job);

}  // namespace meshwork::op::policy
