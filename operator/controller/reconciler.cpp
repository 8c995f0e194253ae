#include "operator/controller/reconciler.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "operator/controller/desired.h"
#include "operator/controller/gang.h"
#include "operator/controller/kueue.h"
#include "operator/controller/trainer_report.h"
#include "operator/controller/training_runtime.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

k8s::ResourceRef Jobs() { return k8s::resources::Custom(kGroup, kVersion, kPlural); }
// What to say when a gang admission's PodGroup API is not served.
std::string PodGroupApiMissing(GangAdmission admission) {
  switch (admission) {
    case GangAdmission::kVolcano:
      return " (spec.runPolicy.schedulingPolicy.gangAdmission Volcano needs Volcano installed: its PodGroup API, "
             "scheduling.volcano.sh/v1beta1)";
    case GangAdmission::kCoscheduling:
      return " (spec.runPolicy.schedulingPolicy.gangAdmission Coscheduling needs the scheduler-plugins PodGroup CRD, "
             "scheduling.x-k8s.io/v1alpha1, and a scheduler running the Coscheduling plugin)";
    default:
      return " (spec.runPolicy.schedulingPolicy.gangAdmission PodGroup needs the PodGroup API, scheduling.k8s.io/v1beta1: "
             "Kubernetes 1.37 with the GenericWorkload feature gate)";
  }
}

// The PodGroup API of a gang admission (desired.h, DesiredPodGroup).
k8s::ResourceRef PodGroups(GangAdmission admission) {
  switch (admission) {
    case GangAdmission::kVolcano: return k8s::resources::Custom("scheduling.volcano.sh", "v1beta1", "podgroups");
    case GangAdmission::kCoscheduling: return k8s::resources::Custom("scheduling.x-k8s.io", "v1alpha1", "podgroups");
    default: return k8s::resources::Custom("scheduling.k8s.io", "v1beta1", "podgroups");
  }
}

std::string ReasonOf(const k8s::Error& e) { return k8s::IsConflict(e) ? "conflict" : "api"; }

bool OwnedBy(const json& pod, const std::string& uid) {
  const json refs = pod.value("metadata", json::object()).value("ownerReferences", json::array());
  for (const auto& ref : refs) {
    if (ref.is_object() && ref.value("uid", "") == uid) return true;
  }
  return false;
}

// Whether resourceVersion `a` is `b` or later. They are opaque to clients in general; the API
// server's are etcd revisions, decimal, so compare them as numbers when both are.
bool NotOlder(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const bool numbers = !a.empty() && !b.empty() && a.find_first_not_of("0123456789") == std::string::npos &&
                       b.find_first_not_of("0123456789") == std::string::npos;
  return numbers && (a.size() != b.size() ? a.size() > b.size() : a > b);
}

ReconcileOutcome Failed(const k8s::Error& e, const std::string& what) {
  ReconcileOutcome o;
  o.ok = false;
  o.error_reason = ReasonOf(e);
  o.message = what + ": " + e.ToString();
  return o;
}

}  // namespace

void PodIndex::Set(const std::string& job_key, const std::string& pod_key) {
  std::lock_guard<std::mutex> lock(mu_);
  by_job_[job_key].insert(pod_key);
}

void PodIndex::Remove(const std::string& job_key, const std::string& pod_key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_job_.find(job_key);
  if (it == by_job_.end()) return;
  it->second.erase(pod_key);
  if (it->second.empty()) by_job_.erase(it);
}

std::set<std::string> PodIndex::Get(const std::string& job_key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_job_.find(job_key);
  return it == by_job_.end() ? std::set<std::string>{} : it->second;
}

std::string PodIndex::JobKeyOf(const json& pod) {
  const json& meta = pod.contains("metadata") ? pod["metadata"] : json::object();
  const json labels = meta.value("labels", json::object());
  if (!labels.is_object() || !labels.contains(kJobLabel) || !labels[kJobLabel].is_string()) return "";
  return meta.value("namespace", "default") + "/" + labels[kJobLabel].get<std::string>();
}

Reconciler::Reconciler(k8s::ObjectApi* api, const k8s::Store* jobs, const k8s::Store* pods,
                       const k8s::Store* services, const PodIndex* index, ReconcilerOptions options,
                       ReconcilerHooks hooks)
    : api_(api),
      jobs_(jobs),
      pods_(pods),
      services_(services),
      index_(index),
      options_(options),
      hooks_(std::move(hooks)) {}

void Reconciler::Log(const std::string& line) const {
  if (hooks_.log) hooks_.log(line);
}

void Reconciler::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  last_scrape_.erase(key);
  expected_.erase(key);
  written_from_.erase(key);
  gang_waiting_.erase(key);
  std::lock_guard<std::mutex> runtimes_lock(runtimes_mu_);
  last_runtime_.erase(key);
}

bool Reconciler::CacheBehindOwnWrite(const std::string& key, const std::string& cached_rv) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = written_from_.find(key);
  if (it == written_from_.end()) return false;
  if (it->second == cached_rv) return true;
  written_from_.erase(it);  // the cache has moved on (our write, or a later one)
  return false;
}

void Reconciler::WroteStatus(const std::string& key, const std::string& based_on_rv) {
  std::lock_guard<std::mutex> lock(mu_);
  written_from_[key] = based_on_rv;
}

void Reconciler::Expect(const std::string& key, const std::string& pod_uid) {
  if (pod_uid.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  expected_[key][pod_uid] = std::chrono::steady_clock::now() + options_.expectation_timeout;
}

bool Reconciler::ExpectationsMet(const std::string& key, const std::set<std::string>& seen_uids) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expected_.find(key);
  if (it == expected_.end()) return true;
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
  expected_.erase(it);
  return true;
}

