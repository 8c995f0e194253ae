// LeaderElector: client-go's tryAcquireOrRenew / renew / release on a Lease (see the header).
#include "operator/runtime/leader_election.h"

#include <unistd.h>

#include <cmath>
#include <ctime>
#include <iostream>
#include <random>

namespace meshwork::runtime {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

// client-go's wait.JitterUntil factor for the acquire loop.
constexpr double kJitterFactor = 1.2;

std::string RandomHex(int digits) {
  std::random_device rd;
  std::uniform_int_distribution<int> d(0, 15);
  std::string s;
  for (int i = 0; i < digits; ++i) s += "0123456789abcdef"[d(rd)];
  return s;
}

std::string StringField(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t IntField(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

std::string DefaultIdentity() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof(host), "unknown");
  return std::string(host) + "_" + RandomHex(8);
}

std::string FormatMicroTime(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  int64_t frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(frac));
  return buf;
}

Status LeaderElectionOptions::Validate() const {
  if (lease_namespace.empty()) return InvalidConfig("leader election: lease namespace is empty");
  if (lease_name.empty()) return InvalidConfig("leader election: lease name is empty");
  if (retry_period.count() <= 0) return InvalidConfig("leader election: retry_period must be > 0");
  if (renew_deadline.count() <= 0) return InvalidConfig("leader election: renew_deadline must be > 0");
  if (lease_duration <= renew_deadline) {
    return InvalidConfig("leader election: lease_duration (" + std::to_string(lease_duration.count()) +
                         " ms) must be greater than renew_deadline (" + std::to_string(renew_deadline.count()) +
                         " ms)");
  }
  if (static_cast<double>(renew_deadline.count()) <= kJitterFactor * static_cast<double>(retry_period.count())) {
    return InvalidConfig("leader election: renew_deadline (" + std::to_string(renew_deadline.count()) +
                         " ms) must be greater than 1.2 * retry_period (" + std::to_string(retry_period.count()) +
                         " ms)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<LeaderElector>> LeaderElector::Create(k8s::Client* client, LeaderElectionOptions options,
                                                             LeaderElectionCallbacks callbacks) {
  if (client == nullptr) return InvalidConfig("leader election: no client");
  MW_RETURN_IF_ERROR(options.Validate());
  if (options.identity.empty()) options.identity = DefaultIdentity();
  return std::unique_ptr<LeaderElector>(new LeaderElector(client, std::move(options), std::move(callbacks)));
}

LeaderElector::LeaderElector(k8s::Client* client, LeaderElectionOptions options, LeaderElectionCallbacks callbacks)
    : client_(client), options_(std::move(options)), callbacks_(std::move(callbacks)) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::Log(const std::string& line) const {
  const std::string full = "leader election " + options_.lease_namespace + "/" + options_.lease_name + " (" +
                           options_.identity + "): " + line;
  if (options_.log) {
    options_.log(full);
  } else {
    std::cerr << full << "\n";
  }
}

bool LeaderElector::IsLeader() const {
  if (!leader_.load()) return false;
  const auto since = std::chrono::nanoseconds(SteadyNowNs() - last_renew_ns_.load());
  return since < options_.renew_deadline;
}

std::string LeaderElector::ObservedLeader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return StringField(observed_spec_, "holderIdentity");
}

bool LeaderElector::Sleep(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stopping_; });
}

void LeaderElector::SetLeader(bool leading) {
  leader_ = leading;
  if (callbacks_.on_leader_gauge) callbacks_.on_leader_gauge(leading);
}

// client-go: a lease whose record differs from the last one seen restarts the expiry clock.
void LeaderElector::Observe(const json& spec) {
  std::string report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spec != observed_spec_) {
      observed_spec_ = spec;
      observed_time_ = SteadyClock::now();
    }
    const std::string holder = StringField(spec, "holderIdentity");
    if (!holder.empty() && holder != reported_leader_) {
      reported_leader_ = holder;
      report = holder;
    }
  }
  if (!report.empty()) {
    Log("new leader observed: " + report);
    if (callbacks_.on_new_leader) callbacks_.on_new_leader(report);
  }
}

bool LeaderElector::TryAcquireOrRenew() {
  const std::string now = FormatMicroTime(std::chrono::system_clock::now());
  const int64_t duration_s = static_cast<int64_t>(std::ceil(options_.lease_duration.count() / 1000.0));
  json spec = {{"holderIdentity", options_.identity},
               {"leaseDurationSeconds", duration_s},
               {"acquireTime", now},
               {"renewTime", now},
               {"leaseTransitions", 0}};

  auto got = client_->Get(k8s::resources::Leases(), options_.lease_namespace, options_.lease_name);
  if (!got.ok()) {
    if (!k8s::IsNotFound(got.error())) {
      Log("error retrieving the lease: " + got.error().ToString());
      return false;
    }
    json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
                  {"spec", spec}};
    auto created = client_->Create(k8s::resources::Leases(), options_.lease_namespace, lease);
    if (!created.ok()) {
      Log("error creating the lease: " + created.error().ToString());
      return false;
    }
    Observe(created->value("spec", json::object()));
    last_renew_ns_ = SteadyNowNs();
    return true;
  }

  const json old_spec = got->value("spec", json::object());
  Observe(old_spec);
  const std::string holder = StringField(old_spec, "holderIdentity");
  bool held_by_other = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto expiry = observed_time_ + std::chrono::seconds(IntField(old_spec, "leaseDurationSeconds"));
    held_by_other = !holder.empty() && holder != options_.identity && SteadyClock::now() < expiry;
  }
  if (held_by_other) return false;  // held by `holder` and not expired by our clock

  if (holder == options_.identity) {
    if (old_spec.contains("acquireTime")) spec["acquireTime"] = old_spec["acquireTime"];
    spec["leaseTransitions"] = IntField(old_spec, "leaseTransitions");
  } else {
    spec["leaseTransitions"] = IntField(old_spec, "leaseTransitions") + 1;
  }
  json lease = *got;
  lease["spec"] = spec;  // carries metadata.resourceVersion: a concurrent writer makes this 409
  auto updated = client_->Update(k8s::resources::Leases(), options_.lease_namespace, lease);
  if (!updated.ok()) {
    if (!k8s::IsConflict(updated.error())) Log("error updating the lease: " + updated.error().ToString());
    return false;
  }
  Observe(updated->value("spec", json::object()));
  last_renew_ns_ = SteadyNowNs();
  return true;
}

