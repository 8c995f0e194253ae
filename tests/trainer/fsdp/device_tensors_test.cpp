// No host tensor reaches a device communicator (NCCL rejects them): every path that moves host
// values or calibrates a link is run against a communicator whose device is not the CPU and
// which, like NCCL, refuses any tensor on another device. Its device is `meta` (tensors without
// data), the one non-CPU device a CPU-only libtorch has: the collectives accept and do nothing,
// so results are meaningless and copies back to the host fail; what is checked is what the
// communicator was handed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/compiler/ir.h"
#include "trainer/dist/communicator.h"
#include "trainer/dist/host_collectives.h"
#include "trainer/fsdp/calibrate.h"
#include "trainer/fsdp/fully_shard.h"

namespace meshwork::fsdp {
namespace {

using dist::Collective;
using dist::CommStats;
using dist::ReduceOp;
using dist::Work;

class DoneWork : public Work {
 public:
  Status Wait() override { return Status::Ok(); }
};

// One rank; takes tensors on `meta` only, as NCCL takes tensors on its GPU only.
class DeviceOnlyCommunicator : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "device-only"; }
  const std::string& group_name() const override { return name_; }
  torch::Device device() const override { return torch::Device(torch::kMeta); }
  Result<std::unique_ptr<Work>> AllGatherInto(torch::Tensor output, torch::Tensor input) override {
    return Take(Collective::kAllGather, {output, input});
  }
  Result<std::unique_ptr<Work>> ReduceScatter(torch::Tensor output, torch::Tensor input, ReduceOp) override {
    return Take(Collective::kReduceScatter, {output, input});
  }
  Result<std::unique_ptr<Work>> AllReduce(torch::Tensor tensor, ReduceOp) override {
    return Take(Collective::kAllReduce, {tensor});
  }
  Result<std::unique_ptr<Work>> Broadcast(torch::Tensor tensor, int) override {
    return Take(Collective::kBroadcast, {tensor});
  }
  Result<std::unique_ptr<Work>> Barrier() override { return Take(Collective::kBarrier, {}); }
  CommStats stats() const override { return {}; }

  int calls = 0;
  std::vector<std::string> rejected;  // "<collective>: tensor on <device>"

 private:
  Result<std::unique_ptr<Work>> Take(Collective c, const std::vector<torch::Tensor>& tensors) {
    ++calls;
    for (const auto& t : tensors) {
      if (t.device() != device()) {
        rejected.push_back(std::string(dist::CollectiveName(c)) + ": tensor on " + t.device().str());
        return InvalidInput(rejected.back());
      }
    }
    return std::unique_ptr<Work>(std::make_unique<DoneWork>());
  }
  std::string name_ = "world";
};

TEST(DeviceCommunicator, HostValuesReachItOnlyOnItsDevice) {
  DeviceOnlyCommunicator comm;
  (void)dist::AllReduceValues(comm, {1.0, 2.0}, ReduceOp::kAvg);
  (void)dist::AllGatherText(comm, "rank 0's trace");
  (void)dist::BroadcastText(comm, "a plan", 0);
  EXPECT_GE(comm.calls, 3);
  EXPECT_THAT(comm.rejected, ::testing::IsEmpty());
}

TEST(DeviceCommunicator, CopyingAResultBackThatFailsIsAnErrorNotACrash) {
  DeviceOnlyCommunicator comm;
  auto r = dist::AllReduceValues(comm, {1.0}, ReduceOp::kSum);
  ASSERT_FALSE(r.ok());  // meta tensors hold no data to copy back
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("group 'world'"));
}

TEST(DeviceCommunicator, LinkCalibrationAndPlanAgreementUseItsDevice) {
  DeviceOnlyCommunicator comm;
  for (auto kind : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce}) {
    (void)CalibrateLink(comm, kind, {int64_t{1} << 16, int64_t{1} << 20});
  }
  (void)dist::MedianAcrossRanks(comm, {1.0, 2.0});
  (void)MeasureInterference(comm);
  (void)MeasureLaneShare(comm, comm, int64_t{1} << 20, int64_t{1} << 20);
  (void)AgreeOnPlan(comm, compiler::Graph());
  EXPECT_GE(comm.calls, 4);
  EXPECT_THAT(comm.rejected, ::testing::IsEmpty());
}

}  // namespace
}  // namespace meshwork::fsdp
