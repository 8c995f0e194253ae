// Communicators: N ranks as threads of one process meet through a c10d::HashStore, each with a
// Gloo communicator on 127.0.0.1; values, stats, validation, timeouts, and the NCCL factory's
// failure on a machine without a GPU.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/needs_gloo.h"
#include "trainer/dist/communicator.h"
#include "trainer/dist/gloo_communicator.h"
#include "trainer/dist/host_collectives.h"
#ifdef MESHWORK_HAVE_NCCL
#include "trainer/dist/nccl_communicator.h"
#endif

namespace meshwork::dist {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Runs `body` on a thread; a test that has not finished within `bound` aborts the binary
// rather than hang ctest.
void RunBounded(std::function<void()> body, seconds bound) {
  std::packaged_task<void()> task(std::move(body));
  std::future<void> done = task.get_future();
  std::thread thread(std::move(task));
  if (done.wait_for(bound) != std::future_status::ready) {
    std::fprintf(stderr, "test did not finish within %lld s; aborting\n",
                 static_cast<long long>(bound.count()));
    std::abort();
  }
  thread.join();
  done.get();
}

// Runs `per_rank(rank, communicator)` on `n` ranks, each its own thread and Gloo communicator.
void RunRanks(int n, const std::function<void(int, Communicator&)>& per_rank,
              CommunicatorOptions options = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunBounded(
      [&]() {
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r) {
          threads.emplace_back([&, r]() {
            auto comm = MakeGlooCommunicator(store, r, n, options, "127.0.0.1");
            ASSERT_TRUE(comm.ok()) << comm.status().ToString();
            per_rank(r, **comm);
          });
        }
        for (auto& t : threads) t.join();
      },
      seconds(120));
}

void WaitOk(Result<std::unique_ptr<Work>> work) {
  ASSERT_TRUE(work.ok()) << work.status().ToString();
  const Status s = (*work)->Wait();
  ASSERT_TRUE(s.ok()) << s.ToString();
}

torch::Tensor RankValues(int rank, int64_t n, torch::ScalarType dtype) {
  return (torch::arange(n, torch::kInt64) + 100 * rank).to(dtype);
}

constexpr int64_t kShard = 6;

TEST(CollectiveName, NamesEveryCollective) {
  EXPECT_STREQ(CollectiveName(Collective::kAllGather), "all_gather");
  EXPECT_STREQ(CollectiveName(Collective::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(CollectiveName(Collective::kAllReduce), "all_reduce");
  EXPECT_STREQ(CollectiveName(Collective::kBroadcast), "broadcast");
  EXPECT_STREQ(CollectiveName(Collective::kBarrier), "barrier");
  EXPECT_STREQ(CollectiveName(Collective::kSend), "send");
  EXPECT_STREQ(CollectiveName(Collective::kRecv), "recv");
}

class GlooCollectives : public testing::NeedsGloo<::testing::TestWithParam<int>> {};
class GlooCommunicator : public testing::NeedsGloo<> {};

TEST_P(GlooCollectives, AllGatherPutsShardsInRankOrder) {
  const int n = GetParam();
  for (auto dtype : {torch::kFloat32, torch::kInt64, torch::kBFloat16}) {
    RunRanks(n, [&](int rank, Communicator& comm) {
      EXPECT_STREQ(comm.backend(), "gloo");
      EXPECT_EQ(comm.rank(), rank);
      EXPECT_EQ(comm.size(), n);
      torch::Tensor input = RankValues(rank, kShard, dtype);
      torch::Tensor output = torch::full({n * kShard}, -1, dtype);
      WaitOk(comm.AllGatherInto(output, input));
      std::vector<torch::Tensor> expected;
      for (int r = 0; r < n; ++r) expected.push_back(RankValues(r, kShard, dtype));
      EXPECT_TRUE(torch::equal(output, torch::cat(expected)))
          << c10::toString(dtype) << " rank " << rank << ": " << output;
    });
  }
}

TEST_P(GlooCollectives, ReduceScatterSumAndAvgGiveThisRanksSlice) {
  const int n = GetParam();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      RunRanks(n, [&](int rank, Communicator& comm) {
        // Rank r contributes arange(n·k) + 100·r: the sum over ranks is n·arange + 100·n(n−1)/2.
        torch::Tensor input = RankValues(rank, n * kShard, dtype);
        const torch::Tensor before = input.clone();
        torch::Tensor output = torch::full({kShard}, -1, dtype);
        WaitOk(comm.ReduceScatter(output, input, op));
        EXPECT_TRUE(torch::equal(input, before)) << "the reduce-scatter wrote into its input";
        torch::Tensor sum =
            n * torch::arange(rank * kShard, (rank + 1) * kShard, torch::kFloat32) +
            100.0f * n * (n - 1) / 2;
        // bfloat16 is reduced in fp32 and rounded once, like this expectation.
        torch::Tensor expected = (op == ReduceOp::kSum ? sum : sum / n).to(dtype);
        EXPECT_TRUE(torch::equal(output, expected))
            << c10::toString(dtype) << " rank " << rank << ": " << output;
        // In place: the output is this rank's own slice of the input (read before it is written).
        torch::Tensor in_place = RankValues(rank, n * kShard, dtype);
        WaitOk(comm.ReduceScatter(in_place.narrow(0, rank * kShard, kShard), in_place, op));
        EXPECT_TRUE(torch::equal(in_place.narrow(0, rank * kShard, kShard), expected))
            << "in place, " << c10::toString(dtype) << " rank " << rank;
      });
    }
  }
}

