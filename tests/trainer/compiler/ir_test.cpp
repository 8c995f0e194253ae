// The schedule IR's text form and its validity rules.
#include "trainer/compiler/ir.h"

#include <gtest/gtest.h>

#include "tests/trainer/compiler/small_graph.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

const std::string kOps = R"(%ag0 = all_gather [0]
wait %ag0
compute fwd embed
%ag1 = all_gather [1,2]
wait %ag1
compute fwd layers.0
free %ag1
%ag2 = all_gather [3,4]
wait %ag2
compute fwd layers.1
free %ag2
%ag3 = all_gather [5]
wait %ag3
compute fwd head
compute bwd head
%rs0 = reduce_scatter [5]
%ag4 = all_gather [3,4]
wait %ag4
compute bwd layers.1
free %ag4
%rs1 = reduce_scatter [3,4]
%ag5 = all_gather [1,2]
wait %ag5
compute bwd layers.0
free %ag5
%rs2 = reduce_scatter [1,2]
compute bwd embed
free %ag0
free %ag3
%rs3 = reduce_scatter [0]
wait %rs0
wait %rs1
wait %rs2
wait %rs3
optimizer_step
)";

TEST(ScheduleIr, PrintParsePrintIsTheIdentity) {
  const std::string text = kSmallModel + kOps;
  auto g = Parse(text);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Print(*g), text);
  EXPECT_TRUE(Validate(*g).ok()) << Validate(*g).ToString();
  auto again = Parse(Print(*g));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Print(*again), text);
}

TEST(ScheduleIr, SecondsRoundTripExactly) {
  auto g = Parse(kSmallModel);
  ASSERT_TRUE(g.ok());
  g->modules[1].fwd_seconds = 0.1 + 0.2;  // not representable in few digits
  g->modules[1].bwd_seconds = 1.0 / 3.0;
  auto back = Parse(Print(*g));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->modules[1].fwd_seconds, g->modules[1].fwd_seconds);
  EXPECT_EQ(back->modules[1].bwd_seconds, g->modules[1].bwd_seconds);
}

TEST(ScheduleIr, HsdpAllReduceRoundTrips) {
  std::string text = kSmallModel;
  text.replace(text.find("dp_replicate=1"), 14, "dp_replicate=2");
  text += "%ag0 = all_gather [0,1,2,3,4,5]\nwait %ag0\ncompute fwd embed\ncompute fwd layers.0\n"
          "compute fwd layers.1\ncompute fwd head\ncompute bwd head\ncompute bwd layers.1\n"
          "compute bwd layers.0\ncompute bwd embed\nfree %ag0\n%rs0 = reduce_scatter [0,1,2,3,4,5]\n"
          "wait %rs0\n%ar0 = all_reduce %rs0\nwait %ar0\noptimizer_step\n";
  auto g = Parse(text);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Print(*g), text);
  EXPECT_TRUE(Validate(*g).ok()) << Validate(*g).ToString();
}

// A checkpointing candidate (ckpt=) and a checkpointed module (ws=) print and parse back; the
// optional keys come in one order and nothing else may sit between act= and params=.
TEST(ScheduleIr, CheckpointingKeysRoundTrip) {
  auto g = Parse(kSmallModel);
  ASSERT_TRUE(g.ok());
  g->modules[1].checkpoint_input_bytes = 1000;
  g->modules[2].checkpoint_input_bytes = 1000;
  Checkpoint(g->modules[2]);
  const std::string text = Print(*g);
  EXPECT_NE(text.find("module layers.0 fwd=0.01 bwd=0.02 act=5000 ckpt=1000 params=[1,2]"), std::string::npos) << text;
  EXPECT_NE(text.find("module layers.1 fwd=0.01 bwd=0.03 act=1000 ws=5000 params=[3,4]"), std::string::npos) << text;
  auto back = Parse(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Print(*back), text);
  EXPECT_TRUE(IsCheckpointed(back->modules[2]));
  EXPECT_FALSE(IsCheckpointed(back->modules[1]));
  std::string swapped = kSmallModel;
  swapped.replace(swapped.find("act=5000 params=[1,2]"), 21, "act=5000 ckpt=1 ws=2 params=[1,2]");
  auto bad = Parse(swapped);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unexpected 'ws=2'"), std::string::npos) << bad.status().message();
}

void ExpectParseError(const std::string& ops, const std::string& want) {
  auto g = Parse(kSmallModel + ops);
  ASSERT_FALSE(g.ok()) << ops;
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(g.status().message().find(want), std::string::npos) << g.status().message();
}