// client-go's ReleaseOnCancel: holder cleared, leaseDurationSeconds 1, transitions kept.
void LeaderElector::Release() {
  auto got = client_->Get(k8s::resources::Leases(), options_.lease_namespace, options_.lease_name);
  if (!got.ok()) {
    Log("cannot release the lease: " + got.error().ToString());
    return;
  }
  const json old_spec = got->value("spec", json::object());
  if (StringField(old_spec, "holderIdentity") != options_.identity) return;  // not ours any more
  const std::string now = FormatMicroTime(std::chrono::system_clock::now());
  json lease = *got;
  lease["spec"] = {{"holderIdentity", ""},
                   {"leaseDurationSeconds", 1},
                   {"acquireTime", now},
                   {"renewTime", now},
                   {"leaseTransitions", IntField(old_spec, "leaseTransitions")}};
  auto updated = client_->Update(k8s::resources::Leases(), options_.lease_namespace, lease);
  if (!updated.ok()) {
    Log("cannot release the lease: " + updated.error().ToString());
    return;
  }
  Observe(updated->value("spec", json::object()));
  Log("released the lease");
}

void LeaderElector::Run() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || running_) return;
    running_ = true;
  }
  RunLoop();
}

// running_ is already true (set by Run or Start).
void LeaderElector::RunLoop() {
  bool stopped = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    run_thread_ = std::this_thread::get_id();
    stopped = stopping_;  // Stop() came between Start() and this thread's start
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.0, kJitterFactor);

  // Campaign: try every retry_period (+ jitter) until the lease is ours.
  bool acquired = false;
  while (!stopped && !acquired) {
    acquired = TryAcquireOrRenew();
    if (acquired) break;
    const auto wait = std::chrono::milliseconds(
        static_cast<int64_t>(options_.retry_period.count() * (1.0 + jitter(rng))));
    if (!Sleep(wait)) break;
  }

  if (acquired) {
    SetLeader(true);
    Log("became leader");
    if (callbacks_.on_started_leading) callbacks_.on_started_leading();

    // Renew every retry_period. Leadership ends when renewals fail for renew_deadline, or at once
    // when the lease is seen held by someone else (client-go waits out renew_deadline then too;
    // there is nothing to wait for once another holder is known).
    auto last_renew = SteadyClock::now();
    bool lost = false;
    while (Sleep(options_.retry_period)) {
      const bool renewed = TryAcquireOrRenew();
      // A renewal that returns after the deadline does not count: IsLeader() has been false
      // since the deadline, and client-go would have cancelled the request by then.
      const bool late = SteadyClock::now() - last_renew >= options_.renew_deadline;
      if (renewed && !late) {
        last_renew = SteadyClock::now();
        continue;
      }
      const std::string holder = ObservedLeader();
      if (!renewed && !holder.empty() && holder != options_.identity) {
        Log("lost the lease to " + holder);
        lost = true;
        break;
      }
      if (late) {
        Log(renewed ? "renewed the lease only after the renew deadline: giving leadership up"
                    : "failed to renew the lease within the renew deadline");
        if (renewed && options_.release_on_cancel) Release();  // we hold it: let a standby in now
        lost = true;
        break;
      }
    }
    if (!lost && options_.release_on_cancel) Release();
    SetLeader(false);
    Log("stopped leading");
    if (callbacks_.on_stopped_leading) callbacks_.on_stopped_leading();
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  cv_.notify_all();
}

void LeaderElector::Start() {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_ || running_) return;
  if (thread_.joinable()) {  // the previous Run() ended (leadership lost): campaign anew
    std::thread done = std::move(thread_);
    lock.unlock();
    done.join();
    lock.lock();
    if (stopping_ || running_ || thread_.joinable()) return;
  }
  running_ = true;  // before the thread exists, so that Stop() waits for it
  thread_ = std::thread([this] { RunLoop(); });
}

void LeaderElector::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  const bool on_run_thread = running_ && run_thread_ == std::this_thread::get_id();
  if (!on_run_thread) cv_.wait(lock, [&] { return !running_; });
  lock.unlock();
  if (!on_run_thread && thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace meshwork::runtime
