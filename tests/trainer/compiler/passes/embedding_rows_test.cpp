// The embedding_rows choice pass, through the planner: read by rows where that is faster,
// and the plan summary says which and why.
#include "trainer/compiler/planner.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>

#include "tests/trainer/compiler/passes/fixtures.h"

namespace meshwork::compiler {
namespace {

// The planner reads the embedding by rows where its rows' exchange moves less than the table's
// collectives and the plan is then faster (kWhenFaster), always with kAlways, never with kNever
// or with replicas (HSDP); it says which and why.
TEST(Planner, TheEmbeddingIsReadByRowsWhereThatIsFaster) {
  auto plan = [](int64_t row_bytes, PlanOptions::Rows rows, int dp_replicate = 1) {
    auto g = Parse(kSmallModel);
    EXPECT_TRUE(g.ok());
    g->params[0].row_bytes = row_bytes;
    g->dp_replicate = dp_replicate;
    PlanOptions options;
    options.bucketing = Bucketing::kBlock;
    options.read_by_rows = rows;
    CostModel cost = Context().cost;
    cost.dp_replicate = dp_replicate;
    auto plans = PlanStep(*g, cost, options);
    EXPECT_TRUE(plans.ok()) << plans.status().ToString();
    int row_ops = 0;
    for (const Op& op : plans->compiled.ops) row_ops += op.kind == OpKind::kRowGather || op.kind == OpKind::kRowReduce;
    std::string said;
    for (const std::string& c : plans->choices) said += c + "\n";
    return std::make_pair(row_ops, said);
  };
  // Rows of 100 bytes against a 4000-byte table: read by rows.
  auto [ops, said] = plan(100, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(ops, 2) << said;
  EXPECT_NE(said.find("the embedding is read by rows: predicted step"), std::string::npos) << said;
  EXPECT_NE(said.find("model.embed_tokens.weight read by rows: 200 B of rows"), std::string::npos) << said;
  // Rows of 40000 bytes (dp_shard 2: 80000 exchanged): gathered whole, and why.
  std::tie(ops, said) = plan(40000, PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(ops, 0) << said;
  EXPECT_NE(said.find("the embedding is gathered whole: exchanging every rank's rows (dp_shard 2 x "), std::string::npos)
      << said;
  std::tie(ops, said) = plan(40000, PlanOptions::Rows::kAlways);
  EXPECT_EQ(ops, 2) << said;
  std::tie(ops, said) = plan(100, PlanOptions::Rows::kNever);
  EXPECT_EQ(ops, 0) << said;
  EXPECT_EQ(said.find("the embedding is"), std::string::npos) << said;
  std::tie(ops, said) = plan(100, PlanOptions::Rows::kAlways, 2);
  EXPECT_EQ(ops, 0) << "HSDP: " << said;
}

}  // namespace
}  // namespace meshwork::compiler
