// The CPU communicator over c10d's ProcessGroupGloo. libtorch throws; nothing here lets an
// exception out: issue-time failures become kInternal, failures seen in Wait() (a timeout, a
// peer that died) become kUnavailable naming the collective, the group, the rank and the timeout.
//
// All-gather and reduce-scatter, FSDP's collectives, are Gloo point-to-point transfers, each
// rank sending straight to every other, cut in pieces of about 1 MiB (kPieceBytes) that are all
// in flight at once. Gloo's own collectives move one large message per peer and step, and on a
// shaped 1 Gbit/s link (bench/netlab) reach 55-74 MB/s where the same transfer in 1 MiB pieces
// reaches 100-110 MB/s and TCP itself 118 (bench/results/netlab_compiled_vs_eager.md). A
// pair's sends leave in issue order, so a group's collectives still finish in the order they
// were issued: the lane the compiler's simulator models. Gloo reports no completion of a
// point-to-point transfer, so one thread per communicator (Completer) waits for them in issue
// order, with the group's timeout, and notes when each collective finished.
//  - all-gather: rank r sends its input to every peer and receives each peer's into its slot.
//  - reduce-scatter: rank r sends chunk q of its input to rank q and receives chunk r of every
//    rank's input, summed in rank order in Wait(). Each rank sends (n−1)/n of the input, as a
//    ring reduce-scatter does (an all-reduce would send twice that), and the sum of an element
//    does not depend on how the input was bucketed.
//  - ReduceOp AVG: sum, then divide by the group size in Wait().
//  - bfloat16 (1.13's Gloo throws "Invalid scalar type" in its collectives): point-to-point
//    transfers move bytes; broadcast moves the same bits viewed as float16; the reduce-scatter
//    sums in fp32; all-reduce reduces an fp32 copy and casts back in Wait(), so it sends fp32
//    bytes, which is what stats count.
#include "trainer/dist/gloo_communicator.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
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

// The size of one point-to-point piece: small enough that several are in flight on a link,
// large enough that a piece's fixed costs do not count; at most kMaxPieces a peer.
constexpr int64_t kPieceBytes = int64_t{1} << 20;
constexpr int64_t kMaxPieces = 64;
// Send and Recv tags start here: collectives use [0, 2^30) (2^24 numbers x kMaxPieces).
constexpr int kPointToPointTags = 1 << 30;

double SteadyNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A contiguous tensor's elements as bytes (a flat uint8 view of the same storage).
torch::Tensor Bytes(const torch::Tensor& t) { return t.view({-1}).view(torch::kUInt8); }

// The point-to-point transfers of one collective, and what became of them.
struct Transfers {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  double done_at = 0;
  std::string error;  // "" when every transfer completed
};

// Waits for each collective's transfers, in issue order, on its own thread: the one place a
// point-to-point collective completes (and times out). Destroying it aborts what is pending.
class Completer {
 public:
  explicit Completer(std::chrono::milliseconds timeout) : timeout_(timeout), thread_([this] { Run(); }) {}

  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& t : queue_)
        for (auto& w : t->works) w->abort();
      if (current_ != nullptr)
        for (auto& w : current_->works) w->abort();
    }
    cv_.notify_all();
    thread_.join();
  }

  void Add(std::shared_ptr<Transfers> t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(t));
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    for (;;) {
      std::shared_ptr<Transfers> t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        t = queue_.front();
        queue_.pop_front();
        current_ = t;
      }
      std::string error;
      for (auto& w : t->works) {
        try {
          if (error.empty()) {
            w->wait(timeout_);
          } else {
            w->abort();  // the collective failed: release the rest
          }
        } catch (const std::exception& e) {
          error = ExceptionText(e);
        } catch (...) {
          error = "an unknown exception";
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_ && error.empty()) error = "the communicator was destroyed";
        current_ = nullptr;
      }
      {
        std::lock_guard<std::mutex> lock(t->mu);
        t->done = true;
        t->done_at = SteadyNow();
        t->error = std::move(error);
        t->works.clear();  // Gloo's buffers go as soon as the data is in place
      }
      t->cv.notify_all();
    }
  }

  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Transfers>> queue_;
  std::shared_ptr<Transfers> current_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

// The status of a collective `what` that ended with `error` ("" when it completed); when it
// completed, `finish` (the sum or division that makes the result) runs first.
Status Conclude(const std::string& what, const std::string& error, const std::function<void()>& finish) {
  if (!error.empty()) {
    return Unavailable(what + " failed: " + error +
                       " (if it timed out: a peer may have died or not joined the collective)");
  }
  if (!finish) return Status::Ok();
  try {
    finish();
  } catch (const std::exception& e) {
    return Internal(what + ": finishing the result failed: " + ExceptionText(e));
  }
  return Status::Ok();
}

