// LeaderElectionOptions validation (client-go's rules), identity and MicroTime formatting.
#include <gtest/gtest.h>

#include <regex>

#include "operator/runtime/leader_election.h"

namespace meshwork::runtime {
namespace {

using namespace std::chrono_literals;

TEST(LeaderElectionOptionsTest, DefaultsAreClientGos) {
  LeaderElectionOptions o;
  EXPECT_EQ(o.lease_duration, 15s);
  EXPECT_EQ(o.renew_deadline, 10s);
  EXPECT_EQ(o.retry_period, 2s);
  EXPECT_TRUE(o.release_on_cancel);
  EXPECT_TRUE(o.Validate().ok()) << o.Validate().ToString();
}

TEST(LeaderElectionOptionsTest, InvalidTimingsNameTheOption) {
  struct Case {
    std::chrono::milliseconds lease, renew, retry;
    const char* names;
  };
  for (const Case& c : {Case{10s, 10s, 2s, "lease_duration"}, Case{5s, 10s, 2s, "lease_duration"},
                        Case{15s, 2400ms, 2s, "renew_deadline"}, Case{15s, 10s, 0s, "retry_period"},
                        Case{15s, 0s, 2s, "renew_deadline"}}) {
    LeaderElectionOptions o;
    o.lease_duration = c.lease;
    o.renew_deadline = c.renew;
    o.retry_period = c.retry;
    Status s = o.Validate();
    ASSERT_FALSE(s.ok()) << c.names;
    EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
    EXPECT_NE(s.message().find(c.names), std::string::npos) << s.message();
  }
  LeaderElectionOptions o;
  o.lease_name = "";
  EXPECT_NE(o.Validate().message().find("lease name"), std::string::npos);
}

TEST(LeaderElectionOptionsTest, CreateRefusesInvalidOptionsAndNoClient) {
  EXPECT_EQ(LeaderElector::Create(nullptr, LeaderElectionOptions{}, {}).status().code(), StatusCode::kInvalidConfig);
  k8s::Config cfg;
  cfg.server = "http://127.0.0.1:1";  // never contacted
  auto client = k8s::Client::FromConfig(cfg);
  ASSERT_TRUE(client.ok()) << client.error().ToString();
  LeaderElectionOptions o;
  o.renew_deadline = o.lease_duration;
  auto e = LeaderElector::Create(client->get(), o, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("renew_deadline"), std::string::npos) << e.status().message();
  o = LeaderElectionOptions{};
  auto ok = LeaderElector::Create(client->get(), o, {});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_FALSE((*ok)->identity().empty());  // DefaultIdentity()
  EXPECT_FALSE((*ok)->IsLeader());
}

TEST(LeaderElectionOptionsTest, DefaultIdentityIsHostnameAndRandomSuffix) {
  const std::string a = DefaultIdentity(), b = DefaultIdentity();
  EXPECT_TRUE(std::regex_match(a, std::regex(R"(.+_[0-9a-f]{8})"))) << a;
  EXPECT_NE(a, b);
}

TEST(LeaderElectionOptionsTest, MicroTimeIsRfc3339WithMicroseconds) {
  const auto t = std::chrono::system_clock::time_point(std::chrono::microseconds(1136214245000123LL));
  EXPECT_EQ(FormatMicroTime(t), "2006-01-02T15:04:05.000123Z");
  EXPECT_EQ(FormatMicroTime(std::chrono::system_clock::time_point{}), "1970-01-01T00:00:00.000000Z");
}

}  // namespace
}  // namespace meshwork::runtime
