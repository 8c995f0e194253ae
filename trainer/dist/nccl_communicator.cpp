// The GPU communicator through the NCCL C API. One dedicated CUDA stream per communicator runs
// its collectives; CUDA events order that stream after the compute stream (before a collective)
// and the compute stream after it (Work::Wait), so the host never blocks except in Barrier and
// Synchronize.
//
// The compute stream is libtorch's current stream on the device (c10::cuda) with a CUDA
// libtorch, whose caching allocator is also told (recordStream) that the collective's tensors
// are used on the communication stream. Without one (a CUDA toolkit beside a CPU libtorch),
// it is CUDA's legacy default stream, libtorch's default there too.
#include "trainer/dist/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef MESHWORK_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace meshwork::dist {
namespace {


// ---- check macros: file, line, the call, the library's error string and a hint -------------

Status CudaFailure(cudaError_t err, const char* call, const char* file, int line,
                   const char* hint) {
  // No device, no driver or a stub driver: retrying on another machine may help.
  const bool unavailable = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                           err == cudaErrorInvalidDevice || err == cudaErrorDevicesUnavailable ||
                           err == cudaErrorStubLibrary;
  std::ostringstream s;
  s << file << ":" << line << ": " << call << " failed: " << cudaGetErrorName(err) << " ("
    << cudaGetErrorString(err) << "); hint: " << hint;
  return {unavailable ? StatusCode::kUnavailable : StatusCode::kInternal, s.str()};
}

Status NcclFailure(ncclResult_t err, ncclComm_t comm, const char* call, const char* file,
                   int line, const char* hint) {
  // System and remote errors are the network or a peer: retrying (a restart) may help.
  const bool unavailable = err == ncclSystemError || err == ncclRemoteError ||
                           err == ncclUnhandledCudaError;
  std::ostringstream s;
  s << file << ":" << line << ": " << call << " failed: " << ncclGetErrorString(err);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') s << " (" << last << ")";
  }
  s << "; hint: " << hint;
  return {unavailable ? StatusCode::kUnavailable : StatusCode::kInternal, s.str()};
}

#define MW_CUDA_CHECK(call, hint)                                                       \
  do {                                                                                  \
    const cudaError_t mw_cuda_err_ = (call);                                            \
    if (mw_cuda_err_ != cudaSuccess) {                                                  \
      return CudaFailure(mw_cuda_err_, #call, __FILE__, __LINE__, hint);                \
    }                                                                                   \
  } while (0)

#define MW_NCCL_CHECK(call, comm, hint)                                                 \
  do {                                                                                  \
    const ncclResult_t mw_nccl_err_ = (call);                                           \
    if (mw_nccl_err_ != ncclSuccess) {                                                  \
      return NcclFailure(mw_nccl_err_, comm, #call, __FILE__, __LINE__, hint);          \
    }                                                                                   \
  } while (0)

// For destructors, which cannot return a Status: report and go on.
#define MW_CUDA_WARN(call)                                                              \
  do {                                                                                  \
    const cudaError_t mw_cuda_err_ = (call);                                            \
    if (mw_cuda_err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,         \
                   cudaGetErrorString(mw_cuda_err_));                                   \
    }                                                                                   \
  } while (0)

#define MW_NCCL_WARN(call)                                                              \
  do {                                                                                  \
    const ncclResult_t mw_nccl_err_ = (call);                                           \
    if (mw_nccl_err_ != ncclSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,         \
                   ncclGetErrorString(mw_nccl_err_));                                   \
    }                                                                                   \
  } while (0)

constexpr const char* kCudaHint =
    "is a GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES) with a driver new enough for this "
    "CUDA runtime?";
constexpr const char* kNcclHint =
    "run with NCCL_DEBUG=INFO; check that every rank joined with the same group and size and "
    "that the ranks can reach each other (NCCL_SOCKET_IFNAME)";

cudaStream_t ComputeStream(int device) {
#ifdef MESHWORK_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

// Tells libtorch's caching allocator that `tensors` are in use on `stream` too, so that their
// memory is not handed out again before the work queued there now has finished.
void RecordStream(const std::vector<torch::Tensor>& tensors, cudaStream_t stream, int device) {
#ifdef MESHWORK_TORCH_CUDA
  const auto on = c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device));
  for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), on);
