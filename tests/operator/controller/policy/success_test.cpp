// Every rank exited 0 (success.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/controller/trainer_report.h"
#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(SuccessTest, NoOpinionUntilEveryRankOfTheGangSucceeded) {
  EXPECT_FALSE(Success(State(Job(), {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Running")}).Get()).has_value());
  EXPECT_FALSE(Success(State(Job(), {Pod(0, 0, "Succeeded", 0)}).Get()).has_value());  // one missing
  EXPECT_FALSE(Success(State(Job(), {Pod(0, 7, "Succeeded", 0), Pod(1, 7, "Succeeded", 0)}).Get()).has_value());
}

TEST(SuccessTest, Rank0IsEnoughWithSuccessPolicyRank0) {
  const json rank0 = {{"runPolicy", {{"successPolicy", "Rank0"}}}};
  EXPECT_FALSE(Success(State(Job(rank0), {Pod(0, 0, "Running"), Pod(1, 0, "Succeeded", 0)}).Get()).has_value());
  EXPECT_FALSE(Success(State(Job(rank0), {Pod(0, 7, "Succeeded", 0), Pod(1, 0, "Running")}).Get()).has_value());
  // Rank 0 done: the job succeeded, whatever the others are doing; cleanPodPolicy Running stops them.
  for (const char* other : {"Running", "Failed"}) {
    State s(Job(rank0), {Pod(0, 0, "Succeeded", 0), Pod(1, 0, other, std::string(other) == "Failed" ? std::optional<int>(1) : std::nullopt)});
    const auto d = Success(s.Get());
    ASSERT_TRUE(d.has_value()) << other;
    EXPECT_EQ(ReasonOf(*d, "Succeeded"), "Rank0Succeeded");
    EXPECT_EQ(d->events.at(0).message, "pod tiny-0 (rank 0) exited 0; successPolicy is Rank0");
    EXPECT_EQ(Names(d->remove), std::string(other) == "Running" ? std::vector<std::string>{"tiny-1"}
                                                                 : std::vector<std::string>{})
        << other;
  }
}

TEST(SuccessTest, EndsTheJobAndCleanPodPolicyApplies) {
  for (const auto& [clean, removed] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"Running", {}}, {"All", {"tiny-0", "tiny-1"}}}) {
    State s(Job({{"runPolicy", {{"cleanPodPolicy", clean}}}}), {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Succeeded", 0)});
    const auto d = Success(s.Get());
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->phase, "Succeeded");
    EXPECT_EQ(ReasonOf(*d, "Succeeded"), "AllRanksSucceeded");
    EXPECT_EQ(d->events.at(0).message, "all 2 ranks in 2 pod(s) exited 0");
    EXPECT_EQ(Names(d->remove), removed) << clean;
    EXPECT_TRUE(d->status_first);
    EXPECT_FALSE(d->status.contains("trainer"));  // nothing was ever reported
  }
}

TEST(SuccessTest, TheReportIsCompletedFromRankZerosFinalLine) {
  struct Case {
    std::string name;
    std::optional<TrainerReport> scraped;
    json previous;  // status.trainer before
    std::optional<FinalReport> final_line;
    json want;  // status.trainer after, updateTime aside
  };
  const std::vector<Case> cases = {
      {"scraped, with a final line", TrainerReport{290, 300, 2.5, 4000, "", std::nullopt}, json(), FinalReport{2.123456, 7777.77},
       {{"step", 300}, {"totalSteps", 300}, {"loss", 2.1235}, {"tokensPerSecond", 7777.8}, {"percent", 100.0},
        {"progress", "100.0%"}}},
      {"scraped, no final line", TrainerReport{290, 300, 2.5, 4000, "", std::nullopt}, json(), std::nullopt,
       {{"step", 300}, {"totalSteps", 300}, {"loss", 2.5}, {"tokensPerSecond", 8000.0}, {"percent", 100.0},
        {"progress", "100.0%"}}},
      {"an earlier scrape only", std::nullopt, {{"step", 10}, {"totalSteps", 0}, {"loss", 3.0}}, FinalReport{2.0, 10},
       {{"step", 10}, {"totalSteps", 0}, {"loss", 2.0}, {"tokensPerSecond", 10.0}}},
  };
  for (const auto& c : cases) {
    json status = json::object();
    if (!c.previous.is_null()) status["trainer"] = c.previous;
    State s(Job({}, status), {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Succeeded", 0)});
    s.in().report = c.scraped;
    int reads = 0;
    s.in().final_report = [&] {
      ++reads;
      return c.final_line;
    };
    const auto d = Success(s.Get());
    ASSERT_TRUE(d.has_value()) << c.name;
    json trainer = d->status.at("trainer");
    trainer.erase("updateTime");
    EXPECT_EQ(trainer, c.want) << c.name;
    EXPECT_EQ(reads, 1) << c.name;
  }
}

// A run that ended between two scrapes (a short job): rank 0's last log line fills the status;
// without one (not meshwork-train, or logs gone) there is none.
TEST(SuccessTest, WithNothingScrapedTheFinalLineFillsTheStatus) {
  State s(Job(), {Pod(0, 0, "Succeeded", 0), Pod(1, 0, "Succeeded", 0)});
  s.in().final_report = [] { return std::optional<FinalReport>(FinalReport{2.345678, 1234.56, 20}); };
  auto d = Success(s.Get());
  ASSERT_TRUE(d.has_value());
  json trainer = d->status.at("trainer");
  trainer.erase("updateTime");
  EXPECT_EQ(trainer, json::parse(R"({"step": 20, "totalSteps": 20, "loss": 2.3457, "tokensPerSecond": 1234.6,
                                    "percent": 100.0, "progress": "100.0%"})"));
  EXPECT_THAT(Reasons(d->events), ElementsAre("AllRanksSucceeded"));
  EXPECT_THAT(d->create, IsEmpty());
  s.in().final_report = [] { return std::optional<FinalReport>(); };
  d = Success(s.Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(d->status.contains("trainer"));
}

TEST(ParseFinalLineTest, StepsAndTheStepItResumedAt) {
  auto r = ParseFinalLine("step 20/20 | ...\ndone: 20 steps, 5120 tokens in 3.1 s | final loss 2.5000 | 1650 tok/s | mfu 1.0%\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->last_step, 20);
  EXPECT_DOUBLE_EQ(r->loss, 2.5);
  r = ParseFinalLine("done: 5 steps (resumed at step 15), 1280 tokens in 1.0 s | final loss 2.1000 | 1280 tok/s | mfu 1%");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->last_step, 20);
}

}  // namespace
}  // namespace meshwork::op::policy
