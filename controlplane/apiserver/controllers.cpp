// Garbage collector, pod controller and Deployment controller (see controllers.h).
#include "controlplane/apiserver/controllers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <tuple>

#include "controlplane/apiserver/selectors.h"

namespace meshwork::controlplane {

using nlohmann::json;

namespace {

std::string Md(const json& obj, const char* field) { return FieldValue(obj, std::string("metadata.") + field); }

bool Deleting(const json& obj) { return !Md(obj, "deletionTimestamp").empty(); }

json OwnerRefs(const json& obj) {
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) return json::array();
  json refs = obj["metadata"].value("ownerReferences", json::array());
  return refs.is_array() ? refs : json::array();
}

bool HasFinalizer(const json& obj, const std::string& f) {
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) return false;
  json fs = obj["metadata"].value("finalizers", json::array());
  return fs.is_array() && std::find(fs.begin(), fs.end(), f) != fs.end();
}

// Records a core/v1 Event about an object, as the scheduler and kube-controller-manager do
// (kubectl describe lists them).
void RecordEvent(Store& store, const json& object, const std::string& type, const std::string& reason,
                 const std::string& message, const std::string& component) {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  char suffix[20], uid[40];
  {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t a = rng(), b = rng();
    std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(a));
    std::snprintf(uid, sizeof(uid), "%08llx-%04llx-4%03llx-8%03llx-%012llx",
                  static_cast<unsigned long long>(a >> 32), static_cast<unsigned long long>((a >> 16) & 0xFFFF),
                  static_cast<unsigned long long>(a & 0xFFF), static_cast<unsigned long long>(b & 0xFFF),
                  static_cast<unsigned long long>((b >> 16) & 0xFFFFFFFFFFFFULL));
  }
  std::string ns = Md(object, "namespace"), name = Md(object, "name");
  std::string now = Rfc3339(std::chrono::system_clock::now());
  json ev = {{"apiVersion", "v1"},
             {"kind", "Event"},
             {"metadata", {{"name", name + "." + suffix}, {"namespace", ns}, {"uid", uid}, {"creationTimestamp", now}}},
             {"involvedObject",
              {{"apiVersion", object.value("apiVersion", "v1")},
               {"kind", object.value("kind", "Pod")},
               {"namespace", ns},
               {"name", name},
               {"uid", Md(object, "uid")}}},
             {"reason", reason},
             {"message", message},
             {"type", type},
             {"source", {{"component", component}}},
             {"reportingComponent", component},
             {"firstTimestamp", now},
             {"lastTimestamp", now},
             {"count", 1}};
  auto r = store.Create(StoreKey("events", ns, name + "." + suffix), ev);
  (void)r;
}

}  // namespace

// ---- garbage collector --------------------------------------------------------------------

