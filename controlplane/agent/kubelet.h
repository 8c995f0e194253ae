// The node agent's API side, for a real kube-apiserver (docs/controlplane-agent.md): registers
// the configured Nodes, renews their Leases and Ready condition, runs the Pods bound to them with
// PodRuntime and writes the Pods' status, as kubelet does. Scheduling is kube-scheduler's.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controlplane/agent/node_agent.h"
#include "operator/k8s/client.h"
#include "operator/k8s/informer.h"

namespace meshwork::controlplane::agent {

struct KubeletOptions {
  std::vector<NodeConfig> nodes;                      // at least one
  std::chrono::milliseconds sync_period{100};          // how often pods are synced
  std::chrono::seconds lease_duration{40};             // kube-node-lease Lease, as kubelet's default
  std::chrono::seconds lease_renew{10};
  std::chrono::seconds status_report{60};              // Node Ready heartbeat
  int kubelet_port = 0;  // the kubelet API's port (status.daemonEndpoints); 0: not served
  // Ask the API server for each Pod's bound service-account token (TokenRequest) and hand it to
  // the runtime, as kubelet's projected token volume does. Needs RuntimeOptions::service_account.
  bool service_account_tokens = false;
};

class Kubelet {
 public:
  // `client` (the node's identity: its Node, Lease and Pods) and `names_client` (reads every Pod
  // and Service for headless-Service names, as a cluster DNS does; may be the same client) and
  // `runtime` must outlive the Kubelet.
  Kubelet(k8s::Client* client, k8s::Client* names_client, PodRuntime* runtime, KubeletOptions options);
  ~Kubelet();  // Stop()
  Kubelet(const Kubelet&) = delete;
  Kubelet& operator=(const Kubelet&) = delete;

  // Creates each Node (or updates its labels and status) and its Lease. Errors name the node.
  Status Register();
  // Starts the pod and service informers and the sync thread.
  void Start();
  // Ends the sync thread and the informers; pods keep running (PodRuntime owns them).
  void Stop();

  // A Pod bound to one of this agent's nodes, from the informer's cache (the kubelet API's view).
  std::optional<nlohmann::json> FindPod(const std::string& ns, const std::string& name) const;

 private:
  // Whether the Pod is bound (spec.nodeName) to one of this agent's nodes.
  bool OnMyNode(const nlohmann::json& pod) const;
  void SyncLoop();
  void SyncOnce();
  // Re-reads the Pods whose keys the informer's events named since the last pass into mine_
  // (their uids; a Pod gone or moved leaves it), and returns them.
  std::vector<std::string> ApplyChangedPods();
  // Rebuilds mine_ from the whole cache.
  void WalkAllPods();
  void SyncPod(const nlohmann::json& pod);
  // The Pod's bound token ("" when it mounts none); an error leaves the Pod for the next pass.
  Result<std::string> ServiceAccountToken(const nlohmann::json& pod);
  void WriteStatuses(const std::map<std::string, nlohmann::json>& pod_by_uid);
  void Heartbeat(bool force);
  nlohmann::json NodeStatus(const NodeConfig& node) const;
  Status RenewLease(const NodeConfig& node, const std::string& node_uid);

  k8s::Client* client_;
  k8s::Client* names_client_;
  PodRuntime* runtime_;
  KubeletOptions options_;
  std::set<std::string> node_names_;
  std::map<std::string, std::string> node_uids_;  // for the Leases' owner references
  std::unique_ptr<k8s::Informer> pods_;       // this agent's Pods (spec.nodeName, with one node)
  std::unique_ptr<k8s::Informer> all_pods_;   // every Pod, for names
  std::unique_ptr<k8s::Informer> services_;

  std::set<std::string> started_;          // uids handed to the runtime
  std::set<std::string> stopping_;         // uids Stop was called for
  std::set<std::string> released_;         // uids whose final DELETE went out
  std::map<std::string, nlohmann::json> unwritten_;  // uid -> status not yet accepted by the API
  std::map<std::string, std::chrono::steady_clock::time_point> token_errors_;  // uid -> last logged
  std::map<std::string, std::string> hosts_;
  std::map<std::string, nlohmann::json> mine_;  // uid -> this node's Pod, as of the last pass
  std::map<std::string, std::string> uid_of_key_;  // namespace/name -> its uid in mine_
  std::mutex changed_mu_;
  std::set<std::string> changed_;  // keys of this node's Pods the informer changed since the last pass
  std::set<std::string> retry_;    // keys of Pods to start again next pass (no token yet)
  std::atomic<bool> names_changed_{true};
  std::chrono::steady_clock::time_point last_walk_{};
  std::chrono::steady_clock::time_point last_lease_{};
  std::chrono::steady_clock::time_point last_status_{};

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace meshwork::controlplane::agent
