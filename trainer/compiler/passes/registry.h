// The pass registry and the pipeline: every pass the compiler has, by name, in the order they
// run, each given its own options from PlanOptions here and nowhere else; a pipeline runs them,
// validating the program after each, and can print the IR after each (--dump-plan).
//
//   embedding_rows, vocab_split      choice passes (passes/pass.h): algorithm changes, each
//                                    planned both ways by the schedule passes below
//   async_tp                         passes/async_tp.h
//   checkpoint                       passes/checkpoint.h
//   keep_gathered                    passes/keep_gathered.h
//   bucket_all_gathers               passes/bucket.h
//   bucket_reduce_scatters           passes/bucket.h
//   reorder                          passes/reorder.h
//   insert_frees (required)          passes/insert_frees.h
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/pass.h"
#include "trainer/compiler/plan_options.h"

namespace meshwork::compiler {

class Pipeline {
 public:
  // Every registered pass, in order, with its options from `options`; the passes `options`
  // turns off (reorder false, async_tp false, read_by_rows or split_by_vocabulary kNever) are
  // disabled.
  static Pipeline For(const PlanOptions& options);
  // The given passes in order, all enabled (a pipeline of one's own: tests, experiments).
  // kInvalidConfig when a choice pass follows a schedule pass, or a pass has neither or both of
  // run and choose.
  static Result<Pipeline> Of(std::vector<Pass> passes);
  // The names of every registered pass, in order.
  static std::vector<std::string> Names();

  // kInvalidConfig naming the pass when it is unknown or required.
  Status Disable(const std::string& name);
  // Names in order, disabled ones marked: "bucket_all_gathers, reorder (disabled), ...".
  std::string Describe() const;
  // Runs every enabled pass, validating after each. `g` is the front end's program, built with
  // the reshard_after_forward the pipeline was made with (the choice passes rebuild their
  // alternatives with it). `dump` (optional) gets the pipeline by name,
  // then the IR before the first pass and after each one, under "== <pass> ==" headers (of the
  // alternative each choice pass kept). `choices` (optional) gets a clause per choice pass that
  // compared or declined alternatives: which it kept, and the predicted steps.
  Result<Graph> Run(Graph g, const PassContext& ctx, std::ostream* dump = nullptr,
                    std::vector<std::string>* choices = nullptr) const;

 private:
  std::vector<Pass> passes_;
  std::vector<bool> enabled_;
};

}  // namespace meshwork::compiler
