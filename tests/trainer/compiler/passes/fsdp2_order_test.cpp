// FSDP2's order as a plan: the eager plan is what the eager executor runs.
#include "trainer/compiler/passes/fsdp2_order.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/trainer/compiler/passes/fixtures.h"

namespace meshwork::compiler {
namespace {

TEST(Passes, TheEagerPlanIsFsdp2sDefaults) {
  // As the eager executor does: each reduce-scatter waited for right after the next one is
  // issued (one in flight), so every wait but the last two comes before a backward compute.
  const std::string ops = Ops(Ok(EagerPlan(Naive(), Context())));
  const std::vector<std::string> issued = {"%rs0 = ", "%rs1 = ", "%rs3 = ", "%rs5 = "};
  for (size_t k = 0; k + 1 < issued.size(); ++k) {
    const std::string wait = "wait " + issued[k].substr(0, 4);
    ASSERT_NE(ops.find(wait), std::string::npos) << wait << "\n" << ops;
    EXPECT_GT(ops.find(wait), ops.find(issued[k + 1])) << wait << "\n" << ops;
    // Nothing but the wait and its all-reduce between the next issue and the wait.
    EXPECT_EQ(ops.find(wait), ops.find("\n", ops.find(issued[k + 1])) + 1) << wait << "\n" << ops;
  }
  EXPECT_LT(ops.find("wait %rs1"), ops.rfind("compute bwd")) << ops;
  // The root's modules (the embedding here) and the last layer stay gathered from forward to
  // backward; layer 0 is gathered again for its backward.
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = ops.find(what); at != std::string::npos; at = ops.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("all_gather [0]"), 1u) << ops;
  EXPECT_EQ(count("all_gather [3,4]"), 1u) << ops;
  EXPECT_EQ(count("all_gather [1,2]"), 2u) << ops;
  // Without reshard after forward nothing is gathered twice.
  const std::string kept = Ops(Ok(EagerPlan(Naive(false), Context())));
  EXPECT_EQ(kept.find("all_gather [1,2]"), kept.rfind("all_gather [1,2]")) << kept;
}

}  // namespace
}  // namespace meshwork::compiler
