// All-or-nothing gang placement (issue 20): a gang's Pods are created behind a scheduling gate
// (kGangGate) and released together only once every one of them fits the cluster's free
// capacity, so two gangs can never each hold part of the room the other needs (rank 0 of both
// running, rank 1 of both Pending, until the rendezvous times out). This is the decision, on
// plain JSON: the Nodes, the Pods that use or will use their capacity, and the gang.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshwork::op {

inline constexpr const char* kGangGate = "meshwork.dev/gang";

// A Node's Ready condition, null when it has none: gang admission leaves out a Node whose status
// is not True, and node loss (policy/node_loss.cpp) reads its status, reason and time.
nlohmann::json ReadyConditionOf(const nlohmann::json& node);

// Whether `pod` still carries kGangGate.
bool HasGangGate(const nlohmann::json& pod);

struct GangFit {
  bool fits = false;
  std::string why;  // when it does not: what the gang needs and what is free, for an Event
};

// Places `gang` (Pods, their requests from their containers' requests or limits, and their
// nodeSelector) on `nodes` (a NodeList: status.allocatable, else status.capacity; unschedulable
// nodes are skipped), first fit, largest cpu request first, after what `pods` (a PodList)
// already takes: every Pod bound to a node and not finished, and every Pod a gang admitted
// earlier that the scheduler has not bound yet (labelled meshwork.dev/job, no node, without the
// gang gate: another gate, such as Kueue's topology gate, does not make its room free).
// Taints, affinity and ports are not considered (the scheduler still checks them).
GangFit FitGang(const nlohmann::json& nodes, const nlohmann::json& pods, const std::vector<nlohmann::json>& gang);

// What a Pod asks of a node: its containers' requests (else limits), summed.
struct PodRequests {
  double cpu = 0;
  int64_t memory = 0;
  int64_t gpus = 0;
};
PodRequests RequestsOf(const nlohmann::json& pod);

// The room the cluster's Pods take, kept up to date one Pod event at a time (the operator feeds
// it from its informer of Pods that hold room), so that an admission reads a summary whose size
// is the node count and the few released Pods not bound yet, instead of copying every Pod.
class RoomLedger {
 public:
  // The Pod of `key` is now `pod` (an add or an update); Remove: it is gone, or finished.
  void Set(const std::string& key, const nlohmann::json& pod);
  void Remove(const std::string& key);

  // A released gang Pod not bound yet, as placement reads it: what it asks and where it may go.
  struct Claim {
    PodRequests requests;
    nlohmann::json node_selector;  // spec.nodeSelector, null when it has none
  };
  struct Snapshot {
    std::map<std::string, PodRequests> bound;  // node name -> what its bound, unfinished Pods ask
    // Gang Pods released, not bound yet (FitGang's rule), that ask for anything: a Pod that asks
    // for nothing takes no room wherever it lands.
    std::vector<Claim> released;
  };
  // What the Pods not owned by `skip_owner_uid` (the gang being placed) take.
  Snapshot Taken(const std::string& skip_owner_uid) const;
  // The resourceVersion of the Pod of `key` as last Set, "" when the ledger does not have it.
  std::string VersionOf(const std::string& key) const;

 private:
  struct Entry {
    std::string node;        // "" when not bound
    std::string owner_uid;   // the first ownerReference's uid
    std::string version;     // metadata.resourceVersion
    PodRequests requests;
    nlohmann::json node_selector;  // kept for a released gang Pod not bound yet
  };
  void Drop(const std::string& key);  // mu_ held

  mutable std::mutex mu_;
  std::map<std::string, Entry> pods_;  // by Pod key, the Pods that take or will take room
  // The keys of pods_ whose Pod is released, not bound, and asks for room: an admission reads
  // these few, not every Pod the ledger holds.
  std::set<std::string> released_;
  std::map<std::string, PodRequests> bound_;  // node -> the sum of its bound Pods' requests
  // (node, owner uid) -> the part of bound_ that owner's Pods take: an admission leaves the gang's
  // own job out, as FitGang's caller leaves the job's own Pods out of `pods`.
  std::map<std::pair<std::string, std::string>, PodRequests> bound_by_owner_;
};

// FitGang with the other Pods' room from a ledger's Snapshot.
GangFit FitGang(const nlohmann::json& nodes, const RoomLedger::Snapshot& taken, const std::vector<nlohmann::json>& gang);

}  // namespace meshwork::op
