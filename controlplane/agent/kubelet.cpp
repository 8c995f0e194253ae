// The node agent's API side: Node registration, Lease and Ready heartbeats, and the pod sync loop
// (start, stop, final delete, status) over the Kubernetes API.
#include "controlplane/agent/kubelet.h"

#include <cstdio>
#include <ctime>
#include <iostream>
#include <utility>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/pod_network.h"
#include "controlplane/agent/pod_status_patch.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;
namespace resources = k8s::resources;

std::string Md(const json& obj, const char* key) { return internal::StringAt(internal::ObjectAt(obj, "metadata"), key); }

// metav1.MicroTime as the API writes it: "2026-11-26T06:00:00.123456Z".
std::string MicroTime(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us % 1000000));
  return buf;
}

void Log(const std::string& message) { std::cerr << "meshwork-node-agent: " << message << std::endl; }

}  // namespace

Kubelet::Kubelet(k8s::Client* client, k8s::Client* names_client, PodRuntime* runtime, KubeletOptions options)
    : client_(client), names_client_(names_client), runtime_(runtime), options_(std::move(options)) {
  for (const NodeConfig& n : options_.nodes) node_names_.insert(n.name);
}

Kubelet::~Kubelet() { Stop(); }

Status Kubelet::Register() {
  for (const NodeConfig& node : options_.nodes) {
    const json desired = NodeObject(node);
    auto current = client_->Get(resources::Nodes(), "", node.name);
    json object;
    if (!current.ok() && k8s::IsNotFound(current.error())) {
      auto created = client_->Create(resources::Nodes(), "", desired);
      if (!created.ok()) return Unavailable("node " + node.name + ": create: " + created.error().ToString());
      object = created.value();
    } else if (!current.ok()) {
      return Unavailable("node " + node.name + ": get: " + current.error().ToString());
    } else {
      auto patched = client_->MergePatch(resources::Nodes(), "", node.name,
                                         {{"metadata", {{"labels", desired["metadata"]["labels"]}}}});
      if (!patched.ok()) return Unavailable("node " + node.name + ": labels: " + patched.error().ToString());
      object = patched.value();
    }
    // Capacity, addresses and the Ready condition live in status, which create ignores.
    auto status = client_->MergePatch(resources::Nodes(), "", node.name, {{"status", NodeStatus(node)}}, "status");
    if (!status.ok()) return Unavailable("node " + node.name + ": status: " + status.error().ToString());
    node_uids_[node.name] = Md(object, "uid");
    MW_RETURN_IF_ERROR(RenewLease(node, node_uids_[node.name]));
  }
  last_lease_ = last_status_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

Status Kubelet::RenewLease(const NodeConfig& node, const std::string& node_uid) {
  const std::string now = MicroTime(std::chrono::system_clock::now());
  auto patched = client_->MergePatch(resources::Leases(), "kube-node-lease", node.name,
                                     {{"spec", {{"holderIdentity", node.name}, {"renewTime", now}}}});
  if (patched.ok()) return Status::Ok();
  if (!k8s::IsNotFound(patched.error())) {
    return Unavailable("node " + node.name + ": lease: " + patched.error().ToString());
  }
  json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", node.name}, {"namespace", "kube-node-lease"}}},
                {"spec",
                 {{"holderIdentity", node.name},
                  {"leaseDurationSeconds", options_.lease_duration.count()},
                  {"renewTime", now}}}};
  if (!node_uid.empty()) {
    // As kubelet does: the Lease goes when its Node does.
    lease["metadata"]["ownerReferences"] = {
        {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node.name}, {"uid", node_uid}}};
  }
  auto created = client_->Create(resources::Leases(), "kube-node-lease", lease);
  if (!created.ok() && !k8s::IsAlreadyExists(created.error())) {
    return Unavailable("node " + node.name + ": lease: " + created.error().ToString());
  }
  return Status::Ok();
}

