#include "trainer/compiler/passes/vocab_split.h"

#include <algorithm>

namespace meshwork::compiler {

Result<Choice> ChooseVocabSplit(const Graph& naive, const PassContext&, const RowsChoiceOptions& options) {
  const bool read_by_rows = std::any_of(naive.modules.begin(), naive.modules.end(), [](const ModuleInfo& m) { return !m.rows.empty(); });
  Choice choice;
  choice.alternatives.push_back({naive, "the output head gathers the table whole", "splitting it by vocabulary",
                                 std::string("with the table gathered for the head") + (read_by_rows ? "" : " and the embedding")});
  if (options.when == PlanOptions::Rows::kNever || naive.dp_shard <= 1 || naive.dp_replicate != 1) return choice;
  Graph skeleton = naive;
  if (!read_by_rows) ReadByRows(skeleton);
  SplitByVocabulary(skeleton);
  if (std::none_of(skeleton.modules.begin(), skeleton.modules.end(), [](const ModuleInfo& m) { return !m.vocab.empty(); }))
    return choice;
  choice.forced = options.when == PlanOptions::Rows::kAlways;
  choice.alternatives.push_back({BuildNaiveProgram(std::move(skeleton), options.front_end),
                                 "the output head is split by vocabulary (each rank the table rows it owns, for every "
                                 "rank's tokens)",
                                 "splitting it by vocabulary", "with the head split by vocabulary"});
  return choice;
}

}  // namespace meshwork::compiler
