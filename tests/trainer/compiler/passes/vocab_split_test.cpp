// The vocab_split choice pass, through the planner: a tied head split by vocabulary where
// that is faster, and the plan summary says which and why.
#include "trainer/compiler/planner.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>

#include "tests/trainer/compiler/passes/fixtures.h"

namespace meshwork::compiler {
namespace {

// A tied head splits the table by vocabulary where that is faster than gathering the table for
// it (kWhenFaster: a slow, low-latency link and small hidden states), always with kAlways, never with kNever
// or when the plan does not read the table by rows; the plan summary says which and why.
TEST(Planner, ATiedHeadIsSplitByVocabularyWhereThatIsFaster) {
  auto plan = [](int64_t row_bytes, PlanOptions::Rows vocab, PlanOptions::Rows rows = PlanOptions::Rows::kAlways) {
    auto g = Parse(kSmallModel);
    EXPECT_TRUE(g.ok());
    g->params[0].row_bytes = row_bytes;
    g->modules[3].params = {5, 0};  // tied
    PlanOptions options;
    options.bucketing = Bucketing::kBlock;
    options.read_by_rows = rows;
    options.split_by_vocabulary = vocab;
    auto plans = PlanStep(*g, Context(0.0001, 1e5).cost, options);
    EXPECT_TRUE(plans.ok()) << plans.status().ToString();
    std::string said;
    for (const std::string& c : plans->choices) said += c + "\n";
    return std::make_pair(plans->compiled.modules[3].vocab.size(), said);
  };
  // Hidden states of 100 bytes against a 4000-byte table on a 100 kB/s link: split.
  auto [split, said] = plan(100, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(split, 1u) << said;
  EXPECT_NE(said.find("the output head is split by vocabulary"), std::string::npos) << said;
  EXPECT_NE(said.find("never gathered or reduce-scattered whole: the output head splits it by vocabulary"),
            std::string::npos) << said;
  // Hidden states of 40000 bytes: the head gathers the table, and says why.
  std::tie(split, said) = plan(40000, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(split, 0u) << said;
  EXPECT_NE(said.find("the output head gathers the table whole: splitting it by vocabulary is predicted"),
            std::string::npos) << said;
  std::tie(split, said) = plan(40000, PlanOptions::Rows::kAlways);
  EXPECT_EQ(split, 1u) << said;
  std::tie(split, said) = plan(100, PlanOptions::Rows::kNever);
  EXPECT_EQ(split, 0u) << said;
  EXPECT_EQ(said.find("vocabulary"), std::string::npos) << said;
  std::tie(split, said) = plan(100, PlanOptions::Rows::kAlways, PlanOptions::Rows::kNever);
  EXPECT_EQ(split, 0u) << "the table is not read by rows: " << said;
}

}  // namespace
}  // namespace meshwork::compiler
