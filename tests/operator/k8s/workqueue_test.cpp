// WorkQueue semantics: de-duplication, requeue after processing, backoff, delays, shutdown.
// Waits are bounded; no assertion depends on how fast the machine is.
#include "operator/k8s/workqueue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

namespace meshwork::k8s {
namespace {

using namespace std::chrono_literals;
constexpr auto kEventually = 10s;  // generous bound for "happens eventually"

TEST(WorkQueueTest, DuplicateAddsWhileQueuedAreOneItem) {
  WorkQueue q;
  q.Add("a");
  q.Add("b");
  q.Add("a");
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(q.Get(kEventually), "a");
  EXPECT_EQ(q.Get(kEventually), "b");
  EXPECT_EQ(q.Get(10ms), std::nullopt);
}

TEST(WorkQueueTest, KeyAddedWhileProcessingIsRequeuedAfterDoneNotBefore) {
  WorkQueue q;
  q.Add("a");
  auto key = q.Get(kEventually);
  ASSERT_EQ(key, "a");
  q.Add("a");  // changed again while a worker holds it
  q.Add("a");
  EXPECT_EQ(q.Len(), 0u);                // no second worker may get it
  EXPECT_EQ(q.Get(20ms), std::nullopt);
  EXPECT_EQ(q.NumProcessing(), 1u);
  q.Done("a");
  EXPECT_EQ(q.Len(), 1u);                // once, however often it was added
  EXPECT_EQ(q.Get(kEventually), "a");
  q.Done("a");
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.NumProcessing(), 0u);
}

TEST(WorkQueueTest, DoneWithoutReAddDropsTheKey) {
  WorkQueue q;
  q.Add("a");
  ASSERT_EQ(q.Get(kEventually), "a");
  q.Done("a");
  EXPECT_EQ(q.Get(20ms), std::nullopt);
}

TEST(WorkQueueTest, ShutDownWakesABlockedGet) {
  WorkQueue q;
  auto getter = std::async(std::launch::async, [&] { return q.Get(); });
  // Whether or not the getter is already blocked, ShutDown must release it.
  std::this_thread::sleep_for(20ms);
  q.ShutDown();
  ASSERT_EQ(getter.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(getter.get(), std::nullopt);
  EXPECT_TRUE(q.ShuttingDown());
  q.Add("late");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueueTest, ConcurrentWorkersNeverHoldTheSameKey) {
  WorkQueue q;
  std::atomic<int> in_flight_a{0}, max_in_flight_a{0}, processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = q.Get()) {
        if (*key == "a") {
          int now = ++in_flight_a;
          int prev = max_in_flight_a.load();
          while (now > prev && !max_in_flight_a.compare_exchange_weak(prev, now)) {}
          std::this_thread::sleep_for(1ms);
          --in_flight_a;
        }
        ++processed;
        q.Done(*key);
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
    q.Add("a");
    q.Add("k" + std::to_string(i % 7));
  }
  auto deadline = std::chrono::steady_clock::now() + kEventually;
  while ((q.Len() > 0 || q.NumProcessing() > 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  q.ShutDown();
  for (auto& t : workers) t.join();
  EXPECT_EQ(max_in_flight_a.load(), 1);
  EXPECT_GE(processed.load(), 8);  // at least every distinct key once
}

TEST(ItemBackoffTest, GrowsExponentiallyPerKeyUpToTheCapAndForgets) {
  ItemBackoff b(5ms, 1000ms);
  EXPECT_EQ(b.Next("a"), 5ms);
  EXPECT_EQ(b.Next("a"), 10ms);
  EXPECT_EQ(b.Next("a"), 20ms);
  EXPECT_EQ(b.Next("b"), 5ms);  // per key
  EXPECT_EQ(b.NumRequeues("a"), 3);
  for (int i = 0; i < 100; ++i) b.Next("a");  // no overflow however long it fails
  EXPECT_EQ(b.Next("a"), 1000ms);
  b.Forget("a");
  EXPECT_EQ(b.NumRequeues("a"), 0);
  EXPECT_EQ(b.Next("a"), 5ms);
}

TEST(TokenBucketTest, BurstThenOneTokenPerInterval) {
  auto t0 = Clock::now();
  TokenBucket bucket(/*qps=*/10, /*burst=*/3, t0);
  EXPECT_EQ(bucket.Reserve(t0), 0ms);
  EXPECT_EQ(bucket.Reserve(t0), 0ms);
  EXPECT_EQ(bucket.Reserve(t0), 0ms);
  EXPECT_EQ(bucket.Reserve(t0), 100ms);   // the 4th waits one interval
  EXPECT_EQ(bucket.Reserve(t0), 200ms);   // the 5th two
  // After a long pause the bucket is full again, never more than the burst.
  auto later = t0 + 10s;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bucket.Reserve(later), 0ms);
  EXPECT_GT(bucket.Reserve(later), 0ms);
}

TEST(WorkQueueTest, AddRateLimitedCountsRequeuesAndForgetResets) {
  WorkQueueOptions o;
  o.base_delay = 1ms;
  o.max_delay = 4ms;
  WorkQueue q(o);
  for (int i = 0; i < 5; ++i) {
    q.AddRateLimited("a");
    auto key = q.Get(kEventually);
    ASSERT_EQ(key, "a") << "attempt " << i;
    q.Done("a");
  }
  EXPECT_EQ(q.NumRequeues("a"), 5);
  q.Forget("a");
  EXPECT_EQ(q.NumRequeues("a"), 0);
}

TEST(WorkQueueTest, AddAfterDeliversInDueOrder) {
  WorkQueue q;
  q.AddAfter("late", 300ms);
  q.AddAfter("early", 50ms);
  q.Add("now");
  EXPECT_EQ(q.Get(kEventually), "now");
  EXPECT_EQ(q.Get(kEventually), "early");
  EXPECT_EQ(q.Get(kEventually), "late");
}

TEST(WorkQueueTest, AddAfterKeepsTheEarlierDueTimeAndDedupes) {
  WorkQueue q;
  q.AddAfter("a", 1h);
  q.AddAfter("a", 30ms);  // sooner wins
  q.AddAfter("a", 2h);    // later is ignored
  EXPECT_EQ(q.NumDelayed(), 1u);
  EXPECT_EQ(q.Get(kEventually), "a");
  q.Done("a");
  EXPECT_EQ(q.Get(50ms), std::nullopt);
}

TEST(WorkQueueTest, MetricHooksSeeEachGetAndDone) {
  std::mutex mu;
  std::vector<double> latencies, durations;
  WorkQueueOptions o;
  o.on_queue_latency = [&](double s) { std::lock_guard<std::mutex> l(mu); latencies.push_back(s); };
  o.on_work_duration = [&](double s) { std::lock_guard<std::mutex> l(mu); durations.push_back(s); };
  WorkQueue q(o);
  q.Add("a");
  q.Add("b");
  for (int i = 0; i < 2; ++i) {
    auto key = q.Get(kEventually);
    ASSERT_TRUE(key.has_value());
    q.Done(*key);
  }
  q.Done("never-taken");  // ignored: no duration for a key nobody took
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(latencies.size(), 2u);
  ASSERT_EQ(durations.size(), 2u);
  for (double v : latencies) EXPECT_GE(v, 0.0);
  for (double v : durations) EXPECT_GE(v, 0.0);
}

TEST(WorkQueueTest, ShutDownWithPendingDelaysDoesNotHang) {
  auto q = std::make_unique<WorkQueue>();
  q->AddAfter("x", 1h);
  auto done = std::async(std::launch::async, [&] { q.reset(); });
  EXPECT_EQ(done.wait_for(kEventually), std::future_status::ready);
}

}  // namespace
}  // namespace meshwork::k8s
