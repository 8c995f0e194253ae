// Leader election on a coordination.k8s.io/v1 Lease with client-go's semantics, so that of
// several operator replicas exactly one reconciles. See docs/operator-runtime.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "operator/k8s/client.h"
#include "common/status.h"

namespace meshwork::runtime {

struct LeaderElectionCallbacks {
  // This replica now holds the lease. Runs on the elector's thread: start work elsewhere and
  // return (the lease is not renewed while it runs).
  std::function<void()> on_started_leading;
  // This replica held the lease and no longer does: renewal failed for renew_deadline, another
  // holder was observed, or Stop() was called. The operator must stop reconciling (or exit).
  std::function<void()> on_stopped_leading;
  // The lease's holder changed to `identity` (ours included); not called for an empty holder.
  std::function<void(const std::string& identity)> on_new_leader;
  // Metric hook: true on becoming leader, false on losing it. Called before the callbacks above.
  std::function<void(bool is_leader)> on_leader_gauge;
};

struct LeaderElectionOptions {
  std::string lease_namespace = "default";
  std::string lease_name = "meshwork-operator";
  std::string identity;  // "" = DefaultIdentity(): hostname + "_" + random
  // How long a non-leader waits after the lease last changed (by its own clock) before taking
  // it. Written to spec.leaseDurationSeconds rounded up to whole seconds.
  std::chrono::milliseconds lease_duration{15000};
  // How long the leader keeps retrying a failed renewal before it gives leadership up.
  std::chrono::milliseconds renew_deadline{10000};
  // Pause between tries (acquire: plus up to 1.2x jitter, as client-go's JitterUntil).
  std::chrono::milliseconds retry_period{2000};
  // On Stop(), hand the lease back (leaseDurationSeconds 1, holder cleared) so a standby takes
  // over within one retry period instead of waiting out the lease.
  bool release_on_cancel = true;
  // Where failures and transitions are logged (one line each); nullptr = std::cerr.
  std::function<void(const std::string&)> log;

  // lease_duration > renew_deadline > 1.2 * retry_period > 0, names non-empty (client-go's
  // checks); InvalidConfig naming the option otherwise.
  Status Validate() const;
};

// hostname + "_" + 8 random hex digits.
std::string DefaultIdentity();
// RFC 3339 with microseconds, UTC: "2006-01-02T15:04:05.000000Z" (metav1.MicroTime).
std::string FormatMicroTime(std::chrono::system_clock::time_point t);

class LeaderElector {
 public:
  // `client` must outlive the elector; its request_timeout should be well below renew_deadline
  // (a renewal stuck in a request cannot be abandoned). Validates `options` (InvalidConfig).
  static Result<std::unique_ptr<LeaderElector>> Create(k8s::Client* client, LeaderElectionOptions options,
                                                       LeaderElectionCallbacks callbacks);
  ~LeaderElector();  // Stop()
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Campaigns until this replica leads, then renews until leadership is lost or Stop() is
  // called; returns then (client-go's Run). May be called again after a loss to campaign anew,
  // unless Stop() was called.
  void Run();
  // Run() on a thread of the elector's own (again, after a loss ended the previous Run()).
  void Start();
  // Ends Run() promptly; if leading and release_on_cancel, releases the lease first. Joins the
  // thread Start() made (unless called from a callback on that thread). Idempotent.
  void Stop();

  // True while this replica leads and its last successful renewal is less than renew_deadline
  // old by our clock: a renewal stuck in a slow request turns it false before the lease can
  // expire for the others, even though on_stopped_leading comes only when the attempt returns.
  // Check it before writes that only the leader may make.
  bool IsLeader() const;
  const std::string& identity() const { return options_.identity; }
  // The holder last observed in the lease ("" if none or not yet read).
  std::string ObservedLeader() const;

 private:
  LeaderElector(k8s::Client* client, LeaderElectionOptions options, LeaderElectionCallbacks callbacks);
  void RunLoop();
  bool TryAcquireOrRenew();
  void Release();
  void Observe(const nlohmann::json& spec);
  void SetLeader(bool leading);
  // Sleeps `d` unless Stop() comes first; false when stopped.
  bool Sleep(std::chrono::milliseconds d);
  void Log(const std::string& line) const;

  k8s::Client* client_;
  LeaderElectionOptions options_;
  LeaderElectionCallbacks callbacks_;
  std::atomic<bool> leader_{false};
  std::atomic<int64_t> last_renew_ns_{0};  // steady clock, of the last successful acquire/renew

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool running_ = false;           // Run() is between its start and its return
  std::thread::id run_thread_;     // the thread in Run(), so Stop() from a callback does not wait on itself
  // What we last read or wrote, and when by our steady clock (client-go's observedRecord and
  // observedTime): the lease is expired once it has not changed for its leaseDurationSeconds.
  nlohmann::json observed_spec_;
  std::chrono::steady_clock::time_point observed_time_{};
  std::string reported_leader_;
  std::thread thread_;
};

}  // namespace meshwork::runtime