std::vector<json> Reconciler::OwnedPods(const std::string& key, const std::string& uid,
                                         std::set<std::string>* seen_uids) const {
  std::vector<json> owned;
  for (const auto& pod_key : index_->Get(key)) {
    auto pod = pods_->Get(pod_key);
    if (!pod || !OwnedBy(*pod, uid)) continue;  // a Pod that only carries the label is not ours
    seen_uids->insert((*pod)["metadata"].value("uid", ""));
    owned.push_back(std::move(*pod));
  }
  return owned;
}

std::map<std::string, NodeHealth> Reconciler::UnhealthyNodes(const std::vector<json>& pods, const json& lost_nodes,
                                                              std::chrono::seconds back_after) const {
  std::map<std::string, NodeHealth> unhealthy;
  if (nodes_ == nullptr) return unhealthy;
  for (const auto& pod : pods) {
    const std::string node = pod.value("spec", json::object()).value("nodeName", "");
    if (node.empty() || unhealthy.count(node)) continue;
    const auto cached = nodes_->Get(node);
    if (!cached) {
      NodeHealth& h = unhealthy[node];
      h.deleted = true;
      // When the Pod was bound: its PodScheduled condition, else (bound by its spec) its creation.
      const json status = pod.value("status", json::object());
      for (const auto& c : status.value("conditions", json::array())) {
        if (c.is_object() && c.value("type", "") == "PodScheduled") h.since = ParseTime(c.value("lastTransitionTime", ""));
      }
      if (!h.since) h.since = ParseTime(pod.value("metadata", json::object()).value("creationTimestamp", ""));
      continue;
    }
    const json ready = ReadyConditionOf(*cached);
    if (ready.is_null() || ready.value("status", "") == "True") continue;
    NodeHealth& h = unhealthy[node];
    h.ready = ready.value("status", "");
    h.reason = ready.value("reason", "");
    h.since = ParseTime(ready.value("lastTransitionTime", ""));
  }
  // An elastic job shrunk by a node loss runs without those nodes until each is back: Ready for
  // `back_after` (a node that flaps would cost a checkpoint interval each time), schedulable, and
  // without a NoSchedule or NoExecute taint (a repaired node still cordoned would take a full-size
  // gang that cannot start). The entries say why not; having no `since`, they judge no Pod lost.
  const auto now = std::chrono::system_clock::now();
  for (const auto& lost : lost_nodes) {
    if (!lost.is_string() || unhealthy.count(lost.get<std::string>())) continue;
    const auto cached = nodes_->Get(lost.get<std::string>());
    const json ready = cached ? ReadyConditionOf(*cached) : json();
    std::string why;
    if (!cached) {
      why = "deleted";
    } else if (!ready.is_object() || ready.value("status", "") != "True") {
      why = "not Ready";
    } else if (auto since = ParseTime(ready.value("lastTransitionTime", "")); !since || now - *since < back_after) {
      why = "Ready for less than " + std::to_string(back_after.count()) + " s";
    } else if (cached->value("spec", json::object()).value("unschedulable", false)) {
      why = "cordoned";
    } else {
      for (const auto& taint : cached->value("spec", json::object()).value("taints", json::array())) {
        const std::string effect = taint.value("effect", "");
        if (effect == "NoSchedule" || effect == "NoExecute") why = "tainted " + taint.value("key", "");
      }
    }
    if (why.empty()) continue;
    NodeHealth& h = unhealthy[lost.get<std::string>()];
    h.deleted = !cached;
    h.ready = ready.is_object() ? ready.value("status", "") : "";
    h.reason = why;
  }
  return unhealthy;
}

std::optional<TrainerReport> Reconciler::Scrape(const std::string& key, const json& job, const JobSpec& spec,
                                                const std::vector<json>& pods) {
  if (spec.metrics_port <= 0) return std::nullopt;
  const int64_t gen = job.value("status", json::object()).value("restartGeneration", int64_t{0});
  for (const auto& pod : pods) {
    const PodView v = ViewPod(pod);
    if (v.index != 0 || v.generation != gen || v.phase != "Running" || v.terminating) continue;
    const std::string ip = pod.value("status", json::object()).value("podIP", "");
    if (ip.empty()) return std::nullopt;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = last_scrape_.find(key);
      if (it != last_scrape_.end() && now - it->second < options_.report_interval - std::chrono::milliseconds(500)) {
        return std::nullopt;
      }
      last_scrape_[key] = now;
    }
    auto body = HttpGet(ip, spec.metrics_port, "/metrics", options_.scrape_timeout);
    if (!body.ok()) return std::nullopt;  // not listening yet, or just finished
    return ParseTrainerMetrics(*body);
  }
  return std::nullopt;
}

