// Node loss: a rank's node that stopped reporting (Ready False or Unknown: the node lifecycle
// controller marks a kubelet that missed its heartbeats) for spec.runPolicy.nodeLossGraceSeconds,
// or that was deleted, has lost the rank, whatever its Pod's phase still says: no kubelet is there
// to end it or to finish a graceful delete. Failure (failure.cpp) restarts the gang on the other
// nodes as a disruption, as JobSet and Kueue treat node failures; deletes of lost Pods are
// immediate (grace 0, the reconciler's DeletePods), as kube-controller-manager's Pod garbage
// collector forces them on a node that is gone.
#include "operator/controller/policy/policy.h"

namespace meshwork::op::policy {

std::optional<Decision> MarkNodeLoss(const Observed& in, const JobSpec& spec, std::vector<PodView>* pods) {
  const auto grace = std::chrono::seconds(spec.node_loss_grace_seconds);
  std::optional<std::chrono::seconds> first_end;  // the soonest grace to end, from now
  for (PodView& pod : *pods) {
    if (pod.node.empty()) continue;
    auto it = in.unhealthy_nodes.find(pod.node);
    if (it == in.unhealthy_nodes.end()) continue;
    const NodeHealth& node = it->second;
    if (node.deleted && !node.since) {
      pod.node_lost = true;
      pod.node_lost_why = "node " + pod.node + " was deleted";
      continue;
    }
    if (!node.since) continue;  // not judged (decide.h)
    const auto down = std::chrono::duration_cast<std::chrono::seconds>(in.now - *node.since);
    const std::string how =
        node.deleted ? "node " + pod.node + " was deleted (the Pod was bound to it at " + FormatTime(*node.since) + ")"
                     : "node " + pod.node + " is NotReady (Ready " + node.ready +
                           (node.reason.empty() ? "" : ", " + node.reason) + ") since " + FormatTime(*node.since);
    if (down >= grace) {
      pod.node_lost = true;
      pod.node_lost_why = node.deleted ? how : how + ", " + std::to_string(down.count()) +
                                                   " s, past runPolicy.nodeLossGraceSeconds " + std::to_string(grace.count());
    } else if (pod.phase != "Succeeded" && pod.phase != "Failed") {
      const auto left = grace - down;
      if (!first_end || left < *first_end) first_end = left;
    }
  }
  if (!first_end) return std::nullopt;
  Decision d;  // an adjustment: nothing but the look when the grace ends
  d.requeue_after = *first_end;
  return d;
}

}  // namespace meshwork::op::policy
