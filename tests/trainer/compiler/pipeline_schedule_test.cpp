// Pipeline schedules as programs (trainer/compiler/pipeline): the text form, the generators over a
// range of shapes, what Validate refuses, and the simulated step, bubble and peaks against the
// closed forms of each schedule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trainer/compiler/frontend.h"
#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/pipeline/model_stages.h"
#include "trainer/compiler/pipeline/partition.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/pipeline/simulate.h"

namespace meshwork::compiler::pipeline {
namespace {

Program Ok(Result<Program> p) {
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : Program();
}

// Every stage F seconds forward, B backward (I and W half each), `act` bytes held, transfers free.
PipelineCost UniformCost(const Shape& s, double f, double b, int64_t act = 1 << 20) {
  PipelineCost c;
  c.link = {0, 1e9};
  for (int i = 0; i < s.stages(); ++i) c.stages.push_back({f, b / 2, b / 2, act, act / 2, 0});
  return c;
}

// The tiny model's module table at seq 64, sharded over 2 ranks.
Graph TinySkeleton(const model::LlamaConfig& config) {
  LlamaShape shape;
  shape.config = config;
  shape.seq_len = 64;
  shape.dp_shard = 2;
  return LlamaSkeleton(shape);
}

// `text` parses, and Validate refuses it with a message containing `expected`.
void ExpectRefused(const std::string& text, const std::string& expected) {
  const Program p = Ok(Parse(text));
  const Status s = Validate(p);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
}

PipelineResult Sim(const Program& p, const PipelineCost& c) {
  auto r = SimulatePipeline(p, c);
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n" << Print(p);
  return r.ok() ? *r : PipelineResult();
}

TEST(PipelineSchedule, TextRoundTrips) {
  const std::string text =
      "pipeline pp=2 virtual=1 microbatches=2\n"
      "rank 0: F0@0 sa0@0 F1@0 sa1@0 rg0@0 B0@0 rg1@0 B1@0\n"
      "rank 1: ra0@1 F0@1 B0@1 sg0@1 ra1@1 F1@1 I1@1 sg1@1 W1@1\n";
  const Program p = Ok(Parse(text));
  EXPECT_EQ(Print(p), text);
  EXPECT_TRUE(Validate(p).ok()) << Validate(p).ToString();
}

TEST(PipelineSchedule, BadTextNamesTheLineAndToken) {
  auto bad = Parse("pipeline pp=2 virtual=1 microbatches=2\nrank 0: F0@0 X1@0\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("'X1@0'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(Parse("pipeline pp=0 virtual=1 microbatches=2\n").ok());
  EXPECT_FALSE(Parse("rank 0: F0@0\n").ok());
  auto order = Parse("pipeline pp=2 virtual=1 microbatches=1\nrank 1: F0@1\n");
  ASSERT_FALSE(order.ok());
  EXPECT_NE(order.status().message().find("'rank 0: <actions>'"), std::string::npos) << order.status().message();
}

// Every generator, over shapes from one stage to eight, is valid as written and lowered, and
// survives the text form.
TEST(PipelineSchedule, EveryGeneratorIsValidOverARangeOfShapes) {
  int checked = 0;
  for (ScheduleKind kind : AllSchedules()) {
    for (int pp : {1, 2, 3, 4, 8}) {
      for (int v : {1, 2, 3}) {
        for (int m : {1, 2, 3, 4, 6, 8, 16}) {
          const Shape shape{pp, v, m};
          auto p = Generate(kind, shape);
          if (!p.ok()) {
            EXPECT_EQ(p.status().code(), StatusCode::kInvalidConfig) << p.status().ToString();
            continue;
          }
          const std::string what = std::string(ScheduleName(kind)) + " pp " + std::to_string(pp) + " v " +
                                   std::to_string(v) + " m " + std::to_string(m);
          ASSERT_TRUE(Validate(*p).ok()) << what << ": " << Validate(*p).ToString() << "\n" << Print(*p);
          const Program lowered = Ok(Lower(*p));
          ASSERT_TRUE(Validate(lowered).ok()) << what << ": " << Validate(lowered).ToString();
          EXPECT_EQ(Ok(Parse(Print(lowered))), lowered) << what;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(PipelineSchedule, OneFOneBOrdersAsMegatronDoes) {
  const Program p = Ok(Generate(ScheduleKind::k1F1B, {3, 1, 4}));
  EXPECT_EQ(Print(p),
            "pipeline pp=3 virtual=1 microbatches=4\n"
            "rank 0: F0@0 F1@0 F2@0 B0@0 F3@0 B1@0 B2@0 B3@0\n"
            "rank 1: F0@1 F1@1 B0@1 F2@1 B1@1 F3@1 B2@1 B3@1\n"
            "rank 2: F0@2 B0@2 F1@2 B1@2 F2@2 B2@2 F3@2 B3@2\n");
}

TEST(PipelineSchedule, GeneratorsRefuseShapesTheyCannotRunNamingThem) {
  auto few = Generate(ScheduleKind::k1F1B, {4, 1, 2});
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(few.status().message().find("1f1b with pp 4"), std::string::npos) << few.status().message();
  EXPECT_NE(few.status().message().find("2 micro-batches"), std::string::npos) << few.status().message();
  auto groups = Generate(ScheduleKind::kInterleaved1F1B, {4, 2, 6});
  ASSERT_FALSE(groups.ok());
  EXPECT_NE(groups.status().message().find("multiple of pp"), std::string::npos) << groups.status().message();
  EXPECT_FALSE(Generate(ScheduleKind::kGPipe, {2, 2, 4}).ok()) << "GPipe has no virtual stages";
  EXPECT_FALSE(Generate(ScheduleKind::kInterleaved1F1B, {2, 1, 4}).ok()) << "one virtual stage: that is 1f1b";
  auto name = ParseScheduleKind("2f2b");
  ASSERT_FALSE(name.ok());
  EXPECT_NE(name.status().message().find("'2f2b'"), std::string::npos);
  EXPECT_NE(name.status().message().find("zb-h1"), std::string::npos);
  for (ScheduleKind k : AllSchedules()) EXPECT_EQ(*ParseScheduleKind(ScheduleName(k)), k);
}

TEST(PipelineSchedule, ValidateRefusesBrokenProgramsNamingTheAction) {
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: F0@0 B0@0\nrank 1: F0@1\n", "needs one backward B0@1");
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: F0@0 F0@0 B0@0\nrank 1: F0@1 B0@1\n", "appears twice");
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: F0@0 B0@0 F0@1\nrank 1: B0@1\n", "is on rank 1");
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: B0@0 F0@0\nrank 1: F0@1 B0@1\n",
          "rank 0's B0@0 needs F0@0 on rank 0, which does not come before it");
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: F0@0 I0@0 B0@0\nrank 1: F0@1 B0@1\n", "1 B, 1 I, 0 W");
  ExpectRefused("pipeline pp=1 virtual=1 microbatches=1\nrank 0: F0@0 W0@0 I0@0\n", "W0@0 needs I0@0");
  // Each rank waits for the other: rank 0's B0 for rank 1's, which waits behind F1@1, which waits
  // for rank 0's F1, behind B0.
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=2\n"
          "rank 0: F0@0 B0@0 F1@0 B1@0\n"
          "rank 1: F1@1 B1@1 F0@1 B0@1\n",
          "deadlocks");
  // Lowered: every crossing sent and received once.
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: F0@0 rg0@0 B0@0\nrank 1: ra0@1 F0@1 B0@1 sg0@1\n",
          "does not send its activation (sa0@0)");
  ExpectRefused("pipeline pp=2 virtual=1 microbatches=1\nrank 0: F0@0 sa0@0 rg0@0 B0@0 sg0@0\nrank 1: ra0@1 F0@1 B0@1 sg0@1\n",
          "no stage on another rank before stage 0");
  EXPECT_FALSE(Lower(Ok(Lower(Ok(Generate(ScheduleKind::kGPipe, {2, 1, 2}))))).ok()) << "lowered twice";
}

// FSDP's ops (compiled mode): each rank's units gathered at its start in use order, each unit's
// reduce-scatter right after its stage's last backward (and that backward's send), the later
// units first; a tied table's unit (reduced after the program) gets no rs.
TEST(PipelineSchedule, PlaceFsdpGathersFirstAndReducesAfterEachStagesLastBackward) {
  const Program lowered = Ok(Lower(Ok(Generate(ScheduleKind::k1F1B, {2, 1, 2}))));
  const Program placed = Ok(PlaceFsdp(lowered, {{{0, false}, {0, true}, {0, true}}, {{1, true}, {1, false}}}));
  EXPECT_EQ(Print(placed),
            "pipeline pp=2 virtual=1 microbatches=2\n"
            "rank 0: ag0@0 ag1@0 ag2@0 F0@0 sa0@0 F1@0 sa1@0 rg0@0 B0@0 rg1@0 B1@0 rs2@0 rs1@0\n"
            "rank 1: ag0@1 ag1@1 ra0@1 F0@1 B0@1 sg0@1 ra1@1 F1@1 B1@1 sg1@1 rs0@1\n");
  EXPECT_TRUE(Validate(placed).ok()) << Validate(placed).ToString();
  EXPECT_EQ(Ok(Parse(Print(placed))), placed);
  // Interleaved: a rank's second stage finishes its backwards first, so its units are reduced first.
  const Program interleaved = Ok(PlaceFsdp(Ok(Lower(Ok(Generate(ScheduleKind::kInterleaved1F1B, {2, 2, 2})))),
                                           {{{0, true}, {2, true}}, {{1, true}, {3, true}}}));
  ASSERT_TRUE(Validate(interleaved).ok()) << Validate(interleaved).ToString();
  const std::string rank0 = Print(interleaved).substr(Print(interleaved).find("rank 0:"));
  EXPECT_LT(rank0.find("rs1@2"), rank0.find("rs0@0")) << Print(interleaved);
  auto elsewhere = PlaceFsdp(lowered, {{{1, true}}, {}});
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_NE(elsewhere.status().message().find("rank 0's FSDP unit 0 is on stage 1"), std::string::npos)
      << elsewhere.status().message();
  EXPECT_FALSE(PlaceFsdp(placed, {{}, {}}).ok()) << "placed twice";
}

// Every synchronous generator's program, with a unit per stage and one more on the first, still
// validates once FSDP's ops are placed in it.
TEST(PipelineSchedule, PlacedFsdpValidatesForEverySynchronousSchedule) {
  int checked = 0;
  for (ScheduleKind kind : AllSchedules()) {
    if (kind == ScheduleKind::kPipeMare) continue;
    for (int pp : {1, 2, 3, 4}) {
      for (int v : {1, 2}) {
        for (int m : {1, 2, 4, 8}) {
          const Shape shape{pp, v, m};
          auto p = Generate(kind, shape);
          if (!p.ok()) continue;
          std::vector<std::vector<FsdpUnit>> units(static_cast<size_t>(pp));
          units[0].push_back({0, false});
          for (int st = 0; st < shape.stages(); ++st) units[static_cast<size_t>(shape.RankOf(st))].push_back({st, true});
          const Program placed = Ok(PlaceFsdp(Ok(Lower(*p)), units));
          ASSERT_TRUE(Validate(placed).ok()) << ScheduleName(kind) << " pp " << pp << " v " << v << " m " << m << ": "
                                             << Validate(placed).ToString() << "\n" << Print(placed);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 30);
  auto async = PlaceFsdp(Ok(Lower(Ok(Generate(ScheduleKind::kPipeMare, {2, 1, 4, 2})))), {{}, {}});
  ASSERT_FALSE(async.ok());
  EXPECT_NE(async.status().message().find("synchronous programs only"), std::string::npos) << async.status().message();
}

TEST(PipelineSchedule, ValidateRefusesMisplacedFsdpOps) {
  const std::string head = "pipeline pp=1 virtual=1 microbatches=2\n";
  ExpectRefused(head + "rank 0: F0@0 ag0@0 F1@0 B0@0 B1@0 rs0@0\n", "ag0@0 comes after F0@0, which uses it");
  ExpectRefused(head + "rank 0: ag0@0 F0@0 F1@0 B0@0 rs0@0 B1@0\n", "rs0@0 comes before B1@0, which still adds to its gradients");
  ExpectRefused(head + "rank 0: F0@0 F1@0 B0@0 B1@0 rs0@0\n", "reduce-scattered (rs0@0) but never gathered (no ag0@0)");
  ExpectRefused(head + "rank 0: ag0@0 ag0@0 F0@0 F1@0 B0@0 B1@0\n", "appears twice");
  ExpectRefused("pipeline pp=1 virtual=2 microbatches=2\nrank 0: ag0@0 ag0@1 F0@0 F0@1 B0@1 B0@0 F1@0 F1@1 B1@1 B1@0\n",
          "unit 0 is stage 0's elsewhere on the rank");
  ExpectRefused("pipeline pp=1 virtual=1 microbatches=2 per_update=1\n"
          "rank 0: ag0@0 F0@0 B0@0 U0@0 F1@0 B1@0 U1@0\n",
          "FSDP's ops in an asynchronous program");
  // Placed right: the ops only, in the same order.
  EXPECT_TRUE(Validate(Ok(Parse(head + "rank 0: ag0@0 F0@0 F1@0 B0@0 B1@0 rs0@0\n"))).ok());
  // A unit gathered and left to be reduced after the program (a tied table's).
  EXPECT_TRUE(Validate(Ok(Parse(head + "rank 0: ag0@0 F0@0 F1@0 B0@0 B1@0\n"))).ok());
}

// Equal stages, a free link: GPipe and 1F1B take (m + pp - 1) x (F + B); 1F1B holds pp - r
// micro-batches on rank r where GPipe holds all m; ZB-H1 takes 3m + 2(pp - 1) units for F = I = W
// = 1 at 1F1B's peaks; interleaving v stages a rank divides the bubble by v.
TEST(PipelineSchedule, SimulatedStepsMatchTheSchedulesClosedForms) {
  const int pp = 4, m = 8;
  const int64_t act = 1 << 20;
  const Shape one{pp, 1, m};
  const PipelineResult gpipe = Sim(Ok(Generate(ScheduleKind::kGPipe, one)), UniformCost(one, 1, 2, act));
  const PipelineResult f1b1 = Sim(Ok(Generate(ScheduleKind::k1F1B, one)), UniformCost(one, 1, 2, act));
  EXPECT_DOUBLE_EQ(gpipe.step_seconds, (m + pp - 1) * 3.0);
  EXPECT_DOUBLE_EQ(f1b1.step_seconds, (m + pp - 1) * 3.0);
  EXPECT_NEAR(f1b1.bubble_fraction, (pp - 1) * 3.0 / f1b1.step_seconds, 1e-12);
  for (int r = 0; r < pp; ++r) {
    EXPECT_EQ(gpipe.peak_bytes[r], m * act) << r;
    EXPECT_EQ(f1b1.peak_bytes[r], (pp - r) * act) << r;
  }
  const PipelineResult zb = Sim(Ok(Generate(ScheduleKind::kZeroBubbleH1, one)), UniformCost(one, 1, 2, act));
  EXPECT_DOUBLE_EQ(zb.step_seconds, 3.0 * m + 2.0 * (pp - 1));
  for (int r = 0; r < pp; ++r) EXPECT_LE(zb.peak_bytes[r], f1b1.peak_bytes[r]) << r;
  // The same model in twice the stages, each half the compute.
  const Shape two{pp, 2, m};
  const PipelineResult inter = Sim(Ok(Generate(ScheduleKind::kInterleaved1F1B, two)), UniformCost(two, 0.5, 1, act / 2));
  EXPECT_DOUBLE_EQ(inter.step_seconds, m * 3.0 + (pp - 1) * 3.0 / 2);
}

// The schedule's own bubble (what a TrainingJob's status shows): the idle share of the closed
// forms, (p - 1) / (v m + p - 1) for GPipe, 1F1B and interleaved 1F1B, and less for ZB-H1.
TEST(PipelineSchedule, EqualStagesGiveEachSchedulesOwnBubble) {
  for (const Shape& s : {Shape{2, 1, 4}, Shape{4, 1, 8}, Shape{3, 1, 5}}) {
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
      auto r = SimulateEqualStages(Ok(Generate(kind, s)));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_NEAR(r->bubble_fraction, (s.pp - 1.0) / (s.microbatches + s.pp - 1.0), 1e-12) << s.pp << " " << s.microbatches;
    }
    auto zb = SimulateEqualStages(Ok(Generate(ScheduleKind::kZeroBubbleH1, s)));
    ASSERT_TRUE(zb.ok()) << zb.status().ToString();
    EXPECT_LT(zb->bubble_fraction, (s.pp - 1.0) / (s.microbatches + s.pp - 1.0));
  }
  const Shape two{2, 2, 4};
  auto inter = SimulateEqualStages(Ok(Generate(ScheduleKind::kInterleaved1F1B, two)));
  ASSERT_TRUE(inter.ok()) << inter.status().ToString();
  EXPECT_NEAR(inter->bubble_fraction, 1.0 / 9.0, 1e-12);
}

// FSDP inside the stages moves each stage's parameters: the embedding with the first, the head
// (the tied table again) with the last, every other parameter on exactly one stage.
TEST(PipelineSchedule, StageParamsCountEachStagesParametersAndTheTiedTableTwice) {
  auto config = model::PresetConfig("tiny");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->tie_word_embeddings);
  const Graph g = TinySkeleton(*config);
  StagePartition cut;
  cut.first_layer = {0, 1, static_cast<int>(config->num_hidden_layers)};
  auto stages = StageParamsOf(g, cut);
  ASSERT_TRUE(stages.ok()) << stages.status().ToString();
  ASSERT_EQ(stages->size(), 2u);
  int64_t gathered = 0, grads = 0, shards = 0, table = 0;
  for (const ParamInfo& p : g.params) {
    gathered += p.gathered_bytes;
    grads += p.grad_bytes;
    shards += p.shard_bytes;
    if (p.name == "model.embed_tokens.weight") table = p.gathered_bytes;
  }
  ASSERT_GT(table, 0);
  EXPECT_EQ((*stages)[0].gathered_bytes + (*stages)[1].gathered_bytes, gathered + table);
  EXPECT_GT((*stages)[0].grad_bytes + (*stages)[1].grad_bytes, grads);
  EXPECT_GT((*stages)[0].shard_bytes + (*stages)[1].shard_bytes, shards);
  // The first stage is the table and one layer, the second the other layers and the table again.
  EXPECT_LT((*stages)[0].gathered_bytes, (*stages)[1].gathered_bytes);
  StagePartition wrong;
  wrong.first_layer = {0, 1, 2};
  auto refused = StageParamsOf(g, wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("but the model has 4"), std::string::npos) << refused.status().message();
}

// FSDP's groups inside the stages, as the trainer makes them: one per decoder layer at its place in
// its stage, the embedding's first on the first stage and the rest (the final norm, the tied head)
// last on the last; the tied table's two groups wait for the program's end.
TEST(PipelineSchedule, FsdpGroupsAreTheLayersTheEmbeddingAndTheRest) {
  auto config = model::PresetConfig("tiny");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->num_hidden_layers, 4);
  const Graph g = TinySkeleton(*config);
  CostModel cost;
  cost.dp_shard = 2;
  cost.shard_link = {1e-5, 1e9};
  StagePartition cut;
  cut.first_layer = {0, 1, 4};
  auto groups = FsdpGroupsOf(g, cut, cost);
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 6u);
  const std::vector<int> stage{0, 0, 1, 1, 1, 1};
  const std::vector<double> at{0, 0, 0, 1.0 / 3, 2.0 / 3, 1};
  for (size_t i = 0; i < groups->size(); ++i) {
    const FsdpGroup& group = (*groups)[i];
    EXPECT_EQ(group.stage, stage[i]) << "group " << i;
    EXPECT_DOUBLE_EQ(group.at, at[i]) << "group " << i;
    EXPECT_GT(group.gather_seconds, 0) << "group " << i;
    EXPECT_GT(group.scatter_seconds, 0) << "group " << i;
    EXPECT_EQ(group.after_program, i == 0 || i == 5) << "group " << i << ": only the tied table's wait";
  }
  StagePartition wrong;
  wrong.first_layer = {0, 1, 2};
  EXPECT_FALSE(FsdpGroupsOf(g, wrong, cost).ok());
}

// GPipe over 2 stages, 2 micro-batches, F and B 1 s each: rank 0 runs F 0-2 and B 4-6, rank 1 F 1-3
// and B 3-5. Its groups' gathers (one after another from 0) must be done where the first forward
// reaches them, else the rank starts that much later; a group's reduce-scatter starts when the
// last backward has passed it (the tied one's at the program's end), one at a time.
TEST(PipelineSchedule, FsdpOverlapsTheGroupsCollectivesWithTheProgram) {
  const Shape s{2, 1, 2};
  const Program p = Ok(Generate(ScheduleKind::kGPipe, s));
  const PipelineResult r = Sim(p, UniformCost(s, 1, 1));
  ASSERT_DOUBLE_EQ(r.step_seconds, 6);
  std::vector<FsdpGroup> groups(3);
  groups[0] = {0, 0, 0.5, 0.25, true};   // the embedding: needed at 0, gathered by 0.5
  groups[1] = {0, 0.5, 1.0, 1.0, false};  // a layer: needed at 0.5, gathered by 1.5
  groups[2] = {1, 1, 3.0, 0.5, true};     // the head: needed at 2 (rank 1's F0 1-2), gathered by 3
  const std::vector<RankFsdp> o = OverlapFsdp(p, r, groups);
  ASSERT_EQ(o.size(), 2u);
  EXPECT_DOUBLE_EQ(o[0].delay, 1.0);
  // The layer's scatter from 5.5 (halfway through B1 5-6) to 6.5, the embedding's from then, 6.75;
  // the whole 1 s later.
  EXPECT_DOUBLE_EQ(o[0].end, 7.75);
  EXPECT_DOUBLE_EQ(o[1].delay, 1.0);
  EXPECT_DOUBLE_EQ(o[1].end, 5 + 0.5 + 1.0);
  // Collectives that fit the compute cost nothing.
  for (FsdpGroup& g : groups) g.gather_seconds = g.scatter_seconds = 0.01;
  groups[0].after_program = groups[2].after_program = false;
  const std::vector<RankFsdp> hidden = OverlapFsdp(p, r, groups);
  EXPECT_DOUBLE_EQ(hidden[0].delay, 0.01) << "the first group's gather is always waited for";
  EXPECT_NEAR(hidden[0].end, 6.02, 1e-12) << "the embedding's scatter, last, after the program's end";
  EXPECT_DOUBLE_EQ(hidden[1].delay, 0);
  EXPECT_DOUBLE_EQ(hidden[1].end, 5);
}

TEST(PipelineSchedule, TransfersTakeTheLinksTime) {
  const Shape s{2, 1, 1};
  PipelineCost c = UniformCost(s, 1, 2);
  c.link = {0.25, 4.0 * (1 << 20)};  // 0.25 s + 1 MiB at 4 MiB/s: 0.5 s a transfer
  for (StageCost& stage : c.stages) stage.output_bytes = 1 << 20;
  const PipelineResult r = Sim(Ok(Generate(ScheduleKind::kGPipe, s)), c);
  // F0@0, its activation across, F0@1 and B0@1, the gradient back, B0@0.
  EXPECT_DOUBLE_EQ(r.step_seconds, 1 + 0.5 + 1 + 2 + 0.5 + 2);
}

// A gradient sent back is of the sending stage's input: the previous stage's output's size.
TEST(PipelineSchedule, AGradientIsTheSizeOfThePreviousStagesOutput) {
  const Shape s{3, 1, 1};
  PipelineCost c = UniformCost(s, 0, 0);
  c.link = {0, 100};  // 100 bytes a second
  c.stages[0].output_bytes = 100;
  const PipelineResult r = Sim(Ok(Generate(ScheduleKind::kGPipe, s)), c);
  EXPECT_DOUBLE_EQ(r.step_seconds, 2) << "stage 0's output forward and its gradient back, 1 s each";
}

TEST(PipelineSchedule, TimelineShowsWhatEachRankRuns) {
  const Shape s{2, 1, 2};
  const Program p = Ok(Generate(ScheduleKind::kGPipe, s));
  const PipelineResult r = Sim(p, UniformCost(s, 1, 1));
  ASSERT_DOUBLE_EQ(r.step_seconds, 6);
  const std::string t = Timeline(p, r, 6);
  EXPECT_NE(t.find("rank 0 |FF..BB|\nrank 1 |.FFBB.|\n"), std::string::npos) << t;
  EXPECT_NE(t.find("bubble 33.3%"), std::string::npos) << t;
  auto wrong = SimulatePipeline(p, UniformCost({3, 1, 2}, 1, 1));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidConfig);
}

// Stages balance compute, not layer counts: heavier ends (the embedding with the first layer, the
// head with the last) get fewer layers; among equally fast splits the smaller largest stage wins.
TEST(PipelineSchedule, StagesBalanceComputeThenMemory) {
  auto layers = [](std::vector<double> seconds, std::vector<int64_t> bytes) {
    std::vector<LayerCost> out;
    for (size_t i = 0; i < seconds.size(); ++i) out.push_back({seconds[i], bytes.empty() ? 0 : bytes[i]});
    return out;
  };
  auto uniform = PartitionLayers(layers({1, 1, 1, 1, 1, 1, 1, 1}, {}), 4);
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->first_layer, (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_DOUBLE_EQ(uniform->max_seconds, 2);
  auto ends = PartitionLayers(layers({3, 1, 1, 1, 1, 1, 1, 3}, {}), 3);
  ASSERT_TRUE(ends.ok());
  EXPECT_EQ(ends->first_layer, (std::vector<int>{0, 2, 6, 8}));
  EXPECT_DOUBLE_EQ(ends->max_seconds, 4);
  auto tie = PartitionLayers(layers({1, 0, 1}, {1, 5, 3}), 2);  // [1 | 0 1] and [1 0 | 1] both take 1 s
  ASSERT_TRUE(tie.ok());
  EXPECT_EQ(tie->first_layer, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(tie->max_bytes, 6);
  // The bytes decide only among splits as fast as the fastest: here the last layer alone sets the
  // beat (10 s), and of the splits within it [2 1 | 1 | 10] holds less than [2 | 1 1 | 10].
  auto within = PartitionLayers(layers({2, 1, 1, 10}, {1, 5, 5, 1}), 3);
  ASSERT_TRUE(within.ok());
  EXPECT_EQ(within->first_layer, (std::vector<int>{0, 2, 3, 4}));
  EXPECT_EQ(within->max_bytes, 6);
  EXPECT_DOUBLE_EQ(within->max_seconds, 10);
  auto few = PartitionLayers(layers({1, 1, 1}, {}), 4);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(few.status().message().find("3 decoder layers cannot fill 4 stages"), std::string::npos);
}

}  // namespace
}  // namespace meshwork::compiler::pipeline
