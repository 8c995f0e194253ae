// The pass registry and pipeline: every combination of options yields a valid program, passes
// are disabled by name or by their options, and the dump names the pipeline.
#include "trainer/compiler/passes/registry.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "tests/trainer/compiler/passes/fixtures.h"

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

}  // namespace
}  // namespace meshwork::compiler