void Kubelet::Heartbeat(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (force || now - last_lease_ >= options_.lease_renew) {
    last_lease_ = now;
    for (const NodeConfig& node : options_.nodes) {
      Status s = RenewLease(node, node_uids_[node.name]);
      if (!s.ok()) Log(s.message());
    }
  }
  if (force || now - last_status_ >= options_.status_report) {
    last_status_ = now;
    for (const NodeConfig& node : options_.nodes) {
      const json status = NodeStatus(node);
      auto r = client_->MergePatch(resources::Nodes(), "", node.name, {{"status", status}}, "status");
      if (!r.ok()) Log("node " + node.name + ": status: " + r.error().ToString());
    }
  }
}

json Kubelet::NodeStatus(const NodeConfig& node) const {
  json status = NodeObject(node)["status"];
  if (options_.kubelet_port > 0) {
    status["daemonEndpoints"] = {{"kubeletEndpoint", {{"Port", options_.kubelet_port}}}};
  }
  return status;
}

bool Kubelet::OnMyNode(const json& pod) const {
  return node_names_.count(internal::StringAt(internal::ObjectAt(pod, "spec"), "nodeName")) > 0;
}

std::optional<json> Kubelet::FindPod(const std::string& ns, const std::string& name) const {
  if (!pods_) return std::nullopt;
  std::optional<json> pod = pods_->store().Get(ns + "/" + name);
  if (!pod || !OnMyNode(*pod)) {
    return std::nullopt;
  }
  return pod;
}

void Kubelet::Start() {
  k8s::InformerOptions opts;
  opts.watch_timeout_seconds = 300;
  // This node's Pods. A node's identity may list only those (the Node authorizer wants the
  // spec.nodeName selector), so an agent of one node asks for them by name.
  k8s::InformerOptions mine = opts;
  if (options_.nodes.size() == 1) mine.field_selector = "spec.nodeName=" + options_.nodes[0].name;
  pods_ = std::make_unique<k8s::Informer>(client_, resources::Pods(), "", mine);
  // Every Pod and Service, through the names identity: headless Service names point at Pods on
  // any node (EndpointSlices would be the source, but they refuse the Pods' loopback addresses).
  all_pods_ = std::make_unique<k8s::Informer>(names_client_, resources::Pods(), "", opts);
  services_ = std::make_unique<k8s::Informer>(names_client_, resources::Services(), "", opts);
  // Passes act on what changed: a pass that read every cached Pod on any change cost a burst of
  // 2,000 one-Pod jobs O(Pods^2), more CPU than the API server. The whole cache is walked once a
  // second.
  auto changed = [this](const json& pod) {
    std::lock_guard<std::mutex> lock(changed_mu_);
    changed_.insert(Md(pod, "namespace") + "/" + Md(pod, "name"));
  };
  pods_->AddEventHandlers(k8s::EventHandlers{changed, [changed](const json&, const json& pod) { changed(pod); }, changed});
  auto mark = [](std::atomic<bool>* flag) {
    return k8s::EventHandlers{[flag](const json&) { *flag = true; }, [flag](const json&, const json&) { *flag = true; },
                              [flag](const json&) { *flag = true; }};
  };
  all_pods_->AddEventHandlers(mark(&names_changed_));
  services_->AddEventHandlers(mark(&names_changed_));
  pods_->Start();
  all_pods_->Start();
  services_->Start();
  stop_ = false;
  thread_ = std::thread([this] { SyncLoop(); });
}

void Kubelet::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (pods_) pods_->Stop();
  if (all_pods_) all_pods_->Stop();
  if (services_) services_->Stop();
}

void Kubelet::SyncLoop() {
  while (!stop_) {
    try {
      if (pods_->HasSynced() && all_pods_->HasSynced() && services_->HasSynced()) SyncOnce();
      Heartbeat(false);
    } catch (const std::exception& e) {
      // One object of an unexpected shape must not stop the node.
      Log(std::string("sync: ") + e.what());
    }
    std::this_thread::sleep_for(options_.sync_period);
  }
}