#else
  (void)tensors, (void)stream, (void)device;
#endif
}

// ---- RAII handles --------------------------------------------------------------------------

// Makes `device` current and restores the previous device when it goes out of scope.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0) MW_CUDA_WARN(cudaSetDevice(previous_));
  }
  Status Set(int device) {
    int previous = -1;
    MW_CUDA_CHECK(cudaGetDevice(&previous), kCudaHint);
    MW_CUDA_CHECK(cudaSetDevice(device), kCudaHint);
    previous_ = previous;
    return Status::Ok();
  }

 private:
  int previous_ = -1;
};

class CudaStream {
 public:
  static Result<std::unique_ptr<CudaStream>> Create() {
    cudaStream_t s = nullptr;
    // Non-blocking: no implicit sync with the legacy stream; ordering is by events only.
    MW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), kCudaHint);
    return std::unique_ptr<CudaStream>(new CudaStream(s));
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() { MW_CUDA_WARN(cudaStreamDestroy(stream_)); }
  cudaStream_t get() const { return stream_; }

 private:
  explicit CudaStream(cudaStream_t s) : stream_(s) {}
  cudaStream_t stream_;
};

class CudaEvent {
 public:
  // `timing`: the event can be an end of cudaEventElapsedTime (costs a little more to record).
  static Result<std::unique_ptr<CudaEvent>> Create(bool timing = false) {
    cudaEvent_t e = nullptr;
    MW_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), kCudaHint);
    return std::unique_ptr<CudaEvent>(new CudaEvent(e));
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { MW_CUDA_WARN(cudaEventDestroy(event_)); }
  cudaEvent_t get() const { return event_; }

 private:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_;
};

class DeviceBuffer {
 public:
  static Result<std::unique_ptr<DeviceBuffer>> Create(size_t bytes) {
    void* p = nullptr;
    MW_CUDA_CHECK(cudaMalloc(&p, bytes), kCudaHint);
    auto buffer = std::unique_ptr<DeviceBuffer>(new DeviceBuffer(p));
    MW_CUDA_CHECK(cudaMemset(p, 0, bytes), kCudaHint);
    return buffer;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { MW_CUDA_WARN(cudaFree(ptr_)); }
  void* get() const { return ptr_; }

 private:
  explicit DeviceBuffer(void* p) : ptr_(p) {}
  void* ptr_;
};

// Owns an ncclComm_t: destroyed normally, or aborted once a collective failed or timed out
// (after which it must not be used, and ncclCommDestroy could hang on the stuck collective).
class NcclComm {
 public:
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    MW_NCCL_WARN(ncclCommDestroy(comm_));
  }
  ncclComm_t get() const { return comm_; }
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    MW_NCCL_WARN(ncclCommAbort(comm_));
  }
  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

 private:
  ncclComm_t comm_;
  std::mutex mu_;
  bool aborted_ = false;
};

std::optional<ncclDataType_t> NcclDtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat16: return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case torch::kBFloat16: return ncclBfloat16;
#endif
    case torch::kFloat64: return ncclFloat64;
    case torch::kInt32: return ncclInt32;
    case torch::kInt64: return ncclInt64;
    case torch::kUInt8: return ncclUint8;
    case torch::kInt8: return ncclInt8;
    default: return std::nullopt;
  }
}


// Seconds between two recorded timing events (blocks until `end` has completed).
Result<double> ElapsedSeconds(const CudaEvent& start, const CudaEvent& end) {
  MW_CUDA_CHECK(cudaEventSynchronize(end.get()), kCudaHint);
  float ms = 0;
  MW_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), end.get()), kCudaHint);
  return static_cast<double>(ms) / 1e3;
}

