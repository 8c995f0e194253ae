// Kueue (a job labelled kueue.x-k8s.io/queue-name): the job's Workload, made by the operator; the
// job held (suspended) until Kueue admits it; its Pods placed on the ResourceFlavors it was
// admitted on; an evicted gang's quota handed back once it is gone, and a finished job's Workload
// marked Finished. The Workload's shape and status are kueue.h's pure functions.
#include "operator/controller/desired.h"
#include "operator/controller/integration.h"
#include "operator/controller/kueue.h"
#include "operator/controller/training_runtime.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

// The job's Workload for the spec merged with its runtime (`merged`), with the priority of its
// class; an error (a missing class, no Kueue API) fails.
std::optional<ReconcileOutcome> CreateWorkload(k8s::ObjectApi* api, const std::string& key, const json& job,
                                               const json& merged, const JobSpec& spec, int64_t generation) {
  const std::string ns = job["metadata"].value("namespace", "default");
  const json pod = DesiredPod(merged, spec, 0, generation);
  json want = DesiredWorkload(merged, spec, pod);
  // The Workload's priority, by which Kueue orders and preempts: the class's value, read now.
  if (const json ref = WorkloadPriorityClassRef(job, pod); !ref.is_null()) {
    const bool kueue_class = ref["kind"] == "WorkloadPriorityClass";
    const std::string name = ref["name"];
    auto cls = api->Get(kueue_class ? KueueWorkloadPriorityClasses() : PriorityClasses(), "", name);
    if (!cls.ok()) {
      return Failed(cls.error(), "reading " + ref["kind"].get<std::string>() + " " + name + " for the Workload of " + key +
                                     " (" +
                                     (kueue_class ? "the job's label " + std::string(kKueuePriorityClassLabel)
                                                  : std::string("the Pod template's priorityClassName")) +
                                     ")");
    }
    want["spec"]["priorityClassRef"] = ref;
    want["spec"]["priority"] = cls->value("value", int64_t{0});
  }
  auto made = api->Create(KueueWorkloads(), ns, want);
  if (!made.ok() && !k8s::IsAlreadyExists(made.error())) {
    return Failed(made.error(), "creating Workload of " + key +
                                    (k8s::IsNotFound(made.error())
                                         ? " (the job's label " + std::string(kKueueQueueLabel) +
                                               " asks for Kueue, whose Workload API kueue.x-k8s.io/v1beta2 is not installed)"
                                         : ""));
  }
  return std::nullopt;
}

// What Observe read, for the later calls of the same reconcile.
struct Seen {
  std::optional<json> workload;
  WorkloadState state;
};

class Kueue final : public Integration {
 public:
  std::string Name() const override { return "Kueue"; }
  std::vector<RbacRule> Rbac() const override {
    return {{"kueue.x-k8s.io", "workloads", {"get", "create", "delete"}},
            {"kueue.x-k8s.io", "workloads/status", {"update"}},
            {"kueue.x-k8s.io", "resourceflavors", {"get"}, true},
            {"kueue.x-k8s.io", "workloadpriorityclasses", {"get"}, true},
            {"scheduling.k8s.io", "priorityclasses", {"get"}, true}};
  }

  // The Workload is read whatever the spec: a job that fails because its spec no longer parses
  // must still mark its Workload Finished, or the quota stays reserved until the job is deleted.
  std::optional<ReconcileOutcome> Observe(ReconcileScope& scope, Observed* in) const override {
    const json& job = *scope.job;
    k8s::ObjectApi* api = scope.shared->api;
    Seen seen;
    auto wl = api->Get(KueueWorkloads(), scope.ns(), WorkloadName(job));
    if (!wl.ok() && !k8s::IsNotFound(wl.error())) return Failed(wl.error(), "reading Workload of " + scope.key);
    if (wl.ok()) {
      seen.workload = *wl;
      seen.state = ReadWorkload(*wl);
    }
    const Result<JobSpec>& spec = *scope.spec;
    if (!scope.finished && spec.ok()) {
      // A Workload of another size (a resize while queued) is replaced, as Kueue's job framework does.
      const json pod_sets =
          seen.workload ? seen.workload->value("spec", json::object()).value("podSets", json::array()) : json();
      if (seen.workload && !seen.state.has_admission && PrebuiltWorkload(job).empty() &&
          !(pod_sets.is_array() && pod_sets.size() == 1 && pod_sets[0].value("count", -1) == spec->replicas)) {
        k8s::DeleteOptions opts;
        opts.precondition_uid = (*seen.workload)["metadata"].value("uid", "");
        auto deleted = api->Delete(KueueWorkloads(), scope.ns(), WorkloadName(job), opts);
        if (!deleted.ok() && !k8s::IsNotFound(deleted.error())) {
          return Failed(deleted.error(), "replacing Workload of " + scope.key);
        }
        seen.workload.reset();
      }
      const std::string queue = KueueQueue(job);
      if (!seen.workload) {
        // With the prebuilt-workload label (MultiKueue's copy of a job, in a worker cluster) the
        // Workload is MultiKueue's to make: the job waits for it.
        if (PrebuiltWorkload(job).empty()) {
          const int64_t generation = job.value("status", json::object()).value("restartGeneration", int64_t{0});
          if (auto failed = CreateWorkload(api, scope.key, job, in->job, *spec, generation)) return failed;
        }
        in->queued = PrebuiltWorkload(job).empty()
                         ? "queued by Kueue in LocalQueue " + queue + ": Workload " + WorkloadName(job) +
                               " is created and waits for admission"
                         : "queued by Kueue in LocalQueue " + queue + ": waiting for Workload " + WorkloadName(job) +
                               ", which MultiKueue makes for this copy of a job (label " + kKueuePrebuiltWorkloadLabel + ")";
      } else if (!seen.state.admitted || seen.state.evicted) {
        in->queued = seen.state.why;
      } else {
        in->admitted_replicas = seen.state.admitted_count;
      }
    }
    scope.notes[Name()] = std::move(seen);
    return std::nullopt;
  }

