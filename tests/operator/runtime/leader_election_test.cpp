// LeaderElector against the real control plane: one leader of two, takeover after a crash only
// once the lease has run out, prompt takeover after a graceful release, leaseTransitions, and a
// leader that steps down when someone else overwrites its lease.
#include "operator/runtime/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <regex>
#include <vector>

#include "tests/operator/local_cluster.h"

namespace meshwork::runtime {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using meshwork::testing::LocalClusterTest;
using meshwork::testing::Eventually;
using SteadyClock = std::chrono::steady_clock;

// Short timings so the tests take seconds (the lease is written as 3 s), with room for a loaded
// machine: a renewal may take a second before the leader gives up.
constexpr auto kLease = 3000ms;
constexpr auto kRenewDeadline = 2000ms;
constexpr auto kRetry = 200ms;

// One replica: its own client (as separate processes would have) and what its callbacks saw.
struct Candidate {
  std::unique_ptr<k8s::Client> client;
  std::unique_ptr<LeaderElector> elector;
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::atomic<int> gauge{-1};
  std::mutex mu;
  std::vector<std::string> new_leaders;
  std::vector<std::string> log;

  std::string Logs() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out;
    for (const auto& l : log) out += "\n  " + l;
    return out;
  }

  std::vector<std::string> NewLeaders() {
    std::lock_guard<std::mutex> lock(mu);
    return new_leaders;
  }
};

// Each test has its own namespace, and so its own Lease, on the binary's shared cluster.
class LeaderElectionTest : public LocalClusterTest {
 protected:
  void SetUp() override {
    LocalClusterTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    EnsureNamespace(ns_);
  }

  std::unique_ptr<Candidate> MakeCandidate(const std::string& identity, bool release_on_cancel,
                                           std::chrono::milliseconds lease = kLease,
                                           std::chrono::milliseconds request_timeout = 1000ms) {
    auto c = std::make_unique<Candidate>();
    c->client = NewClient(request_timeout);  // by default well inside the renew deadline
    LeaderElectionOptions o;
    o.lease_namespace = ns_;
    o.lease_name = "meshwork-operator-test";
    o.identity = identity;
    o.lease_duration = lease;
    o.renew_deadline = kRenewDeadline;
    o.retry_period = kRetry;
    o.release_on_cancel = release_on_cancel;
    Candidate* raw = c.get();
    o.log = [raw](const std::string& line) {
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->log.push_back(line);
    };
    LeaderElectionCallbacks cb;
    cb.on_started_leading = [raw] { raw->started++; };
    cb.on_stopped_leading = [raw] { raw->stopped++; };
    cb.on_new_leader = [raw](const std::string& id) {
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->new_leaders.push_back(id);
    };
    cb.on_leader_gauge = [raw](bool leading) { raw->gauge = leading ? 1 : 0; };
    auto e = LeaderElector::Create(c->client.get(), o, cb);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (e.ok()) c->elector = std::move(e).value();
    return c;
  }

  json Lease() {
    auto got = client_->Get(k8s::resources::Leases(), ns_, "meshwork-operator-test");
    EXPECT_TRUE(got.ok()) << got.error().ToString();
    return got.ok() ? got->value("spec", json::object()) : json::object();
  }

  // Starts both and waits for one to lead; returns {leader, standby}.
  std::pair<Candidate*, Candidate*> ElectOne(Candidate* a, Candidate* b) {
    a->elector->Start();
    b->elector->Start();
    EXPECT_TRUE(Eventually([&] { return a->elector->IsLeader() || b->elector->IsLeader(); }, 10s));
    return a->elector->IsLeader() ? std::make_pair(a, b) : std::make_pair(b, a);
  }
};

