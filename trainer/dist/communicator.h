// Collectives on one process group behind one interface (c10d's Backend/Work shape): every
// collective is a virtual call returning a waitable handle. Backends: Gloo on CPU through
// libtorch's c10d ProcessGroupGloo, NCCL on GPU through the NCCL C API.
#pragma once

#include <torch/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace meshwork::dist {

enum class ReduceOp { kSum, kAvg };

// kSend and kRecv: point-to-point transfers (pipeline stages' activations and their gradients).
enum class Collective { kAllGather = 0, kReduceScatter, kAllReduce, kBroadcast, kBarrier, kSend, kRecv };
inline constexpr int kNumCollectives = 7;
const char* CollectiveName(Collective c);  // "all_gather", "reduce_scatter", ...

// Bytes a tensor's elements occupy (what a collective moves for it).
inline int64_t TensorBytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The checks every backend makes on an all-gather / reduce-scatter pair, whatever its device:
// same dtype, and the gathered (scattered) side holding `size` times the other. Returns the
// reason, or "" when the pair is fine.
std::string CheckCollectivePair(Collective c, const torch::Tensor& output, const torch::Tensor& input, int size);

// What a communicator has moved, per collective type: calls issued and the bytes this rank
// actually sent over the wire (an emulated collective counts what its emulation sends).
struct CommStats {
  std::array<int64_t, kNumCollectives> calls{};
  std::array<int64_t, kNumCollectives> bytes_sent{};
};

// A collective in flight. Wait() blocks until it completes; a peer that died or a timeout is
// kUnavailable naming the collective, the group and how long it waited.
class Work {
 public:
  virtual ~Work() = default;
  virtual Status Wait() = 0;
  // Steady-clock seconds at which the collective finished, where the backend reports it (Gloo,
  // from its completion callback); nullopt where it does not (NCCL: the wait's return bounds it).
  virtual std::optional<double> CompletedAt() const { return std::nullopt; }
  // Blocks the host until the collective has finished on its device, then does what Wait()
  // does. For measurements: Wait() on a device backend only orders the compute stream.
  virtual Status Synchronize() { return Wait(); }
  // After Synchronize(): how long the collective ran, as the backend measured it on its device
  // (NCCL: CUDA events around it on its stream); nullopt where the host clock is the measure.
  virtual std::optional<double> DeviceSeconds() const { return std::nullopt; }
};

struct CommunicatorOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // per collective
  std::string group_name = "world";                           // for messages and metrics
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "gloo" or "nccl"
  virtual const std::string& group_name() const = 0;
  // Where every tensor handed to this communicator must live: the CPU for Gloo, this rank's GPU
  // for NCCL. Host values travel through host_collectives.h, which puts them there.
  virtual torch::Device device() const = 0;

  // output [size · n] <- every rank's input [n], in rank order. Contiguous, same dtype/device.
  virtual Result<std::unique_ptr<Work>> AllGatherInto(torch::Tensor output, torch::Tensor input) = 0;
  // output [n] <- op over ranks of input[rank · n, (rank + 1) · n).
  virtual Result<std::unique_ptr<Work>> ReduceScatter(torch::Tensor output, torch::Tensor input,
                                                      ReduceOp op) = 0;
  virtual Result<std::unique_ptr<Work>> AllReduce(torch::Tensor tensor, ReduceOp op) = 0;
  virtual Result<std::unique_ptr<Work>> Broadcast(torch::Tensor tensor, int root) = 0;
  virtual Result<std::unique_ptr<Work>> Barrier() = 0;
  // Point-to-point: `tensor` to / into rank `peer` of this group (contiguous; the receiver's
  // tensor has the sender's dtype and element count). Transfers between two ranks match in issue
  // order: the k-th Send from a to b fills the k-th Recv on b from a. A Send does not wait for
  // its Recv to be issued; its Wait() does. A backend without them says so (Internal).
  virtual Result<std::unique_ptr<Work>> Send(torch::Tensor tensor, int peer);
  virtual Result<std::unique_ptr<Work>> Recv(torch::Tensor tensor, int peer);

  virtual CommStats stats() const = 0;
  // Seconds the compute stream stood waiting for this communicator's collectives since the last
  // call, where Wait() orders a stream instead of blocking the host (NCCL: CUDA events around
  // each such wait; the call blocks until they are recorded). 0 where Wait() blocks the host
  // (Gloo): the caller's clock measures that.
  virtual double TakeDeviceStallSeconds() { return 0; }
};

}  // namespace meshwork::dist
