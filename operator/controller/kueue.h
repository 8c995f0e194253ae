// Kueue (kueue.sigs.k8s.io) as the queue of TrainingJobs: the operator is Kueue's integration for
// its own kind, as Kueue's job framework is for batch Jobs ("external framework",
// `integrations.externalFrameworks: [TrainingJob.v1alpha1.meshwork.dev]` in Kueue's
// configuration). A job labelled kueue.x-k8s.io/queue-name gets a Workload (one pod set, the
// gang: count = replicas, the trainer Pod's template and requests; an elastic job's minCount =
// minReplicas, so that Kueue may admit it smaller) owned by it; the job is held,
// as if suspended, until Kueue admits that Workload; an eviction (preemption, deactivation) stops
// the gang, then clears the Workload's admission so that Kueue can queue it again; a finished job
// marks its Workload Finished (docs/trainingjob.md, "Kueue").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "operator/controller/decide.h"
#include "operator/controller/spec.h"
#include "operator/k8s/resource.h"

namespace meshwork::op {

inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";
inline constexpr const char* kKueueJobUidLabel = "kueue.x-k8s.io/job-uid";
inline constexpr const char* kKueuePriorityClassLabel = "kueue.x-k8s.io/priority-class";
// Topology-aware scheduling (Kueue's TAS): the Pod template's annotations that ask for it, and
// what an admitted gang's Pods carry so that Kueue's topology ungater finds them, puts each on its
// domain (a nodeSelector) and lifts its gate.
inline constexpr const char* kKueueRequiredTopology = "kueue.x-k8s.io/podset-required-topology";
inline constexpr const char* kKueuePreferredTopology = "kueue.x-k8s.io/podset-preferred-topology";
inline constexpr const char* kKueueUnconstrainedTopology = "kueue.x-k8s.io/podset-unconstrained-topology";
inline constexpr const char* kKueueTopologyGate = "kueue.x-k8s.io/topology";
inline constexpr const char* kKueuePodSetLabel = "kueue.x-k8s.io/podset";
inline constexpr const char* kKueueWorkloadAnnotation = "kueue.x-k8s.io/workload";
inline constexpr const char* kKueuePodSetName = "trainer";
inline constexpr const char* kKueueApiVersion = "kueue.x-k8s.io/v1beta2";

// kueue.x-k8s.io/v1beta2 workloads, and resourceflavors (cluster-scoped).
k8s::ResourceRef KueueWorkloads();
k8s::ResourceRef KueueResourceFlavors();
// kueue.x-k8s.io/v1beta2 workloadpriorityclasses and scheduling.k8s.io/v1 priorityclasses (both
// cluster-scoped).
k8s::ResourceRef KueueWorkloadPriorityClasses();
k8s::ResourceRef PriorityClasses();

// The priority class a job's Workload takes, as Kueue's own integrations choose it: the
// WorkloadPriorityClass the job's label kueue.x-k8s.io/priority-class names, else the
// PriorityClass of the trainer Pod's priorityClassName (`pod`, as DesiredPod makes it), else none
// (null). {group, kind, name}, the Workload's spec.priorityClassRef.
nlohmann::json WorkloadPriorityClassRef(const nlohmann::json& job, const nlohmann::json& pod);

// The LocalQueue the job names in its kueue.x-k8s.io/queue-name label, "" when none (the job is
// not Kueue's).
std::string KueueQueue(const nlohmann::json& job);

// MultiKueue: the manager a job names in spec.managedBy to be run in a worker cluster; the
// label MultiKueue puts on that worker-cluster copy, naming the Workload it made for it there.
inline constexpr const char* kMultiKueueManager = "kueue.x-k8s.io/multikueue";
inline constexpr const char* kKueuePrebuiltWorkloadLabel = "kueue.x-k8s.io/prebuilt-workload-name";

// The Workload a job's label kueue.x-k8s.io/prebuilt-workload-name names, "" when none.
std::string PrebuiltWorkload(const nlohmann::json& job);

// The Workload of a job: its prebuilt one when labelled so, else "trainingjob-<name>".
std::string WorkloadName(const nlohmann::json& job);

// The job's Workload: queueName, one pod set "trainer" of `replicas` Pods whose template is
// `pod` (a Pod DesiredPod made) without what only a created Pod has (its name, gates, group).
// A template annotated kueue.x-k8s.io/podset-{required,preferred,unconstrained}-topology gives
// the pod set a topologyRequest, with podIndexLabel meshwork.dev/replica-index so that Kueue
// places replicas (and so ranks) in order.
nlohmann::json DesiredWorkload(const nlohmann::json& job, const JobSpec& spec, const nlohmann::json& pod);

// What a Workload's status says to the job.
struct WorkloadState {
  bool admitted = false;       // Admitted=True (quota reserved, admission checks passed)
  bool has_admission = false;  // status.admission is set (quota reserved)
  bool evicted = false;        // Evicted=True: the gang must stop
  bool finished = false;       // Finished=True
  // status.admission.podSetAssignments[0].count: the Pods Kueue admitted, fewer than the pod set's
  // count after a partial admission (an elastic job's minCount).
  std::optional<int> admitted_count;
  std::string why;             // for the job's Suspended condition while it is held
};
WorkloadState ReadWorkload(const nlohmann::json& workload);

// `workload` with its admission cleared after an eviction, as Kueue's job framework does once
// the job has stopped: QuotaReserved=False (Pending), Admitted=False, Requeued=True when Kueue
// preempted it (or a node failed), status.admission removed. nullopt when nothing changes.
std::optional<nlohmann::json> ClearAdmission(const nlohmann::json& workload, SystemTime now);

// The ResourceFlavors Kueue assigned to the admitted Workload's pod set
// (status.admission.podSetAssignments[].flavors: resource -> flavor), each once, sorted.
std::vector<std::string> AdmittedFlavors(const nlohmann::json& workload);

// `pod` placed on the nodes its flavors stand for, as Kueue's job framework does when it starts a
// job: each flavor's spec.nodeLabels join the Pod's nodeSelector, its spec.tolerations the Pod's
// tolerations (each once). A label that two flavors, or a flavor and the Pod's own nodeSelector
// (the template's), set to different values can place the Pod nowhere: an error naming both.
Result<nlohmann::json> PlaceOnFlavors(nlohmann::json pod, const std::vector<nlohmann::json>& flavors);

// Whether Kueue admitted the Workload with a topology assignment (TAS).
bool AdmittedByTopology(const nlohmann::json& workload);
// `pod` as Kueue's topology ungater expects it: gate kueue.x-k8s.io/topology, label
// kueue.x-k8s.io/podset: trainer, annotation kueue.x-k8s.io/workload: <workload name>.
nlohmann::json GateForTopology(nlohmann::json pod, const std::string& workload_name);

// `workload` with Finished=True (reason Succeeded or Failed), nullopt when it already is.
std::optional<nlohmann::json> FinishWorkload(const nlohmann::json& workload, bool succeeded, const std::string& message,
                                             SystemTime now);

}  // namespace meshwork::op