// All-gathers and reduce-scatters travel in pieces of about 1 MiB, several collectives in flight
// at once (waited for in any order), an all-gather's input may be its own slot of the output.
TEST_P(GlooCollectives, LargeCollectivesInPiecesSeveralInFlight) {
  const int n = GetParam();
  const int64_t part = (int64_t{7} << 20) / 8 + 3;  // 3.5 MiB of fp32 and a ragged last piece
  RunRanks(n, [&](int rank, Communicator& comm) {
    std::vector<torch::Tensor> outputs;
    std::vector<std::unique_ptr<Work>> works;
    for (int i = 0; i < 3; ++i) {
      torch::Tensor output = torch::full({n * part}, -1.0f);
      torch::Tensor mine = output.narrow(0, rank * part, part);
      mine.copy_(RankValues(rank, part, torch::kFloat32) + 1000 * i);
      auto work = i == 1 ? comm.AllGatherInto(output, mine)  // in place
                         : comm.AllGatherInto(output, mine.clone());
      ASSERT_TRUE(work.ok()) << work.status().ToString();
      works.push_back(std::move(*work));
      outputs.push_back(output);
    }
    torch::Tensor rs_in = RankValues(rank, n * part, torch::kFloat32);
    torch::Tensor rs_out = torch::empty({part});
    auto rs = comm.ReduceScatter(rs_out, rs_in, ReduceOp::kSum);
    ASSERT_TRUE(rs.ok()) << rs.status().ToString();
    ASSERT_TRUE((*rs)->Wait().ok());
    for (int i = 2; i >= 0; --i) {
      ASSERT_TRUE(works[i]->Wait().ok()) << i;
      ASSERT_TRUE(works[i]->CompletedAt().has_value()) << "a finished collective says when";
      std::vector<torch::Tensor> expected;
      for (int r = 0; r < n; ++r) expected.push_back(RankValues(r, part, torch::kFloat32) + 1000 * i);
      EXPECT_TRUE(torch::equal(outputs[i], torch::cat(expected))) << "all-gather " << i << " rank " << rank;
    }
    torch::Tensor sum = n * torch::arange(rank * part, (rank + 1) * part, torch::kFloat32) + 100.0f * n * (n - 1) / 2;
    EXPECT_TRUE(torch::equal(rs_out, sum)) << "rank " << rank;
  });
}

