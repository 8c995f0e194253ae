// The control plane's own controllers over the store: the garbage collector (ownerReferences,
// foreground deletion, namespace cleanup), the pod controller that schedules pods onto the
// configured nodes and runs them with the node agent, and the Deployment controller. Level-triggered: each pass reads the
// store and fixes what differs, so a restart resumes where the last process stopped.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controlplane/agent/node_agent.h"
#include "controlplane/apiserver/api_server.h"

namespace meshwork::controlplane {

// Runs `pass` every `period` on its own thread until Stop(). An exception from a pass is logged
// under `name` and the loop goes on: one object of an unexpected shape must not stop a controller.
class PeriodicLoop {
 public:
  ~PeriodicLoop() { Stop(); }
  void Start(std::string name, std::chrono::milliseconds period, std::function<void()> pass);
  void Stop();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class GarbageCollector {
 public:
  explicit GarbageCollector(ApiServer* api) : api_(api) {}
  ~GarbageCollector() { Stop(); }

  // One pass: deletes (background) objects whose every owner is gone, deletes dependents of
  // owners in foreground deletion and drops the owner's foregroundDeletion finalizer once no
  // blocking dependent remains, empties and then removes terminating namespaces.
  void Sweep();
  // Runs Sweep after store changes (and every second) on its own thread.
  void Start();
  void Stop();

 private:
  ApiServer* api_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class PodController {
 public:
  PodController(ApiServer* api, std::vector<agent::NodeConfig> nodes, agent::PodRuntime* runtime)
      : api_(api), nodes_(std::move(nodes)), runtime_(runtime) {}
  ~PodController() { Stop(); }

  // Writes the Node objects of the configured nodes (and removes others).
  void RegisterNodes();
  // One pass: schedule, start, stop, remove, write statuses from the runtime, update hosts.
  void Sync();
  void Start();
  void Stop();

 private:
  void SyncPod(const nlohmann::json& pod, const std::string& key, std::vector<nlohmann::json>* bound);

  ApiServer* api_;
  std::vector<agent::NodeConfig> nodes_;
  agent::PodRuntime* runtime_;
  std::set<std::string> started_;   // uids handed to the runtime
  std::set<std::string> stopping_;  // uids Stop was called for
  std::map<std::string, std::string> hosts_;
  PeriodicLoop loop_;
};

// Keeps each Deployment's Pods: spec.replicas Pods from spec.template, owned by the Deployment
// directly (there is no ReplicaSet layer), named <deployment>-<pod-template-hash>-<5 chars>.
// A changed template is rolled out as Recreate: the old Pods are deleted, and the new ones are
// created once the old ones are gone. Finished (Succeeded/Failed) Pods are replaced. Writes the
// Deployment's status (replica counts, Available/Progressing/ReplicaFailure conditions) as
// kube-controller-manager does, so that `kubectl rollout status` and `kubectl wait` work.
class DeploymentController {
 public:
  explicit DeploymentController(ApiServer* api) : api_(api) {}
  ~DeploymentController() { Stop(); }

  // One pass over every Deployment.
  void Sync();
  // Runs Sync every 200 ms on its own thread.
  void Start();
  void Stop();

 private:
  void SyncDeployment(const nlohmann::json& deployment, const std::string& key,
                      const std::vector<nlohmann::json>& pods);

  ApiServer* api_;
  PeriodicLoop loop_;
};

// The pod-template-hash label of a Pod template, as kube-controller-manager computes it (FNV-1a
// of the template, encoded with the alphabet of generated names; not byte-identical to
// kube's, which hashes the Go struct's printed form).
std::string PodTemplateHash(const nlohmann::json& pod_template);

}  // namespace meshwork::controlplane