void GarbageCollector::Sweep() {
  Store& store = api_->store();
  std::vector<ResourceInfo> resources = api_->AllStorageResources();
  struct Entry {
    const ResourceInfo* info;
    std::string key;
    json obj;
  };
  std::vector<Entry> all;
  std::map<std::string, size_t> by_uid;
  for (const ResourceInfo& info : resources) {
    Store::ListResult r = store.List(info.StoreResource() + "/");
    for (size_t i = 0; i < r.items.size(); ++i) {
      by_uid[Md(r.items[i], "uid")] = all.size();
      all.push_back({&info, r.keys[i], r.items[i]});
    }
  }
  DeleteOptions background;
  background.propagation_policy = "Background";
  DeleteOptions foreground;
  foreground.propagation_policy = "Foreground";
  std::map<std::string, int> blocking;  // owner uid -> dependents with blockOwnerDeletion
  for (const Entry& e : all) {
    json refs = OwnerRefs(e.obj);
    if (refs.empty()) continue;
    bool any_owner_alive = false;
    bool owner_in_foreground = false;
    for (const json& ref : refs) {
      auto it = by_uid.find(ref.value("uid", ""));
      if (it == by_uid.end()) continue;
      const json& owner = all[it->second].obj;
      if (Deleting(owner) && HasFinalizer(owner, "foregroundDeletion")) {
        owner_in_foreground = true;
        if (ref.value("blockOwnerDeletion", false)) ++blocking[ref.value("uid", "")];
      } else {
        any_owner_alive = true;
      }
    }
    if (Deleting(e.obj)) continue;
    if (owner_in_foreground || !any_owner_alive) {
      bool has_alive_foreground_owner = owner_in_foreground;
      std::string ns = Md(e.obj, "namespace"), name = Md(e.obj, "name");
      auto r = api_->DeleteObject(*e.info, ns, name, has_alive_foreground_owner ? foreground : background);
      (void)r;
    }
  }
  // Owners in foreground deletion whose blocking dependents are gone lose the finalizer.
  for (const Entry& e : all) {
    if (!Deleting(e.obj) || !HasFinalizer(e.obj, "foregroundDeletion")) continue;
    if (blocking.count(Md(e.obj, "uid"))) continue;
    api_->Mutate(e.key, [](json& o) {
      json kept = json::array();
      for (const json& f : o["metadata"].value("finalizers", json::array())) {
        if (f != "foregroundDeletion") kept.push_back(f);
      }
      o["metadata"]["finalizers"] = kept;
      if (kept.empty()) o["metadata"].erase("finalizers");
      return true;
    });
  }
  // Terminating namespaces: delete what is in them; remove them once empty.
  for (const Entry& e : all) {
    if (e.info->resource != "namespaces" || !e.info->group.empty() || !Deleting(e.obj)) continue;
    std::string ns = Md(e.obj, "name");
    bool empty = true;
    for (const Entry& o : all) {
      if (!o.info->namespaced || Md(o.obj, "namespace") != ns) continue;
      empty = false;
      if (!Deleting(o.obj)) {
        auto r = api_->DeleteObject(*o.info, ns, Md(o.obj, "name"), background);
        (void)r;
      }
    }
    if (empty) {
      auto r = store.Delete(e.key, ObjectRevision(e.obj));
      (void)r;
    }
  }
}

void GarbageCollector::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    auto watch = api_->store().Watch("", api_->store().Revision());
    std::unique_ptr<WatchStream> stream = watch.ok() ? std::move(watch).value() : nullptr;
    auto last_sweep = std::chrono::steady_clock::now() - std::chrono::seconds(10);
    bool dirty = true;
    while (!stop_) {
      StoreEvent ev;
      if (stream && stream->Next(&ev, std::chrono::milliseconds(100))) {
        dirty = true;
        continue;  // drain what is queued before sweeping
      }
      if (stream && stream->Done()) {
        auto w = api_->store().Watch("", api_->store().Revision());
        stream = w.ok() ? std::move(w).value() : nullptr;
        dirty = true;
      }
      if (!stream) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto now = std::chrono::steady_clock::now();
      if (dirty || now - last_sweep > std::chrono::seconds(1)) {
        // An object of an unexpected shape must not take the process down; the next pass retries.
        try {
          Sweep();
        } catch (const std::exception& e) {
          std::cerr << "meshwork-controlplane: garbage collector: " << e.what() << std::endl;
        }
        dirty = false;
        last_sweep = now;
      }
    }
  });
}

void GarbageCollector::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

// ---- pod controller -----------------------------------------------------------------------