TEST_P(GlooCollectives, AllReduceSumAndAvg) {
  const int n = GetParam();
  RunRanks(n, [&](int rank, Communicator& comm) {
    torch::Tensor sum_f = RankValues(rank, kShard, torch::kFloat32);
    WaitOk(comm.AllReduce(sum_f, ReduceOp::kSum));
    torch::Tensor expected_sum = n * torch::arange(kShard, torch::kFloat32) + 100.0f * n * (n - 1) / 2;
    EXPECT_TRUE(torch::allclose(sum_f, expected_sum)) << sum_f;

    torch::Tensor avg_f = RankValues(rank, kShard, torch::kFloat32);
    WaitOk(comm.AllReduce(avg_f, ReduceOp::kAvg));
    EXPECT_TRUE(torch::allclose(avg_f, expected_sum / n)) << avg_f;

    torch::Tensor sum_i = RankValues(rank, kShard, torch::kInt64);
    WaitOk(comm.AllReduce(sum_i, ReduceOp::kSum));
    EXPECT_TRUE(torch::equal(sum_i, expected_sum.to(torch::kInt64))) << sum_i;

    torch::Tensor sum_bf = RankValues(rank, kShard, torch::kBFloat16);
    WaitOk(comm.AllReduce(sum_bf, ReduceOp::kSum));
    EXPECT_TRUE(torch::equal(sum_bf, expected_sum.to(torch::kBFloat16))) << sum_bf;
  });
}

TEST_P(GlooCollectives, BroadcastCopiesTheRootsTensor) {
  const int n = GetParam();
  const int root = n > 1 ? 1 : 0;
  RunRanks(n, [&](int rank, Communicator& comm) {
    torch::Tensor t = RankValues(rank, kShard, torch::kFloat32);
    WaitOk(comm.Broadcast(t, root));
    EXPECT_TRUE(torch::equal(t, RankValues(root, kShard, torch::kFloat32))) << t;
  });
}

TEST_P(GlooCollectives, BarrierCompletes) {
  RunRanks(GetParam(), [&](int, Communicator& comm) {
    WaitOk(comm.Barrier());
    WaitOk(comm.Barrier());
  });
}

