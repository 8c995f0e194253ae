// WorkQueue and its rate limiters (see workqueue.h).
#include "operator/k8s/workqueue.h"

#include <algorithm>
#include <cmath>

namespace meshwork::k8s {

std::chrono::milliseconds ItemBackoff::Next(const std::string& key) {
  int failures = failures_[key]++;
  // base * 2^failures without overflow: stop doubling once past the cap.
  double delay = static_cast<double>(base_.count()) * std::pow(2.0, std::min(failures, 62));
  if (delay >= static_cast<double>(cap_.count())) return cap_;
  return std::chrono::milliseconds(static_cast<int64_t>(delay));
}

int ItemBackoff::NumRequeues(const std::string& key) const {
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

TokenBucket::TokenBucket(double qps, int burst, Clock::time_point now)
    : qps_(qps), burst_(std::max(1, burst)), tokens_(std::max(1, burst)), last_(now) {}

std::chrono::milliseconds TokenBucket::Reserve(Clock::time_point now) {
  if (qps_ <= 0) return std::chrono::milliseconds(0);  // no overall limit
  if (now > last_) {
    double elapsed = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
    last_ = now;
  }
  tokens_ -= 1.0;
  if (tokens_ >= 0) return std::chrono::milliseconds(0);
  double wait_s = -tokens_ / qps_;
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(wait_s * 1000.0)));
}

WorkQueue::WorkQueue(WorkQueueOptions options)
    : options_(options),
      backoff_(options.base_delay, options.max_delay),
      bucket_(options.qps, options.burst) {
  delay_thread_ = std::thread([this] { DelayLoop(); });
}

WorkQueue::~WorkQueue() {
  ShutDown();
  if (delay_thread_.joinable()) delay_thread_.join();
}

void WorkQueue::PushLocked(const std::string& key) {
  queue_.push_back(key);
  queued_at_[key] = Clock::now();
  if (options_.on_depth) options_.on_depth(queue_.size());
  cv_.notify_one();
}

std::string WorkQueue::PopLocked(double* waited_seconds) {
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  if (options_.on_depth) options_.on_depth(queue_.size());
  Clock::time_point now = Clock::now();
  auto it = queued_at_.find(key);
  *waited_seconds = it == queued_at_.end() ? 0.0 : std::chrono::duration<double>(now - it->second).count();
  if (it != queued_at_.end()) queued_at_.erase(it);
  processing_[key] = now;
  dirty_.erase(key);
  return key;
}

void WorkQueue::AddLocked(const std::string& key) {
  if (shutting_down_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (options_.on_add) options_.on_add();
  if (processing_.count(key)) return;  // Done() queues it
  PushLocked(key);
}

void WorkQueue::Add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  if (delay.count() <= 0) {
    AddLocked(key);
    return;
  }
  Clock::time_point due = Clock::now() + delay;
  auto it = waiting_.find(key);
  if (it != waiting_.end() && it->second <= due) return;  // already due sooner
  waiting_[key] = due;
  waiting_heap_.emplace(due, key);
  delay_cv_.notify_one();
}

void WorkQueue::AddRateLimited(const std::string& key) {
  std::chrono::milliseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    delay = std::max(backoff_.Next(key), bucket_.Reserve());
  }
  if (options_.on_retry) options_.on_retry();
  AddAfter(key, delay);
}

void WorkQueue::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  backoff_.Forget(key);
}

int WorkQueue::NumRequeues(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return backoff_.NumRequeues(key);
}

std::optional<std::string> WorkQueue::Get() { return Get(std::chrono::milliseconds::max()); }

std::optional<std::string> WorkQueue::Get(std::chrono::milliseconds timeout) {
  double waited = 0;
  std::string key;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return shutting_down_ || !queue_.empty(); };
    if (timeout == std::chrono::milliseconds::max()) {
      cv_.wait(lock, ready);
    } else if (!cv_.wait_for(lock, timeout, ready)) {
      return std::nullopt;
    }
    if (shutting_down_) return std::nullopt;
    key = PopLocked(&waited);
  }
  if (options_.on_queue_latency) options_.on_queue_latency(waited);
  return key;
}

void WorkQueue::Done(const std::string& key) {
  double held = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = processing_.find(key);
    if (it != processing_.end()) {
      held = std::chrono::duration<double>(Clock::now() - it->second).count();
      processing_.erase(it);
      if (dirty_.count(key) && !shutting_down_) PushLocked(key);  // re-added while processed
    }
  }
  if (held >= 0 && options_.on_work_duration) options_.on_work_duration(held);
}

void WorkQueue::ShutDown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
  }
  cv_.notify_all();
  delay_cv_.notify_all();
}

bool WorkQueue::ShuttingDown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

size_t WorkQueue::Len() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t WorkQueue::NumProcessing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return processing_.size();
}

size_t WorkQueue::NumDelayed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

void WorkQueue::DelayLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    if (waiting_heap_.empty()) {
      delay_cv_.wait(lock);
      continue;
    }
    auto [due, key] = waiting_heap_.top();
    auto it = waiting_.find(key);
    if (it == waiting_.end() || it->second != due) {  // superseded by an earlier AddAfter
      waiting_heap_.pop();
      continue;
    }
    if (Clock::now() < due) {
      delay_cv_.wait_until(lock, due);
      continue;
    }
    waiting_heap_.pop();
    waiting_.erase(it);
    AddLocked(key);
  }
}

}  // namespace meshwork::k8s