void PodController::RegisterNodes() {
  Store& store = api_->store();
  std::set<std::string> keep;
  for (const agent::NodeConfig& n : nodes_) {
    json obj = agent::NodeObject(n);
    std::string key = StoreKey("nodes", "", n.name);
    keep.insert(key);
    auto cur = store.Get(key);
    json& md = obj["metadata"];
    if (cur) {
      md["uid"] = (*cur)["metadata"].value("uid", "");
      md["creationTimestamp"] = (*cur)["metadata"].value("creationTimestamp", "");
      json cmp = obj;
      cmp["metadata"]["resourceVersion"] = (*cur)["metadata"].value("resourceVersion", "");
      if (cmp != *cur) {
        auto r = store.Update(key, obj, 0);
        (void)r;
      }
    } else {
      if (!md.contains("uid")) md["uid"] = "node-" + n.name;
      if (!md.contains("creationTimestamp")) md["creationTimestamp"] = Rfc3339(std::chrono::system_clock::now());
      auto r = store.Create(key, obj);
      (void)r;
    }
  }
  for (const std::string& key : store.List("nodes//").keys) {
    if (!keep.count(key)) {
      auto r = store.Delete(key, 0);
      (void)r;
    }
  }
}

void PodController::SyncPod(const json& pod, const std::string& key, std::vector<json>* bound_ptr) {
  std::vector<json>& bound = *bound_ptr;
  std::string uid = Md(pod, "uid");
  std::string node = FieldValue(pod, "spec.nodeName");
  std::string phase = FieldValue(pod, "status.phase");
  if (Deleting(pod)) {
    if (!node.empty() && !stopping_.count(uid)) {
      std::optional<int> grace;
      std::string g = Md(pod, "deletionGracePeriodSeconds");
      if (!g.empty()) grace = std::atoi(g.c_str());
      runtime_->Stop(uid, grace);
      stopping_.insert(uid);
    }
    if (runtime_->Stopped(uid)) {
      // The processes are gone: the object may go (when no finalizer holds it).
      api_->Mutate(key, [](json& o) {
        if (o["metadata"].value("deletionGracePeriodSeconds", -1) == 0) return false;
        o["metadata"]["deletionGracePeriodSeconds"] = 0;
        return true;
      });
    }
    return;
  }
  if (node.empty()) {
    agent::Schedule s = agent::PickNode(pod, nodes_, bound);
    if (s.node) {
      json scheduled = pod;
      scheduled["spec"]["nodeName"] = *s.node;
      bound.push_back(scheduled);
      std::string chosen = *s.node;
      bool bound_now = false;
      auto r = api_->Mutate(key, [&](json& o) {
        if (!FieldValue(o, "spec.nodeName").empty()) return false;
        bound_now = true;
        o["spec"]["nodeName"] = chosen;
        json conds = json::array();
        for (const json& c : o["status"].value("conditions", json::array())) {
          if (c.value("type", "") != "PodScheduled") conds.push_back(c);
        }
        conds.push_back({{"type", "PodScheduled"},
                         {"status", "True"},
                         {"lastProbeTime", nullptr},
                         {"lastTransitionTime", Rfc3339(std::chrono::system_clock::now())}});
        o["status"]["conditions"] = conds;
        return true;
      });
      if (r.ok() && bound_now) {
        RecordEvent(api_->store(), pod, "Normal", "Scheduled",
                       "Successfully assigned " + Md(pod, "namespace") + "/" + Md(pod, "name") + " to " + chosen,
                       "default-scheduler");
      }
    } else {
      std::string reason = s.reason;
      const std::string condition_reason = s.gated ? "SchedulingGated" : "Unschedulable";
      bool changed = false;
      auto r = api_->Mutate(key, [&](json& o) {
        for (const json& c : o["status"].value("conditions", json::array())) {
          if (c.value("type", "") == "PodScheduled" && c.value("message", "") == reason) return false;
        }
        changed = true;
        json conds = json::array();
        for (const json& c : o["status"].value("conditions", json::array())) {
          if (c.value("type", "") != "PodScheduled") conds.push_back(c);
        }
        conds.push_back({{"type", "PodScheduled"},
                         {"status", "False"},
                         {"reason", condition_reason},
                         {"message", reason},
                         {"lastProbeTime", nullptr},
                         {"lastTransitionTime", Rfc3339(std::chrono::system_clock::now())}});
        o["status"]["conditions"] = conds;
        o["status"]["phase"] = "Pending";
        return true;
      });
      // A gated pod is waiting by design: kube-scheduler records no event for it.
      if (r.ok() && changed && !s.gated) {
        RecordEvent(api_->store(), pod, "Warning", "FailedScheduling", reason, "default-scheduler");
      }
    }
    return;
  }
  if (!started_.count(uid) && phase != "Succeeded" && phase != "Failed") {
    Status st = runtime_->Start(pod);
    started_.insert(uid);
    if (!st.ok()) {
      std::string message = st.message();
      api_->Mutate(key, [&](json& o) {
        o["status"]["phase"] = "Failed";
        o["status"]["reason"] = "CreateContainerConfigError";
        o["status"]["message"] = message;
        return true;
      });
    }
  }
  }

