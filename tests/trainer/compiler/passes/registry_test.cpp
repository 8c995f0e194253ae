// The pass registry and pipeline: every combination of options yields a valid program, passes
// are disabled by name or by their options, the dump names the pipeline, and a choice pass's
// alternatives are planned once each and judged by the budget, then the predicted step.
#include "trainer/compiler/passes/registry.h"

#include <gtest/gtest.h>

#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "tests/trainer/compiler/passes/fixtures.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

TEST(Passes, EveryCombinationYieldsAValidProgram) {
  for (bool reshard : {true, false})
    for (Bucketing b : {Bucketing::kNone, Bucketing::kBlock, Bucketing::kAuto})
      for (bool reorder : {true, false}) {
        Pipeline p = PipelineWith(b);
        if (!reorder) {
          ASSERT_TRUE(p.Disable("reorder").ok());
        }
        auto out = p.Run(Naive(reshard), Context());
        EXPECT_TRUE(out.ok()) << BucketingName(b) << " reorder " << reorder << ": " << out.status().ToString();
      }
}

TEST(Passes, PipelineDisablesOptionalPassesByName) {
  Pipeline p = PipelineWith(Bucketing::kBlock);
  const std::string every = "embedding_rows, vocab_split, async_tp, checkpoint, keep_gathered, bucket_all_gathers, "
                            "bucket_reduce_scatters, reorder, insert_frees";
  EXPECT_EQ(p.Describe(), every);
  std::string names;
  for (const std::string& n : Pipeline::Names()) names += (names.empty() ? "" : ", ") + n;
  EXPECT_EQ(names, every);
  ASSERT_TRUE(p.Disable("reorder").ok());
  const std::string without_reorder = "embedding_rows, vocab_split, async_tp, checkpoint, keep_gathered, "
                                      "bucket_all_gathers, bucket_reduce_scatters, reorder (disabled), insert_frees";
  EXPECT_EQ(p.Describe(), without_reorder);
  Status unknown = p.Disable("fuse");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidConfig);
  EXPECT_NE(unknown.message().find("unknown pass 'fuse'"), std::string::npos);
  EXPECT_EQ(p.Disable("insert_frees").code(), StatusCode::kInvalidConfig);
  std::ostringstream dump;
  auto out = p.Run(Naive(), Context(), &dump);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(dump.str().rfind("== pipeline: " + without_reorder + " ==\n== input ==\n", 0), 0u) << dump.str().substr(0, 300);
  EXPECT_NE(dump.str().find("== embedding_rows ==\nmeshwork-ir 1"), std::string::npos);
  EXPECT_NE(dump.str().find("== reorder (disabled) =="), std::string::npos);
  EXPECT_NE(dump.str().find("== insert_frees ==\nmeshwork-ir 1"), std::string::npos);
  // The options turn off their passes: no reordering, async TP or reading by rows.
  PlanOptions off;
  off.reorder = false;
  off.async_tp = false;
  off.read_by_rows = PlanOptions::Rows::kNever;
  EXPECT_EQ(Pipeline::For(off).Describe(),
            "embedding_rows (disabled), vocab_split (disabled), async_tp (disabled), checkpoint, keep_gathered, "
            "bucket_all_gathers, bucket_reduce_scatters, reorder (disabled), insert_frees");
}

// A pipeline of a choice pass offering the program as it is and the program with layers.0
// checkpointed (less memory, a recompute more), then a schedule pass that counts its runs.
struct CheckpointChoice {
  int runs = 0;
  bool forced = false;
  Pipeline pipeline() {
    Pass choose{"try_checkpoint", true, nullptr, [this](const Graph& g, const PassContext&) -> Result<Choice> {
                  Choice c;
                  c.alternatives.push_back({g, "kept whole", "keeping it whole", "with nothing checkpointed"});
                  Graph ckpt = g;
                  Checkpoint(ckpt.modules[1]);
                  c.alternatives.push_back({ckpt, "layers.0 checkpointed", "checkpointing layers.0", "with layers.0 checkpointed"});
                  c.forced = forced;
                  return c;
                }};
    Pass count{"count", false, [this](const Graph& g, const PassContext&) -> Result<Graph> { ++runs; return g; }, nullptr};
    auto p = Pipeline::Of({choose, count});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  }
};

std::string Seconds(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(4) << s;
  return o.str();
}

TEST(Pipeline, AChoicePassKeepsWhatFitsTheBudgetThenTheFasterAndPlansEachAlternativeOnce) {
  const Graph whole = CheckpointableNaive();
  Graph ckpt = whole;
  Checkpoint(ckpt.modules[1]);
  const PassContext free_ctx = Context();
  const SimResult w = Simulate(whole, free_ctx.cost), c = Simulate(ckpt, free_ctx.cost);
  ASSERT_LT(c.peak_bytes, w.peak_bytes) << "checkpointing layers.0 must save memory for this test";
  ASSERT_GT(c.step_seconds, w.step_seconds) << "and cost its recompute";

  // No budget: the faster, the program as it came; each alternative planned once (the one kept
  // is not planned again).
  CheckpointChoice choice;
  std::vector<std::string> said;
  Graph out = Ok(choice.pipeline().Run(whole, free_ctx, nullptr, &said));
  EXPECT_FALSE(IsCheckpointed(out.modules[1]));
  EXPECT_EQ(choice.runs, 2);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0], "kept whole: checkpointing layers.0 is predicted " + Seconds(c.step_seconds) + " s a step, against " +
                         Seconds(w.step_seconds) + " s");

  // A budget only the checkpointed program fits: it is kept, though slower.
  CheckpointChoice tight;
  said.clear();
  out = Ok(tight.pipeline().Run(whole, Context(0.001, 1e6, c.peak_bytes), nullptr, &said));
  EXPECT_TRUE(IsCheckpointed(out.modules[1]));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0], "layers.0 checkpointed: predicted step " + Seconds(c.step_seconds) + " s, against " +
                         Seconds(w.step_seconds) + " s with nothing checkpointed");

  // A budget neither fits: the faster again, and no "does not fit" (the one kept does not either).
  CheckpointChoice neither;
  said.clear();
  out = Ok(neither.pipeline().Run(whole, Context(0.001, 1e6, c.peak_bytes - 1), nullptr, &said));
  EXPECT_FALSE(IsCheckpointed(out.modules[1]));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0].find("does not fit"), std::string::npos) << said[0];

  // Forced (kAlways): the last alternative whatever the comparison says.
  CheckpointChoice forced;
  forced.forced = true;
  out = Ok(forced.pipeline().Run(whole, free_ctx));
  EXPECT_TRUE(IsCheckpointed(out.modules[1]));
}

TEST(Pipeline, ChoicePassesMustComeFirstAndEachPassIsOneKind) {
  Pass schedule{"s", true, [](const Graph& g, const PassContext&) -> Result<Graph> { return g; }, nullptr};
  Pass choice{"c", true, nullptr, [](const Graph& g, const PassContext&) -> Result<Choice> {
                Choice c;
                c.alternatives.push_back({g, "", "", ""});
                return c;
              }};
  EXPECT_TRUE(Pipeline::Of({choice, schedule}).ok());
  auto late = Pipeline::Of({schedule, choice});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(late.status().message().find("choice pass 'c' follows a schedule pass"), std::string::npos);
  Pass both = schedule;
  both.choose = choice.choose;
  EXPECT_FALSE(Pipeline::Of({both}).ok());
  EXPECT_FALSE(Pipeline::Of({Pass{"none", true, nullptr, nullptr}}).ok());
}

}  // namespace
}  // namespace meshwork::compiler