TEST(ScheduleIr, ParseErrorsNameTheLineAndText) {
  ExpectParseError("compute fwd nosuch\n", "IR line 13: unknown module 'nosuch': 'compute fwd nosuch'");
  ExpectParseError("%ag0 = all_gather [0,9]\n", "unknown param 9");
  ExpectParseError("%ag0 = broadcast [0]\n", "unknown collective 'broadcast'");
  ExpectParseError("wait ag0\n", "expected 'wait <%id>'");
  ExpectParseError("jump 3\n", "unknown statement 'jump'");
  EXPECT_FALSE(Parse("").ok());
  EXPECT_FALSE(Parse("meshwork-ir 2\n").ok());
}

void ExpectInvalid(const std::string& ops, const std::string& want) {
  auto g = Parse(kSmallModel + ops);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Status s = Validate(*g);
  ASSERT_FALSE(s.ok()) << ops;
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
}

TEST(ScheduleIr, ValidateRejectsBrokenPrograms) {
  ExpectInvalid("%ag0 = all_gather [0]\ncompute fwd embed\n", "(compute fwd embed): param 0 (model.embed_tokens.weight) is not gathered (%ag0 not waited for)");
  ExpectInvalid("%ag0 = all_gather [0]\n%ag1 = all_gather [0]\n", "already gathered by %ag0");
  ExpectInvalid("%ag0 = all_gather [0]\nwait %ag0\nwait %ag0\n", "waited for twice");
  ExpectInvalid("%ag0 = all_gather [0]\nfree %ag0\n", "frees before the all_gather was waited for");
  ExpectInvalid("%ag0 = all_gather [0]\nwait %ag0\n%rs0 = reduce_scatter [0]\ncompute bwd embed\n",
                "is still used by a later backward");
  ExpectInvalid("%ag0 = all_gather [0]\nwait %ag0\ncompute bwd embed\nfree %ag0\noptimizer_step\n",
                "param 0 (model.embed_tokens.weight) is never reduce-scattered");
  ExpectInvalid("%ag0 = all_gather [0]\nwait %ag0\noptimizer_step\ncompute fwd embed\n", "after optimizer_step");
  ExpectInvalid("%ag0 = all_gather [0]\noptimizer_step\n", "%ag0 is never waited for");
}

// The embedding read by rows (ReadByRows): rows= round-trips on the param and module lines; the
// naive program fetches the rows before the embedding's forward and reduces their gradients
// after its backward, and (untied) never gathers or reduce-scatters the table; a tied head still
// gathers it whole and reduce-scatters it right after its own backward.
TEST(ScheduleIr, EmbeddingReadByRows) {
  auto g = Parse(kSmallModel);
  ASSERT_TRUE(g.ok());
  g->params[0].row_bytes = 640;
  ReadByRows(*g);
  EXPECT_TRUE(g->modules[0].params.empty());
  EXPECT_EQ(g->modules[0].rows, std::vector<int>{0});
  const std::string text = Print(*g);
  EXPECT_NE(text.find("param 0 model.embed_tokens.weight gathered=4000 grad=8000 shard=4000 rows=640\n"),
            std::string::npos) << text;
  // Its backward scatters the rows' gradients, no longer the whole table's: at most the
  // forward's time (the traced 0.002 s was the dense gradient's).
  EXPECT_NE(text.find("module embed fwd=0.001 bwd=0.001 act=100 rows=[0] params=[]\n"), std::string::npos) << text;
  auto back = Parse(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Print(*back), text);

  const Graph naive = BuildNaiveProgram(*g, {true});
  ASSERT_TRUE(Validate(naive).ok()) << Validate(naive).ToString();
  const std::string ops = Print(naive);
  EXPECT_NE(ops.find("%rg0 = row_gather [0]\nwait %rg0\ncompute fwd embed\n"), std::string::npos) << ops;
  EXPECT_NE(ops.find("compute bwd embed\n%rr0 = row_reduce [0]\nwait %rr0\n"), std::string::npos) << ops;
  EXPECT_EQ(ops.find("all_gather [0]"), std::string::npos) << ops;
  EXPECT_EQ(ops.find("reduce_scatter [0]"), std::string::npos) << ops;

  // Tied: the head uses the table whole; only the embedding's lookup reads it by rows.
  auto tied = Parse(kSmallModel);
  ASSERT_TRUE(tied.ok());
  tied->params[0].row_bytes = 640;
  tied->modules[3].params = {5, 0};
  ReadByRows(*tied);
  EXPECT_EQ(tied->modules[3].params, (std::vector<int>{5, 0}));
  const Graph tied_naive = BuildNaiveProgram(*tied, {true});
  ASSERT_TRUE(Validate(tied_naive).ok()) << Validate(tied_naive).ToString();
  const std::string tied_ops = Print(tied_naive);
  const size_t gather = tied_ops.find("all_gather [0]");
  EXPECT_EQ(tied_ops.find("all_gather [0]", gather + 1), std::string::npos) << "gathered once: " << tied_ops;
  EXPECT_TRUE(tied_ops.find("compute fwd layers.1") < gather && gather < tied_ops.find("compute fwd head"))
      << tied_ops;
  const size_t head_bwd = tied_ops.find("compute bwd head"), rs = tied_ops.find("reduce_scatter [0]"),
               next = tied_ops.find("compute bwd layers.1");
  EXPECT_TRUE(head_bwd < rs && rs < next) << tied_ops;

  // Costs: a row_gather is a reduce-scatter of every rank's rows, a row_reduce an all-gather of
  // them; two collectives each (the token ids, then the rows).
  CostModel cost;
  cost.dp_shard = 2;
  cost.shard_link = {0.001, 1e6};
  for (const Op& op : naive.ops) {
    if (op.kind != OpKind::kRowGather && op.kind != OpKind::kRowReduce) continue;
    EXPECT_EQ(cost.CollectiveBytes(naive, op), 1280);
    EXPECT_EQ(CostModel::CollectiveCalls(naive, op), 2);
    EXPECT_EQ(LaneOf(op.kind), kAllGatherLane);
  }
}

