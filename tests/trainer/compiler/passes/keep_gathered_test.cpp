// The keep_gathered pass: re-gathers dropped where they were exposed, within the budget.
#include "trainer/compiler/passes/keep_gathered.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/trainer/compiler/passes/fixtures.h"

namespace meshwork::compiler {
namespace {

// How many all-gathers a step issues for parameter `p`.
int GathersOf(const Graph& g, int p) {
  int n = 0;
  for (const Op& o : g.ops)
    if (o.kind == OpKind::kAllGather && std::find(o.params.begin(), o.params.end(), p) != o.params.end()) ++n;
  return n;
}

TEST(Passes, KeepGatheredDropsExposedReGathersWithinTheBudget) {
  const Graph naive = Naive();  // params 1,2: layers.0; 3,4: layers.1
  ASSERT_EQ(GathersOf(naive, 1), 2);
  ASSERT_EQ(GathersOf(naive, 3), 2);
  // A slow link: the backward re-gathers are exposed. Room for everything: both layers stay
  // gathered from forward to backward, and the program is still valid.
  const PassContext slow = Context(0.001, 1e5, int64_t{1} << 30);
  const Graph kept = Ok(KeepGatheredWithinBudget(naive, slow));
  EXPECT_TRUE(Validate(kept).ok()) << Validate(kept).ToString();
  for (int p : {1, 2, 3, 4}) EXPECT_EQ(GathersOf(kept, p), 1) << "param " << p;
  EXPECT_EQ(GathersOf(kept, 0), 2) << "embed is not a layer: resharded as before";
  // A budget that holds nothing more keeps the resharding.
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(naive, Context(0.001, 1e5, 1)))), Print(naive));
  // Without a budget, or with communication hidden anyway (a fast link), nothing changes.
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(naive, Context(0.001, 1e5, 0)))), Print(naive));
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(naive, Context(1e-6, 1e12, int64_t{1} << 30)))),
            Print(naive));
  // Without reshard after forward there is nothing to keep.
  EXPECT_EQ(Print(Ok(KeepGatheredWithinBudget(Naive(false), slow))), Print(Naive(false)));
}

}  // namespace
}  // namespace meshwork::compiler
