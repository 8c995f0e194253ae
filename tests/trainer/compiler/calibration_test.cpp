// The calibration file a compiled run writes (fsdp.calibration_out) and meshwork-simulate reads:
// what is printed parses back to the same calibration, and bad files are refused naming the line.
#include "trainer/compiler/calibration.h"

#include <gtest/gtest.h>

#include "tests/trainer/compiler/small_graph.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

Calibration Sample() {
  Calibration c;
  c.cost.dp_shard = 2;
  c.cost.shard_link = {0.00031, 1.0993e8};
  c.cost.shard_reduce_scatter_link = LinkCost{0.0007, 9.1e7};
  c.cost.replicate_link = {0, 1e9};
  c.cost.shard_lanes_share = 0.61;
  c.cost.interference = 0.137;
  c.cost.comm_interference = 0.021;
  c.cost.host_copy_bytes_per_second = 3.3e9;
  c.cost.step_overhead_seconds = 0.28;
  c.compute_scale = 1.0 / 3;  // needs all 17 digits
  c.eager_step_seconds = 6.449;
  auto g = Parse(kSmallModel);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  c.skeleton = *g;
  return c;
}

TEST(Calibration, PrintedParsesBackToTheSameCalibration) {
  const Calibration c = Sample();
  const std::string text = PrintCalibration(c);
  auto back = ParseCalibration(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(PrintCalibration(*back), text);
  EXPECT_EQ(back->compute_scale, c.compute_scale);
  ASSERT_TRUE(back->cost.shard_reduce_scatter_link.has_value());
  EXPECT_EQ(back->cost.shard_reduce_scatter_link->bus_bytes_per_second, 9.1e7);
  EXPECT_EQ(back->cost.comm_interference, 0.021);
  EXPECT_EQ(Print(back->skeleton), Print(c.skeleton));
  // Without a separate reduce-scatter link the line is left out, and stays out.
  Calibration one_link = c;
  one_link.cost.shard_reduce_scatter_link.reset();
  auto again = ParseCalibration(PrintCalibration(one_link));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->cost.shard_reduce_scatter_link.has_value());
}

TEST(Calibration, PlansFromTheFileAsFromTheRun) {
  // The same plans and the same predicted step as planning from the calibration's parts.
  const Calibration c = Sample();
  auto back = ParseCalibration(PrintCalibration(c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  PlanOptions options;
  options.budget = {MemoryBudget::Source::kEagerPeak, 0};
  auto want = PlanStep(ScaleCompute(c.skeleton, c.compute_scale), c.cost, options);
  auto got = PlanStep(ScaleCompute(back->skeleton, back->compute_scale), back->cost, options);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(Print(got->compiled), Print(want->compiled));
  EXPECT_EQ(Simulate(got->eager, got->ctx.cost).step_seconds, Simulate(want->eager, want->ctx.cost).step_seconds);
}

TEST(Calibration, ScaledLinksMoveBandwidthOnly) {
  const CostModel scaled = ScaleLinks(Sample().cost, 4);
  EXPECT_EQ(scaled.shard_link.bus_bytes_per_second, 4 * 1.0993e8);
  EXPECT_EQ(scaled.shard_link.latency_seconds, 0.00031);
  EXPECT_EQ(scaled.shard_reduce_scatter_link->bus_bytes_per_second, 4 * 9.1e7);
  EXPECT_EQ(scaled.replicate_link.bus_bytes_per_second, 4e9);
  EXPECT_EQ(scaled.interference, 0.137);
}

// A skeleton whose modules exchange over tp (a trainer's compiled TP plan on the host clock)
// comes with its tp link; the link is scaled with the others, and a file without it, or with it
// beside a skeleton without exchanges, is refused.
TEST(Calibration, TensorParallelExchangesComeWithTheTpLink) {
  Calibration c = Sample();
  c.skeleton.tp = 2;
  c.skeleton.modules[1].tp_fwd = {1 << 20, 2};
  c.skeleton.modules[1].tp_bwd = {1 << 20, 2};
  c.skeleton.modules[1].tp_gemm_share = 0.6;
  c.cost.tp = 2;
  c.cost.tp_link = {2.5e-5, 4.75e8};
  const std::string text = PrintCalibration(c);
  EXPECT_NE(text.find("\ntp_link "), std::string::npos) << text;
  auto back = ParseCalibration(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(PrintCalibration(*back), text);
  EXPECT_EQ(back->cost.tp, 2);
  EXPECT_EQ(back->cost.tp_link.bus_bytes_per_second, 4.75e8);
  EXPECT_EQ(ScaleLinks(back->cost, 2).tp_link.bus_bytes_per_second, 9.5e8);
  EXPECT_EQ(ScaleLinks(back->cost, 2).tp_link.latency_seconds, 2.5e-5);

  std::string bad = text;
  bad.erase(bad.find("tp_link"), bad.find('\n', bad.find("tp_link")) - bad.find("tp_link") + 1);
  auto missing = ParseCalibration(bad);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no 'tp_link' line"), std::string::npos) << missing.status().message();
  const std::string plain = PrintCalibration(Sample());
  bad = plain;
  bad.insert(bad.find("shard_lanes_share"), "tp_link 0 1e9\n");
  auto stray = ParseCalibration(bad);
  ASSERT_FALSE(stray.ok());
  EXPECT_NE(stray.status().message().find("no module of the skeleton exchanges over tp"), std::string::npos);
}

TEST(Calibration, BadFilesAreRefusedNamingTheLine) {
  const std::string good = PrintCalibration(Sample());
  auto refused = [](const std::string& text) {
    auto c = ParseCalibration(text);
    EXPECT_FALSE(c.ok()) << text;
    return c.ok() ? std::string() : c.status().message();
  };
  EXPECT_NE(refused("meshwork-ir 1\n").find("not a calibration file"), std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("interference 0.137"), 18, "interference fast");
  EXPECT_NE(refused(bad).find("line 7"), std::string::npos) << refused(bad);
  bad = good;
  bad.replace(bad.find("compute_scale"), 13, "compute_scales");
  EXPECT_NE(refused(bad).find("unknown key 'compute_scales'"), std::string::npos);
  bad = good;
  bad.erase(bad.find("skeleton"));
  EXPECT_NE(refused(bad).find("no 'skeleton' line"), std::string::npos);
  bad = good;
  bad.replace(bad.find("mesh 2 1"), 8, "mesh 4 1");
  EXPECT_NE(refused(bad).find("the skeleton's mesh"), std::string::npos);
  bad = good;
  bad.replace(bad.find("shard_link 0.00031"), 18, "shard_link -1");
  EXPECT_NE(refused(bad).find("line 3: a link is latency >= 0"), std::string::npos) << refused(bad);
}

}  // namespace
}  // namespace meshwork::compiler