// A tied head split by vocabulary (SplitByVocabulary after ReadByRows): vocab= round-trips on
// the module line; the naive program never gathers or reduce-scatters the table; the cost model
// charges the head's exchange inside its compute (every rank's hidden states each way, and the
// small collectives' latencies), and the simulator counts it as exposed.
TEST(ScheduleIr, TiedHeadSplitByVocabulary) {
  auto g = Parse(kSmallModel);
  ASSERT_TRUE(g.ok());
  g->params[0].row_bytes = 640;
  g->modules[3].params = {5, 0};
  ReadByRows(*g);
  SplitByVocabulary(*g);
  EXPECT_EQ(g->modules[3].params, std::vector<int>{5});
  EXPECT_EQ(g->modules[3].vocab, std::vector<int>{0});
  EXPECT_TRUE(g->modules[0].vocab.empty()) << "the lookup reads by rows, it does not split";
  const std::string text = Print(*g);
  EXPECT_NE(text.find("module head fwd=0.002 bwd=0.004 act=800 vocab=[0] params=[5]\n"), std::string::npos) << text;
  auto back = Parse(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Print(*back), text);

  const Graph naive = BuildNaiveProgram(*g, {true});
  ASSERT_TRUE(Validate(naive).ok()) << Validate(naive).ToString();
  const std::string ops = Print(naive);
  EXPECT_EQ(ops.find("all_gather [0"), std::string::npos) << ops;
  EXPECT_EQ(ops.find("reduce_scatter [0"), std::string::npos) << ops;

  CostModel cost;
  cost.dp_shard = 2;
  cost.shard_link = {0.001, 1e6};
  const ModuleInfo& head = naive.modules[3];
  // Forward: an all-gather of 2 x 640 bytes (half of it moves) and three more latencies.
  EXPECT_NEAR(cost.VocabSeconds(naive, head, Phase::kForward), 4 * 0.001 + 640 / 1e6, 1e-12);
  EXPECT_NEAR(cost.VocabSeconds(naive, head, Phase::kBackward), 3 * 0.001 + 640 / 1e6, 1e-12);
  EXPECT_EQ(cost.VocabSeconds(naive, naive.modules[1], Phase::kForward), 0);
  const SimResult sim = Simulate(naive, cost);
  EXPECT_GE(sim.exposed_comm_seconds, 7 * 0.001 + 2 * 640 / 1e6 - 1e-12);

  // Broken: a vocab= parameter without a row size, and one used both whole and split.
  std::string unsized = kSmallModel;
  unsized.replace(unsized.find("act=800 params=[5]"), 18, "act=800 vocab=[0] params=[5]");
  auto bad = Parse(unsized);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("param 0 is read by rows but has no rows= size"), std::string::npos)
      << bad.status().message();
  Graph both = naive;
  both.modules[3].params = {5, 0};
  const Status s = Validate(both);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("module head uses param 0 both whole and split by vocabulary"), std::string::npos)
      << s.message();
}