void PodController::Sync() {
  Store& store = api_->store();
  Store::ListResult pods = store.List("pods/");
  std::vector<json> bound;
  std::map<std::string, std::string> key_of_uid;
  for (size_t i = 0; i < pods.items.size(); ++i) {
    key_of_uid[Md(pods.items[i], "uid")] = pods.keys[i];
    if (!FieldValue(pods.items[i], "spec.nodeName").empty()) bound.push_back(pods.items[i]);
  }
  for (size_t i = 0; i < pods.items.size(); ++i) {
    try {
      SyncPod(pods.items[i], pods.keys[i], &bound);
    } catch (const std::exception& e) {
      // One pod of an unexpected shape must not stop the others.
      std::cerr << "meshwork-controlplane: pod " << pods.keys[i] << ": " << e.what() << std::endl;
    }
  }
  // Pods removed from the store (forced deletion, namespace or CRD cleanup): stop and forget.
  for (auto it = started_.begin(); it != started_.end();) {
    if (key_of_uid.count(*it)) {
      ++it;
      continue;
    }
    if (!stopping_.count(*it)) {
      runtime_->Stop(*it, 0);
      stopping_.insert(*it);
    }
    if (runtime_->Stopped(*it)) {
      runtime_->Remove(*it);
      stopping_.erase(*it);
      it = started_.erase(it);
    } else {
      ++it;
    }
  }
  // Status from the runtime, written through the status subresource's rules (status only).
  for (auto& [uid, status] : runtime_->Poll()) {
    auto k = key_of_uid.find(uid);
    if (k == key_of_uid.end()) continue;
    json st = status;
    api_->Mutate(k->second, [&](json& o) {
      if (Md(o, "uid") != uid) return false;
      json merged = st;
      // Keep the scheduler's condition when the runtime does not report one.
      bool has_sched = false;
      for (const json& c : merged.value("conditions", json::array())) {
        if (c.value("type", "") == "PodScheduled") has_sched = true;
      }
      if (!has_sched && o.contains("status")) {
        for (const json& c : o["status"].value("conditions", json::array())) {
          if (c.value("type", "") == "PodScheduled") merged["conditions"].push_back(c);
        }
      }
      if (o.contains("status") && o["status"] == merged) return false;
      o["status"] = merged;
      return true;
    });
  }
  // Stable names from headless Services.
  Store::ListResult services = store.List("services/");
  std::vector<json> current = store.List("pods/").items;
  auto hosts = agent::HeadlessServiceHosts(current, services.items);
  if (hosts != hosts_) {
    runtime_->SetHosts(hosts);
    hosts_ = hosts;
  }
}

void PeriodicLoop::Start(std::string name, std::chrono::milliseconds period, std::function<void()> pass) {
  stop_ = false;
  thread_ = std::thread([this, name = std::move(name), period, pass = std::move(pass)] {
    while (!stop_) {
      try {
        pass();
      } catch (const std::exception& e) {
        std::cerr << "meshwork-controlplane: " << name << ": " << e.what() << std::endl;
      }
      std::this_thread::sleep_for(period);
    }
  });
}

