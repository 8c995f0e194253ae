// The insert_frees pass on golden text.
#include "trainer/compiler/passes/insert_frees.h"

#include <gtest/gtest.h>

#include "tests/trainer/compiler/passes/fixtures.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

TEST(Passes, InsertFreesReleasesRightAfterTheLastUse) {
  // A hand-written program with frees at the very end: the pass moves each up to its last use.
  auto g = Parse(kSmallModel + R"(%ag0 = all_gather [0,5]
wait %ag0
compute fwd embed
%ag1 = all_gather [1,2,3,4]
wait %ag1
compute fwd layers.0
compute fwd layers.1
compute fwd head
compute bwd head
compute bwd layers.1
compute bwd layers.0
compute bwd embed
%rs0 = reduce_scatter [0,1,2,3,4,5]
wait %rs0
free %ag1
free %ag0
optimizer_step
)");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Graph f = Ok(InsertFrees(*g, Context()));
  EXPECT_EQ(Ops(f), R"(%ag0 = all_gather [0,5]
wait %ag0
compute fwd embed
%ag1 = all_gather [1,2,3,4]
wait %ag1
compute fwd layers.0
compute fwd layers.1
compute fwd head
compute bwd head
compute bwd layers.1
compute bwd layers.0
free %ag1
compute bwd embed
free %ag0
%rs0 = reduce_scatter [0,1,2,3,4,5]
wait %rs0
optimizer_step
)");
  EXPECT_LT(PeakBytes(f), PeakBytes(*g));
}

}  // namespace
}  // namespace meshwork::compiler