TEST_P(GlooCollectives, StatsCountCallsAndBytesSent) {
  const int n = GetParam();
  const int root = n > 1 ? 1 : 0;
  RunRanks(n, [&](int rank, Communicator& comm) {
    const int64_t shard_bytes = kShard * 4;  // fp32
    WaitOk(comm.AllGatherInto(torch::zeros({n * kShard}), torch::zeros({kShard})));
    WaitOk(comm.AllGatherInto(torch::zeros({n * kShard}), torch::zeros({kShard})));
    WaitOk(comm.ReduceScatter(torch::zeros({kShard}), torch::zeros({n * kShard}), ReduceOp::kSum));
    WaitOk(comm.AllReduce(torch::zeros({kShard}), ReduceOp::kAvg));
    WaitOk(comm.Broadcast(torch::zeros({kShard}), root));
    WaitOk(comm.Barrier());
    const CommStats stats = comm.stats();
    auto calls = [&](Collective c) { return stats.calls[static_cast<int>(c)]; };
    auto bytes = [&](Collective c) { return stats.bytes_sent[static_cast<int>(c)]; };
    EXPECT_EQ(calls(Collective::kAllGather), 2);
    EXPECT_EQ(calls(Collective::kReduceScatter), 1);
    EXPECT_EQ(calls(Collective::kAllReduce), 1);
    EXPECT_EQ(calls(Collective::kBroadcast), 1);
    EXPECT_EQ(calls(Collective::kBarrier), 1);
    // all-gather: (n−1)·shard per call.
    EXPECT_EQ(bytes(Collective::kAllGather), 2 * (n - 1) * shard_bytes);
    // reduce-scatter (an all-to-all on Gloo): the n−1 chunks that go to other ranks.
    EXPECT_EQ(bytes(Collective::kReduceScatter), (n - 1) * shard_bytes);
    EXPECT_EQ(bytes(Collective::kAllReduce), 2 * (n - 1) * shard_bytes / n);
    // broadcast: the root counts one copy per other rank; the others count nothing.
    EXPECT_EQ(bytes(Collective::kBroadcast), rank == root ? (n - 1) * shard_bytes : 0);
    EXPECT_EQ(bytes(Collective::kBarrier), 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "N" + std::to_string(info.param);
                         });

// Host values through the group: sums and means, texts of different lengths (one empty), and a
// broadcast from a rank other than 0.
TEST_P(GlooCollectives, HostValuesAndTextsTravelThroughTheGroup) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Communicator& comm) {
    auto sum = AllReduceValues(comm, {1.0 * rank, 2.5}, ReduceOp::kSum);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_DOUBLE_EQ((*sum)[0], n * (n - 1) / 2.0);
    EXPECT_DOUBLE_EQ((*sum)[1], 2.5 * n);
    auto mean = AllReduceValues(comm, {1.0 * rank}, ReduceOp::kAvg);
    ASSERT_TRUE(mean.ok());
    EXPECT_DOUBLE_EQ((*mean)[0], (n - 1) / 2.0);
    // Rank r offers r² and 10 - r: the median of each column, the same on every rank.
    auto median = MedianAcrossRanks(comm, {1.0 * rank * rank, 10.0 - rank});
    ASSERT_TRUE(median.ok()) << median.status().ToString();
    EXPECT_DOUBLE_EQ((*median)[0], 1.0 * (n / 2) * (n / 2));
    EXPECT_DOUBLE_EQ((*median)[1], 10.0 - (n - 1 - n / 2));
    auto texts = AllGatherText(comm, rank == 0 ? std::string() : std::string(static_cast<size_t>(rank * 3), 'a' + rank));
    ASSERT_TRUE(texts.ok()) << texts.status().ToString();
    ASSERT_EQ(texts->size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) EXPECT_EQ((*texts)[r], r == 0 ? "" : std::string(static_cast<size_t>(r * 3), 'a' + r));
    const int root = n - 1;
    auto text = BroadcastText(comm, rank == root ? "plan from the last rank" : "ignored", root);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, "plan from the last rank");
  });
}

TEST_F(GlooCommunicator, SendAndRecvMatchInIssueOrderBetweenEachPair) {
  // Ring of 3: each rank sends two tensors (fp32, then bf16) to the next and receives the
  // previous rank's, posting both sends before any receive; a pair's k-th send fills its k-th recv.
  const int n = 3;
  RunRanks(n, [&](int rank, Communicator& comm) {
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    torch::Tensor a = RankValues(rank, 5, torch::kFloat32), b = RankValues(rank, 7, torch::kBFloat16);
    auto send_a = comm.Send(a, next);
    auto send_b = comm.Send(b, next);
    ASSERT_TRUE(send_a.ok() && send_b.ok());
    torch::Tensor got_a = torch::empty({5}, torch::kFloat32), got_b = torch::empty({7}, torch::kBFloat16);
    WaitOk(comm.Recv(got_a, prev));
    WaitOk(comm.Recv(got_b, prev));
    ASSERT_TRUE((*send_a)->Wait().ok());
    ASSERT_TRUE((*send_b)->Wait().ok());
    EXPECT_TRUE(got_a.equal(RankValues(prev, 5, torch::kFloat32)));
    EXPECT_TRUE(got_b.equal(RankValues(prev, 7, torch::kBFloat16)));
    const CommStats stats = comm.stats();
    EXPECT_EQ(stats.calls[static_cast<int>(Collective::kSend)], 2);
    EXPECT_EQ(stats.calls[static_cast<int>(Collective::kRecv)], 2);
    EXPECT_EQ(stats.bytes_sent[static_cast<int>(Collective::kSend)], 5 * 4 + 7 * 2);
    // Another peer than the group's ranks, or itself, is refused by name.
    auto self = comm.Send(a, rank);
    ASSERT_FALSE(self.ok());
    EXPECT_NE(self.status().message().find("peer " + std::to_string(rank) + " is not another rank of a group of 3"),
              std::string::npos)
        << self.status().message();
    EXPECT_FALSE(comm.Recv(got_a, 7).ok());
  });
}