TEST_F(LeaderElectionTest, ExactlyOneOfTwoLeadsAndTheLeaseSaysWho) {
  auto a = MakeCandidate("replica-a", true);
  auto b = MakeCandidate("replica-b", true);
  ASSERT_TRUE(a->elector && b->elector);
  auto [leader, standby] = ElectOne(a.get(), b.get());
  ASSERT_TRUE(leader->elector->IsLeader());

  // For several lease durations: never both, never neither, no change of leader.
  const auto until = SteadyClock::now() + 2 * kLease;
  while (SteadyClock::now() < until) {
    ASSERT_TRUE(leader->elector->IsLeader()) << leader->Logs();
    ASSERT_FALSE(standby->elector->IsLeader()) << standby->Logs();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(leader->started.load(), 1);
  EXPECT_EQ(standby->started.load(), 0);
  EXPECT_EQ(leader->gauge.load(), 1);
  EXPECT_EQ(standby->gauge.load(), -1);  // never led: the hook was not called
  EXPECT_EQ(standby->elector->ObservedLeader(), leader->elector->identity());
  ASSERT_FALSE(standby->NewLeaders().empty());
  EXPECT_EQ(standby->NewLeaders().back(), leader->elector->identity());

  const json spec = Lease();
  EXPECT_EQ(spec.value("holderIdentity", ""), leader->elector->identity());
  EXPECT_EQ(spec.value("leaseDurationSeconds", 0), 3);
  EXPECT_EQ(spec.value("leaseTransitions", -1), 0);
  const std::regex micro(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  EXPECT_TRUE(std::regex_match(spec.value("acquireTime", ""), micro)) << spec.dump();
  EXPECT_TRUE(std::regex_match(spec.value("renewTime", ""), micro)) << spec.dump();
  EXPECT_GT(spec.value("renewTime", ""), spec.value("acquireTime", ""));  // renewed since
  a->elector->Stop();
  b->elector->Stop();
}

// A crash (simulated: stop renewing without releasing) leaves the lease held; the standby must
// wait until it has not changed for the lease duration by its own clock, and no longer.
TEST_F(LeaderElectionTest, CrashedLeaderIsReplacedAfterTheLeaseDurationNotBefore) {
  auto a = MakeCandidate("replica-a", false);
  auto b = MakeCandidate("replica-b", false);
  ASSERT_TRUE(a->elector && b->elector);
  auto [leader, standby] = ElectOne(a.get(), b.get());
  ASSERT_TRUE(leader->elector->IsLeader());
  std::this_thread::sleep_for(500ms);  // a few renewals observed by the standby

  const auto crashed = SteadyClock::now();
  leader->elector->Stop();  // no release: the lease still names the old leader
  EXPECT_EQ(Lease().value("holderIdentity", ""), leader->elector->identity());
  ASSERT_TRUE(Eventually([&] { return standby->elector->IsLeader(); }, kLease + 5s));
  const auto took = SteadyClock::now() - crashed;

  // The last renewal was written at most one retry period (plus a request's latency) before the
  // crash, and the standby saw it no earlier than it was written: it may take over from about
  // lease - retry after the crash on, and must not before.
  EXPECT_GE(took, kLease - kRetry - 300ms) << std::chrono::duration<double>(took).count() << " s";
  EXPECT_LE(took, kLease + 3s) << std::chrono::duration<double>(took).count() << " s";
  const json spec = Lease();
  EXPECT_EQ(spec.value("holderIdentity", ""), standby->elector->identity());
  EXPECT_EQ(spec.value("leaseTransitions", -1), 1);
  EXPECT_EQ(standby->started.load(), 1);
  standby->elector->Stop();
}

// ReleaseOnCancel: the lease is handed back (holder cleared, 1 s), so the standby takes over
// within about one retry period although the lease duration is long.
TEST_F(LeaderElectionTest, GracefulStopReleasesAndTheStandbyTakesOverAtOnce) {
  constexpr auto kLongLease = 10000ms;
  auto a = MakeCandidate("replica-a", true, kLongLease);
  auto b = MakeCandidate("replica-b", true, kLongLease);
  ASSERT_TRUE(a->elector && b->elector);
  auto [leader, standby] = ElectOne(a.get(), b.get());
  ASSERT_TRUE(leader->elector->IsLeader());
  std::this_thread::sleep_for(300ms);

  const auto stopping = SteadyClock::now();
  leader->elector->Stop();
  EXPECT_FALSE(leader->elector->IsLeader());
  EXPECT_EQ(leader->stopped.load(), 1);
  EXPECT_EQ(leader->gauge.load(), 0);
  ASSERT_TRUE(Eventually([&] { return standby->elector->IsLeader(); }, kLongLease));
  const auto took = SteadyClock::now() - stopping;
  // Acquire tries come every retry period plus up to 1.2x jitter: 440 ms at most, plus requests.
  EXPECT_LE(took, 2000ms) << std::chrono::duration<double>(took).count() << " s";

  const json spec = Lease();
  EXPECT_EQ(spec.value("holderIdentity", ""), standby->elector->identity());
  EXPECT_EQ(spec.value("leaseDurationSeconds", 0), 10);
  EXPECT_EQ(spec.value("leaseTransitions", -1), 1);

  // And back: the second handover counts again.
  leader->elector = nullptr;  // a stopped elector does not campaign again: a new process would
  auto again = MakeCandidate(leader == a.get() ? "replica-a" : "replica-b", true, kLongLease);
  again->elector->Start();
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(again->elector->IsLeader());  // the lease is held and fresh
  standby->elector->Stop();
  ASSERT_TRUE(Eventually([&] { return again->elector->IsLeader(); }, kLongLease));
  EXPECT_EQ(Lease().value("leaseTransitions", -1), 2);
  again->elector->Stop();
}

// Someone else writes the lease (another elector with a skewed view, an admin): the leader sees a
// different holder on its next renewal and stops leading instead of fighting over the lease.
TEST_F(LeaderElectionTest, LeaderThatFindsTheLeaseOverwrittenStepsDown) {
  auto a = MakeCandidate("replica-a", true);
  ASSERT_TRUE(a->elector);
  a->elector->Start();
  ASSERT_TRUE(Eventually([&] { return a->elector->IsLeader(); }, 10s));

  bool written = false;
  for (int i = 0; i < 20 && !written; ++i) {  // a renewal may race us: retry on 409
    auto got = client_->Get(k8s::resources::Leases(), ns_, "meshwork-operator-test");
    ASSERT_TRUE(got.ok()) << got.error().ToString();
    json lease = *got;
    lease["spec"]["holderIdentity"] = "intruder";
    lease["spec"]["leaseDurationSeconds"] = 30;
    lease["spec"]["renewTime"] = FormatMicroTime(std::chrono::system_clock::now());
    auto upd = client_->Update(k8s::resources::Leases(), ns_, lease);
    written = upd.ok();
    if (!written) {
      ASSERT_TRUE(k8s::IsConflict(upd.error())) << upd.error().ToString();
    }
  }
  ASSERT_TRUE(written);

  const auto overwritten = SteadyClock::now();
  ASSERT_TRUE(Eventually([&] { return a->stopped.load() == 1; }, 5s));
  EXPECT_LE(SteadyClock::now() - overwritten, kRenewDeadline + 1s);
  EXPECT_FALSE(a->elector->IsLeader());
  EXPECT_EQ(a->gauge.load(), 0);
  EXPECT_EQ(a->NewLeaders().back(), "intruder");
  // It gave up without writing: the intruder keeps the lease (no release of a lease not ours).
  std::this_thread::sleep_for(3 * kRetry);
  EXPECT_EQ(Lease().value("holderIdentity", ""), "intruder");
  a->elector->Stop();
  EXPECT_EQ(Lease().value("holderIdentity", ""), "intruder");
}

// Overwrites the lease with another holder; retries when a renewal races the write.
void Overwrite(k8s::Client* client, const std::string& ns, const std::string& holder, int duration_s) {
  for (int i = 0; i < 20; ++i) {
    auto got = client->Get(k8s::resources::Leases(), ns, "meshwork-operator-test");
    ASSERT_TRUE(got.ok()) << got.error().ToString();
    json lease = *got;
    lease["spec"]["holderIdentity"] = holder;
    lease["spec"]["leaseDurationSeconds"] = duration_s;
    lease["spec"]["renewTime"] = FormatMicroTime(std::chrono::system_clock::now());
    auto upd = client->Update(k8s::resources::Leases(), ns, lease);
    if (upd.ok()) return;
    ASSERT_TRUE(k8s::IsConflict(upd.error())) << upd.error().ToString();
  }
  FAIL() << "could not overwrite the lease in 20 tries";
}

// After a loss Run() returns; Start() again campaigns anew and, once the other holder's lease
// has run out by our clock, leads again (one more transition).
TEST_F(LeaderElectionTest, ElectorCanCampaignAgainAfterALoss) {
  auto a = MakeCandidate("replica-a", true);
  ASSERT_TRUE(a->elector);
  a->elector->Start();
  ASSERT_TRUE(Eventually([&] { return a->elector->IsLeader(); }, 10s));
  Overwrite(client_.get(), ns_, "intruder", 1);
  const auto overwritten = SteadyClock::now();
  ASSERT_TRUE(Eventually([&] { return a->stopped.load() == 1; }, 5s));

  a->elector->Start();
  ASSERT_TRUE(Eventually([&] { return a->elector->IsLeader(); }, 10s));
  // The intruder's 1 s lease ran out (counted from when A saw it, after it was written) first.
  EXPECT_GE(SteadyClock::now() - overwritten, 1000ms - 300ms);
  EXPECT_EQ(a->started.load(), 2);
  const json spec = Lease();
  EXPECT_EQ(spec.value("holderIdentity", ""), "replica-a");
  EXPECT_EQ(spec.value("leaseTransitions", -1), 1);
  a->elector->Stop();
  EXPECT_EQ(a->stopped.load(), 2);
}

// A renewal stuck in a request longer than the renew deadline (the API server is frozen):
// IsLeader() turns false once the deadline has passed since the last renewal, before the
// request gives up and on_stopped_leading runs, and so before a standby could take over.
TEST_F(LeaderElectionTest, IsLeaderTurnsFalseWhenRenewalsStallPastTheDeadline) {
  auto a = MakeCandidate("replica-a", false, kLease, 6000ms);
  ASSERT_TRUE(a->elector);
  a->elector->Start();
  ASSERT_TRUE(Eventually([&] { return a->elector->IsLeader(); }, 10s));
  std::this_thread::sleep_for(300ms);

  cluster_->SignalApiServer(SIGSTOP);
  const auto frozen = SteadyClock::now();
  ASSERT_TRUE(Eventually([&] { return !a->elector->IsLeader(); }, 10s));
  const auto noticed = SteadyClock::now() - frozen;
  EXPECT_LE(noticed, kRenewDeadline + 300ms) << std::chrono::duration<double>(noticed).count() << " s";
  EXPECT_EQ(a->stopped.load(), 0);  // the stuck request has not returned yet
  cluster_->SignalApiServer(SIGCONT);
  ASSERT_TRUE(Eventually([&] { return a->stopped.load() == 1; }, 15s));
  a->elector->Stop();
}

}  // namespace
}  // namespace meshwork::runtime
