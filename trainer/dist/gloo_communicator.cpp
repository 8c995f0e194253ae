// The CPU communicator over c10d's ProcessGroupGloo. libtorch throws; nothing here lets an
// exception out: issue-time failures become kInternal, failures seen in Wait() (a timeout, a
// peer that died) become kUnavailable naming the collective, the group, the rank and the timeout.
//
// What libtorch 1.13's Gloo lacks, and how it is emulated (the same code runs on 2.x):
//  - flat all-gather (_allgather_base throws): allgather into `size` views of the flat output;
//    Gloo gathers into its own flat buffer and copies into the views, so the result lands in
//    the output (checked by the tests).
//  - reduce_scatter on CPU (throws): an all-to-all of the input (rank r receives chunk r of
//    every rank's input, no copy at issue), summed in rank order in Wait(). Each rank sends
//    (n−1)/n of the input, as a ring reduce-scatter does (an all-reduce would send twice that),
//    and the sum of an element does not depend on how the input was bucketed.
//  - ReduceOp AVG: sum, then divide by the group size in Wait().
//  - bfloat16 (1.13's Gloo throws "Invalid scalar type"): all-gather, broadcast and the
//    reduce-scatter's all-to-all move the same bits viewed as float16 (the reduce-scatter sums
//    them in fp32); all-reduce reduces an fp32 copy and casts back in Wait(), so it sends fp32
//    bytes, which is what stats count.
#include "trainer/dist/gloo_communicator.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

namespace meshwork::dist {
namespace {


std::string ExceptionText(const std::exception& e) {
  // c10::Error::what() carries a C++ backtrace; the message without it is enough here.
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}


// Bytes one rank sends in a ring all-reduce of `bytes`: 2·(n−1)/n · bytes.
int64_t AllReduceBytes(int64_t bytes, int n) { return 2 * (n - 1) * bytes / n; }

bool IsSupportedDtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
    case torch::kFloat64:
    case torch::kFloat16:
    case torch::kBFloat16:
    case torch::kInt32:
    case torch::kInt64:
    case torch::kUInt8:
    case torch::kInt8:
      return true;
    default:
      return false;
  }
}

// Bit-exact data movement of bfloat16 through Gloo: the same 2-byte elements seen as float16.
torch::Tensor AsMovable(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.view(torch::kHalf) : t;
}

// Bytes of the tensor Gloo reduces: fp32 for bfloat16.
int64_t ReductionBytes(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.numel() * 4 : TensorBytes(t);
}