TEST_F(GlooCommunicator, RejectsBadInputsWithClearMessages) {
  RunRanks(2, [&](int rank, Communicator& comm) {
    auto expect_invalid = [](Result<std::unique_ptr<Work>> r, const std::string& needle) {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput) << r.status().ToString();
      EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
    };
    const torch::Tensor non_contiguous = torch::zeros({4, 4}).t();
    expect_invalid(comm.AllReduce(non_contiguous, ReduceOp::kSum), "not contiguous");
    expect_invalid(comm.AllReduce(torch::Tensor(), ReduceOp::kSum), "undefined");
    expect_invalid(comm.AllReduce(torch::zeros({3}, torch::kInt64), ReduceOp::kAvg),
                   "floating-point");
    expect_invalid(comm.AllReduce(torch::zeros({3}, torch::kBool), ReduceOp::kSum), "dtype");
    expect_invalid(comm.AllGatherInto(torch::zeros({4}, torch::kFloat64), torch::zeros({2})),
                   "differs from input dtype");
    expect_invalid(comm.AllGatherInto(torch::zeros({5}), torch::zeros({2})),
                   "expected size · input");
    expect_invalid(comm.ReduceScatter(torch::zeros({2}), torch::zeros({3}), ReduceOp::kSum),
                   "expected size · output");
    expect_invalid(comm.Broadcast(torch::zeros({2}), 2), "root 2");
    expect_invalid(comm.Broadcast(torch::zeros({2}), -1), "root -1");
    // Rejected calls are not counted, and the group still works afterwards.
    EXPECT_EQ(comm.stats().calls[static_cast<int>(Collective::kAllReduce)], 0);
    WaitOk(comm.Barrier());
  });
}

TEST_F(GlooCommunicator, FactoryRejectsBadArguments) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto bad_rank = MakeGlooCommunicator(store, 2, 2, {}, "127.0.0.1");
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidConfig);
  auto null_store = MakeGlooCommunicator(c10::intrusive_ptr<c10d::Store>(), 0, 1, {}, "127.0.0.1");
  ASSERT_FALSE(null_store.ok());
  EXPECT_EQ(null_store.status().code(), StatusCode::kInvalidConfig);
}

TEST_F(GlooCommunicator, SetupTimesOutWhenAPeerNeverComes) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CommunicatorOptions options;
  options.timeout = milliseconds(1000);
  RunBounded(
      [&]() {
        const auto start = std::chrono::steady_clock::now();
        auto comm = MakeGlooCommunicator(store, 0, 2, options, "127.0.0.1");
        ASSERT_FALSE(comm.ok());
        EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable) << comm.status().ToString();
        EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10));
      },
      seconds(60));
}

// Rank 0 issues `issue`'s collective and rank 1, in the group, never joins it: Wait() is
// kUnavailable naming the collective, group, rank and timeout, within the timeout's order.
void ExpectUnavailableWithoutThePeer(const char* name,
                                     const std::function<Result<std::unique_ptr<Work>>(Communicator&)>& issue) {
  CommunicatorOptions options;
  options.timeout = milliseconds(1000);
  options.group_name = "dp_shard";
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  // Rank 1 stays in the group until rank 0 has its answer, even if rank 0 fails an ASSERT.
  struct SetOnExit {
    std::promise<void>& p;
    ~SetOnExit() { p.set_value(); }
  };
  RunRanks(
      2,
      [&](int rank, Communicator& comm) {
        if (rank == 1) {  // joins the group, never the collective
          rank0_done_future.wait();
          return;
        }
        SetOnExit release_rank1{rank0_done};
        const auto start = std::chrono::steady_clock::now();
        auto work = issue(comm);
        ASSERT_TRUE(work.ok()) << work.status().ToString();
        const Status s = (*work)->Wait();
        const auto waited = std::chrono::steady_clock::now() - start;
        EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
        for (const char* needle : {name, "dp_shard", "rank 0", "1000 ms"}) {
          EXPECT_NE(s.message().find(needle), std::string::npos) << needle << " in " << s.ToString();
        }
        EXPECT_LT(waited, seconds(10));
        EXPECT_EQ((*work)->Wait().code(), StatusCode::kUnavailable);  // the same answer again
      },
      options);
}

