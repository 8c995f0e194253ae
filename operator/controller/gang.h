// All-or-nothing gang placement (issue 20): a gang's Pods are created behind a scheduling gate
// (kGangGate) and released together only once every one of them fits the cluster's free
// capacity, so two gangs can never each hold part of the room the other needs (rank 0 of both
// running, rank 1 of both Pending, until the rendezvous times out). This is the decision, on
// plain JSON: the Nodes, the Pods that use or will use their capacity, and the gang.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshwork::op {

inline constexpr const char* kGangGate = "meshwork.dev/gang";

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

}  // namespace meshwork::op
