// The checkpoint pass: as few layers as the budget needs, earliest first.
#include "trainer/compiler/passes/checkpoint.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/trainer/compiler/passes/fixtures.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

TEST(Passes, CheckpointingTakesAsFewLayersAsTheBudgetNeedsEarliestFirst) {
  const Graph naive = CheckpointableNaive();
  Graph first = naive, both = naive;
  Checkpoint(first.modules[1]);
  Checkpoint(both.modules[1]);
  Checkpoint(both.modules[2]);
  const int64_t none_peak = PeakBytes(naive), first_peak = PeakBytes(first), both_peak = PeakBytes(both);
  ASSERT_LT(first_peak, none_peak);
  // layers.1 recomputed holds its input and its activations at once: no lower a peak.
  ASSERT_GE(both_peak, first_peak);

  auto checkpointed = [](const Graph& g) {
    std::string names;
    for (const auto& m : g.modules)
      if (IsCheckpointed(m)) names += m.name + " ";
    return names;
  };
  // A budget that holds the naive program: nothing checkpointed (it only costs time).
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(0.001, 1e6, none_peak)))), "");
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context()))), "") << "no budget";
  // Just below it: the first layer only.
  const Graph one = Ok(CheckpointToFit(naive, Context(0.001, 1e6, none_peak - 1)));
  EXPECT_EQ(checkpointed(one), "layers.0 ");
  EXPECT_EQ(PeakBytes(one), first_peak);
  // A checkpointed layer recomputes its forward in backward and holds the recomputed activations
  // only then.
  EXPECT_DOUBLE_EQ(one.modules[1].bwd_seconds, naive.modules[1].bwd_seconds + naive.modules[1].fwd_seconds);
  EXPECT_EQ(one.modules[1].activation_bytes, 1000);
  EXPECT_EQ(one.modules[1].backward_workspace_bytes, naive.modules[1].activation_bytes);
  EXPECT_EQ(one.modules[1].checkpoint_input_bytes, 0);
  // Below that, checkpointing layers.1 too would not help: the pass stops at layers.0 and the
  // plan is still produced (over the budget; the summary says so).
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(0.001, 1e6, first_peak - 1)))),
            "layers.0 ");
  EXPECT_EQ(checkpointed(Ok(CheckpointToFit(naive, Context(0.001, 1e6, 1)))), "layers.0 ");
  // With three layers and the budget far below, the earlier ones are checkpointed first.
  std::string three = kSmallModel;
  three.replace(three.find("module head"), 0, "module layers.2 fwd=0.01 bwd=0.02 act=50000 ckpt=1000 params=[]\n");
  for (const std::string layer : {"layers.0 fwd=0.01 bwd=0.02 act=5000 ", "layers.1 fwd=0.01 bwd=0.02 act=5000 "}) {
    three.replace(three.find(layer), layer.size(), layer.substr(0, layer.size() - 1) + "0 ckpt=1000 ");
  }
  auto parsed = Parse(three);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Graph naive3 = BuildNaiveProgram(*parsed, {});
  const std::string taken = checkpointed(Ok(CheckpointToFit(naive3, Context(0.001, 1e6, 1))));
  EXPECT_EQ(taken.rfind("layers.0 layers.1 ", 0), 0u) << "earliest first: " << taken;
  // Without candidates (the trainer's skeleton today) the pass changes nothing.
  EXPECT_EQ(Print(Ok(CheckpointToFit(Naive(), Context(0.001, 1e6, 1)))), Print(Naive()));
}

}  // namespace
}  // namespace meshwork::compiler
