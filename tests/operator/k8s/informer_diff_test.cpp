// The informer's relist diff (a pure function) and its cache.
#include "operator/k8s/informer.h"

#include <gtest/gtest.h>

namespace meshwork::k8s {
namespace {

using nlohmann::json;

json Obj(const std::string& ns, const std::string& name, const std::string& rv) {
  return {{"metadata", {{"namespace", ns}, {"name", name}, {"resourceVersion", rv}}}};
}

TEST(DiffOnRelistTest, AddsUpdatesAndDeletesSortedByKey) {
  std::map<std::string, json> cached = {
      {"d/kept", Obj("d", "kept", "1")},
      {"d/changed", Obj("d", "changed", "2")},
      {"d/gone", Obj("d", "gone", "3")},
  };
  std::vector<json> listed = {Obj("d", "kept", "1"), Obj("d", "changed", "9"), Obj("d", "new", "10")};
  auto deltas = DiffOnRelist(cached, listed);
  ASSERT_EQ(deltas.size(), 3u);
  EXPECT_EQ(deltas[0].type, Delta::Type::kUpdated);
  EXPECT_EQ(deltas[0].key, "d/changed");
  EXPECT_EQ(ResourceVersionOf(deltas[0].old_object), "2");
  EXPECT_EQ(ResourceVersionOf(deltas[0].new_object), "9");
  EXPECT_EQ(deltas[1].type, Delta::Type::kDeleted);
  EXPECT_EQ(deltas[1].key, "d/gone");
  EXPECT_EQ(ResourceVersionOf(deltas[1].old_object), "3");  // the last state known
  EXPECT_EQ(deltas[2].type, Delta::Type::kAdded);
  EXPECT_EQ(deltas[2].key, "d/new");
}

TEST(DiffOnRelistTest, EmptyCacheIsAllAddsAndEmptyListAllDeletes) {
  std::vector<json> listed = {Obj("a", "x", "1"), Obj("", "cluster-wide", "2")};
  auto adds = DiffOnRelist({}, listed);
  ASSERT_EQ(adds.size(), 2u);
  for (const auto& d : adds) EXPECT_EQ(d.type, Delta::Type::kAdded);
  EXPECT_EQ(adds[0].key, "a/x");
  EXPECT_EQ(adds[1].key, "cluster-wide");

  std::map<std::string, json> cached = {{"a/x", Obj("a", "x", "1")}};
  auto dels = DiffOnRelist(cached, {});
  ASSERT_EQ(dels.size(), 1u);
  EXPECT_EQ(dels[0].type, Delta::Type::kDeleted);
}

TEST(DiffOnRelistTest, IdenticalStateHasNoDeltas) {
  std::map<std::string, json> cached = {{"a/x", Obj("a", "x", "1")}, {"a/y", Obj("a", "y", "5")}};
  EXPECT_TRUE(DiffOnRelist(cached, {Obj("a", "y", "5"), Obj("a", "x", "1")}).empty());
}

TEST(DiffOnRelistTest, SameNameRecreatedWithNewVersionIsAnUpdate) {
  std::map<std::string, json> cached = {{"a/x", Obj("a", "x", "1")}};
  auto deltas = DiffOnRelist(cached, {Obj("a", "x", "7")});
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].type, Delta::Type::kUpdated);
}

TEST(StoreTest, UpsertRemoveReplace) {
  Store s;
  s.Upsert("a/x", Obj("a", "x", "1"));
  s.Upsert("a/x", Obj("a", "x", "2"));
  ASSERT_TRUE(s.Get("a/x").has_value());
  EXPECT_EQ(ResourceVersionOf(*s.Get("a/x")), "2");
  EXPECT_EQ(s.Size(), 1u);
  s.Remove("a/x");
  EXPECT_FALSE(s.Get("a/x").has_value());
  s.Replace({{"b/y", Obj("b", "y", "3")}});
  EXPECT_EQ(s.Keys(), std::vector<std::string>{"b/y"});
}

TEST(StoreTest, ForEachVisitsEveryObjectInKeyOrder) {
  Store s;
  s.Upsert("b/y", Obj("b", "y", "2"));
  s.Upsert("a/x", Obj("a", "x", "1"));
  std::vector<std::string> seen;
  s.ForEach([&](const std::string& key, const json& obj) { seen.push_back(key + "@" + ResourceVersionOf(obj)); });
  EXPECT_EQ(seen, (std::vector<std::string>{"a/x@1", "b/y@2"}));
}

}  // namespace
}  // namespace meshwork::k8s