// The trainer config problem that makes the job InvalidSpec, if any. A ConfigMap that does not
// exist (yet) is not a spec error: the job waits for it.
ConfigCheck Reconciler::CheckConfig(const std::string& key, const json& job, const JobSpec& spec) {
  const std::string ns = job["metadata"].value("namespace", "default");
  const std::string name = job["metadata"].value("name", "");
  ConfigCheck check;
  if (spec.config_map_name.empty()) {
    Status s = ValidateTrainerConfig(spec.config_inline, spec, ns, name, "spec.config.inline", &check.pipeline,
                                     &check.global_batch_size);
    if (!s.ok()) check.error = s.message();
    return check;
  }
  auto cm = api_->Get(k8s::resources::ConfigMaps(), ns, spec.config_map_name);
  const std::string field = "spec.config.configMapRef";
  if (!cm.ok()) {
    check.wait = k8s::IsNotFound(cm.error())
                     ? "waiting for ConfigMap " + ns + "/" + spec.config_map_name + " (" + field + ".name)"
                     : "reading ConfigMap " + spec.config_map_name + ": " + cm.error().ToString();
    Log(key + ": " + *check.wait);
    return check;
  }
  const json data = cm->value("data", json::object());
  if (!data.contains(spec.config_map_key) || !data[spec.config_map_key].is_string()) {
    check.error = field + ".key: ConfigMap " + spec.config_map_name + " has no key \"" + spec.config_map_key + "\"";
    return check;
  }
  Status s = ValidateTrainerConfig(data[spec.config_map_key].get<std::string>(), spec, ns, name,
                                   field + " (ConfigMap " + spec.config_map_name + ", key " + spec.config_map_key +
                                       ")",
                                   &check.pipeline, &check.global_batch_size);
  if (!s.ok()) check.error = s.message();
  return check;
}

std::optional<FinalReport> Reconciler::ReadFinalReport(const json& job) {
  k8s::LogOptions log_options;
  log_options.container = kTrainerContainer;
  log_options.tail_lines = 20;
  auto log = api_->GetLog(job["metadata"].value("namespace", "default"),
                          PodName(job["metadata"].value("name", ""), 0), log_options);
  if (!log.ok()) return std::nullopt;
  return ParseFinalLine(*log);
}

namespace {

// An object of the job's child's name that the job does not own: an error naming it (and its
// API version, `detail`, where the kind alone is ambiguous).
k8s::Error NotOwned(const std::string& kind, const json& object, const std::string& detail = "") {
  const json& meta = object["metadata"];
  return k8s::Error(k8s::ErrorKind::kAlreadyExists,
                    kind + " " + meta.value("namespace", "") + "/" + meta.value("name", "") +
                        (detail.empty() ? "" : " (" + detail + ")") +
                        " exists and is not owned by this TrainingJob; rename the job or delete the " + kind);
}

}  // namespace

