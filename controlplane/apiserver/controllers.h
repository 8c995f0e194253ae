// The control plane's own controllers over the store: the garbage collector (ownerReferences,
// foreground deletion, namespace cleanup) and the pod controller that schedules pods onto the
// configured nodes and runs them with the node agent. Level-triggered: each pass reads the
// store and fixes what differs, so a restart resumes where the last process stopped.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controlplane/agent/node_agent.h"
#include "controlplane/apiserver/api_server.h"

namespace meshwork::controlplane {

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
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace meshwork::controlplane