  // Kueue admitted the gang on its ResourceFlavors: the new Pods go where those stand for, and
  // with a topology assignment behind Kueue's topology gate (its ungater puts each there).
  std::optional<ReconcileOutcome> BeforeCreate(ReconcileScope& scope, Plan* plan) const override {
    const Seen& seen = std::any_cast<const Seen&>(scope.notes.at(Name()));
    if (!seen.workload || !seen.state.admitted || seen.state.evicted || plan->create.empty()) return std::nullopt;
    const json& workload = *seen.workload;
    std::vector<json> flavors;
    for (const std::string& name : AdmittedFlavors(workload)) {
      auto flavor = scope.shared->api->Get(KueueResourceFlavors(), "", name);
      if (!flavor.ok()) {
        return Failed(flavor.error(),
                      "reading ResourceFlavor " + name + " of Workload " + workload["metadata"].value("name", ""));
      }
      flavors.push_back(std::move(*flavor));
    }
    const bool topology = AdmittedByTopology(workload);
    for (json& pod : plan->create) {
      auto placed = PlaceOnFlavors(pod, flavors);
      if (!placed.ok()) {
        return Failed(k8s::Error(k8s::ErrorKind::kInvalid, placed.status().message()),
                      "placing the gang of " + scope.key + " on its Kueue flavors");
      }
      pod = std::move(*placed);
      if (topology) pod = GateForTopology(std::move(pod), workload["metadata"].value("name", ""));
    }
    return std::nullopt;
  }

  // An evicted gang, once gone, hands its quota back; a finished job's Workload is Finished.
  // While queued, the job is looked at again soon: there is no Workload informer.
  std::optional<ReconcileOutcome> AfterApply(ReconcileScope& scope, const Plan& plan, Applied* applied) const override {
    const Seen& seen = std::any_cast<const Seen&>(scope.notes.at(Name()));
    if (seen.workload) {
      std::optional<json> update;
      if (plan.phase == "Succeeded" || plan.phase == "Failed") {
        update = FinishWorkload(*seen.workload, plan.phase == "Succeeded", "TrainingJob " + scope.key + " " + plan.phase,
                                scope.in->now);
      } else if (seen.state.evicted && seen.state.has_admission && scope.in->pods.empty()) {
        update = ClearAdmission(*seen.workload, scope.in->now);
      }
      if (update) {
        auto put = scope.shared->api->UpdateStatus(KueueWorkloads(), scope.ns(), *update);
        if (!put.ok()) return Failed(put.error(), "writing the status of Workload " + WorkloadName(*scope.job));
      }
    }
    if (scope.in->queued) applied->RequeueWithin(std::chrono::seconds(2));
    return std::nullopt;
  }
};

}  // namespace

const Integration& KueueIntegration() {
  static const Kueue kueue;
  return kueue;
}

std::optional<ReconcileOutcome> ReconcileForMultiKueue(k8s::ObjectApi* api, const std::string& key, const json& job) {
  // MultiKueue runs the job in a worker cluster and copies that copy's status here: this
  // cluster's part is the Workload that MultiKueue dispatches, nothing else (no Pods, no status).
  if (KueueQueue(job).empty()) return std::nullopt;
  json merged = job;
  if (const std::string runtime = RuntimeName(job); !runtime.empty()) {
    auto rt = api->Get(Runtimes(), "", runtime);
    if (!rt.ok()) return Failed(rt.error(), "reading TrainingRuntime " + runtime + " for the Workload of " + key);
    auto applied = ApplyRuntime(job, *rt);
    if (!applied.ok()) {
      return Failed(k8s::Error(k8s::ErrorKind::kInvalid, applied.status().message()), "the Workload of " + key);
    }
    merged = std::move(*applied);
  }
  auto spec = ParseSpec(merged);
  if (!spec.ok()) return Failed(k8s::Error(k8s::ErrorKind::kInvalid, spec.status().message()), "the Workload of " + key);
  auto have = api->Get(KueueWorkloads(), job["metadata"].value("namespace", "default"), WorkloadName(job));
  if (have.ok()) return std::nullopt;
  if (!k8s::IsNotFound(have.error())) return Failed(have.error(), "reading Workload of " + key);
  return CreateWorkload(api, key, job, merged, *spec, 0);
}

}  // namespace meshwork::op
