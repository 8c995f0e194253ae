// Pods' own network namespaces, made as a kubelet's container runtime makes a Pod sandbox's: one
// namespace per Pod, pinned by a file (a bind mount of the namespace) under the network's directory,
// and the CNI reference plugins called in it by the CNI protocol (the command and the Pod in
// CNI_* variables, the network's config as JSON on stdin, the result or the error as JSON on
// stdout): `bridge` with `host-local` IPAM gives the Pod eth0 on the node's bridge with an address
// from the node's Pod CIDR, and `loopback` brings up its lo. Deleting runs the plugins' DEL, which
// removes the veth and releases the lease, and then drops the namespace. docs/controlplane-agent.md,
// "Pod networks".
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace meshwork::controlplane::agent {

// What PodRuntime::Start's error message starts with when the Pod's network could not be made
// (the Kubelet reports such a Pod with reason FailedCreatePodSandBox, as kubelet does).
inline constexpr const char* kPodNetworkError = "pod network: ";

struct PodNetworkOptions {
  std::string cni_bin_dir;  // where the bridge, host-local and loopback plugins are
  // This node's own directory: netns/<uid> pins each Pod's namespace, ipam/ holds host-local's
  // leases. An agent that starts on a directory an earlier one left releases what it finds there.
  std::string dir;
  std::string bridge;    // the bridge every node's Pods attach to (made by the bridge plugin if absent)
  std::string subnet;    // the bridge's network, e.g. "100.64.0.0/16": every node's Pods are on it
  std::string gateway;   // the host's address on the bridge, e.g. "100.64.0.1" (in subnet, outside pod_cidr)
  std::string pod_cidr;  // the addresses this node hands out, inside subnet, e.g. "100.64.1.0/24"
  std::chrono::milliseconds plugin_timeout{30000};  // a plugin that runs longer is killed: an error
};

class PodNetwork {
 public:
  // Checks the options (InvalidConfig naming the option and its value: CIDRs that do not parse,
  // a pod_cidr outside subnet, a gateway outside subnet or inside pod_cidr, a plugin that is not
  // executable) and that this process may make a network namespace (Unavailable saying why not:
  // not root, or namespaces refused), then releases what an earlier agent left in `dir` (what a
  // plugin refuses to release is logged on stderr, not an error). The bridge is not checked: the
  // bridge plugin makes it when absent, and then nothing on it has the gateway address.
  static Result<std::unique_ptr<PodNetwork>> Create(PodNetworkOptions options);

  // Only Create makes one (the key is private); public for std::make_unique.
  struct Key {
   private:
    Key() = default;
    friend class PodNetwork;
  };
  PodNetwork(Key, PodNetworkOptions options);
  ~PodNetwork();  // unpins netns/ (its own mount point); Pods' namespaces are Remove's to release

  PodNetwork(const PodNetwork&) = delete;
  PodNetwork& operator=(const PodNetwork&) = delete;

  // A namespace for the Pod with lo up and eth0 on the bridge; returns the Pod's address. On an
  // error, Unavailable starting with kPodNetworkError and naming the plugin and its message, and
  // nothing of the Pod's is left. A uid that has a namespace already gets it released first.
  Result<std::string> Add(const std::string& uid);
  // Runs the plugins' DEL and drops the namespace; a uid without one is Ok. Every step is tried;
  // the first error is returned. When a DEL fails, the bridge plugin's DEL is run again without
  // the namespace, which releases the address lease.
  Status Remove(const std::string& uid);
  // Releases every Pod's namespace in `dir` (Create does it for an earlier agent's); how many.
  Result<int> RemoveAll();

  // The file a Pod's processes join (setns) and the plugins are given as CNI_NETNS.
  std::string NamespacePath(const std::string& uid) const;
  // The directory every NamespacePath is in: a mount point of its own, which a container's private
  // mount namespace detaches, so that its copy of the mount table pins no other Pod's namespace.
  std::string NamespaceDir() const;
  // The uids that have a namespace now.
  std::vector<std::string> Attached() const;
  const PodNetworkOptions& options() const { return options_; }

 private:
  std::string BridgeConfig() const;  // the bridge plugin's network config (host-local IPAM inside)
  // The plugins' DEL with CNI_NETNS=netns (empty: no namespace to enter), the namespace kept.
  Status Delete(const std::string& uid, const std::string& netns);

  PodNetworkOptions options_;
  bool pinned_dir_ = false;  // netns/ was bind-mounted onto itself by Create
};

// "100.64.1.0/24" -> the first and last address a host may have in it (network and broadcast
// addresses excluded from /30 and wider), as text; InvalidConfig naming `what` and the value.
Result<std::pair<std::string, std::string>> HostRange(const std::string& cidr, const std::string& what);
// Whether `ip` (IPv4) is inside `cidr`.
bool InCidr(const std::string& ip, const std::string& cidr);

}  // namespace meshwork::controlplane::agent
