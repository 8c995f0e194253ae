// WorkQueue's counting hooks (on_depth, on_add, on_retry): what they report and when; a queue
// without them behaves as before (operator/k8s's own tests).
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "operator/k8s/workqueue.h"

namespace meshwork::k8s {
namespace {

using namespace std::chrono_literals;

TEST(WorkQueueHooksTest, DepthAddsAndRetriesAreReported) {
  std::mutex mu;
  std::vector<size_t> depths;
  std::atomic<int> adds{0}, retries{0};
  WorkQueueOptions o;
  o.base_delay = 1ms;
  o.on_depth = [&](size_t d) {
    std::lock_guard<std::mutex> lock(mu);
    depths.push_back(d);
  };
  o.on_add = [&] { adds++; };
  o.on_retry = [&] { retries++; };
  WorkQueue q(o);

  q.Add("a");
  q.Add("b");
  q.Add("a");  // de-duplicated: no add, no depth change
  EXPECT_EQ(adds.load(), 2);
  auto key = q.Get(1000ms);
  ASSERT_EQ(key, "a");
  q.Add("a");  // re-added while processed: counted, queued on Done
  EXPECT_EQ(adds.load(), 3);
  q.Done("a");
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(depths, (std::vector<size_t>{1, 2, 1, 2}));
  }
  q.AddRateLimited("c");
  EXPECT_EQ(retries.load(), 1);
  for (int i = 0; i < 200 && q.Len() < 3; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(q.Len(), 3u);
  EXPECT_EQ(adds.load(), 4);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(depths.back(), 3u);
}

TEST(WorkQueueHooksTest, HooksAreOptional) {
  WorkQueueOptions o;
  o.on_add = [] {};  // some set, some not
  WorkQueue q(o);
  q.Add("a");
  q.AddRateLimited("b");
  EXPECT_EQ(q.Get(1000ms), "a");
  q.Done("a");
}

}  // namespace
}  // namespace meshwork::k8s
