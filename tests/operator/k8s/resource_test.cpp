// REST paths and query strings for every kind of resource the operator addresses.
#include "operator/k8s/resource.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace meshwork::k8s {
namespace {

using ::testing::HasSubstr;

struct PathCase {
  ResourceRef ref;
  std::string ns, name, sub, want;
};

TEST(ResourcePathTest, EveryKindAndScope) {
  const PathCase cases[] = {
      {resources::Pods(), "ns1", "p", "", "/api/v1/namespaces/ns1/pods/p"},
      {resources::Pods(), "ns1", "", "", "/api/v1/namespaces/ns1/pods"},
      {resources::Pods(), "", "", "", "/api/v1/pods"},
      {resources::Pods(), "ns1", "p", "log", "/api/v1/namespaces/ns1/pods/p/log"},
      {resources::Pods(), "ns1", "p", "status", "/api/v1/namespaces/ns1/pods/p/status"},
      {resources::Services(), "ns1", "svc", "", "/api/v1/namespaces/ns1/services/svc"},
      {resources::ConfigMaps(), "ns1", "cm", "", "/api/v1/namespaces/ns1/configmaps/cm"},
      {resources::Events(), "ns1", "", "", "/api/v1/namespaces/ns1/events"},
      {resources::Namespaces(), "", "team", "", "/api/v1/namespaces/team"},
      {resources::Namespaces(), "", "", "", "/api/v1/namespaces"},
      {resources::Leases(), "kube-system", "op", "", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/op"},
      {resources::CustomResourceDefinitions(), "", "trainingjobs.meshwork.dev", "",
       "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.meshwork.dev"},
      {resources::Custom("meshwork.dev", "v1alpha1", "trainingjobs"), "ns1", "j", "status",
       "/apis/meshwork.dev/v1alpha1/namespaces/ns1/trainingjobs/j/status"},
      {resources::Custom("meshwork.dev", "v1alpha1", "trainingjobs"), "", "", "",
       "/apis/meshwork.dev/v1alpha1/trainingjobs"},
      {resources::Custom("example.com", "v1", "clusterthings", false), "", "x", "",
       "/apis/example.com/v1/clusterthings/x"},
  };
  for (const auto& c : cases) {
    auto p = ResourcePath(c.ref, c.ns, c.name, c.sub);
    ASSERT_TRUE(p.ok()) << c.want << ": " << p.error().ToString();
    EXPECT_EQ(*p, c.want);
  }
}

TEST(ResourcePathTest, BadAddressesAreRefusedNamingTheValue) {
  auto no_ns = ResourcePath(resources::Pods(), "", "p");
  ASSERT_FALSE(no_ns.ok());
  EXPECT_THAT(no_ns.error().message(), HasSubstr("namespace is required"));
  auto ns_on_cluster = ResourcePath(resources::Namespaces(), "x", "y");
  ASSERT_FALSE(ns_on_cluster.ok());
  EXPECT_THAT(ns_on_cluster.error().message(), HasSubstr("cluster-scoped"));
  auto slash = ResourcePath(resources::Pods(), "ns", "a/b");
  ASSERT_FALSE(slash.ok());
  EXPECT_THAT(slash.error().message(), HasSubstr("\"a/b\""));
  EXPECT_FALSE(ResourcePath(resources::Pods(), "..", "p").ok());
  EXPECT_FALSE(ResourcePath(resources::Pods(), "ns", "", "status").ok());
  EXPECT_FALSE(ResourcePath(ResourceRef{"", "v1", "", true}, "ns").ok());
}

TEST(ResourceRefTest, ApiVersion) {
  EXPECT_EQ(resources::Pods().ApiVersion(), "v1");
  EXPECT_EQ(resources::Leases().ApiVersion(), "coordination.k8s.io/v1");
}

TEST(QueryTest, ListQueryEncodesSelectorsAndPagination) {
  ListOptions o;
  EXPECT_EQ(ListQuery(o), "");
  o.label_selector = "app=x,tier in (a,b)";
  o.field_selector = "status.phase!=Running";
  o.limit = 50;
  o.continue_token = "abc==";
  EXPECT_EQ(ListQuery(o),
            "?labelSelector=app%3Dx%2Ctier%20in%20%28a%2Cb%29&fieldSelector=status.phase%21%3DRunning"
            "&limit=50&continue=abc%3D%3D");
}

TEST(QueryTest, WatchQueryAsksForBookmarksFromAResourceVersion) {
  WatchOptions o;
  o.timeout_seconds = 60;
  o.label_selector = "a=b";
  EXPECT_EQ(WatchQuery(o, "123"),
            "?watch=1&allowWatchBookmarks=true&resourceVersion=123&timeoutSeconds=60&labelSelector=a%3Db");
  o.allow_bookmarks = false;
  o.label_selector.clear();
  EXPECT_EQ(WatchQuery(o, ""), "?watch=1&timeoutSeconds=60");
}

TEST(QueryTest, LogQuery) {
  LogOptions o;
  o.container = "trainer";
  o.tail_lines = 20;
  o.previous = true;
  EXPECT_EQ(LogQuery(o), "?container=trainer&tailLines=20&previous=true");
  EXPECT_EQ(LogQuery(LogOptions{}), "");
}

TEST(DeleteBodyTest, PropagationGraceAndPreconditions) {
  DeleteOptions o;
  EXPECT_EQ(DeleteBody(o), nlohmann::json({{"kind", "DeleteOptions"}, {"apiVersion", "v1"}}));
  o.propagation_policy = "Foreground";
  o.grace_period_seconds = 0;
  o.precondition_uid = "u-1";
  o.precondition_resource_version = "42";
  nlohmann::json b = DeleteBody(o);
  EXPECT_EQ(b["propagationPolicy"], "Foreground");
  EXPECT_EQ(b["gracePeriodSeconds"], 0);
  EXPECT_EQ(b["preconditions"]["uid"], "u-1");
  EXPECT_EQ(b["preconditions"]["resourceVersion"], "42");
}

TEST(ObjectKeyTest, NamespacedAndClusterScoped) {
  EXPECT_EQ(ObjectKey({{"metadata", {{"namespace", "a"}, {"name", "b"}}}}), "a/b");
  EXPECT_EQ(ObjectKey({{"metadata", {{"name", "n"}}}}), "n");
  EXPECT_EQ(SplitKey("a/b"), std::make_pair(std::string("a"), std::string("b")));
  EXPECT_EQ(SplitKey("n"), std::make_pair(std::string(""), std::string("n")));
  EXPECT_EQ(ResourceVersionOf({{"metadata", {{"resourceVersion", "7"}}}}), "7");
  EXPECT_EQ(ResourceVersionOf(nlohmann::json::array()), "");
}

}  // namespace
}  // namespace meshwork::k8s
