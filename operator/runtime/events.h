// Kubernetes Events (core/v1) about the objects the operator manages, as client-go's
// EventRecorder writes them: asynchronous, never failing the caller, and with repeats of the same
// event aggregated into one object whose count grows. See docs/operator-runtime.md ("Events").
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "operator/k8s/client.h"

namespace meshwork::runtime {

enum class EventType { kNormal, kWarning };
const char* EventTypeName(EventType t);  // "Normal", "Warning"

// What an Event is about (its involvedObject).
struct ObjectReference {
  std::string api_version;  // "meshwork.dev/v1alpha1"
  std::string kind;         // "TrainingJob"
  std::string ns;           // "" for a cluster-scoped object (the Event then goes to "default")
  std::string name;
  std::string uid;
  std::string resource_version;
};
// The reference to an object as the API server returned it (apiVersion, kind, metadata).
ObjectReference ReferenceTo(const nlohmann::json& obj);

struct EventRecorderOptions {
  std::string component = "meshwork-operator";  // source.component and reportingComponent
  std::string instance;                         // source.host and reportingInstance; "" = hostname
  // A repeat of an event (same object, type, reason and message) within this time of its last
  // occurrence patches that Event's count and lastTimestamp; later, a new Event is created.
  std::chrono::milliseconds aggregation_window{10 * 60 * 1000};
  size_t cache_size = 4096;                   // events remembered for aggregation (LRU)
  size_t queue_size = 1000;                   // events waiting to be sent; more are dropped
  std::chrono::milliseconds flush_timeout{5000};  // the destructor sends for at most this long
  // Where failures are logged (one line each); nullptr = std::cerr.
  std::function<void(const std::string&)> log;
};

class EventRecorder {
 public:
  // `client` must outlive the recorder. Starts the sending thread.
  explicit EventRecorder(k8s::Client* client, EventRecorderOptions options = {});
  // Sends what is queued for at most flush_timeout (plus the request in flight, bounded by the
  // client's request_timeout); what is left is dropped and logged.
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues the event and returns at once. Never throws; a full queue drops the event (logged),
  // and API errors are logged by the sending thread.
  void Record(const ObjectReference& object, EventType type, const std::string& reason,
              const std::string& message) noexcept;
  void Normal(const ObjectReference& object, const std::string& reason, const std::string& message) noexcept {
    Record(object, EventType::kNormal, reason, message);
  }
  void Warning(const ObjectReference& object, const std::string& reason, const std::string& message) noexcept {
    Record(object, EventType::kWarning, reason, message);
  }

  // Waits until everything recorded so far has been sent (or has failed); false on timeout.
  bool Flush(std::chrono::milliseconds timeout);

  int64_t NumSent() const { return sent_.load(); }        // creates and patches that succeeded
  int64_t NumFailed() const { return failed_.load(); }    // API errors
  int64_t NumDropped() const { return dropped_.load(); }  // queue full, or left at destruction

 private:
  struct Pending {
    ObjectReference object;
    EventType type;
    std::string reason;
    std::string message;
    std::chrono::system_clock::time_point when;
  };
  // An Event already in the API, for aggregation.
  struct Sent {
    std::string key;
    std::string ns;
    std::string name;
    int64_t count = 1;
    std::chrono::system_clock::time_point last;
  };

  void Loop();
  void Send(const Pending& p);
  bool Create(const Pending& p, const std::string& key);
  void Remember(Sent s);
  void Log(const std::string& line) const;

  k8s::Client* client_;
  EventRecorderOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;       // the sender: work or stop
  std::condition_variable idle_cv_;  // Flush(): nothing queued or in flight
  std::deque<Pending> queue_;
  bool in_flight_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point drain_deadline_{};

  // LRU of sent events; touched only by the sending thread.
  std::list<Sent> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Sent>::iterator> by_key_;

  std::atomic<int64_t> sent_{0}, failed_{0}, dropped_{0};
  std::thread thread_;  // last: started after everything it reads exists
};

}  // namespace meshwork::runtime
