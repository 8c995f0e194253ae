// A container's requests as the node agent reads them to hand out GPUs: limits stand in for
// absent requests, a request wins over its limit, and errors name the field and the value.
#include <gtest/gtest.h>

#include "controlplane/agent/internal.h"
#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

json Container(json requests, json limits = json::object()) {
  return {{"name", "c"}, {"resources", {{"requests", std::move(requests)}, {"limits", std::move(limits)}}}};
}

TEST(ContainerRequests, LimitsStandInForAbsentRequestsAndRequestsWin) {
  auto r = internal::ContainerRequests(Container({{"cpu", "500m"}}, {{"cpu", "3"}, {"memory", "1Gi"}, {"nvidia.com/gpu", 2}}),
                                       "spec.containers[0]");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->cpu, 0.5);
  EXPECT_EQ(r->memory_bytes, 1LL << 30);
  EXPECT_EQ(r->extended.at("nvidia.com/gpu"), 2);
  auto none = internal::ContainerRequests(json{{"name", "c"}}, "spec.containers[0]");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->extended.empty());
}

TEST(ContainerRequests, ErrorsNameTheFieldAndTheValue) {
  auto bad = internal::ContainerRequests(Container({{"cpu", "lots"}}), "spec.containers[1]");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("spec.containers[1].resources.requests.cpu"), std::string::npos);
  EXPECT_NE(bad.status().message().find("\"lots\""), std::string::npos);
  auto half = internal::ContainerRequests(Container({{"nvidia.com/gpu", "0.5"}}), "spec.containers[0]");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("must be a whole number for an extended resource"), std::string::npos);
  EXPECT_FALSE(internal::ContainerRequests(json("x"), "spec.containers[0]").ok());
}

}  // namespace
}  // namespace meshwork::controlplane::agent