void Kubelet::SyncPod(const json& pod) {
  const std::string uid = Md(pod, "uid");
  const std::string ns = Md(pod, "namespace");
  const std::string name = Md(pod, "name");
  const json& md = pod["metadata"];
  if (md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null()) {
    if (started_.count(uid) && !stopping_.count(uid)) {
      std::optional<int> grace;
      if (md.contains("deletionGracePeriodSeconds") && md["deletionGracePeriodSeconds"].is_number()) {
        grace = md["deletionGracePeriodSeconds"].get<int>();
      }
      runtime_->Stop(uid, grace);
      stopping_.insert(uid);
    }
    if (!released_.count(uid) && runtime_->Stopped(uid)) {
      // The processes are gone: kubelet's final DELETE with grace 0 lets the object go.
      k8s::DeleteOptions del;
      del.grace_period_seconds = 0;
      del.precondition_uid = uid;
      auto r = client_->Delete(resources::Pods(), ns, name, del);
      if (r.ok() || k8s::IsNotFound(r.error()) || k8s::IsConflict(r.error())) {
        released_.insert(uid);
      } else {
        Log("pod " + ns + "/" + name + ": delete: " + r.error().ToString());
      }
    }
    return;
  }
  const std::string phase = internal::StringAt(internal::ObjectAt(pod, "status"), "phase");
  if (started_.count(uid) || phase == "Succeeded" || phase == "Failed") return;
  auto token = ServiceAccountToken(pod);
  if (!token.ok()) {
    // Retried every pass (100 ms); said at most every 30 s per Pod.
    retry_.insert(ns + "/" + name);
    auto& last = token_errors_[uid];
    if (std::chrono::steady_clock::now() - last > std::chrono::seconds(30)) {
      last = std::chrono::steady_clock::now();
      Log("pod " + ns + "/" + name + ": service account token: " + token.status().message() + " (retrying)");
    }
    return;
  }
  token_errors_.erase(uid);
  Status st = runtime_->Start(pod, token.value());
  started_.insert(uid);
  if (!st.ok()) {
    // A Pod whose network could not be made is kubelet's FailedCreatePodSandBox; kubelet retries
    // it, here it fails at once with the plugin's message, which a retry would only repeat.
    const bool sandbox = st.message().rfind(kPodNetworkError, 0) == 0;
    json status = {{"phase", "Failed"},
                   {"reason", sandbox ? "FailedCreatePodSandBox" : "CreateContainerConfigError"},
                   {"message", st.message()}};
    auto r = client_->MergePatch(resources::Pods(), ns, name, PodStatusPatch(uid, status), "status");
    if (!r.ok()) Log("pod " + ns + "/" + name + ": status: " + r.error().ToString());
  }
}

