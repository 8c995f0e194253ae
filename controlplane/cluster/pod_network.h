// The local cluster's Pod network (docs/cluster.md, "Pod network"): one bridge every node's Pods
// attach to, with the host's address on it (where Pods reach kube-apiserver), and a Pod CIDR per
// node inside its subnet, which that node's agent hands out through the CNI plugins
// (controlplane/agent/pod_network.h). Clusters on one machine take distinct slots: slot k is
// 100.(64+k).0.0/16 on bridge "mwpods<k>", held by a lock under /run/meshwork/pod-network for the
// cluster's life; a cluster that takes a slot first clears what an earlier holder left.
#pragma once

#include <string>

#include "common/status.h"

namespace meshwork::controlplane::cluster {

class ClusterNetwork {
 public:
  // Takes a free slot, clears its leftovers and brings up its bridge (with `ip`, from iproute2).
  // Unavailable saying why when it cannot (not root, no CNI plugins in cni_bin_dir, no `ip`, no
  // free slot, the bridge refused): the cluster then runs Pods on loopback addresses.
  static Result<ClusterNetwork> SetUp(const std::string& cni_bin_dir);
  ClusterNetwork(ClusterNetwork&& other) noexcept;
  ClusterNetwork& operator=(ClusterNetwork&& other) noexcept;
  ~ClusterNetwork();  // TearDown

  // Deletes the bridge and the slot's directory and gives the slot back. After the node agents
  // have stopped (they release their Pods' namespaces). Idempotent.
  void TearDown();

  const std::string& bridge() const { return bridge_; }
  const std::string& subnet() const { return subnet_; }    // "100.64.0.0/16"
  const std::string& gateway() const { return gateway_; }  // "100.64.0.1": the host's address on the bridge
  const std::string& cni_bin_dir() const { return cni_bin_dir_; }
  // Node i's Pod CIDR ("100.64.<i+1>.0/24", so at most 254 nodes) and its agent's directory.
  std::string NodeCidr(size_t i) const;
  std::string NodeDir(const std::string& node) const;

 private:
  ClusterNetwork() = default;

  int slot_ = -1;
  int lock_fd_ = -1;
  std::string bridge_, subnet_, gateway_, dir_, cni_bin_dir_;
};

}  // namespace meshwork::controlplane::cluster