TEST(ScheduleIr, ValidateRejectsBrokenRowPrograms) {
  std::string model = kSmallModel;
  model.replace(model.find("shard=4000\n"), 11, "shard=4000 rows=640\n");
  model.replace(model.find("act=100 params=[0]"), 18, "act=100 rows=[0] params=[]");
  auto check = [&](const std::string& ops, const std::string& want) {
    auto g = Parse(model + ops);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Status s = Validate(*g);
    ASSERT_FALSE(s.ok()) << ops;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
  };
  check("compute fwd embed\n", "(compute fwd embed): param 0 (model.embed_tokens.weight) has no rows gathered");
  check("%rg0 = row_gather [0]\ncompute fwd embed\n", "has no rows gathered (%rg0 not waited for)");
  check("%rg0 = row_gather [1]\n", "param 1 is read by rows by no module");
  check("%rg0 = row_gather [0]\nwait %rg0\n%rr0 = row_reduce [0]\ncompute bwd embed\n",
        "rows are still read by a later backward");
  check("%rg0 = row_gather [0]\nwait %rg0\ncompute fwd embed\ncompute bwd embed\noptimizer_step\n",
        "param 0 (model.embed_tokens.weight) is never row-reduced");
  check("%rg0 = row_gather [0]\nwait %rg0\nfree %rg0\n", "frees something that is not an all_gather");
  // A module reading by rows a parameter with no row size: a parse error.
  std::string unsized = kSmallModel;
  unsized.replace(unsized.find("act=100 params=[0]"), 18, "act=100 rows=[0] params=[]");
  auto bad = Parse(unsized);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("param 0 is read by rows but has no rows= size"), std::string::npos)
      << bad.status().message();
}

TEST(ScheduleIr, NaiveProgramIsValidAndDeclaresOneCollectivePerParameterUse) {
  auto g = Parse(kSmallModel);
  ASSERT_TRUE(g.ok());
  for (bool reshard : {true, false}) {
    Graph naive = BuildNaiveProgram(*g, {reshard});
    EXPECT_TRUE(Validate(naive).ok()) << Validate(naive).ToString();
    int ag = 0, rs = 0;
    for (const auto& op : naive.ops) {
      if (op.kind == OpKind::kAllGather) {
        EXPECT_EQ(op.params.size(), 1u);
        ++ag;
      }
      if (op.kind == OpKind::kReduceScatter) ++rs;
    }
    // Forward gathers all 6; with reshard, everything but the head is gathered again.
    EXPECT_EQ(ag, reshard ? 11 : 6);
    EXPECT_EQ(rs, 6);
  }
}

// With flat groups (the runtime's layout: GroupByOwner), one collective per group: a layer's
// parameters travel together; group= round-trips; a collective that splits a group is invalid.
TEST(ScheduleIr, FlatGroupsAreCommunicatedWhole) {
  auto g = Parse(kSmallModel);
  ASSERT_TRUE(g.ok());
  GroupByOwner(*g);
  EXPECT_EQ(g->params[1].group, 1);
  EXPECT_EQ(g->params[2].group, 1);
  EXPECT_EQ(g->params[5].group, 3);
  const std::string text = Print(*g);
  EXPECT_NE(text.find("param 2 model.layers.0.v gathered=1000 grad=2000 shard=1000 group=1\n"), std::string::npos)
      << text;
  auto back = Parse(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Print(*back), text);
  for (bool reshard : {true, false}) {
    Graph naive = BuildNaiveProgram(*g, {reshard});
    EXPECT_TRUE(Validate(naive).ok()) << Validate(naive).ToString();
    int ag = 0, rs = 0;
    for (const auto& op : naive.ops) {
      if (op.kind == OpKind::kAllGather) ++ag;
      if (op.kind == OpKind::kReduceScatter) ++rs;
      if (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter) {
        for (int p : op.params) EXPECT_EQ(g->params[p].group, g->params[op.params[0]].group) << Print(naive);
        const size_t want = g->params[op.params[0]].group == 1 || g->params[op.params[0]].group == 2 ? 2u : 1u;
        EXPECT_EQ(op.params.size(), want) << Print(naive);
      }
    }
    // Four groups gathered in forward; with reshard, all but the head's again for backward.
    EXPECT_EQ(ag, reshard ? 7 : 4);
    EXPECT_EQ(rs, 4);
  }
  // Half of layers.0's group in one all-gather, half in another: refused.
  auto split = Parse(text + R"(%ag0 = all_gather [0]
wait %ag0
compute fwd embed
%ag1 = all_gather [1]
%ag2 = all_gather [2]
wait %ag1
wait %ag2
compute fwd layers.0
)");
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  const Status s = Validate(*split);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("flat group 1 has 2 parameters, this collective lists 1"), std::string::npos) << s.ToString();
  EXPECT_FALSE(Parse(std::string(kSmallModel).replace(kSmallModel.find("shard=1000\n"), 11, "shard=1000 group=-2\n")).ok());
}

}  // namespace
}  // namespace meshwork::compiler