// A collective issued to Gloo. `finish` runs once, after Gloo completes: the division of AVG,
// the cast back of a bfloat16 all-reduce.
class GlooWork final : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what)
      : work_(std::move(work)), finish_(std::move(finish)), what_(std::move(what)) {
    // Gloo completes the work on its own thread: note when, for traces (--trace-out).
    try {
      auto done = done_at_;
      work_->getFuture()->addCallback([done](c10::ivalue::Future&) { done->store(SteadyNow()); });
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
    std::string error;
    try {
      // No timeout here: Gloo's own per-operation timeout (Options::timeout) ends a stuck op.
      work_->wait();
    } catch (const std::exception& e) {
      error = ExceptionText(e);
    } catch (...) {
      error = "an unknown exception";
    }
    status_ = Conclude(what_, error, finish_);
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

// A point-to-point collective: done when the Completer says so; `finish` then runs once on the
// waiting thread (the reduce-scatter's sum).
class TransfersWork final : public Work {
 public:
  TransfersWork(std::shared_ptr<Transfers> transfers, std::function<void()> finish, std::string what)
      : transfers_(std::move(transfers)), finish_(std::move(finish)), what_(std::move(what)) {}

  std::optional<double> CompletedAt() const override {
    std::lock_guard<std::mutex> lock(transfers_->mu);
    if (transfers_->done) return transfers_->done_at;
    return std::nullopt;
  }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    std::string error;
    {
      std::unique_lock<std::mutex> lock(transfers_->mu);
      transfers_->cv.wait(lock, [&] { return transfers_->done; });
      error = transfers_->error;
    }
    status_ = Conclude(what_, error, finish_);
    return status_;
  }

 private:
  std::shared_ptr<Transfers> transfers_;
  std::function<void()> finish_;
  std::string what_;
  bool waited_ = false;
  Status status_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size,
                   CommunicatorOptions options)
      : pg_(std::move(pg)), rank_(rank), size_(size), options_(std::move(options)), completer_(options_.timeout) {}

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
    return IssueTransfers(c, (size_ - 1) * TensorBytes(input), [&](Transfers& t, int tag) {
      torch::Tensor in = Bytes(input);
      torch::Tensor out = Bytes(output);
      const int64_t part = in.numel();
      torch::Tensor mine = out.narrow(0, rank_ * part, part);
      if (mine.data_ptr() != in.data_ptr()) mine.copy_(in);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        Exchange(t, peer, tag, in, out.narrow(0, peer * part, part));
      }
      return std::function<void()>();
    });
  }

  Result<std::unique_ptr<Work>> ReduceScatter(torch::Tensor output, torch::Tensor input,
                                              ReduceOp op) override {
    const Collective c = Collective::kReduceScatter;
    MW_RETURN_IF_ERROR(CheckTensor(c, "input", input));
    MW_RETURN_IF_ERROR(CheckTensor(c, "output", output));
    if (auto why = CheckCollectivePair(c, output, input, size_); !why.empty()) return Invalid(c, why);
    MW_RETURN_IF_ERROR(CheckOp(c, op, input));
    // Chunk r of every rank's input comes to rank r, which sums the chunks in rank order in
    // Wait() (see the top of the file).
    const int64_t n = output.numel();
    return IssueTransfers(c, (size_ - 1) * n * input.element_size(), [&](Transfers& t, int tag) {
      torch::Tensor in = Bytes(input.contiguous());
      torch::Tensor recv = torch::empty_like(in);
      const int64_t chunk = in.numel() / size_;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        Exchange(t, peer, tag, in.narrow(0, peer * chunk, chunk), recv.narrow(0, peer * chunk, chunk));
      }
      const int size = size_;
      const int rank = rank_;
      const torch::ScalarType dtype = input.scalar_type();
      return std::function<void()>([in, recv, output, n, chunk, size, rank, op, dtype]() mutable {
        const char* in_lo = static_cast<const char*>(in.data_ptr());
        const char* out_lo = static_cast<const char*>(output.data_ptr());
        const bool aliases = out_lo < in_lo + in.numel() && in_lo < out_lo + output.numel() * output.element_size();
        if (dtype != torch::kBFloat16 && output.is_contiguous() && !aliases) {
          // Summed into the output in rank order, with no temporary (the wait is on the step's
          // critical path: a 14 MB shard's sum through a fresh tensor took 10-13 ms, this 5 ms on netlab).
          torch::Tensor out = output.view({-1});
          auto chunk_of = [&](int r) { return (r == rank ? in : recv).narrow(0, r * chunk, chunk).view(dtype); };
          out.copy_(chunk_of(0));
          for (int r = 1; r < size; ++r) out.add_(chunk_of(r));
          if (op == ReduceOp::kAvg) out.div_(size);
        } else {
          recv.narrow(0, rank * chunk, chunk).copy_(in.narrow(0, rank * chunk, chunk));
          torch::Tensor chunks = recv.view(dtype).view({size, n});
          // bfloat16 sums in fp32 and rounds once, as a ring reduction in fp32 would.
          torch::Tensor sum = dtype == torch::kBFloat16 ? chunks.to(torch::kFloat32).sum(0) : chunks.sum(0);
          if (op == ReduceOp::kAvg) sum.div_(size);
          output.copy_(sum.view(output.sizes()));
        }
        in = torch::Tensor();  // the input was the sends' to read until now
      });
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

  Result<std::unique_ptr<Work>> Send(torch::Tensor tensor, int peer) override {
    return PointToPoint(Collective::kSend, std::move(tensor), peer);
  }

  Result<std::unique_ptr<Work>> Recv(torch::Tensor tensor, int peer) override {
    return PointToPoint(Collective::kRecv, std::move(tensor), peer);
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

 private:
  // One Gloo send or receive of the tensor's bytes (any dtype moves as bytes). Tags: the k-th
  // transfer each way between a pair gets kPointToPointTags + k, above every collective's tags,
  // so the k-th send from a to b meets the k-th receive on b from a. Its Wait() is Gloo's own
  // (with the group's timeout), not the Completer's: a pipeline waits on a send while a receive
  // issued before it is still open, which the Completer's issue order would hold up.
  Result<std::unique_ptr<Work>> PointToPoint(Collective c, torch::Tensor tensor, int peer) {
    MW_RETURN_IF_ERROR(CheckTensor(c, "tensor", tensor));
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return Invalid(c, "peer " + std::to_string(peer) + " is not another rank of a group of " + std::to_string(size_));
    }
    std::vector<int64_t>& counts = c == Collective::kSend ? sends_to_ : recvs_from_;
    if (counts.empty()) counts.assign(static_cast<size_t>(size_), 0);
    const int tag = kPointToPointTags + static_cast<int>(counts[static_cast<size_t>(peer)]++ % kPointToPointTags);
    const std::string what = Describe(c) + " with rank " + std::to_string(peer);
    try {
      std::vector<at::Tensor> bytes{Bytes(tensor)};
      auto work = c == Collective::kSend ? pg_->send(bytes, peer, tag) : pg_->recv(bytes, peer, tag);
      Count(c, c == Collective::kSend ? TensorBytes(tensor) : 0);
      // The tensor stays referenced until the transfer is done: Gloo reads or writes its memory.
      return std::unique_ptr<Work>(std::make_unique<GlooWork>(std::move(work), [tensor] {}, what));
    } catch (const ::gloo::IoException& e) {
      return Conclude(what, ExceptionText(e), {});
    } catch (const std::exception& e) {
      return Internal(what + ": issuing it failed: " + ExceptionText(e));
    }
  }

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
      Count(c, bytes_sent);
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

  void Count(Collective c, int64_t bytes_sent) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.calls[static_cast<int>(c)] += 1;
    stats_.bytes_sent[static_cast<int>(c)] += bytes_sent;
  }

  // Sends `send` to `peer` and receives `recv` (as many bytes) from it, both cut into the same
  // pieces, tagged `tag` + piece index, the tags the peer's matching call uses.
  void Exchange(Transfers& t, int peer, int tag, torch::Tensor send, torch::Tensor recv) {
    const int64_t bytes = send.numel();
    const int64_t piece = std::max(kPieceBytes, (bytes + kMaxPieces - 1) / kMaxPieces);
    for (int64_t at = 0, k = 0; at < bytes; at += piece, ++k) {
      const int64_t len = std::min(piece, bytes - at);
      std::vector<at::Tensor> to_peer{send.narrow(0, at, len)};
      std::vector<at::Tensor> from_peer{recv.narrow(0, at, len)};
      t.works.push_back(pg_->send(to_peer, peer, tag + static_cast<int>(k)));
      t.works.push_back(pg_->recv(from_peer, peer, tag + static_cast<int>(k)));
    }
  }

  // Issues a point-to-point collective: `start(transfers, tag)` posts its transfers (tags from
  // `tag` up, below the next collective's) and says how to finish it; counts the call.
  template <typename Start>
  Result<std::unique_ptr<Work>> IssueTransfers(Collective c, int64_t bytes_sent, Start&& start) {
    std::string what = Describe(c);
    try {
      // Every rank of the group issues its collectives in the same order, so a collective's
      // number is the same on all of them; kMaxPieces tags each, wrapping far below INT_MAX.
      const int tag = static_cast<int>(next_collective_++ % (int64_t{1} << 24)) * static_cast<int>(kMaxPieces);
      auto transfers = std::make_shared<Transfers>();
      std::function<void()> finish = start(*transfers, tag);
      Count(c, bytes_sent);
      completer_.Add(transfers);
      return std::unique_ptr<Work>(
          std::make_unique<TransfersWork>(std::move(transfers), std::move(finish), std::move(what)));
    } catch (const ::gloo::IoException& e) {  // a peer's connection is gone: posting a transfer fails at once
      return Conclude(what, ExceptionText(e), {});
    } catch (const c10::OutOfMemoryError& e) {
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
  int64_t next_collective_ = 0;  // point-to-point collectives issued so far
  std::vector<int64_t> sends_to_, recvs_from_;  // Send / Recv issued per peer so far
  Completer completer_;          // after pg_: stops (aborting what is pending) before it goes
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
    // One worker thread: Gloo's collectives (all-reduce, broadcast, barrier) run one at a time
    // in issue order, a lane as the compiler's simulator models it (FSDP puts reduce-scatters on
    // a group of their own); all-gathers and reduce-scatters are point-to-point transfers,
    // which leave in issue order too.
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
