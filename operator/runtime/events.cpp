// EventRecorder: a queue, one sending thread, and an LRU of sent events for aggregation.
#include "operator/runtime/events.h"

#include <unistd.h>

#include <ctime>
#include <iostream>

namespace meshwork::runtime {
namespace {

using nlohmann::json;

// metav1.Time: RFC 3339, seconds, UTC.
std::string FormatTime(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string Hostname() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown";
  return host;
}

std::string EventNamespace(const ObjectReference& o) { return o.ns.empty() ? "default" : o.ns; }

// Identical events share this key (client-go's EventLogger key, without the source host).
std::string AggregationKey(const ObjectReference& o, EventType type, const std::string& reason,
                           const std::string& message) {
  const char sep = '\x1f';
  std::string k;
  for (const std::string* part : {&o.api_version, &o.kind, &o.ns, &o.name, &o.uid}) {
    k += *part;
    k += sep;
  }
  k += EventTypeName(type);
  k += sep;
  k += reason;
  k += sep;
  k += message;
  return k;
}

}  // namespace

const char* EventTypeName(EventType t) { return t == EventType::kWarning ? "Warning" : "Normal"; }

ObjectReference ReferenceTo(const json& obj) {
  ObjectReference r;
  auto str = [](const json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!obj.is_object()) return r;
  r.api_version = str(obj, "apiVersion");
  r.kind = str(obj, "kind");
  auto md = obj.find("metadata");
  if (md != obj.end() && md->is_object()) {
    r.ns = str(*md, "namespace");
    r.name = str(*md, "name");
    r.uid = str(*md, "uid");
    r.resource_version = str(*md, "resourceVersion");
  }
  return r;
}

EventRecorder::EventRecorder(k8s::Client* client, EventRecorderOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.instance.empty()) options_.instance = Hostname();
  if (options_.cache_size == 0) options_.cache_size = 1;
  thread_ = std::thread([this] { Loop(); });
}

EventRecorder::~EventRecorder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    drain_deadline_ = std::chrono::steady_clock::now() + options_.flush_timeout;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EventRecorder::Log(const std::string& line) const {
  const std::string full = "events: " + line;
  if (options_.log) {
    options_.log(full);
  } else {
    std::cerr << full << "\n";
  }
}

void EventRecorder::Record(const ObjectReference& object, EventType type, const std::string& reason,
                           const std::string& message) noexcept {
  try {
    Pending p{object, type, reason, message, std::chrono::system_clock::now()};
    bool dropped = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || queue_.size() >= options_.queue_size) {
        dropped = true;
      } else {
        queue_.push_back(std::move(p));
      }
    }
    if (dropped) {
      // Log the first drop and then every 100th, so a flood does not flood the log too.
      if (dropped_.fetch_add(1) % 100 == 0) {
        Log("queue full (" + std::to_string(options_.queue_size) + "), dropping event " + reason + " for " +
            object.kind + " " + object.ns + "/" + object.name + " (" + std::to_string(dropped_.load()) +
            " dropped so far)");
      }
      return;
    }
    cv_.notify_one();
  } catch (...) {
    dropped_++;  // out of memory: nothing sensible to do but not fail the caller
  }
}

bool EventRecorder::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !in_flight_; });
}

void EventRecorder::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, nothing left
    if (stopping_ && std::chrono::steady_clock::now() >= drain_deadline_) {
      const size_t left = queue_.size();
      dropped_ += static_cast<int64_t>(left);
      queue_.clear();
      lock.unlock();
      Log("shutting down: dropping " + std::to_string(left) + " unsent event(s)");
      lock.lock();
      break;
    }
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    in_flight_ = true;
    lock.unlock();
    try {
      Send(p);
    } catch (const std::exception& e) {
      failed_++;
      Log(std::string("sending an event failed: ") + e.what());
    }
    lock.lock();
    in_flight_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  in_flight_ = false;
  idle_cv_.notify_all();
}

void EventRecorder::Remember(Sent s) {
  auto it = by_key_.find(s.key);
  if (it != by_key_.end()) {
    lru_.erase(it->second);
    by_key_.erase(it);
  }
  lru_.push_front(std::move(s));
  by_key_[lru_.front().key] = lru_.begin();
  while (lru_.size() > options_.cache_size) {
    by_key_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

bool EventRecorder::Create(const Pending& p, const std::string& key) {
  const std::string ns = EventNamespace(p.object);
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(p.when.time_since_epoch()).count();
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), ".%llx", static_cast<unsigned long long>(nanos));
  const std::string name = p.object.name + suffix;  // client-go's "<object>.<unix nanos in hex>"
  const std::string ts = FormatTime(p.when);
  json involved = {{"kind", p.object.kind}, {"name", p.object.name}};
  if (!p.object.ns.empty()) involved["namespace"] = p.object.ns;
  if (!p.object.uid.empty()) involved["uid"] = p.object.uid;
  if (!p.object.api_version.empty()) involved["apiVersion"] = p.object.api_version;
  if (!p.object.resource_version.empty()) involved["resourceVersion"] = p.object.resource_version;
  json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"name", name}, {"namespace", ns}}},
                {"involvedObject", involved},
                {"type", EventTypeName(p.type)},
                {"reason", p.reason},
                {"message", p.message},
                {"source", {{"component", options_.component}, {"host", options_.instance}}},
                {"reportingComponent", options_.component},
                {"reportingInstance", options_.instance},
                {"firstTimestamp", ts},
                {"lastTimestamp", ts},
                {"count", 1}};
  auto created = client_->Create(k8s::resources::Events(), ns, event);
  if (!created.ok()) {
    failed_++;
    Log("cannot create event " + p.reason + " for " + p.object.kind + " " + ns + "/" + p.object.name + ": " +
        created.error().ToString());
    return false;
  }
  sent_++;
  Remember(Sent{key, ns, name, 1, p.when});
  return true;
}

void EventRecorder::Send(const Pending& p) {
  const std::string key = AggregationKey(p.object, p.type, p.reason, p.message);
  auto it = by_key_.find(key);
  if (it == by_key_.end() || p.when - it->second->last > options_.aggregation_window) {
    Create(p, key);
    return;
  }
  Sent s = *it->second;
  const json patch = {{"count", s.count + 1}, {"lastTimestamp", FormatTime(p.when)}};
  auto patched = client_->MergePatch(k8s::resources::Events(), s.ns, s.name, patch);
  if (!patched.ok()) {
    if (k8s::IsNotFound(patched.error())) {  // expired or deleted meanwhile: start a new one
      Create(p, key);
      return;
    }
    failed_++;
    Log("cannot update event " + s.ns + "/" + s.name + ": " + patched.error().ToString());
    return;
  }
  sent_++;
  s.count += 1;
  s.last = p.when;
  Remember(std::move(s));
}

}  // namespace meshwork::runtime