Result<std::string> Kubelet::ServiceAccountToken(const json& pod) {
  const json& spec = internal::ObjectAt(pod, "spec");
  if (!options_.service_account_tokens ||
      (spec.contains("automountServiceAccountToken") && spec["automountServiceAccountToken"] == false)) {
    return std::string();
  }
  std::string account = internal::StringAt(spec, "serviceAccountName");
  if (account.empty()) account = "default";
  // 3607 s is kubelet's request: the API server recognises it and extends a Pod-bound token's
  // life (--service-account-extend-token-expiration), so a long Pod needs no rotation here.
  const json request = {
      {"apiVersion", "authentication.k8s.io/v1"},
      {"kind", "TokenRequest"},
      {"spec",
       {{"expirationSeconds", 3607},
        {"boundObjectRef", {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", Md(pod, "name")}, {"uid", Md(pod, "uid")}}}}}};
  auto answer = client_->CreateSubresource(k8s::ResourceRef{"", "v1", "serviceaccounts", true}, Md(pod, "namespace"),
                                           account, "token", request);
  if (!answer.ok()) return Unavailable("serviceaccount " + account + ": " + answer.error().ToString());
  const std::string token = internal::StringAt(internal::ObjectAt(answer.value(), "status"), "token");
  if (token.empty()) return Unavailable("serviceaccount " + account + ": the TokenRequest answer has no status.token");
  return token;
}

void Kubelet::WriteStatuses(const std::map<std::string, json>& pod_by_uid) {
  for (auto& [uid, status] : runtime_->Poll()) unwritten_[uid] = status;
  for (auto it = unwritten_.begin(); it != unwritten_.end();) {
    auto pod = pod_by_uid.find(it->first);
    if (pod == pod_by_uid.end()) {  // gone from the API
      it = unwritten_.erase(it);
      continue;
    }
    json status = it->second;
    // The API server computes qosClass at creation and refuses a change; PodScheduled is the
    // scheduler's. Merge patch replaces the conditions list, so the scheduler's is carried over.
    status.erase("qosClass");
    for (const json& c : internal::ArrayAt(internal::ObjectAt(pod->second, "status"), "conditions")) {
      if (c.value("type", "") == "PodScheduled") status["conditions"].push_back(c);
    }
    auto r = client_->MergePatch(resources::Pods(), Md(pod->second, "namespace"), Md(pod->second, "name"),
                                 PodStatusPatch(it->first, status), "status");
    if (r.ok() || k8s::IsNotFound(r.error())) {
      it = unwritten_.erase(it);
    } else if (RecreatedUnderSameName(r.error())) {
      Log("pod " + Md(pod->second, "namespace") + "/" + Md(pod->second, "name") + " (uid " + it->first +
          ") is gone and another Pod has its name: its last status is not written");
      it = unwritten_.erase(it);
    } else {
      Log("pod " + Md(pod->second, "namespace") + "/" + Md(pod->second, "name") + ": status: " + r.error().ToString());
      ++it;  // tried again next pass
    }
  }
}

void Kubelet::WalkAllPods() {
  mine_.clear();
  uid_of_key_.clear();
  pods_->store().ForEach([this](const std::string& key, const json& pod) {
    if (!OnMyNode(pod)) return;
    const std::string uid = Md(pod, "uid");
    mine_[uid] = pod;
    uid_of_key_[key] = uid;
  });
}

std::vector<std::string> Kubelet::ApplyChangedPods() {
  std::set<std::string> keys = std::move(retry_);
  retry_.clear();
  {
    std::lock_guard<std::mutex> lock(changed_mu_);
    keys.merge(changed_);
    changed_.clear();
  }
  std::vector<std::string> uids;
  for (const std::string& key : keys) {
    std::optional<json> pod = pods_->store().Get(key);
    const bool here = pod && OnMyNode(*pod);
    auto known = uid_of_key_.find(key);
    const std::string uid = here ? Md(*pod, "uid") : "";
    // A Pod deleted, moved, or made again under its name (another uid): the old one is gone.
    if (known != uid_of_key_.end() && known->second != uid) {
      mine_.erase(known->second);
      uid_of_key_.erase(known);
    }
    if (!here) continue;
    uid_of_key_[key] = uid;
    mine_[uid] = std::move(*pod);
    uids.push_back(uid);
  }
  return uids;
}

void Kubelet::SyncOnce() {
  // The Pods that changed are synced every pass, those stopping too (until their processes are
  // gone), and every Pod once a second.
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> to_sync = ApplyChangedPods();
  if (now - last_walk_ >= std::chrono::seconds(1)) {
    last_walk_ = now;
    WalkAllPods();
    to_sync.clear();
    for (const auto& [uid, pod] : mine_) to_sync.push_back(uid);
  } else {
    to_sync.insert(to_sync.end(), stopping_.begin(), stopping_.end());
  }
  std::set<std::string> synced;
  for (const std::string& uid : to_sync) {
    auto pod = mine_.find(uid);
    if (pod == mine_.end() || !synced.insert(uid).second) continue;
    try {
      SyncPod(pod->second);
    } catch (const std::exception& e) {
      Log("pod " + Md(pod->second, "namespace") + "/" + Md(pod->second, "name") + ": " + e.what());
    }
  }
  // Pods gone from the API (deleted with grace 0, or their namespace removed): stop and forget.
  for (auto it = started_.begin(); it != started_.end();) {
    if (mine_.count(*it)) {
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
      released_.erase(*it);
      it = started_.erase(it);
    } else {
      ++it;
    }
  }
  WriteStatuses(mine_);
  if (names_changed_.exchange(false)) {
    // Read in place: copying every Pod of the cluster on each change was most of a burst's cost.
    HeadlessServiceHostsBuilder builder;
    services_->store().ForEach([&](const std::string&, const json& svc) { builder.AddService(svc); });
    all_pods_->store().ForEach([&](const std::string&, const json& pod) { builder.AddPod(pod); });
    auto hosts = builder.Take();
    if (hosts != hosts_) {
      runtime_->SetHosts(hosts);
      hosts_ = std::move(hosts);
    }
  }
}

}  // namespace meshwork::controlplane::agent