TEST_F(GlooCommunicator, WaitIsUnavailableWhenAPeerNeverJoinsTheCollective) {
  ExpectUnavailableWithoutThePeer("all_reduce", [](Communicator& comm) {
    return comm.AllReduce(torch::ones({16}), ReduceOp::kSum);
  });
  // All-gathers and reduce-scatters are point-to-point transfers, timed out by their own thread.
  ExpectUnavailableWithoutThePeer("all_gather", [](Communicator& comm) {
    return comm.AllGatherInto(torch::zeros({2 * 600000}), torch::ones({600000}));  // several pieces
  });
  ExpectUnavailableWithoutThePeer("reduce_scatter", [](Communicator& comm) {
    return comm.ReduceScatter(torch::zeros({16}), torch::ones({32}), ReduceOp::kSum);
  });
}

// A peer whose communicator is gone (its process died): an all-gather or reduce-scatter issued
// afterwards is kUnavailable naming the collective, whether posting its transfers already fails
// or its wait does; never an internal error.
TEST_F(GlooCommunicator, CollectivesAfterAPeerLeftAreUnavailable) {
  CommunicatorOptions options;
  options.timeout = milliseconds(2000);
  std::promise<void> rank1_gone;
  std::shared_future<void> gone = rank1_gone.get_future().share();
  RunRanks(
      2,
      [&](int rank, Communicator& comm) {
        WaitOk(comm.AllGatherInto(torch::zeros({2 * kShard}), torch::ones({kShard})));  // both connected
        if (rank == 1) {
          // Signalled once this thread's communicator is destroyed (RunRanks' thread has ended).
          std::thread([&rank1_gone] {
            std::this_thread::sleep_for(milliseconds(500));
            rank1_gone.set_value();
          }).detach();
          return;
        }
        gone.wait();
        std::this_thread::sleep_for(milliseconds(300));  // the close reaches this side
        for (const char* name : {"all_gather", "reduce_scatter"}) {
          auto work = std::string(name) == "all_gather"
                          ? comm.AllGatherInto(torch::zeros({2 * 600000}), torch::ones({600000}))
                          : comm.ReduceScatter(torch::zeros({600000}), torch::ones({2 * 600000}), ReduceOp::kSum);
          const Status s = work.ok() ? (*work)->Wait() : work.status();
          EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
          EXPECT_NE(s.message().find(name), std::string::npos) << s.ToString();
        }
      },
      options);
}

TEST(NcclCommunicator, FactoryFailsCleanlyWithoutAGpu) {
#ifndef MESHWORK_HAVE_NCCL
  GTEST_SKIP() << "built without CUDA/NCCL: MakeNcclCommunicator is not compiled";
#else
  auto store = c10::make_intrusive<c10d::HashStore>();
  CommunicatorOptions options;
  options.timeout = milliseconds(2000);
  auto comm = MakeNcclCommunicator(store, 0, 1, 0, options);
  if (comm.ok()) GTEST_SKIP() << "a GPU is present; this test checks the GPU-less path";
  EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable) << comm.status().ToString();
  EXPECT_FALSE(comm.status().message().empty());
  std::printf("MakeNcclCommunicator without a GPU: %s\n", comm.status().ToString().c_str());
#endif
}

}  // namespace
}  // namespace meshwork::dist