k8s::Error Reconciler::EnsureService(const json& job, const JobSpec& spec) {
  const json want = DesiredService(job, spec);
  auto created = api_->Create(k8s::resources::Services(), "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  auto have = api_->Get(k8s::resources::Services(), want["metadata"]["namespace"], want["metadata"]["name"]);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("Service", *have);
  return k8s::Error::Ok();
}

k8s::Error Reconciler::EnsureConfigMap(const json& job, const JobSpec& spec) {
  const json want = DesiredConfigMap(job, spec);
  auto created = api_->Create(k8s::resources::ConfigMaps(), "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  const std::string ns = want["metadata"]["namespace"];
  auto have = api_->Get(k8s::resources::ConfigMaps(), ns, want["metadata"]["name"]);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("ConfigMap", *have);
  if (have->value("data", json::object()) == want["data"]) return k8s::Error::Ok();
  json updated = *have;
  updated["data"] = want["data"];
  auto put = api_->Update(k8s::resources::ConfigMaps(), ns, updated);
  return put.ok() ? k8s::Error::Ok() : put.error();
}

k8s::Error Reconciler::EnsurePodGroup(const json& job, const JobSpec& spec) {
  const json want = DesiredPodGroup(job, spec);
  const k8s::ResourceRef ref = PodGroups(spec.gang_admission);
  auto created = api_->Create(ref, "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  const std::string ns = want["metadata"]["namespace"];
  auto have = api_->Get(ref, ns, want["metadata"]["name"]);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("PodGroup", *have, ref.ApiVersion());
  // A resize changes the gang's size (minCount, minMember), an edit the queue or timeout: the
  // fields the operator sets follow the spec; any others (a scheduler's) stay.
  json updated = *have;
  bool changed = false;
  for (const auto& [key, value] : want["spec"].items()) {
    if (updated["spec"].value(key, json()) != value) {
      updated["spec"][key] = value;
      changed = true;
    }
  }
  if (!changed) return k8s::Error::Ok();
  auto put = api_->Update(ref, ns, updated);
  return put.ok() ? k8s::Error::Ok() : put.error();
}

namespace {

// 32 bytes from the kernel's generator as hex: the job's rendezvous token.
Result<std::string> RandomToken() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[32];
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return IOError("reading /dev/urandom failed");
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

}  // namespace

k8s::Error Reconciler::EnsureRendezvousSecret(const json& job) {
  auto token = RandomToken();
  if (!token.ok()) return k8s::Error(k8s::ErrorKind::kInvalidConfig, token.status().message());
  const json want = DesiredRendezvousSecret(job, *token);
  auto created = api_->Create(k8s::resources::Secrets(), "", want);
  if (created.ok()) return k8s::Error::Ok();
  if (!k8s::IsAlreadyExists(created.error())) return created.error();
  // Made for an earlier gang of this job (the token stays for the job's life), or not ours.
  const std::string ns = want["metadata"]["namespace"];
  const std::string name = want["metadata"]["name"];
  auto have = api_->Get(k8s::resources::Secrets(), ns, name);
  if (!have.ok()) return have.error();
  if (!OwnedBy(*have, job["metadata"].value("uid", ""))) return NotOwned("Secret", *have);
  if (!have->value("data", json::object()).contains(kRendezvousTokenKey)) {
    return k8s::Error(k8s::ErrorKind::kInvalid, "Secret " + ns + "/" + name + " has no key '" + kRendezvousTokenKey +
                                                    "'; delete it and the operator makes a new one");
  }
  return k8s::Error::Ok();
}

std::optional<ReconcileOutcome> Reconciler::CreateWorkload(const std::string& key, const json& job,
                                                           const json& merged, const JobSpec& spec, int64_t generation) {
  const std::string ns = job["metadata"].value("namespace", "default");
  const json pod = DesiredPod(merged, spec, 0, generation);
  json want = DesiredWorkload(merged, spec, pod);
  // The Workload's priority, by which Kueue orders and preempts: the class's value, read now.
  if (const json ref = WorkloadPriorityClassRef(job, pod); !ref.is_null()) {
    const bool kueue_class = ref["kind"] == "WorkloadPriorityClass";
    const std::string name = ref["name"];
    auto cls = api_->Get(kueue_class ? KueueWorkloadPriorityClasses() : PriorityClasses(), "", name);
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
  auto made = api_->Create(KueueWorkloads(), ns, want);
  if (!made.ok() && !k8s::IsAlreadyExists(made.error())) {
    return Failed(made.error(), "creating Workload of " + key +
                                    (k8s::IsNotFound(made.error())
                                         ? " (the job's label " + std::string(kKueueQueueLabel) +
                                               " asks for Kueue, whose Workload API kueue.x-k8s.io/v1beta2 is not installed)"
                                         : ""));
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::ReconcileForMultiKueue(const std::string& key, const json& job) {
  // MultiKueue runs the job in a worker cluster and copies that copy's status here: this
  // cluster's part is the Workload that MultiKueue dispatches, nothing else (no Pods, no status).
  if (KueueQueue(job).empty()) return std::nullopt;
  json merged = job;
  if (const std::string runtime = RuntimeName(job); !runtime.empty()) {
    auto rt = api_->Get(Runtimes(), "", runtime);
    if (!rt.ok()) return Failed(rt.error(), "reading TrainingRuntime " + runtime + " for the Workload of " + key);
    auto applied = ApplyRuntime(job, *rt);
    if (!applied.ok()) {
      return Failed(k8s::Error(k8s::ErrorKind::kInvalid, applied.status().message()), "the Workload of " + key);
    }
    merged = std::move(*applied);
  }
  auto spec = ParseSpec(merged);
  if (!spec.ok()) return Failed(k8s::Error(k8s::ErrorKind::kInvalid, spec.status().message()), "the Workload of " + key);
  auto have = api_->Get(KueueWorkloads(), job["metadata"].value("namespace", "default"), WorkloadName(job));
  if (have.ok()) return std::nullopt;
  if (!k8s::IsNotFound(have.error())) return Failed(have.error(), "reading Workload of " + key);
  return CreateWorkload(key, job, merged, *spec, 0);
}

std::optional<ReconcileOutcome> Reconciler::PlaceOnAdmittedFlavors(const std::string& key, const json& workload,
                                                                   std::vector<json>* pods) {
  std::vector<json> flavors;
  for (const std::string& name : AdmittedFlavors(workload)) {
    auto flavor = api_->Get(KueueResourceFlavors(), "", name);
    if (!flavor.ok()) return Failed(flavor.error(), "reading ResourceFlavor " + name + " of Workload " +
                                                workload["metadata"].value("name", ""));
    flavors.push_back(std::move(*flavor));
  }
  const bool topology = AdmittedByTopology(workload);
  for (json& pod : *pods) {
    auto placed = PlaceOnFlavors(pod, flavors);
    if (!placed.ok()) {
      return Failed(k8s::Error(k8s::ErrorKind::kInvalid, placed.status().message()),
                    "placing the gang of " + key + " on its Kueue flavors");
    }
    pod = std::move(*placed);
    // Kueue chose a topology domain for each replica: its ungater puts the Pod there.
    if (topology) pod = GateForTopology(std::move(pod), workload["metadata"].value("name", ""));
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::DeleteJob(const std::string& key, const json& job) {
  const json& meta = job["metadata"];
  k8s::DeleteOptions opts;
  opts.precondition_uid = meta.value("uid", "");
  opts.propagation_policy = "Background";
  auto deleted = api_->Delete(Jobs(), meta.value("namespace", "default"), meta.value("name", ""), opts);
  if (!deleted.ok() && !k8s::IsNotFound(deleted.error()) && !k8s::IsConflict(deleted.error())) {
    return Failed(deleted.error(), "deleting " + key + " after ttlSecondsAfterFinished");
  }
  Log(key + ": deleted (ttlSecondsAfterFinished)");
  return std::nullopt;
}

namespace {

// The spec sized as the gang the plan runs (Plan::gang_replicas: an elastic job after a node
// loss runs fewer replicas than its spec).
JobSpec GangSpec(const JobSpec& spec, const Plan& plan) {
  JobSpec gang = spec;
  if (plan.gang_replicas > 0) gang.replicas = plan.gang_replicas;
  return gang;
}

}  // namespace

std::optional<ReconcileOutcome> Reconciler::CreateChildren(const std::string& key, const json& job,
                                                           const Result<JobSpec>& spec, const Plan& plan,
                                                           Created* created) {
  const std::string ns = job["metadata"].value("namespace", "default");
  const std::string name = job["metadata"].value("name", "");
  if (spec.ok()) {  // (a spec that does not parse creates nothing)
    if (plan.ensure_service) {
      if (auto e = EnsureService(job, *spec); !e.ok()) return Failed(e, "creating Service " + key);
    }
    if (plan.ensure_config_map) {
      if (auto e = EnsureConfigMap(job, *spec); !e.ok()) return Failed(e, "writing ConfigMap " + ConfigMapName(name));
    }
    if (plan.ensure_pod_group) {
      if (auto e = EnsurePodGroup(job, GangSpec(*spec, plan)); !e.ok()) {
        return Failed(e, "writing PodGroup " + key + (k8s::IsNotFound(e) ? PodGroupApiMissing(spec->gang_admission) : ""));
      }
    }
  }
  if (!plan.create.empty()) {
    // Before the Pods that read it: a Pod whose Secret is missing cannot start.
    if (auto e = EnsureRendezvousSecret(job); !e.ok()) {
      return Failed(e, "writing Secret " + ns + "/" + RendezvousSecretName(name));
    }
  }
  const std::string uid = job["metadata"].value("uid", "");
  created->all = !plan.create.empty();
  for (const auto& pod : plan.create) {
    auto made = api_->Create(k8s::resources::Pods(), ns, pod);
    if (made.ok()) {
      Expect(key, made->value("metadata", json::object()).value("uid", ""));
      if (hooks_.pod_created) hooks_.pod_created();
      continue;
    }
    created->all = false;
    // The name is taken: by this gang's Pod the cache has not shown yet, or by an old one
    // still terminating. The next reconcile sees which.
    if (k8s::IsAlreadyExists(made.error())) {
      created->requeue_after = std::chrono::seconds(1);
      const std::string pod_name = pod["metadata"].value("name", "");
      auto existing = api_->Get(k8s::resources::Pods(), ns, pod_name);
      if (existing.ok() && !OwnedBy(*existing, uid)) {
        // Not ours and never will be: say so, or the job waits without a word.
        const std::string msg = "pod " + pod_name + " already exists and is not owned by this TrainingJob; delete it, "
                                "or give the job another name";
        Log(key + ": PodNameTaken: " + msg);
        created->events.push_back({"Warning", "PodNameTaken", msg});
        created->requeue_after = std::chrono::seconds(10);
      }
      continue;
    }
    if (made.error().http_code() == 422 || made.error().http_code() == 400) {
      created->refused = "spec.template: the API server refused Pod " + pod["metadata"].value("name", "") +
                         " that the job's spec makes: " + made.error().message();
      return std::nullopt;
    }
    return Failed(made.error(), "creating Pod " + pod["metadata"].value("name", ""));
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::AdmitGang(const std::string& key, const json& job, const JobSpec& spec,
                                                      const std::vector<json>& pods, Created* created) {
  const int64_t gen = job.value("status", json::object()).value("restartGeneration", int64_t{0});
  std::vector<json> gang;
  bool gated = false;
  for (const auto& pod : pods) {
    const PodView v = ViewPod(pod);
    if (v.generation != gen || v.terminating) continue;
    gang.push_back(pod);
    gated = gated || HasGangGate(pod);
  }
  if (!gated || static_cast<int>(gang.size()) != spec.replicas) return std::nullopt;  // not all here yet
  const std::string ns = job["metadata"].value("namespace", "default");
  std::lock_guard<std::mutex> admission(admission_mu_);
  // The Nodes from their informer's cache (SetNodes), else one list (unit tests).
  json nodes = {{"items", json::array()}};
  if (nodes_ != nullptr) {
    for (auto& n : nodes_->List()) nodes["items"].push_back(std::move(n));
  } else {
    auto listed = api_->List(k8s::resources::Nodes(), "", {});
    if (!listed.ok()) return Failed(listed.error(), "listing Nodes for gang admission of " + key);
    nodes = std::move(*listed);
  }
  // What the other Pods take: the ledger's summary (kept by the informer of Pods that hold room,
  // its size the node count and the Pods released but not bound yet), else one list (unit tests).
  // This gang's own Pods are what is being placed, not what takes room.
  const std::string uid = job["metadata"].value("uid", "");
  GangFit fit;
  if (room_ != nullptr) {
    fit = FitGang(nodes, room_->Taken(uid), gang);
  } else {
    k8s::ListOptions lo;
    lo.field_selector = "status.phase!=Succeeded,status.phase!=Failed";
    auto listed = api_->List(k8s::resources::Pods(), options_.pods_namespace, lo);
    if (!listed.ok()) return Failed(listed.error(), "listing Pods for gang admission of " + key);
    json others = {{"items", json::array()}};
    for (auto& p : listed.value()["items"]) {
      if (!OwnedBy(p, uid)) others["items"].push_back(std::move(p));
    }
    fit = FitGang(nodes, others, gang);
  }
  if (!fit.fits) {
    std::lock_guard<std::mutex> lock(mu_);
    // Remembered only once the Event is recorded (RecordEvents): a reconcile that fails before
    // that says it again on the next one.
    const auto last = gang_waiting_.find(key);
    if (last == gang_waiting_.end() || last->second != fit.why) {
      created->events.push_back({"Normal", "GangWaiting", "waiting until every Pod fits at once: " + fit.why});
      created->gang_waiting = fit.why;
    }
    created->requeue_after = std::chrono::seconds(3);
    return std::nullopt;
  }
  std::vector<std::pair<std::string, std::string>> released;  // Pod key, resourceVersion after the patch
  for (const auto& pod : gang) {
    if (!HasGangGate(pod)) continue;
    json gates = json::array();
    for (const auto& g : pod["spec"]["schedulingGates"]) {
      if (g.value("name", "") != kGangGate) gates.push_back(g);
    }
    const json patch = {{"spec", {{"schedulingGates", gates.empty() ? json(nullptr) : gates}}}};
    auto patched = api_->MergePatch(k8s::resources::Pods(), ns, pod["metadata"].value("name", ""), patch, "");
    if (!patched.ok() && !k8s::IsNotFound(patched.error())) {
      return Failed(patched.error(), "releasing the gang gate of Pod " + pod["metadata"].value("name", ""));
    }
    if (patched.ok()) released.emplace_back(k8s::ObjectKey(*patched), k8s::ResourceVersionOf(*patched));
  }
  // The next admission must count these Pods as released: wait (still holding admission_mu_)
  // until the ledger has each one at the patch's version or later; a few milliseconds. A Pod
  // absent from it is not taken for done: its informer may not have seen it yet (it lags the
  // own-Pods cache the gang was read from), and the next admission would miss its requests and
  // count its room twice, unless the own-Pods cache says it finished or went (it then holds none).
  if (room_ != nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (const auto& [pod_key, version] : released) {
      while (std::chrono::steady_clock::now() < deadline) {
        const std::string seen = room_->VersionOf(pod_key);
        if (!seen.empty() && NotOlder(seen, version)) break;
        if (seen.empty()) {
          const auto own = pods_->Get(pod_key);
          const std::string phase = own ? own->value("status", json::object()).value("phase", "") : "";
          if (!own || phase == "Succeeded" || phase == "Failed") break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    gang_waiting_.erase(key);
  }
  created->events.push_back({"Normal", "GangAdmitted",
                             "all " + std::to_string(gang.size()) + " Pods fit: released to the scheduler together"});
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::DeletePods(const std::string& ns, const std::vector<PodView>& pods) {
  for (const auto& pod : pods) {
    k8s::DeleteOptions opts;
    opts.precondition_uid = pod.uid;
    // On a lost node no kubelet will finish a graceful delete (and the name stays taken).
    opts.grace_period_seconds = pod.node_lost ? 0 : options_.pod_delete_grace_seconds;
    auto deleted = api_->Delete(k8s::resources::Pods(), ns, pod.name, opts);
    if (deleted.ok()) {
      if (hooks_.pod_deleted) hooks_.pod_deleted();
    } else if (!k8s::IsNotFound(deleted.error()) && !k8s::IsConflict(deleted.error())) {
      return Failed(deleted.error(), "deleting Pod " + pod.name);
    }
  }
  return std::nullopt;
}

std::optional<ReconcileOutcome> Reconciler::WriteStatus(const std::string& key, const json& job, const json& status) {
  if (status == job.value("status", json::object())) return std::nullopt;
  json updated = job;
  updated["status"] = status;
  auto put = api_->UpdateStatus(Jobs(), job["metadata"].value("namespace", "default"), updated);
  if (!put.ok()) return Failed(put.error(), "writing the status of " + key);
  // Wait for the cache to move past the version this write replaced, unless the write replaced
  // none: an update the API server found equal to what it stores (a field it pruned, such as a
  // null) keeps the resourceVersion, and waiting for a change would stop the job's reconciles.
  const std::string based_on = job["metadata"].value("resourceVersion", "");
  const std::string written = put->value("metadata", json::object()).value("resourceVersion", "");
  if (written != based_on) WroteStatus(key, based_on);
  return std::nullopt;
}

ReconcileOutcome Reconciler::Reconcile(const std::string& key) {
  ReconcileOutcome out = ReconcileJob(key);
  // An API error that is not the stale cache's (a conflict, retried at once) is also a Warning
  // Event on the job, so that `kubectl describe tj` shows why nothing happens (a PodGroup of that
  // name the job does not own, a missing PodGroup or Kueue API, RBAC); repeats are aggregated.
  if (!out.ok && out.error_reason != "conflict" && hooks_.record_event) {
    if (auto job = jobs_->Get(key)) hooks_.record_event(*job, {"Warning", "ReconcileError", out.message});
  }
  return out;
}

ReconcileOutcome Reconciler::ReconcileJob(const std::string& key) {
  // 1. Observe: the job and its Pods as the caches show them, the spec parsed once.
  auto cached = jobs_->Get(key);
  if (!cached) {
    Forget(key);
    return {};  // deleted: owner references take the children with it
  }
  const json& job = *cached;
  const json& meta = job["metadata"];
  if (meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null()) return {};
  // Another controller runs this job (spec.managedBy, immutable): nothing here touches it, but
  // for MultiKueue the operator still makes the Workload it dispatches.
  if (const std::string manager = OtherManager(job); !manager.empty()) {
    Forget(key);
    if (manager == kMultiKueueManager) {
      if (auto failed = ReconcileForMultiKueue(key, job)) return *failed;
    }
    return {};
  }
  const json status = job.value("status", json::object());
  ReconcileOutcome look_again;
  look_again.phase = status.value("phase", "Created");
  look_again.requeue_after = std::chrono::seconds(1);
  // Deciding on the object our last status write replaced would only end in a Conflict; the
  // watch event of that write queues the key again.
  if (CacheBehindOwnWrite(key, meta.value("resourceVersion", ""))) return look_again;
  Observed in;
  in.job = job;
  // The job's TrainingRuntime, merged under its spec: what every decision below reads. (The
  // status is written on the object as cached, `job`.)
  std::optional<Status> runtime_error;
  std::vector<EventToRecord> runtime_events;
  if (const std::string runtime = RuntimeName(job); !runtime.empty()) {
    auto rt = api_->Get(Runtimes(), "", runtime);
    if (!rt.ok()) {
      const std::string why = k8s::IsNotFound(rt.error()) ? "it does not exist" : rt.error().ToString();
      // Once merged, a job does not stop because its runtime went away: it goes on with the copy
      // it was last merged with (as a Pod goes on when its ConfigMap is deleted), so that its
      // gang's end, a failure, a suspension or the deadline are still decided.
      std::optional<RuntimeCopy> copy;
      {
        std::lock_guard<std::mutex> lock(runtimes_mu_);
        auto it = last_runtime_.find(key);
        if (it != last_runtime_.end() && it->second.job_uid == meta.value("uid", "") && it->second.name == runtime) {
          copy = it->second;
        }
      }
      auto merged = copy ? ApplyRuntime(job, copy->runtime) : Result<json>(NotFound(""));
      if (merged.ok()) {
        in.job = std::move(*merged);
        runtime_events.push_back({"Warning", "RuntimeNotFound",
                                  "TrainingRuntime " + runtime + " (spec.runtimeRef.name): " + why +
                                      "; the job goes on with the copy the operator read at " + copy->read_at +
                                      " until it is back (an operator restart loses the copy)"});
      } else {
        in.runtime_wait = k8s::IsNotFound(rt.error())
                              ? "waiting for TrainingRuntime " + runtime + " (spec.runtimeRef.name): it does not exist"
                              : "reading TrainingRuntime " + runtime + ": " + rt.error().ToString();
      }
    } else if (auto merged = ApplyRuntime(job, *rt); merged.ok()) {
      in.job = std::move(*merged);
      std::lock_guard<std::mutex> lock(runtimes_mu_);
      last_runtime_[key] = RuntimeCopy{meta.value("uid", ""), runtime, FormatTime(std::chrono::system_clock::now()), *rt};
    } else {
      runtime_error = merged.status();
    }
  }
  in.now = std::chrono::system_clock::now();
  in.report_interval = options_.report_interval;
  std::set<std::string> seen_uids;
  in.pods = OwnedPods(key, meta.value("uid", ""), &seen_uids);
  // Pods this operator created that the cache has not shown yet: deciding now would take them
  // for deleted ones (client-go's "expectations").
  if (!ExpectationsMet(key, seen_uids)) return look_again;
  in.service_exists = services_->Get(key).has_value();
  const Result<JobSpec> spec = [&]() -> Result<JobSpec> {
    if (runtime_error) return *runtime_error;
    Result<JobSpec> parsed = ParseSpec(in.job);
    if (parsed.ok() || RuntimeName(job).empty() || in.runtime_wait) return parsed;
    // The value at fault may be the runtime's: say that the spec was merged with it.
    return Status(parsed.status().code(), parsed.status().message() + " (in the spec merged with TrainingRuntime " +
                                              RuntimeName(job) + ")");
  }();
  in.unhealthy_nodes = UnhealthyNodes(
      in.pods, status.value("elastic", json::object()).value("lostNodes", json::array()),
      std::chrono::seconds(spec.ok() ? spec->node_loss_grace_seconds : 30));
  const bool finished = ConditionTrue(status, "Succeeded") || ConditionTrue(status, "Failed");
  // A runtime edit (or a merge of it with the job's config) that makes the spec wrong must not kill
  // a running gang: as a bad config edit, it applies to the next gang, which waits until it is fixed.
  if (!spec.ok() && !finished && !in.runtime_wait && !RuntimeName(job).empty()) {
    const bool gang_running = std::any_of(in.pods.begin(), in.pods.end(), [](const json& p) {
      const PodView v = ViewPod(p);
      return !v.terminating && v.phase != "Succeeded" && v.phase != "Failed";
    });
    if (gang_running) {
      in.runtime_wait = spec.status().message() + "; the running gang goes on, and no new gang starts until this is fixed";
      in.runtime_wait_reason = "RuntimeInvalid";
    }
  }
  if (!finished && spec.ok()) in.report = Scrape(key, job, *spec, in.pods);
  // Reads that cost an API call, made by Decide only when a decision needs them: the trainer
  // config when a gang is about to start, rank 0's log when the job has just succeeded.
  if (spec.ok()) in.check_config = [&] { return CheckConfig(key, job, *spec); };
  in.final_report = [&] { return ReadFinalReport(job); };

  // Kueue: the job's Workload, made here; until Kueue admits it the job is held (suspended). It
  // is read whatever the spec: a job that fails because its spec no longer parses must still
  // mark its Workload Finished, or the quota stays reserved until the job is deleted.
  std::optional<json> workload;
  WorkloadState queue_state;
  if (const std::string queue = KueueQueue(job); !queue.empty()) {
    const std::string ns = meta.value("namespace", "default");
    auto wl = api_->Get(KueueWorkloads(), ns, WorkloadName(job));
    if (!wl.ok() && !k8s::IsNotFound(wl.error())) return Failed(wl.error(), "reading Workload of " + key);
    if (wl.ok()) {
      workload = *wl;
      queue_state = ReadWorkload(*wl);
    }
    if (!finished && spec.ok()) {
      // A Workload of another size (a resize while queued) is replaced, as Kueue's job framework does.
      const json pod_sets = workload ? workload->value("spec", json::object()).value("podSets", json::array()) : json();
      if (workload && !queue_state.has_admission && PrebuiltWorkload(job).empty() &&
          !(pod_sets.is_array() && pod_sets.size() == 1 && pod_sets[0].value("count", -1) == spec->replicas)) {
        k8s::DeleteOptions opts;
        opts.precondition_uid = (*workload)["metadata"].value("uid", "");
        auto deleted = api_->Delete(KueueWorkloads(), ns, WorkloadName(job), opts);
        if (!deleted.ok() && !k8s::IsNotFound(deleted.error())) return Failed(deleted.error(), "replacing Workload of " + key);
        workload.reset();
      }
      if (!workload) {
        // With the prebuilt-workload label (MultiKueue's copy of a job, in a worker cluster) the
        // Workload is MultiKueue's to make: the job waits for it.
        if (PrebuiltWorkload(job).empty()) {
          if (auto failed = CreateWorkload(key, job, in.job, *spec, status.value("restartGeneration", int64_t{0}))) {
            return *failed;
          }
        }
        in.queued = PrebuiltWorkload(job).empty()
                        ? "queued by Kueue in LocalQueue " + queue + ": Workload " + WorkloadName(job) +
                              " is created and waits for admission"
                        : "queued by Kueue in LocalQueue " + queue + ": waiting for Workload " + WorkloadName(job) +
                              ", which MultiKueue makes for this copy of a job (label " + kKueuePrebuiltWorkloadLabel + ")";
      } else if (!queue_state.admitted || queue_state.evicted) {
        in.queued = queue_state.why;
      } else {
        in.admitted_replicas = queue_state.admitted_count;
      }
    }
  }

  // 2. Decide, once.
  Plan plan = Decide(in, spec);
  ReconcileOutcome out;
  out.phase = plan.phase;
  out.requeue_after = plan.requeue_after;
  // Kueue admitted the gang on its ResourceFlavors: the new Pods go where those stand for.
  if (workload && queue_state.admitted && !queue_state.evicted && !plan.create.empty()) {
    if (auto failed = PlaceOnAdmittedFlavors(key, *workload, &plan.create)) return *failed;
  }

  // 3. Apply. A plan that deletes Pods of the current gang (a gang restart, a resize, a
  // suspension, a finish) writes the status first: if the operator dies after that write, the
  // old gang is stale by its label and goes on the next reconcile; if it dies before, the Pods
  // are still there and the same decision is made again.
  if (plan.delete_job) {
    if (auto failed = DeleteJob(key, job)) return *failed;
    out.phase = "";
    return out;
  }
  // A transition's Events go out as soon as its status is written: a step after the write that
  // fails (a Pod delete, the Workload's status) must not lose them, and a later reconcile, which
  // finds the transition already made, has none to give.
  bool plan_events_recorded = false;
  if (plan.status_first) {
    if (auto failed = WriteStatus(key, job, plan.status)) return *failed;
    RecordEvents(key, job, plan.events, &out);
    plan_events_recorded = true;
  }
  Created created;
  if (auto failed = CreateChildren(key, job, spec, plan, &created)) return *failed;
  if (created.refused) {
    // Retrying the same invalid Pod for ever would leave the job Created without a word: it is
    // the spec's fault, as a bad trainer config is. Decide again with that as the config error.
    Log(key + ": " + *created.refused);
    Observed refused = in;
    refused.check_config = nullptr;
    refused.config_error = created.refused;
    refused.config_wait.reset();
    plan = Decide(refused, spec);
    out.phase = plan.phase;
    out.requeue_after = plan.requeue_after;
    created = Created{};
    plan_events_recorded = false;
    if (plan.status_first) {
      if (auto failed = WriteStatus(key, job, plan.status)) return *failed;
      RecordEvents(key, job, plan.events, &out);
      plan_events_recorded = true;
    }
  }
  if (created.requeue_after) out.requeue_after = created.requeue_after;
  if (auto failed = DeletePods(meta.value("namespace", "default"), plan.remove)) return *failed;
  if (spec.ok() && spec->gang_admission == GangAdmission::kOperator && plan.remove.empty() && !finished &&
      !created.refused && plan.phase != "Failed") {
    if (auto failed = AdmitGang(key, job, GangSpec(*spec, plan), in.pods, &created)) return *failed;
    if (created.requeue_after && (!out.requeue_after || *created.requeue_after < *out.requeue_after)) {
      out.requeue_after = created.requeue_after;
    }
  }

  // Kueue: an evicted gang, once gone, hands its quota back; a finished job's Workload is Finished.
  if (workload) {
    const SystemTime now = in.now;
    std::optional<json> update;
    if (plan.phase == "Succeeded" || plan.phase == "Failed") {
      update = FinishWorkload(*workload, plan.phase == "Succeeded", "TrainingJob " + key + " " + plan.phase, now);
    } else if (queue_state.evicted && queue_state.has_admission && in.pods.empty()) {
      update = ClearAdmission(*workload, now);
    }
    if (update) {
      auto put = api_->UpdateStatus(KueueWorkloads(), meta.value("namespace", "default"), *update);
      if (!put.ok()) return Failed(put.error(), "writing the status of Workload " + WorkloadName(job));
    }
  }
  if (in.queued && (!out.requeue_after || *out.requeue_after > std::chrono::seconds(2))) {
    out.requeue_after = std::chrono::seconds(2);  // no Workload informer yet: look for the admission
  }

  // 4. The status, written once (here, unless it went first). launchedGeneration is recorded
  // only once every Pod of the gang has been created.
  if (!plan.status_first) {
    json next = plan.status;
    if (created.all) next["launchedGeneration"] = next.value("restartGeneration", int64_t{0});
    if (auto failed = WriteStatus(key, job, next)) return *failed;
  }

  // 5. The Events, once the status is written.
  if (!plan_events_recorded) RecordEvents(key, job, plan.events, &out);
  RecordEvents(key, job, created.events, &out);
  RecordEvents(key, job, runtime_events, &out);
  if (created.gang_waiting) {
    std::lock_guard<std::mutex> lock(mu_);
    gang_waiting_[key] = *created.gang_waiting;
  }
  return out;
}

void Reconciler::RecordEvents(const std::string& key, const json& job, const std::vector<EventToRecord>& events,
                              ReconcileOutcome* out) {
  for (const auto& ev : events) {
    if (ev.reason == "InvalidSpec") out->invalid_spec = true;
    Log(key + ": " + ev.reason + ": " + ev.message);
    if (hooks_.record_event) hooks_.record_event(job, ev);
  }
}

}  // namespace meshwork::op