// A collective issued to Gloo. `finish` runs once, after Gloo completes: the copy-out of an
// emulated op and the division of AVG.
class GlooWork final : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what)
      : work_(std::move(work)), finish_(std::move(finish)), what_(std::move(what)) {
    // Gloo completes the work on its own thread: note when, for traces (--trace-out).
    try {
      auto done = done_at_;
      work_->getFuture()->addCallback([done](c10::ivalue::Future&) {
        done->store(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
      });
    } catch (const std::exception&) {
      // This work has no future: CompletedAt() stays unknown.
    }
  }

  std::optional<double> CompletedAt() const override {
    const double t = done_at_->load();
    if (t > 0) return t;
    return std::nullopt;
  }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    try {
      // No timeout here: Gloo's own per-operation timeout (Options::timeout) ends a stuck op.
      work_->wait();
    } catch (const std::exception& e) {
      status_ = Unavailable(what_ + " failed: " + ExceptionText(e) +
                            " (if it timed out: a peer may have died or not joined the collective)");
      return status_;
    } catch (...) {
      status_ = Unavailable(what_ + " failed with an unknown exception");
      return status_;
    }
    if (finish_) {
      try {
        finish_();
      } catch (const std::exception& e) {
        status_ = Internal(what_ + ": finishing the result failed: " + ExceptionText(e));
      }
    }
    return status_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  std::string what_;
  bool waited_ = false;
  Status status_;
  std::shared_ptr<std::atomic<double>> done_at_ = std::make_shared<std::atomic<double>>(0.0);
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size,
                   CommunicatorOptions options)
      : pg_(std::move(pg)), rank_(rank), size_(size), options_(std::move(options)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }
  torch::Device device() const override { return torch::Device(torch::kCPU); }
  const std::string& group_name() const override { return options_.group_name; }

  Result<std::unique_ptr<Work>> AllGatherInto(torch::Tensor output, torch::Tensor input) override {
    const Collective c = Collective::kAllGather;
    MW_RETURN_IF_ERROR(CheckTensor(c, "input", input));
    MW_RETURN_IF_ERROR(CheckTensor(c, "output", output));
    if (auto why = CheckCollectivePair(c, output, input, size_); !why.empty()) return Invalid(c, why);
    return Issue(c, (size_ - 1) * TensorBytes(input), [&]() {
      std::vector<std::vector<at::Tensor>> outputs(1);
      torch::Tensor flat = AsMovable(output).view({-1});
      const int64_t n = input.numel();
      for (int r = 0; r < size_; ++r) {
        outputs[0].push_back(flat.narrow(0, r * n, n).view(input.sizes()));
      }
      std::vector<at::Tensor> inputs{AsMovable(input)};
      return std::make_pair(pg_->allgather(outputs, inputs), std::function<void()>());
    });
  }

  Result<std::unique_ptr<Work>> ReduceScatter(torch::Tensor output, torch::Tensor input,
                                              ReduceOp op) override {
    const Collective c = Collective::kReduceScatter;
    MW_RETURN_IF_ERROR(CheckTensor(c, "input", input));
    MW_RETURN_IF_ERROR(CheckTensor(c, "output", output));
    if (auto why = CheckCollectivePair(c, output, input, size_); !why.empty()) return Invalid(c, why);
    MW_RETURN_IF_ERROR(CheckOp(c, op, input));
    // From Gloo's all-to-all (see the top of the file): chunk r of every rank's input comes to
    // rank r, which sums the chunks in rank order in Wait().
    const int64_t n = output.numel();
    return Issue(c, (size_ - 1) * n * input.element_size(), [&]() {
      torch::Tensor send = AsMovable(input).contiguous().view({-1});
      torch::Tensor recv = torch::empty_like(send);
      std::vector<int64_t> equal_splits;
      auto work = pg_->alltoall_base(recv, send, equal_splits, equal_splits);
      const int size = size_;
      const torch::ScalarType dtype = input.scalar_type();
      std::function<void()> finish = [send, recv, output, n, size, op, dtype]() mutable {
        torch::Tensor chunks = recv.view(dtype).view({size, n});
        // bfloat16 sums in fp32 and rounds once, as a ring reduction in fp32 would.
        torch::Tensor sum = dtype == torch::kBFloat16 ? chunks.to(torch::kFloat32).sum(0) : chunks.sum(0);
        if (op == ReduceOp::kAvg) sum.div_(size);
        output.copy_(sum.view(output.sizes()));
        send = torch::Tensor();  // the input was Gloo's to read until now
      };
      return std::make_pair(std::move(work), std::move(finish));
    });
  }

  Result<std::unique_ptr<Work>> AllReduce(torch::Tensor tensor, ReduceOp op) override {
    const Collective c = Collective::kAllReduce;
    MW_RETURN_IF_ERROR(CheckTensor(c, "tensor", tensor));
    MW_RETURN_IF_ERROR(CheckOp(c, op, tensor));
    const bool via_fp32 = tensor.scalar_type() == torch::kBFloat16;
    return Issue(c, AllReduceBytes(ReductionBytes(tensor), size_), [&]() {
      torch::Tensor reduced = via_fp32 ? tensor.to(torch::kFloat32) : tensor;
      std::vector<at::Tensor> tensors{reduced};
      auto work = pg_->allreduce(tensors, SumOptions());
      std::function<void()> finish;
      if (op == ReduceOp::kAvg || via_fp32) {
        const int size = size_;
        finish = [tensor, reduced, size, op, via_fp32]() mutable {
          if (op == ReduceOp::kAvg) reduced.div_(size);
          if (via_fp32) tensor.copy_(reduced);
        };
      }
      return std::make_pair(std::move(work), std::move(finish));
    });
  }

  Result<std::unique_ptr<Work>> Broadcast(torch::Tensor tensor, int root) override {
    const Collective c = Collective::kBroadcast;
    MW_RETURN_IF_ERROR(CheckTensor(c, "tensor", tensor));
    if (root < 0 || root >= size_) {
      return Invalid(c, "root " + std::to_string(root) + " is not a rank of a group of " +
                            std::to_string(size_));
    }
    // Counted on the root as if it sent the buffer to each of the n−1 others: the total over
    // all ranks is exact for any broadcast tree; Gloo's tree spreads the sends differently.
    const int64_t bytes = rank_ == root ? (size_ - 1) * TensorBytes(tensor) : 0;
    return Issue(c, bytes, [&]() {
      std::vector<at::Tensor> tensors{AsMovable(tensor)};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      return std::make_pair(pg_->broadcast(tensors, opts), std::function<void()>());
    });
  }

  Result<std::unique_ptr<Work>> Barrier() override {
    return Issue(Collective::kBarrier, 0, [&]() {
      return std::make_pair(pg_->barrier(), std::function<void()>());
    });
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

 private:
  // The default reduce op is SUM; ReduceOp's type differs between libtorch 1.13 and 2.x, so
  // it is not named here.
  static c10d::AllreduceOptions SumOptions() { return c10d::AllreduceOptions(); }

  // "all_reduce on group 'world' (gloo, rank 0 of 2, timeout 1000 ms)"
  std::string Describe(Collective c) const {
    std::ostringstream s;
    s << CollectiveName(c) << " on group '" << options_.group_name << "' (gloo, rank " << rank_
      << " of " << size_ << ", timeout " << options_.timeout.count() << " ms)";
    return s.str();
  }

  Status Invalid(Collective c, const std::string& why) const {
    return InvalidInput(Describe(c) + ": " + why);
  }

  Status CheckTensor(Collective c, const char* name, const torch::Tensor& t) const {
    if (!t.defined()) return Invalid(c, std::string(name) + " is an undefined tensor");
    if (!t.device().is_cpu()) {
      return Invalid(c, std::string(name) + " is on " + t.device().str() +
                            "; the gloo communicator takes CPU tensors");
    }
    if (!t.is_contiguous()) return Invalid(c, std::string(name) + " is not contiguous");
    if (!IsSupportedDtype(t.scalar_type())) {
      return Invalid(c, std::string(name) + " has dtype " +
                            std::string(c10::toString(t.scalar_type())) +
                            ", which the gloo communicator does not support");
    }
    return Status::Ok();
  }


  Status CheckOp(Collective c, ReduceOp op, const torch::Tensor& t) const {
    if (op == ReduceOp::kAvg && !t.is_floating_point()) {
      return Invalid(c, std::string("avg needs a floating-point dtype, got ") +
                            c10::toString(t.scalar_type()));
    }
    return Status::Ok();
  }

  // Calls `start` (which issues the c10d op and says how to finish it) and counts the call.
  template <typename Start>
  Result<std::unique_ptr<Work>> Issue(Collective c, int64_t bytes_sent, Start&& start) {
    std::string what = Describe(c);
    try {
      auto [work, finish] = start();
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.calls[static_cast<int>(c)] += 1;
        stats_.bytes_sent[static_cast<int>(c)] += bytes_sent;
      }
      return std::unique_ptr<Work>(
          std::make_unique<GlooWork>(std::move(work), std::move(finish), std::move(what)));
    } catch (const c10::OutOfMemoryError& e) {  // its buffers did not fit: a resource, not a bug
      return Unavailable(what + ": issuing it failed: " + ExceptionText(e));
    } catch (const std::exception& e) {
      return Internal(what + ": issuing it failed: " + ExceptionText(e));
    } catch (...) {
      return Internal(what + ": issuing it failed with an unknown exception");
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int size_;
  CommunicatorOptions options_;
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                           int rank, int size,
                                                           const CommunicatorOptions& options,
                                                           const std::string& hostname) {
  if (!store) return InvalidConfig("gloo communicator: the store is null");
  if (size < 1) return InvalidConfig("gloo communicator: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    return InvalidConfig("gloo communicator: rank " + std::to_string(rank) +
                         " is outside a group of " + std::to_string(size));
  }
  if (options.timeout.count() <= 0) {
    return InvalidConfig("gloo communicator: timeout must be positive, got " +
                         std::to_string(options.timeout.count()) + " ms");
  }
  const std::string where = "gloo communicator for group '" + options.group_name + "' (rank " +
                            std::to_string(rank) + " of " + std::to_string(size) + ", host '" +
                            (hostname.empty() ? std::string("default") : hostname) + "')";
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    // One worker thread: the group's collectives run one at a time in issue order, a lane as
    // the compiler's simulator models it (FSDP puts reduce-scatters on a group of their own).
    gloo_options->threads = 1;
    gloo_options->devices.push_back(
        hostname.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                         : c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>("gloo/" + options.group_name, std::move(store));
    // Connects to every peer; throws when one does not show up within the timeout.
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, gloo_options);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(std::move(pg), rank, size, options));
  } catch (const std::exception& e) {
    return Unavailable(where + ": setting up failed within " +
                       std::to_string(options.timeout.count()) + " ms: " + ExceptionText(e));
  } catch (...) {
    return Unavailable(where + ": setting up failed with an unknown exception");
  }
}

}  // namespace meshwork::dist
