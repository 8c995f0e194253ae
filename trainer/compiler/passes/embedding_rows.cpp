#include "trainer/compiler/passes/embedding_rows.h"

#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>

#include "common/units.h"

namespace meshwork::compiler {

Result<Choice> ChooseEmbeddingRows(const Graph& naive, const PassContext& ctx, const RowsChoiceOptions& options) {
  Choice choice;
  choice.alternatives.push_back(
      {naive, "the embedding is gathered whole", "gathering it whole", "with the table gathered whole"});
  const bool readable = std::any_of(naive.params.begin(), naive.params.end(), [](const ParamInfo& p) { return p.row_bytes > 0; });
  const bool read_already = std::any_of(naive.modules.begin(), naive.modules.end(), [](const ModuleInfo& m) { return !m.rows.empty(); });
  if (options.when == PlanOptions::Rows::kNever || !readable || read_already || naive.dp_shard <= 1 ||
      naive.dp_replicate != 1)
    return choice;
  Graph skeleton = naive;
  ReadByRows(skeleton);
  Graph by_rows = BuildNaiveProgram(std::move(skeleton), options.front_end);
  std::set<int> by_row;
  int64_t row_bytes = 0;
  for (const ModuleInfo& m : by_rows.modules)
    for (int p : m.rows) by_row.insert(p), row_bytes += by_rows.params[p].row_bytes;
  if (row_bytes == 0) return choice;
  // Seconds of the collectives of `g` of `kinds` that move a parameter read by rows.
  auto seconds_of = [&](const Graph& g, std::set<OpKind> kinds) {
    double s = 0;
    for (const Op& op : g.ops)
      if (kinds.count(op.kind) && std::any_of(op.params.begin(), op.params.end(), [&](int p) { return by_row.count(p) > 0; }))
        s += ctx.cost.CollectiveSeconds(op.kind, ctx.cost.CollectiveBytes(g, op), CostModel::CollectiveCalls(g, op));
    return s;
  };
  const double rows_comm = seconds_of(by_rows, {OpKind::kRowGather, OpKind::kRowReduce});
  const double whole_comm = seconds_of(naive, {OpKind::kAllGather, OpKind::kReduceScatter});
  choice.forced = options.when == PlanOptions::Rows::kAlways;
  if (!choice.forced && rows_comm >= whole_comm) {
    std::ostringstream why;
    why << std::fixed << std::setprecision(3) << "the embedding is gathered whole: exchanging every rank's rows (dp_shard "
        << naive.dp_shard << " x " << HumanBytes(row_bytes) << ") would take " << rows_comm
        << " s a step, the table's whole collectives " << whole_comm << " s";
    choice.note = why.str();
    return choice;
  }
  choice.alternatives.push_back(
      {std::move(by_rows), "the embedding is read by rows", "reading it by rows", "with the embedding read by rows"});
  return choice;
}

}  // namespace meshwork::compiler