void PeriodicLoop::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void PodController::Start() { loop_.Start("pod controller", std::chrono::milliseconds(100), [this] { Sync(); }); }

void PodController::Stop() { loop_.Stop(); }

// ---- deployment controller ----------------------------------------------------------------

std::string PodTemplateHash(const json& pod_template) {
  // FNV-1a, 32 bits, over the template's canonical JSON (keys sorted).
  uint32_t h = 2166136261u;
  for (unsigned char c : pod_template.dump()) {
    h ^= c;
    h *= 16777619u;
  }
  // rand.SafeEncodeString of the decimal value: no vowels, no look-alike digits.
  static const char* kAlphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::string out;
  for (char d : std::to_string(h)) out += kAlphabet[static_cast<unsigned char>(d) % 27];
  return out;
}

namespace {

const char* kHashLabel = "pod-template-hash";

bool PodReady(const json& pod) {
  if (!pod.contains("status") || !pod["status"].is_object()) return false;
  for (const json& c : pod["status"].value("conditions", json::array())) {
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  }
  return false;
}

// Ready for at least minReadySeconds.
bool PodAvailable(const json& pod, int64_t min_ready_seconds, std::chrono::system_clock::time_point now) {
  if (!PodReady(pod)) return false;
  if (min_ready_seconds <= 0) return true;
  for (const json& c : pod["status"].value("conditions", json::array())) {
    if (c.value("type", "") != "Ready") continue;
    std::tm tm{};
    std::string since = c.value("lastTransitionTime", "");
    if (strptime(since.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm) == nullptr) return true;
    auto t = std::chrono::system_clock::from_time_t(timegm(&tm));
    return now - t >= std::chrono::seconds(min_ready_seconds);
  }
  return true;
}

// The uid of the object's controller (ownerReference with controller: true), "" when none.
std::string ControllerUid(const json& obj) {
  for (const json& ref : OwnerRefs(obj)) {
    if (ref.is_object() && ref.value("controller", false)) return ref.value("uid", "");
  }
  return "";
}

// Which Pods a scale-down deletes first (kube's ActivePods order): unscheduled before
// scheduled, Pending before Running, not ready before ready, newer before older.
bool DeleteBefore(const json& a, const json& b) {
  auto rank = [](const json& p) {
    std::string phase = FieldValue(p, "status.phase");
    return std::make_tuple(!FieldValue(p, "spec.nodeName").empty(), phase == "Running" ? 2 : phase == "Pending" ? 0 : 1,
                           PodReady(p));
  };
  if (rank(a) != rank(b)) return rank(a) < rank(b);
  return Md(a, "creationTimestamp") > Md(b, "creationTimestamp");
}

// A condition with kube's time-keeping: lastTransitionTime changes with the status, lastUpdateTime
// with the status, reason or message.
json Condition(const json& previous_status, const std::string& type, const std::string& status,
               const std::string& reason, const std::string& message, const std::string& now) {
  json c = {{"type", type}, {"status", status}, {"reason", reason}, {"message", message},
            {"lastUpdateTime", now}, {"lastTransitionTime", now}};
  if (!previous_status.is_object()) return c;
  for (const json& old : previous_status.value("conditions", json::array())) {
    if (old.value("type", "") != type || old.value("status", "") != status) continue;
    c["lastTransitionTime"] = old.value("lastTransitionTime", now);
    if (old.value("reason", "") == reason && old.value("message", "") == message) {
      c["lastUpdateTime"] = old.value("lastUpdateTime", now);
    }
  }
  return c;
}

}  // namespace

