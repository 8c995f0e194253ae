// The vocab_split pass (a choice pass: it changes what is communicated): a module that still
// uses a table read by rows whole (a tied output head) splits it by vocabulary instead
// (compiler::SplitByVocabulary): the table is then never all-gathered or reduce-scattered
// whole, and the head exchanges every rank's hidden states both ways inside its compute,
// exposed. Offered wherever the table may be read by rows (on top of the embedding_rows pass's
// choice: a program that gathers the table whole is read by rows first, since reading by rows
// alone may lose where it wins with the split head); the pipeline keeps the plan that fits the
// budget, then the faster.
#pragma once

#include "common/status.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/ir.h"
#include "trainer/compiler/passes/embedding_rows.h"
#include "trainer/compiler/passes/pass.h"

namespace meshwork::compiler {

// `naive`: the front end's program (after embedding_rows), whose module table it rewrites.
// `options.when`: PlanOptions::split_by_vocabulary.
Result<Choice> ChooseVocabSplit(const Graph& naive, const PassContext& ctx, const RowsChoiceOptions& options);

}  // namespace meshwork::compiler
