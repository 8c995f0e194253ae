// The whole-plan search (plan_search.h): the checkpointing dynamic programme against every subset,
// the search against scoring every plan, its invariants, pins and refusals.
#include "trainer/compiler/plan_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "trainer/config/config.h"
#include "trainer/model/llama_config.h"

namespace meshwork::compiler {
namespace {

using ::testing::HasSubstr;

// The least recompute over every subset of layers to checkpoint that fits, or -1 when none does.
double BruteForce(const std::vector<LayerMemory>& layers, int64_t budget) {
  const size_t n = layers.size();
  double best = -1;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    int64_t held = 0;
    double recompute = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool ckpt = mask & (1u << i);
      held += ckpt ? layers[i].checkpoint_bytes : layers[i].keep_bytes;
      recompute += ckpt ? layers[i].recompute_seconds : 0;
    }
    if (held <= budget && (best < 0 || recompute < best)) best = recompute;
  }
  return best;
}

TEST(ChooseCheckpointing, EqualsEveryCombinationOnSmallInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 9;
    std::vector<LayerMemory> layers(n);
    int64_t all_kept = 0;
    for (LayerMemory& l : layers) {
      l.checkpoint_bytes = rng() % 20;
      l.keep_bytes = l.checkpoint_bytes + rng() % 60;  // sometimes saves nothing
      l.recompute_seconds = 0.1 + (rng() % 100) / 10.0;
      all_kept += l.keep_bytes;
    }
    const int64_t budget = static_cast<int64_t>(rng() % (all_kept + 20));
    // Budgets this small make one byte a step: the programme is exact.
    const CheckpointChoice c = ChooseCheckpointing(layers, budget, 1 << 16);
    const double want = BruteForce(layers, budget);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", budget " + std::to_string(budget));
    ASSERT_EQ(c.fits, want >= 0);
    ASSERT_EQ(c.checkpointed.size(), n);
    int64_t held = 0;
    double recompute = 0;
    for (size_t i = 0; i < n; ++i) {
      held += c.checkpointed[i] ? layers[i].checkpoint_bytes : layers[i].keep_bytes;
      recompute += c.checkpointed[i] ? layers[i].recompute_seconds : 0;
      if (layers[i].keep_bytes == layers[i].checkpoint_bytes) {
        EXPECT_FALSE(c.checkpointed[i]) << "saves nothing";
      }
    }
    EXPECT_EQ(held, c.held_bytes);
    EXPECT_NEAR(recompute, c.recompute_seconds, 1e-9);
    if (c.fits) {
      EXPECT_LE(held, budget);
      EXPECT_NEAR(c.recompute_seconds, want, 1e-9);
    }
  }
}

TEST(ChooseCheckpointing, CoarseStepsStillFitAndCostNoLessThanTheOptimum) {
  std::vector<LayerMemory> layers(40, LayerMemory{1000003, 10007, 1.0});
  layers[3].recompute_seconds = 5;  // the dearest to recompute: kept whole first
  const int64_t budget = 12 * 1000003;
  const CheckpointChoice c = ChooseCheckpointing(layers, budget, 64);
  ASSERT_TRUE(c.fits);
  EXPECT_LE(c.held_bytes, budget);
  EXPECT_FALSE(c.checkpointed[3]);
  // The optimum keeps 11 layers whole (29 recomputed); steps of 1/64 of the room may keep one fewer.
  EXPECT_GE(c.recompute_seconds, 29.0 - 1e-9);
  EXPECT_LE(c.recompute_seconds, 30.0 + 1e-9);
}

// Nodes of 4 devices: NVLink-like inside, a slower link between nodes.
HardwareProfile FourPerNode(int64_t memory_bytes) {
  HardwareProfile p;
  p.name = "test-4";
  p.peak_flops_per_second = 1e14;
  p.achieved_mfu = 0.4;
  p.memory_bytes = memory_bytes;
  p.gpus_per_node = 4;
  p.intra_node = {10e-6, 100e9};
  p.has_inter_node = true;
  p.inter_node = {50e-6, 5e9};
  return p;
}

SearchSpec Small() {
  SearchSpec s;
  s.config = *model::PresetConfig("llama-100m");
  s.seq_len = 512;
  s.global_batch = 16;
  s.gpus = 8;
  return s;
}

void ExpectRunnable(const PlanCandidate& c, const SearchSpec& spec, const HardwareProfile& profile) {
  const ParallelPlan& p = c.plan;
  SCOPED_TRACE(Describe(p));
  EXPECT_EQ(p.dp_replicate * p.dp_shard * p.tp * p.pp, spec.gpus);
  EXPECT_TRUE(model::WhyNotSplittable(spec.config, p.tp).empty());
  EXPECT_EQ(profile.gpus_per_node % p.tp, 0) << "tp within a node";
  EXPECT_LE(p.pp * p.virtual_stages, spec.config.num_hidden_layers);
  if (p.pp == 1) {
    EXPECT_EQ(p.microbatch * p.dp_replicate * p.dp_shard, spec.global_batch);
  } else {
    EXPECT_EQ(p.microbatch * p.microbatches * p.dp_replicate * p.dp_shard, spec.global_batch);
    EXPECT_NE(p.schedule, pipeline::ScheduleKind::kPipeMare);
  }
  ASSERT_TRUE(c.simulated.has_value());
  EXPECT_LE(c.simulated->peak_bytes, profile.memory_bytes);
  EXPECT_GT(c.simulated->step_seconds, 0);
}