void DeploymentController::SyncDeployment(const json& deployment, const std::string& key,
                                          const std::vector<json>& pods) {
  if (Deleting(deployment)) return;  // the garbage collector takes its Pods
  const ResourceInfo pod_info = api_->registry().Builtin("pods");
  std::string ns = Md(deployment, "namespace"), name = Md(deployment, "name"), uid = Md(deployment, "uid");
  const json spec = deployment.value("spec", json::object());
  int64_t desired = spec.value("replicas", int64_t{1});
  int64_t min_ready = spec.value("minReadySeconds", int64_t{0});
  const json tmpl = spec.value("template", json::object());
  std::string hash = PodTemplateHash(tmpl);
  std::string rs_name = name + "-" + hash;  // what kube would call the new ReplicaSet
  auto now = std::chrono::system_clock::now();

  // Fetch: the Pods this Deployment controls, by template.
  std::vector<json> current, old;
  int64_t old_terminating = 0;
  DeleteOptions background;
  background.propagation_policy = "Background";
  for (const json& pod : pods) {
    if (Md(pod, "namespace") != ns || ControllerUid(pod) != uid) continue;
    bool same_template = FieldValue(pod, std::string("metadata.labels.") + kHashLabel) == hash;
    if (Deleting(pod)) {
      if (!same_template) ++old_terminating;
      continue;
    }
    std::string phase = FieldValue(pod, "status.phase");
    if (phase == "Succeeded" || phase == "Failed") {
      // A finished Pod is replaced, as a ReplicaSet replaces it.
      auto r = api_->DeleteObject(pod_info, ns, Md(pod, "name"), background);
      (void)r;
      continue;
    }
    (same_template ? current : old).push_back(pod);
  }

  // Recreate: the old template's Pods go first; the new ones come once those are gone.
  std::string create_error;
  if (!old.empty()) {
    for (const json& pod : old) {
      auto r = api_->DeleteObject(pod_info, ns, Md(pod, "name"), background);
      (void)r;
    }
    RecordEvent(api_->store(), deployment, "Normal", "ScalingReplicaSet",
                "Scaled down replica set " + name + "-" + FieldValue(old[0], std::string("metadata.labels.") + kHashLabel) +
                    " to 0 from " + std::to_string(old.size()),
                "deployment-controller");
    old_terminating += static_cast<int64_t>(old.size());
    old.clear();
  } else if (old_terminating == 0 && static_cast<int64_t>(current.size()) < desired) {
    json labels = tmpl.contains("metadata") ? tmpl["metadata"].value("labels", json::object()) : json::object();
    if (!labels.is_object()) labels = json::object();
    labels[kHashLabel] = hash;
    json md = {{"generateName", rs_name + "-"},
               {"namespace", ns},
               {"labels", labels},
               {"ownerReferences",
                json::array({{{"apiVersion", "apps/v1"},
                              {"kind", "Deployment"},
                              {"name", name},
                              {"uid", uid},
                              {"controller", true},
                              {"blockOwnerDeletion", true}}})}};
    if (tmpl.contains("metadata") && tmpl["metadata"].contains("annotations")) {
      md["annotations"] = tmpl["metadata"]["annotations"];
    }
    json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", md}, {"spec", tmpl.value("spec", json::object())}};
    size_t before = current.size();
    while (static_cast<int64_t>(current.size()) < desired) {
      auto r = api_->CreateObject(pod_info, ns, pod);
      if (!r.ok()) {
        create_error = r.error.message;
        break;
      }
      current.push_back(*r.value);
    }
    if (current.size() > before) {
      RecordEvent(api_->store(), deployment, "Normal", "ScalingReplicaSet",
                  "Scaled up replica set " + rs_name + " to " + std::to_string(current.size()),
                  "deployment-controller");
    }
  } else if (static_cast<int64_t>(current.size()) > desired) {
    std::sort(current.begin(), current.end(), DeleteBefore);
    size_t extra = current.size() - static_cast<size_t>(std::max<int64_t>(desired, 0));
    for (size_t i = 0; i < extra; ++i) {
      auto r = api_->DeleteObject(pod_info, ns, Md(current[i], "name"), background);
      (void)r;
    }
    current.erase(current.begin(), current.begin() + static_cast<long>(extra));
    RecordEvent(api_->store(), deployment, "Normal", "ScalingReplicaSet",
                "Scaled down replica set " + rs_name + " to " + std::to_string(current.size()),
                "deployment-controller");
  }

  // Status, written once, from what the Pods are after this pass.
  int64_t updated = static_cast<int64_t>(current.size());
  int64_t ready = 0, available = 0;
  for (const json& pod : current) {
    if (PodReady(pod)) ++ready;
    if (PodAvailable(pod, min_ready, now)) ++available;
  }
  const json previous = deployment.value("status", json::object());
  std::string stamp = Rfc3339(now);
  json status = json::object();
  status["observedGeneration"] = deployment["metadata"].value("generation", int64_t{1});
  // Zero counts are left out, as kube-apiserver's JSON (omitempty) does.
  auto count = [&](const char* field, int64_t n) {
    if (n > 0) status[field] = n;
  };
  count("replicas", updated);
  count("updatedReplicas", updated);
  count("readyReplicas", ready);
  count("availableReplicas", available);
  count("unavailableReplicas", std::max<int64_t>(0, desired - available));
  json conditions = json::array();
  conditions.push_back(available >= desired
                           ? Condition(previous, "Available", "True", "MinimumReplicasAvailable",
                                       "Deployment has minimum availability.", stamp)
                           : Condition(previous, "Available", "False", "MinimumReplicasUnavailable",
                                       "Deployment does not have minimum availability.", stamp));
  bool complete = old_terminating == 0 && updated == desired && available == desired;
  conditions.push_back(complete ? Condition(previous, "Progressing", "True", "NewReplicaSetAvailable",
                                            "ReplicaSet \"" + rs_name + "\" has successfully progressed.", stamp)
                                : Condition(previous, "Progressing", "True", "ReplicaSetUpdated",
                                            "ReplicaSet \"" + rs_name + "\" is progressing.", stamp));
  bool new_failure = false;
  if (!create_error.empty()) {
    json c = Condition(previous, "ReplicaFailure", "True", "FailedCreate", create_error, stamp);
    new_failure = c["lastUpdateTime"] == stamp;
    conditions.push_back(c);
  }
  status["conditions"] = conditions;
  bool written = false;
  auto r = api_->Mutate(key, [&](json& o) {
    if (Md(o, "uid") != uid || Deleting(o)) return false;
    if (o.contains("status") && o["status"] == status) return false;
    o["status"] = status;
    written = true;
    return true;
  });
  // Events after the status write, and a failure only when it is new (no event per pass).
  if (r.ok() && written && new_failure) {
    RecordEvent(api_->store(), deployment, "Warning", "FailedCreate", "Error creating: " + create_error,
                "replicaset-controller");
  }
}

void DeploymentController::Sync() {
  Store& store = api_->store();
  std::string prefix = api_->registry().Builtin("deployments").StoreResource() + "/";
  Store::ListResult deployments = store.List(prefix);
  if (deployments.items.empty()) return;
  std::vector<json> pods = store.List("pods/").items;
  for (size_t i = 0; i < deployments.items.size(); ++i) {
    try {
      SyncDeployment(deployments.items[i], deployments.keys[i], pods);
    } catch (const std::exception& e) {
      // One Deployment of an unexpected shape must not stop the others.
      std::cerr << "meshwork-controlplane: deployment " << deployments.keys[i] << ": " << e.what() << std::endl;
    }
  }
}

void DeploymentController::Start() {
  loop_.Start("deployment controller", std::chrono::milliseconds(200), [this] { Sync(); });
}

void DeploymentController::Stop() { loop_.Stop(); }

}  // namespace meshwork::controlplane
