// Label and field selector syntax and matching, as the Kubernetes API defines them.
#include "controlplane/apiserver/selectors.h"

#include <gtest/gtest.h>

namespace meshwork::controlplane {
namespace {

using nlohmann::json;

json Labeled(json labels) { return {{"metadata", {{"name", "x"}, {"labels", labels}}}}; }

TEST(LabelSelectorTest, MatchesEveryOperator) {
  struct Case {
    std::string selector;
    json labels;
    bool match;
  };
  const std::vector<Case> cases = {
      {"", json::object(), true},
      {"app=web", {{"app", "web"}}, true},
      {"app==web", {{"app", "web"}}, true},
      {"app=web", {{"app", "db"}}, false},
      {"app!=web", {{"app", "db"}}, true},
      {"app!=web", json::object(), true},
      {"app!=web", {{"app", "web"}}, false},
      {"tier in (a, b)", {{"tier", "b"}}, true},
      {"tier in (a,b)", {{"tier", "c"}}, false},
      {"tier notin (a,b)", {{"tier", "c"}}, true},
      {"tier notin (a,b)", json::object(), true},
      {"tier notin (a,b)", {{"tier", "a"}}, false},
      {"app", {{"app", ""}}, true},
      {"app", json::object(), false},
      {"!app", json::object(), true},
      {"!app", {{"app", "x"}}, false},
      {"app=web,tier in (a,b),!canary", {{"app", "web"}, {"tier", "a"}}, true},
      {"app=web,tier in (a,b),!canary", {{"app", "web"}, {"tier", "a"}, {"canary", "1"}}, false},
      {"example.com/role=trainer", {{"example.com/role", "trainer"}}, true},
  };
  for (const Case& c : cases) {
    auto sel = LabelSelector::Parse(c.selector);
    ASSERT_TRUE(sel.ok()) << c.selector << ": " << sel.status().message();
    EXPECT_EQ(sel->Matches(Labeled(c.labels)), c.match) << c.selector << " on " << c.labels.dump();
  }
}

TEST(LabelSelectorTest, RejectsMalformedSelectorsNamingThem) {
  for (const std::string bad : {"app=we b", "tier in (a,b", "tier between (a)", "=x", "a,,b", "app=x$"}) {
    auto sel = LabelSelector::Parse(bad);
    EXPECT_FALSE(sel.ok()) << bad;
    if (!sel.ok()) {
      EXPECT_NE(sel.status().message().find("unable to parse requirement"), std::string::npos);
    }
  }
}

TEST(LabelSelectorTest, TextOfASelectorObject) {
  json sel = {{"matchLabels", {{"app", "web"}}},
              {"matchExpressions",
               {{{"key", "tier"}, {"operator", "In"}, {"values", {"b", "a"}}},
                {{"key", "legacy"}, {"operator", "DoesNotExist"}},
                {{"key", "zone"}, {"operator", "Exists"}}}}};
  auto text = LabelSelectorText(sel);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "app=web,tier in (a,b),!legacy,zone");
  EXPECT_EQ(*LabelSelectorText(json::object()), "");
  auto bad = LabelSelectorText({{"matchExpressions", {{{"key", "tier"}, {"operator", "Near"}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "matchExpressions[0].operator: Invalid value: \"Near\": not a valid selector operator");
  auto no_values = LabelSelectorText({{"matchExpressions", {{{"key", "tier"}, {"operator", "In"}}}}});
  ASSERT_FALSE(no_values.ok());
  EXPECT_NE(no_values.status().message().find("matchExpressions[0].values: Required value"), std::string::npos);
  EXPECT_FALSE(LabelSelectorText({{"matchLabels", {{"app", "bad value"}}}}).ok());
}

TEST(FieldSelectorTest, MatchesDottedFields) {
  json pod = {{"metadata", {{"name", "p"}, {"namespace", "ns"}}},
              {"spec", {{"nodeName", "gpu-0"}}},
              {"status", {{"phase", "Running"}}}};
  auto sel = FieldSelector::Parse("metadata.name=p,status.phase!=Failed,spec.nodeName==gpu-0");
  ASSERT_TRUE(sel.ok());
  EXPECT_TRUE(sel->Matches(pod));
  EXPECT_EQ(sel->Pinned("metadata.name"), "p");
  auto other = FieldSelector::Parse("status.phase=Pending");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->Matches(pod));
  auto missing = FieldSelector::Parse("spec.hostname=");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->Matches(pod));  // an absent field compares as ""
  EXPECT_FALSE(FieldSelector::Parse("metadata.name").ok());
}

}  // namespace
}  // namespace meshwork::controlplane
