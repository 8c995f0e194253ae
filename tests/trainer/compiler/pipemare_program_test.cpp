// PipeMare as a program of the schedule compiler (trainer/compiler/pipeline): its stream over a
// range of shapes validates with every stage's updates in place and the delays of its closed form;
// the steps the trainer runs (SplitIntoSteps), laid end to end with a drain, are the stream itself;
// Validate refuses updates out of place; the steady step's bubble between the steps' barriers is
// below 1F1B's at the same micro-batches.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/pipeline/simulate.h"
#include "trainer/compiler/pipeline/steps.h"

namespace meshwork::compiler::pipeline {
namespace {

Program Ok(Result<Program> p) {
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : Program();
}

Shape Stream(int pp, int per_update, int minibatches) {
  Shape s{pp, 1, per_update * minibatches};
  s.per_update = per_update;
  return s;
}

TEST(PipeMareProgram, StreamsValidateWithEveryStagesUpdates) {
  int checked = 0;
  for (int pp : {1, 2, 3, 4, 6}) {
    for (int n : {1, 2, 3, 4}) {
      for (int minibatches : {1, 2, 5}) {
        const Program p = Ok(Generate(ScheduleKind::kPipeMare, Stream(pp, n, minibatches)));
        const std::string what = "pp " + std::to_string(pp) + " n " + std::to_string(n) + " x " + std::to_string(minibatches);
        ASSERT_TRUE(Validate(p).ok()) << what << ": " << Validate(p).ToString() << "\n" << Print(p);
        const Program lowered = Ok(Lower(p));
        ASSERT_TRUE(Validate(lowered).ok()) << what << ": " << Validate(lowered).ToString();
        EXPECT_EQ(Ok(Parse(Print(lowered))), lowered) << what;
        for (const auto& list : p.ranks) {
          int updates = 0;
          for (const Action& a : list) updates += a.kind == ActionKind::kUpdate;
          EXPECT_EQ(updates, minibatches) << what;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 60);
}

TEST(PipeMareProgram, UpdatesFollowEachMinibatchsLastBackward) {
  EXPECT_EQ(Print(Ok(Generate(ScheduleKind::kPipeMare, Stream(2, 2, 2)))),
            "pipeline pp=2 virtual=1 microbatches=4 per_update=2\n"
            "rank 0: F0@0 F1@0 B0@0 F2@0 B1@0 U0@0 F3@0 B2@0 B3@0 U1@0\n"
            "rank 1: F0@1 B0@1 F1@1 B1@1 U0@1 F2@1 B2@1 F3@1 B3@1 U1@1\n");
}

TEST(PipeMareProgram, TheShapeIsChecked) {
  auto none = Generate(ScheduleKind::kPipeMare, {2, 1, 4});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(none.status().message().find("per_update 0"), std::string::npos) << none.status().message();
  EXPECT_TRUE(Generate(ScheduleKind::kPipeMare, Stream(2, 3, 1)).ok()) << "fewer micro-batches than stages run";
  Shape ragged = Stream(2, 3, 1);
  ragged.microbatches = 4;
  EXPECT_FALSE(Generate(ScheduleKind::kPipeMare, ragged).ok());
  auto sync = Generate(ScheduleKind::k1F1B, Stream(2, 2, 2));
  ASSERT_FALSE(sync.ok());
  EXPECT_NE(sync.status().message().find("synchronous"), std::string::npos) << sync.status().message();
  EXPECT_EQ(*ParseScheduleKind("pipemare"), ScheduleKind::kPipeMare);
}

TEST(PipeMareProgram, ValidateRefusesUpdatesOutOfPlace) {
  // The update before its minibatch's last backward: that gradient would be stepped late.
  auto early = Parse("pipeline pp=1 virtual=1 microbatches=2 per_update=2\nrank 0: F0@0 B0@0 U0@0 F1@0 B1@0\n");
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  Status s = Validate(*early);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("B1@0 runs after the update of minibatch 0"), std::string::npos) << s.message();
  auto missing = Parse("pipeline pp=1 virtual=1 microbatches=2 per_update=1\nrank 0: F0@0 B0@0 U0@0 F1@0 B1@0\n");
  ASSERT_TRUE(missing.ok());
  s = Validate(*missing);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no update U1@0"), std::string::npos) << s.message();
  auto sync = Parse("pipeline pp=1 virtual=1 microbatches=1\nrank 0: F0@0 B0@0 U0@0\n");
  ASSERT_TRUE(sync.ok());
  s = Validate(*sync);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("an update in a synchronous program"), std::string::npos) << s.message();
  EXPECT_FALSE(Parse("pipeline pp=1 virtual=1 microbatches=2 per_update=0\n").ok());
}

// The trainer's steps from a start: filling, then steady ones, then a drain. Laid end to end
// (numbered back from the step's to the stream's) they must be the stream of that many minibatches.
TEST(PipeMareProgram, StepsEndToEndAreTheStream) {
  for (int pp : {1, 2, 3, 4, 5}) {
    for (int n : {1, 2, 3}) {
      auto steps = SplitIntoSteps({pp, 1, n, n});
      ASSERT_TRUE(steps.ok()) << steps.status().ToString();
      EXPECT_EQ(static_cast<int>(steps->filling.size()), (pp - 1 + n - 1) / n);
      for (int s = 0; s < pp; ++s) {
        EXPECT_EQ(steps->max_delay[s], (pp - 1 - s + n - 1) / n) << "pp " << pp << " n " << n << " stage " << s;
      }
      for (int total = 1; total <= 6; ++total) {
        const Program stream = Ok(Lower(Ok(Generate(ScheduleKind::kPipeMare, Stream(pp, n, total)))));
        std::vector<std::vector<Action>> joined(pp);
        auto append = [&](const Program& step, int k) {
          for (int r = 0; r < pp; ++r) {
            for (Action a : step.ranks[r]) {
              a.microbatch += a.kind == ActionKind::kUpdate ? k : k * n;
              joined[r].push_back(a);
            }
          }
        };
        for (int k = 0; k < total; ++k) append(steps->Step(k), k);
        append(steps->Drain(total - 1), total);
        EXPECT_EQ(joined, stream.ranks) << "pp " << pp << " n " << n << ", " << total << " steps\n" << Print(stream);
      }
    }
  }
}

TEST(PipeMareProgram, TheSteadyStepsBubbleIsBelow1F1Bs) {
  // pp 2, 2 micro-batches: 1F1B idles (pp - 1) / (m + pp - 1) = 1/3 of the ranks' time; PipeMare's
  // steady step only its last rank's wait for the step's first activation (one forward of the 7
  // time units a step lasts: F 1, B 2, three micro-batch-units of work and one of waiting).
  auto pipemare = ScheduleBubble(Ok(Generate(ScheduleKind::kPipeMare, Stream(2, 2, 3))));
  ASSERT_TRUE(pipemare.ok()) << pipemare.status().ToString();
  EXPECT_NEAR(*pipemare, 1.0 / 7, 1e-9);
  auto one_f_one_b = ScheduleBubble(Ok(Generate(ScheduleKind::k1F1B, {2, 1, 2})));
  ASSERT_TRUE(one_f_one_b.ok());
  EXPECT_NEAR(*one_f_one_b, 1.0 / 3, 1e-9);
  // The closed form: idle per unit of compute (p - 1) / (3 m), a third of 1F1B's (p - 1) / m. Each
  // step the last rank waits for the step's first activation through the p - 1 stages before it
  // (a forward, a third of a micro-batch's forward and backward, each) and nothing else.
  for (int pp : {2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      const double async = *ScheduleBubble(Ok(Generate(ScheduleKind::kPipeMare, Stream(pp, m, 3))));
      EXPECT_NEAR(async / (1 - async), (pp - 1) / (3.0 * m), 1e-9) << "pp " << pp << " m " << m;
      if (m < pp) continue;
      const double sync = *ScheduleBubble(Ok(Generate(ScheduleKind::k1F1B, {pp, 1, m})));
      EXPECT_NEAR(sync / (1 - sync), (pp - 1) / static_cast<double>(m), 1e-9) << "pp " << pp << " m " << m;
    }
  }
  // One micro-batch a step: 1F1B cannot run it at all; PipeMare keeps every rank busy but for the
  // fill of the step's one micro-batch.
  EXPECT_FALSE(Generate(ScheduleKind::k1F1B, {4, 1, 1}).ok());
  auto single = ScheduleBubble(Ok(Generate(ScheduleKind::kPipeMare, Stream(4, 1, 5))));
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_LT(*single, 0.6);
}

}  // namespace
}  // namespace meshwork::compiler::pipeline
