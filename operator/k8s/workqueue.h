// The controller work queue (client-go's semantics): keys are de-duplicated, a key being
// processed is not handed to a second worker, failures requeue with per-key exponential backoff
// combined with an overall token bucket, and delayed adds. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace meshwork::k8s {

using Clock = std::chrono::steady_clock;

// Per-key exponential backoff: base * 2^failures, capped (client-go's
// ItemExponentialFailureRateLimiter). Not thread-safe by itself; WorkQueue locks around it.
class ItemBackoff {
 public:
  ItemBackoff(std::chrono::milliseconds base, std::chrono::milliseconds cap) : base_(base), cap_(cap) {}
  // The delay for this key's next retry; counts one more failure.
  std::chrono::milliseconds Next(const std::string& key);
  void Forget(const std::string& key) { failures_.erase(key); }
  int NumRequeues(const std::string& key) const;

 private:
  std::chrono::milliseconds base_, cap_;
  std::map<std::string, int> failures_;
};

// Overall limit: `qps` tokens per second, `burst` at most (client-go's BucketRateLimiter).
// Reserve() takes a token and says how long to wait until it is really there.
class TokenBucket {
 public:
  TokenBucket(double qps, int burst, Clock::time_point now = Clock::now());
  std::chrono::milliseconds Reserve(Clock::time_point now = Clock::now());

 private:
  double qps_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

struct WorkQueueOptions {
  std::chrono::milliseconds base_delay{5};         // first retry after a failure
  std::chrono::milliseconds max_delay{1000 * 1000};  // per-key cap (1000 s)
  double qps = 10;                                   // overall requeue rate ...
  int burst = 100;                                   // ... and burst
  // Optional metric hooks, in seconds, called without the queue's lock held: how long a key
  // waited in the queue before a Get took it, and how long a worker held it (Get to Done).
  std::function<void(double)> on_queue_latency;
  std::function<void(double)> on_work_duration;
  // Optional counting hooks. on_depth (the number of keys waiting, Len()) after every change and
  // on_add (a key was accepted: not already queued) are called with the queue's lock held, so
  // that depth readings arrive in order: they must be quick and must not call into the queue.
  // on_retry (an AddRateLimited call) is called without the lock.
  std::function<void(size_t depth)> on_depth;
  std::function<void()> on_add;
  std::function<void()> on_retry;
};

class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();  // ShutDown() and joins the delay thread
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `key` unless it is already queued; a key being processed is queued again after Done.
  void Add(const std::string& key);
  // Adds `key` once `delay` has passed (an earlier pending AddAfter for the key wins).
  void AddAfter(const std::string& key, std::chrono::milliseconds delay);
  // AddAfter with max(the key's backoff, the token bucket's wait); counts a requeue.
  void AddRateLimited(const std::string& key);
  // The key succeeded: reset its backoff (does not remove it from the queue).
  void Forget(const std::string& key);
  int NumRequeues(const std::string& key) const;

  // Blocks for the next key; nullopt once ShutDown() was called (queued keys are dropped: the
  // level-triggered reconciler finds them again after a restart).
  std::optional<std::string> Get();
  // As Get, but gives up after `timeout` (nullopt).
  std::optional<std::string> Get(std::chrono::milliseconds timeout);
  // The worker finished `key`; if it was re-added meanwhile it is queued now.
  void Done(const std::string& key);

  void ShutDown();
  bool ShuttingDown() const;
  size_t Len() const;            // keys waiting (not processing, not delayed)
  size_t NumProcessing() const;
  size_t NumDelayed() const;

 private:
  void AddLocked(const std::string& key);
  void PushLocked(const std::string& key);
  std::string PopLocked(double* waited_seconds);
  void DelayLoop();

  WorkQueueOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // getters
  std::condition_variable delay_cv_;  // the delay thread
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;       // queued or to be queued after Done
  std::map<std::string, Clock::time_point> processing_;  // key -> when a worker took it
  std::map<std::string, Clock::time_point> queued_at_;
  bool shutting_down_ = false;
  ItemBackoff backoff_;
  TokenBucket bucket_;
  std::map<std::string, Clock::time_point> waiting_;  // delayed key -> when it is due
  std::priority_queue<std::pair<Clock::time_point, std::string>,
                      std::vector<std::pair<Clock::time_point, std::string>>, std::greater<>>
      waiting_heap_;  // may hold stale entries; waiting_ is the truth
  std::thread delay_thread_;
};

}  // namespace meshwork::k8s
