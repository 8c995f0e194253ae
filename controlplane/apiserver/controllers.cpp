// Garbage collector and pod controller (see controllers.h).
#include "controlplane/apiserver/controllers.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>

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

// Records a core/v1 Event about a pod, as the scheduler does (kubectl describe lists them).
void RecordPodEvent(Store& store, const json& pod, const std::string& type, const std::string& reason,
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
  std::string ns = Md(pod, "namespace"), name = Md(pod, "name");
  std::string now = Rfc3339(std::chrono::system_clock::now());
  json ev = {{"apiVersion", "v1"},
             {"kind", "Event"},
             {"metadata", {{"name", name + "." + suffix}, {"namespace", ns}, {"uid", uid}, {"creationTimestamp", now}}},
             {"involvedObject",
              {{"apiVersion", "v1"}, {"kind", "Pod"}, {"namespace", ns}, {"name", name}, {"uid", Md(pod, "uid")}}},
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
        RecordPodEvent(api_->store(), pod, "Normal", "Scheduled",
                       "Successfully assigned " + Md(pod, "namespace") + "/" + Md(pod, "name") + " to " + chosen,
                       "default-scheduler");
      }
    } else {
      std::string reason = s.reason;
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
                         {"reason", "Unschedulable"},
                         {"message", reason},
                         {"lastProbeTime", nullptr},
                         {"lastTransitionTime", Rfc3339(std::chrono::system_clock::now())}});
        o["status"]["conditions"] = conds;
        o["status"]["phase"] = "Pending";
        return true;
      });
      if (r.ok() && changed) RecordPodEvent(api_->store(), pod, "Warning", "FailedScheduling", reason, "default-scheduler");
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

void PodController::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_) {
      try {
        Sync();
      } catch (const std::exception& e) {
        std::cerr << "meshwork-controlplane: pod controller: " << e.what() << std::endl;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

void PodController::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace meshwork::controlplane