// The compute stream's waits on collectives, as pairs of timing events recorded on it just
// before and just after each cudaStreamWaitEvent: the time between them is how long the stream
// stood still for communication (0 when the collective had already finished).
class StallLog {
 public:
  void Add(std::unique_ptr<CudaEvent> before, std::unique_ptr<CudaEvent> after) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.emplace_back(std::move(before), std::move(after));
  }
  double Take() {
    std::vector<std::pair<std::unique_ptr<CudaEvent>, std::unique_ptr<CudaEvent>>> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending.swap(pending_);
    }
    double total = 0;
    for (const auto& [before, after] : pending) {
      auto s = ElapsedSeconds(*before, *after);
      if (s.ok()) total += *s;
    }
    return total;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::unique_ptr<CudaEvent>, std::unique_ptr<CudaEvent>>> pending_;
};

// ---- work ----------------------------------------------------------------------------------

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, std::shared_ptr<StallLog> stalls, std::unique_ptr<CudaEvent> start,
           std::unique_ptr<CudaEvent> done, int device, bool host_wait, std::chrono::milliseconds timeout,
           std::vector<torch::Tensor> tensors, std::string what)
      : comm_(std::move(comm)),
        stalls_(std::move(stalls)),
        start_(std::move(start)),
        done_(std::move(done)),
        device_(device),
        host_wait_(host_wait),
        timeout_(timeout),
        tensors_(std::move(tensors)),
        what_(std::move(what)) {}

  // A Work dropped without Wait() still orders the compute stream after the collective, so
  // that the memory of the tensors it used is not reused too early.
  ~NcclWork() override {
    if (!waited_) (void)Wait();
  }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    status_ = host_wait_ ? HostWait() : StreamWait();
    // The compute stream now runs after the collective: the tensors may go back to the
    // allocator (which reuses memory in compute-stream order).
    tensors_.clear();
    return status_;
  }

  Status Synchronize() override {
    if (waited_) return status_;
    Status done = HostWait();
    if (!done.ok()) {
      waited_ = true;
      status_ = done;
      tensors_.clear();
      return status_;
    }
    return Wait();
  }

  std::optional<double> DeviceSeconds() const override {
    if (!waited_ || !status_.ok() || cudaEventQuery(done_->get()) != cudaSuccess) return std::nullopt;
    auto s = ElapsedSeconds(*start_, *done_);
    return s.ok() ? std::optional<double>(*s) : std::nullopt;
  }

 private:
  // Orders the compute stream after the collective, recording how long that makes it wait.
  Status StreamWait() {
    DeviceGuard guard;
    MW_RETURN_IF_ERROR(guard.Set(device_));
    const cudaStream_t compute = ComputeStream(device_);
    MW_ASSIGN_OR_RETURN(auto before, CudaEvent::Create(/*timing=*/true));
    MW_ASSIGN_OR_RETURN(auto after, CudaEvent::Create(/*timing=*/true));
    MW_CUDA_CHECK(cudaEventRecord(before->get(), compute), kCudaHint);
    MW_CUDA_CHECK(cudaStreamWaitEvent(compute, done_->get(), 0), kCudaHint);
    MW_CUDA_CHECK(cudaEventRecord(after->get(), compute), kCudaHint);
    stalls_->Add(std::move(before), std::move(after));
    return AsyncError();
  }

  // Blocks until the collective is done; polls so that a dead peer or a timeout ends it,
  // aborting the comm.
  Status HostWait() {
    DeviceGuard guard;
    MW_RETURN_IF_ERROR(guard.Set(device_));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (true) {
      const cudaError_t q = cudaEventQuery(done_->get());
      if (q == cudaSuccess) return Status::Ok();
      if (q != cudaErrorNotReady) return CudaFailure(q, "cudaEventQuery", __FILE__, __LINE__, kCudaHint);
      MW_RETURN_IF_ERROR(AsyncError());
      if (std::chrono::steady_clock::now() > deadline) {
        comm_->Abort();
        return Unavailable(what_ + ": timed out after " + std::to_string(timeout_.count()) +
                           " ms; the NCCL communicator was aborted (a peer may have died or not "
                           "joined the collective)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  Status AsyncError() {
    if (comm_->aborted()) return Unavailable(what_ + ": the NCCL communicator was aborted");
    ncclResult_t async = ncclSuccess;
    MW_NCCL_CHECK(ncclCommGetAsyncError(comm_->get(), &async), comm_->get(), kNcclHint);
    if (async != ncclSuccess && async != ncclInProgress) {
      comm_->Abort();
      return Unavailable(what_ + ": NCCL reported " + ncclGetErrorString(async) +
                         "; the communicator was aborted");
    }
    return Status::Ok();
  }

  std::shared_ptr<NcclComm> comm_;
  std::shared_ptr<StallLog> stalls_;
  std::unique_ptr<CudaEvent> start_;
  std::unique_ptr<CudaEvent> done_;
  int device_;
  bool host_wait_;
  std::chrono::milliseconds timeout_;
  std::vector<torch::Tensor> tensors_;  // alive until the compute stream is ordered after us
  std::string what_;
  bool waited_ = false;
  Status status_;
};

// ---- communicator --------------------------------------------------------------------------

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, CommunicatorOptions options,
                   std::unique_ptr<CudaStream> stream, std::unique_ptr<DeviceBuffer> barrier_buffer,
                   std::shared_ptr<NcclComm> comm)
      : rank_(rank),
        size_(size),
        device_(device),
        options_(std::move(options)),
        stream_(std::move(stream)),
        barrier_buffer_(std::move(barrier_buffer)),
        comm_(std::move(comm)) {}

  ~NcclCommunicator() override {
    // Let queued collectives finish before the stream and buffer go (unless the comm was
    // aborted: then they never will).
    DeviceGuard guard;
    if (guard.Set(device_).ok() && !comm_->aborted()) {
      MW_CUDA_WARN(cudaStreamSynchronize(stream_->get()));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  const std::string& group_name() const override { return options_.group_name; }
  torch::Device device() const override { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_)); }
  double TakeDeviceStallSeconds() override { return stalls_->Take(); }

  Result<std::unique_ptr<Work>> AllGatherInto(torch::Tensor output, torch::Tensor input) override {
    const Collective c = Collective::kAllGather;
    MW_RETURN_IF_ERROR(CheckTensor(c, "input", input));
    MW_RETURN_IF_ERROR(CheckTensor(c, "output", output));
    if (auto why = CheckCollectivePair(c, output, input, size_); !why.empty()) return Invalid(c, why);
    const ncclDataType_t dtype = *NcclDtype(input.scalar_type());
    return Enqueue(c, (size_ - 1) * TensorBytes(input), {output, input}, /*host_wait=*/false,
                   [&](ncclComm_t comm, cudaStream_t stream) -> Status {
                     MW_NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(),
                                                 static_cast<size_t>(input.numel()), dtype, comm,
                                                 stream),
                                   comm, kNcclHint);
                     return Status::Ok();
                   });
  }

  Result<std::unique_ptr<Work>> ReduceScatter(torch::Tensor output, torch::Tensor input,
                                              ReduceOp op) override {
    const Collective c = Collective::kReduceScatter;
    MW_RETURN_IF_ERROR(CheckTensor(c, "input", input));
    MW_RETURN_IF_ERROR(CheckTensor(c, "output", output));
    if (auto why = CheckCollectivePair(c, output, input, size_); !why.empty()) return Invalid(c, why);
    MW_ASSIGN_OR_RETURN(const ncclRedOp_t nccl_op, NcclOp(c, op, input));
    const ncclDataType_t dtype = *NcclDtype(input.scalar_type());
    // Ring reduce-scatter: each rank sends (n−1) chunks of the output's size.
    return Enqueue(c, (size_ - 1) * TensorBytes(output), {output, input}, /*host_wait=*/false,
                   [&](ncclComm_t comm, cudaStream_t stream) -> Status {
                     MW_NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(),
                                                     static_cast<size_t>(output.numel()), dtype,
                                                     nccl_op, comm, stream),
                                   comm, kNcclHint);
                     return Status::Ok();
                   });
  }

  Result<std::unique_ptr<Work>> AllReduce(torch::Tensor tensor, ReduceOp op) override {
    const Collective c = Collective::kAllReduce;
    MW_RETURN_IF_ERROR(CheckTensor(c, "tensor", tensor));
    MW_ASSIGN_OR_RETURN(const ncclRedOp_t nccl_op, NcclOp(c, op, tensor));
    const ncclDataType_t dtype = *NcclDtype(tensor.scalar_type());
    return Enqueue(c, 2 * (size_ - 1) * TensorBytes(tensor) / size_, {tensor}, /*host_wait=*/false,
                   [&](ncclComm_t comm, cudaStream_t stream) -> Status {
                     MW_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                                                 static_cast<size_t>(tensor.numel()), dtype,
                                                 nccl_op, comm, stream),
                                   comm, kNcclHint);
                     return Status::Ok();
                   });
  }

  Result<std::unique_ptr<Work>> Broadcast(torch::Tensor tensor, int root) override {
    const Collective c = Collective::kBroadcast;
    MW_RETURN_IF_ERROR(CheckTensor(c, "tensor", tensor));
    if (root < 0 || root >= size_) {
      return Invalid(c, "root " + std::to_string(root) + " is not a rank of a group of " +
                            std::to_string(size_));
    }
    const ncclDataType_t dtype = *NcclDtype(tensor.scalar_type());
    // Same estimate as the Gloo backend: the root counts the buffer once per other rank.
    const int64_t bytes = rank_ == root ? (size_ - 1) * TensorBytes(tensor) : 0;
    return Enqueue(c, bytes, {tensor}, /*host_wait=*/false,
                   [&](ncclComm_t comm, cudaStream_t stream) -> Status {
                     MW_NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(),
                                                 static_cast<size_t>(tensor.numel()), dtype, root,
                                                 comm, stream),
                                   comm, kNcclHint);
                     return Status::Ok();
                   });
  }

  // An all-reduce of one float; its Wait() blocks the host until every rank got there.
  Result<std::unique_ptr<Work>> Barrier() override {
    void* buffer = barrier_buffer_->get();
    return Enqueue(Collective::kBarrier, 0, {}, /*host_wait=*/true,
                   [&](ncclComm_t comm, cudaStream_t stream) -> Status {
                     MW_NCCL_CHECK(ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, comm,
                                                 stream),
                                   comm, kNcclHint);
                     return Status::Ok();
                   });
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

 private:
  std::string Describe(Collective c) const {
    std::ostringstream s;
    s << CollectiveName(c) << " on group '" << options_.group_name << "' (nccl, rank " << rank_
      << " of " << size_ << ", cuda:" << device_ << ", timeout " << options_.timeout.count()
      << " ms)";
    return s.str();
  }

  Status Invalid(Collective c, const std::string& why) const {
    return InvalidInput(Describe(c) + ": " + why);
  }

  Status CheckTensor(Collective c, const char* name, const torch::Tensor& t) const {
    if (!t.defined()) return Invalid(c, std::string(name) + " is an undefined tensor");
    if (!t.is_cuda() || t.device().index() != device_) {
      return Invalid(c, std::string(name) + " is on " + t.device().str() +
                            "; this communicator takes tensors on cuda:" + std::to_string(device_));
    }
    if (!t.is_contiguous()) return Invalid(c, std::string(name) + " is not contiguous");
    if (!NcclDtype(t.scalar_type())) {
      return Invalid(c, std::string(name) + " has dtype " +
                            std::string(c10::toString(t.scalar_type())) +
                            ", which has no NCCL data type");
    }
    return Status::Ok();
  }


  Result<ncclRedOp_t> NcclOp(Collective c, ReduceOp op, const torch::Tensor& t) const {
    if (op == ReduceOp::kSum) return ncclSum;
    if (!t.is_floating_point()) {
      return Invalid(c, std::string("avg needs a floating-point dtype, got ") +
                            c10::toString(t.scalar_type()));
    }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    return ncclAvg;
#else
    return Internal(Describe(c) + ": avg needs NCCL >= 2.10");
#endif
  }

  // Orders the comm stream after the compute stream, launches, records the completion event.
  template <typename Launch>
  Result<std::unique_ptr<Work>> Enqueue(Collective c, int64_t bytes_sent,
                                        std::vector<torch::Tensor> tensors, bool host_wait,
                                        Launch&& launch) {
    std::string what = Describe(c);
    if (comm_->aborted()) {
      return Unavailable(what + ": the NCCL communicator was aborted after an earlier failure");
    }
    DeviceGuard guard;
    MW_RETURN_IF_ERROR(guard.Set(device_));
    {
      MW_ASSIGN_OR_RETURN(auto ready, CudaEvent::Create());
      MW_CUDA_CHECK(cudaEventRecord(ready->get(), ComputeStream(device_)), kCudaHint);
      MW_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), ready->get(), 0), kCudaHint);
    }  // destroying a recorded event is fine: CUDA frees it once it completes
    RecordStream(tensors, stream_->get(), device_);
    MW_ASSIGN_OR_RETURN(auto start, CudaEvent::Create(/*timing=*/true));
    MW_CUDA_CHECK(cudaEventRecord(start->get(), stream_->get()), kCudaHint);
    MW_RETURN_IF_ERROR(launch(comm_->get(), stream_->get()));
    MW_ASSIGN_OR_RETURN(auto done, CudaEvent::Create(/*timing=*/true));
    MW_CUDA_CHECK(cudaEventRecord(done->get(), stream_->get()), kCudaHint);
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.calls[static_cast<int>(c)] += 1;
      stats_.bytes_sent[static_cast<int>(c)] += bytes_sent;
    }
    return std::unique_ptr<Work>(std::make_unique<NcclWork>(comm_, stalls_, std::move(start), std::move(done),
                                                            device_, host_wait, options_.timeout,
                                                            std::move(tensors), std::move(what)));
  }

  int rank_;
  int size_;
  int device_;
  CommunicatorOptions options_;
  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<DeviceBuffer> barrier_buffer_;
  std::shared_ptr<StallLog> stalls_ = std::make_shared<StallLog>();
  std::shared_ptr<NcclComm> comm_;  // last: destroyed first, while stream and buffer exist
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                           int rank, int size, int cuda_device,
                                                           const CommunicatorOptions& options) {
  if (!store) return InvalidConfig("nccl communicator: the store is null");
  if (size < 1) return InvalidConfig("nccl communicator: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    return InvalidConfig("nccl communicator: rank " + std::to_string(rank) +
                         " is outside a group of " + std::to_string(size));
  }
  if (options.timeout.count() <= 0) {
    return InvalidConfig("nccl communicator: timeout must be positive, got " +
                         std::to_string(options.timeout.count()) + " ms");
  }

  int device_count = 0;
  MW_CUDA_CHECK(cudaGetDeviceCount(&device_count), kCudaHint);
  if (cuda_device < 0 || cuda_device >= device_count) {
    return Unavailable("nccl communicator: cuda:" + std::to_string(cuda_device) +
                       " does not exist; this process sees " + std::to_string(device_count) +
                       " CUDA device(s) (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)");
  }
  DeviceGuard guard;
  MW_RETURN_IF_ERROR(guard.Set(cuda_device));

  // Rank 0 makes the id; the others read it from the store.
  const std::string key = "nccl/" + options.group_name + "/unique_id";
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) MW_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, kNcclHint);
  try {
    if (rank == 0) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store->set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    } else {
      store->wait({key}, options.timeout);
      const std::vector<uint8_t> bytes = store->get(key);
      if (bytes.size() != sizeof(id)) {
        return Internal("nccl communicator: store key '" + key + "' holds " +
                        std::to_string(bytes.size()) + " bytes, expected an ncclUniqueId of " +
                        std::to_string(sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (const std::exception& e) {
    return Unavailable("nccl communicator for group '" + options.group_name + "' (rank " +
                       std::to_string(rank) + "): exchanging the NCCL id through the store under '" +
                       key + "' failed within " + std::to_string(options.timeout.count()) +
                       " ms: " + e.what());
  }

  // Blocks until all `size` ranks have joined.
  ncclComm_t raw = nullptr;
  MW_NCCL_CHECK(ncclCommInitRank(&raw, size, id, rank), nullptr, kNcclHint);
  auto comm = std::make_shared<NcclComm>(raw);
  MW_ASSIGN_OR_RETURN(auto stream, CudaStream::Create());
  MW_ASSIGN_OR_RETURN(auto barrier_buffer, DeviceBuffer::Create(sizeof(float)));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      rank, size, cuda_device, options, std::move(stream), std::move(barrier_buffer),
      std::move(comm)));
}

}  // namespace meshwork::dist
