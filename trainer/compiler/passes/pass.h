// What a compiler pass is: a named step from one program to the next, run by the pipeline
// (passes/registry.h), which validates the program after every pass and can print it.
//
// Two kinds. A schedule pass (`run`) changes when things happen, and what is held, and so the
// step's time and peak, never what is computed or communicated in total: bucketing, order,
// checkpointing, frees. A choice pass (`choose`) changes what is communicated (an algorithm
// change: the embedding read by rows, the head split by vocabulary): it offers alternatives of
// the front end's program, the pipeline plans each with the schedule passes, and keeps the one
// that fits the memory budget, then the fastest. Choice passes run first, on the naive program.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/cost_model.h"
#include "trainer/compiler/ir.h"

namespace meshwork::compiler {

// What every pass sees: the cluster (the cost model) and the memory it may plan within. Each
// pass's own options are its function's parameters, bound by the registry from PlanOptions.
struct PassContext {
  CostModel cost;
  int64_t memory_budget_bytes = 0;  // dynamic bytes (gathered + activations + grads); 0 = none
};

// One program a choice pass offers, with the clauses the plan summary says about it.
struct Alternative {
  Graph program;
  std::string kept;     // when it is kept: "the embedding is read by rows"
  std::string instead;  // when another is kept: "reading it by rows"
  std::string beside;   // beside the one kept: "with the table gathered whole"
};

struct Choice {
  // [0] is the program as it came in; an alternative whose program equals it is pointless.
  std::vector<Alternative> alternatives;
  bool forced = false;  // the last alternative is kept whatever the comparison says (kAlways)
  std::string note;     // with a single alternative: why nothing else was offered (may be empty)
};

struct Pass {
  std::string name;
  bool optional = true;  // can be disabled by name; required passes cannot
  std::function<Result<Graph>(const Graph&, const PassContext&)> run;      // a schedule pass, or
  std::function<Result<Choice>(const Graph&, const PassContext&)> choose;  // a choice pass
};

}  // namespace meshwork::compiler
