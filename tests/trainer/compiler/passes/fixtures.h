// What the compiler's pass tests share: the small model's naive program, a pass context on a
// slow or fast link, the pipeline with a bucketing, and the IR's op lines.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "tests/trainer/compiler/small_graph.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/passes/pass.h"
#include "trainer/compiler/passes/registry.h"
#include "trainer/compiler/plan_options.h"

namespace meshwork::compiler {

inline Graph Naive(bool reshard = true) {
  auto g = Parse(kSmallModel);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return BuildNaiveProgram(*g, {reshard});
}

inline PassContext Context(double latency = 0.001, double bandwidth = 1e6, int64_t budget = 0) {
  PassContext ctx;
  ctx.cost.dp_shard = 2;
  ctx.cost.shard_link = {latency, bandwidth};
  ctx.memory_budget_bytes = budget;
  return ctx;
}

// The pipeline with `bucketing`, the rest as PlanOptions' defaults.
inline Pipeline PipelineWith(Bucketing bucketing) {
  PlanOptions options;
  options.bucketing = bucketing;
  return Pipeline::For(options);
}

// The op lines only (the param and module table is unchanged by passes).
inline std::string Ops(const Graph& g) {
  std::string text = Print(g);
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("meshwork-ir", 0) == 0 || line.rfind("mesh ", 0) == 0 || line.rfind("param ", 0) == 0 ||
        line.rfind("module ", 0) == 0)
      continue;
    out += line + "\n";
  }
  return out;
}

inline Graph Ok(Result<Graph> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return Graph();
  EXPECT_TRUE(Validate(*r).ok()) << Validate(*r).ToString();
  return std::move(r).value();
}

// The small model with its two layers as checkpointing candidates, their activations large
// enough (50000) to make the peak, as in a real model (not a reduce-scatter's copy-in of a few
// thousand bytes). layers.0 keeps 1000 bytes (its input) when checkpointed; layers.1's input is
// as large as its activations, so checkpointing it saves nothing and costs its recompute.
inline Graph CheckpointableNaive() {
  Graph g = Naive();
  for (auto& m : g.modules) {
    if (m.name.rfind("layers.", 0) != 0) continue;
    m.activation_bytes = 50000;
    m.checkpoint_input_bytes = m.name == "layers.0" ? 1000 : 50000;
  }
  return g;
}

}  // namespace meshwork::compiler