// The pruned search (the best estimates scored) chooses what scoring every plan that fits
// chooses, under the same simulator.
TEST(SearchPlans, ChoosesWhatScoringEveryPlanChooses) {
  for (int64_t memory_gib : {80, 3}) {
    SCOPED_TRACE("memory " + std::to_string(memory_gib) + " GiB");
    const HardwareProfile profile = FourPerNode(memory_gib << 30);
    const SearchSpec spec = Small();
    auto searched = SearchPlans(profile, spec);
    ASSERT_TRUE(searched.ok()) << searched.status().ToString();
    SearchSpec all = spec;
    all.exhaustive = true;
    auto exhaustive = SearchPlans(profile, all);
    ASSERT_TRUE(exhaustive.ok()) << exhaustive.status().ToString();
    EXPECT_EQ(Describe(searched->chosen().plan), Describe(exhaustive->chosen().plan));
    EXPECT_DOUBLE_EQ(searched->chosen().simulated->step_seconds, exhaustive->chosen().simulated->step_seconds);
    EXPECT_EQ(searched->enumerated, exhaustive->enumerated);
    EXPECT_LT(searched->finalists.size(), exhaustive->finalists.size());
    for (const PlanCandidate& c : exhaustive->finalists) ExpectRunnable(c, spec, profile);
    for (size_t i = 1; i < exhaustive->finalists.size(); ++i) {
      EXPECT_LE(exhaustive->finalists[i - 1].simulated->step_seconds, exhaustive->finalists[i].simulated->step_seconds);
    }
    for (const PlanCandidate& c : exhaustive->rejected) EXPECT_FALSE(c.rejected.empty()) << Describe(c.plan);
  }
}

// Every plan the search scores is one the trainer accepts: its config keys load and validate, and
// the global batch splits at its world size as the plan says.
TEST(SearchPlans, EveryScoredPlanIsATrainerConfigThatValidates) {
  for (int64_t memory_gib : {80, 3}) {
    const HardwareProfile profile = FourPerNode(memory_gib << 30);
    SearchSpec spec = Small();
    spec.exhaustive = true;
    auto searched = SearchPlans(profile, spec);
    ASSERT_TRUE(searched.ok()) << searched.status().ToString();
    for (const PlanCandidate& c : searched->finalists) {
      const std::string yaml = "model: {preset: llama-100m}\n" + PlanConfigYaml(c.plan, spec.seq_len, spec.global_batch);
      SCOPED_TRACE(Describe(c.plan) + "\n" + yaml);
      auto config = config::LoadConfigFromString(yaml, {});
      ASSERT_TRUE(config.ok()) << config.status().ToString();
      auto split = config::ResolveGlobalBatch(*config, spec.gpus);
      ASSERT_TRUE(split.ok()) << split.status().ToString();
      EXPECT_EQ(config->data.batch_size, c.plan.microbatch);
      EXPECT_EQ(config->training.grad_accum, c.plan.pp > 1 ? c.plan.microbatches : 1);
      EXPECT_EQ(config->mesh.tp, c.plan.tp);
      EXPECT_EQ(config->mesh.pp, c.plan.pp);
    }
  }
}

TEST(SearchPlans, PinsAreKeptAndRulesNamed) {
  const HardwareProfile profile = FourPerNode(int64_t{80} << 30);
  SearchSpec spec = Small();
  spec.tp = 2;
  spec.pp = 2;
  auto pinned = SearchPlans(profile, spec);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  for (const PlanCandidate& c : pinned->finalists) {
    EXPECT_EQ(c.plan.tp, 2);
    EXPECT_EQ(c.plan.pp, 2);
  }
  // A tp group across nodes, and one that does not divide the heads, pruned with the rule.
  spec = Small();
  spec.gpus = 16;
  spec.global_batch = 32;
  auto wide = SearchPlans(profile, spec);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  for (const PlanCandidate& c : wide->finalists) EXPECT_LE(c.plan.tp, 4);
}

TEST(SearchPlans, RefusalsNameTheValue) {
  const HardwareProfile profile = FourPerNode(int64_t{80} << 30);
  SearchSpec spec = Small();
  spec.gpus = 0;
  EXPECT_THAT(SearchPlans(profile, spec).status().message(), HasSubstr("gpus: 0"));
  spec = Small();
  spec.global_batch = 0;
  EXPECT_THAT(SearchPlans(profile, spec).status().message(), HasSubstr("global batch: 0"));
  spec = Small();
  spec.tp = 3;
  auto bad_tp = SearchPlans(profile, spec);
  EXPECT_EQ(bad_tp.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(bad_tp.status().message(), HasSubstr("tp 3"));
  spec = Small();
  spec.tp = 4;  // wider than a node of 2
  HardwareProfile two = profile;
  two.gpus_per_node = 2;
  EXPECT_THAT(SearchPlans(two, spec).status().message(), HasSubstr("tp 4: a tp group must be within one node of 2"));
  spec = Small();
  spec.pp = 64;
  EXPECT_THAT(SearchPlans(profile, spec).status().message(), HasSubstr("pp 64"));
  // A model no plan of these GPUs holds: the closest named, with what it needs.
  spec = Small();
  spec.config = *model::PresetConfig("llama3-8b");
  spec.gpus = 2;
  spec.global_batch = 2;
  auto none = SearchPlans(FourPerNode(int64_t{4} << 30), spec);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(none.status().message(), HasSubstr("no plan of 2 GPUs fits 4.0 GiB"));
  EXPECT_THAT(none.status().message(), HasSubstr("the closest, tp"));
}

}  // namespace
}  // namespace meshwork::compiler
