#include "trainer/compiler/passes/registry.h"

#include <iomanip>
#include <map>
#include <sstream>

#include "trainer/compiler/passes/async_tp.h"
#include "trainer/compiler/passes/bucket.h"
#include "trainer/compiler/passes/checkpoint.h"
#include "trainer/compiler/passes/embedding_rows.h"
#include "trainer/compiler/passes/insert_frees.h"
#include "trainer/compiler/passes/keep_gathered.h"
#include "trainer/compiler/passes/program_edit.h"
#include "trainer/compiler/passes/reorder.h"
#include "trainer/compiler/passes/vocab_split.h"
#include "trainer/compiler/simulator.h"

namespace meshwork::compiler {
namespace {

// The registry: every pass in the order it runs, its options bound from `o`. Choice passes come
// first: they rewrite the front end's program, which no schedule pass has touched yet.
std::vector<Pass> Registered(const PlanOptions& o) {
  const RowsChoiceOptions rows{o.read_by_rows, {o.reshard_after_forward}};
  const RowsChoiceOptions vocab{o.split_by_vocabulary, {o.reshard_after_forward}};
  const Bucketing bucketing = o.bucketing;
  const AsyncTpOptions async_tp{o.tp_tokens_per_rank};
  return {
      {"embedding_rows", true, nullptr, [rows](const Graph& g, const PassContext& c) { return ChooseEmbeddingRows(g, c, rows); }},
      {"vocab_split", true, nullptr, [vocab](const Graph& g, const PassContext& c) { return ChooseVocabSplit(g, c, vocab); }},
      {"async_tp", true, [async_tp](const Graph& g, const PassContext& c) { return AsyncTensorParallel(g, c, async_tp); }, nullptr},
      {"checkpoint", true, CheckpointToFit, nullptr},
      {"keep_gathered", true, KeepGatheredWithinBudget, nullptr},
      {"bucket_all_gathers", true,
       [bucketing](const Graph& g, const PassContext& c) { return BucketAllGathers(g, c, bucketing); }, nullptr},
      {"bucket_reduce_scatters", true,
       [bucketing](const Graph& g, const PassContext& c) { return BucketReduceScatters(g, c, bucketing); }, nullptr},
      {"reorder", true, Reorder, nullptr},
      {"insert_frees", false, InsertFrees, nullptr},
  };
}

bool Fits(const SimResult& r, const PassContext& ctx) {
  return ctx.memory_budget_bytes <= 0 || r.peak_bytes <= ctx.memory_budget_bytes;
}

// Whether `by` is preferred over `current`: the one that fits the budget, then the faster.
bool Prefer(const SimResult& by, const SimResult& current, const PassContext& ctx) {
  const bool fits = Fits(by, ctx), current_fits = Fits(current, ctx);
  return (fits && !current_fits) || (fits == current_fits && by.step_seconds < current.step_seconds);
}

}  // namespace

Pipeline Pipeline::For(const PlanOptions& options) {
  Pipeline p;
  p.passes_ = Registered(options);
  p.enabled_.assign(p.passes_.size(), true);
  auto off = [&](const char* name) {
    for (size_t i = 0; i < p.passes_.size(); ++i)
      if (p.passes_[i].name == name) p.enabled_[i] = false;
  };
  if (!options.reorder) off("reorder");
  if (!options.async_tp) off("async_tp");
  if (options.read_by_rows == PlanOptions::Rows::kNever) off("embedding_rows"), off("vocab_split");
  if (options.split_by_vocabulary == PlanOptions::Rows::kNever) off("vocab_split");
  return p;
}

Result<Pipeline> Pipeline::Of(std::vector<Pass> passes) {
  bool scheduled = false;
  for (const Pass& pass : passes) {
    if (static_cast<bool>(pass.run) == static_cast<bool>(pass.choose))
      return InvalidConfig("pass '" + pass.name + "' needs exactly one of run (a schedule pass) and choose (a choice pass)");
    if (pass.choose && scheduled)
      return InvalidConfig("choice pass '" + pass.name + "' follows a schedule pass: choice passes rewrite the front "
                           "end's program and run first");
    scheduled = scheduled || static_cast<bool>(pass.run);
  }
  Pipeline p;
  p.passes_ = std::move(passes);
  p.enabled_.assign(p.passes_.size(), true);
  return p;
}

std::vector<std::string> Pipeline::Names() {
  std::vector<std::string> names;
  for (const Pass& p : Registered(PlanOptions{})) names.push_back(p.name);
  return names;
}

Status Pipeline::Disable(const std::string& name) {
  std::string known;
  for (size_t i = 0; i < passes_.size(); ++i) {
    if (passes_[i].name == name) {
      if (!passes_[i].optional) return InvalidConfig("pass '" + name + "' is required and cannot be disabled");
      enabled_[i] = false;
      return Status::Ok();
    }
    known += (i ? ", " : "") + passes_[i].name;
  }
  return InvalidConfig("unknown pass '" + name + "' (passes: " + known + ")");
}

std::string Pipeline::Describe() const {
  std::string s;
  for (size_t i = 0; i < passes_.size(); ++i) {
    s += (i ? ", " : "") + passes_[i].name;
    if (!enabled_[i]) s += " (disabled)";
  }
  return s;
}

Result<Graph> Pipeline::Run(Graph g, const PassContext& ctx, std::ostream* dump, std::vector<std::string>* choices) const {
  if (Status s = Validate(g); !s.ok()) return Internal("input program: " + s.message());
  if (dump) *dump << "== pipeline: " << Describe() << " ==\n== input ==\n" << Print(g);
  // The schedule passes' plan of each program a choice pass offered, by its text: each is planned
  // once, and the one kept is not planned again.
  struct Planned {
    Graph plan;
    std::string dump;
  };
  std::map<std::string, Planned> planned;
  auto schedule = [&](const Graph& program) -> Result<const Planned*> {
    std::string key = Print(program);
    if (auto it = planned.find(key); it != planned.end()) return &it->second;
    Planned out{program, ""};
    std::ostringstream text;
    for (size_t i = 0; i < passes_.size(); ++i) {
      if (!passes_[i].run) continue;
      if (!enabled_[i]) {
        if (dump) text << "== " << passes_[i].name << " (disabled) ==\n";
        continue;
      }
      auto next = passes_[i].run(out.plan, ctx);
      if (!next.ok()) return next.status();
      MW_ASSIGN_OR_RETURN(out.plan, edit::Checked(std::move(next).value(), passes_[i].name));
      if (dump) text << "== " << passes_[i].name << " ==\n" << Print(out.plan);
    }
    out.dump = text.str();
    return &planned.emplace(std::move(key), std::move(out)).first->second;
  };
  for (size_t i = 0; i < passes_.size(); ++i) {
    const Pass& pass = passes_[i];
    if (!pass.choose) continue;
    if (!enabled_[i]) {
      if (dump) *dump << "== " << pass.name << " (disabled) ==\n";
      continue;
    }
    MW_ASSIGN_OR_RETURN(Choice choice, pass.choose(g, ctx));
    auto& alts = choice.alternatives;
    if (alts.empty()) return Internal(pass.name + " offered no program");
    size_t kept = 0;
    if (alts.size() == 1) {
      if (choices && !choice.note.empty()) choices->push_back(choice.note);
    } else {
      std::vector<SimResult> sims;
      for (const Alternative& alt : alts) {
        MW_ASSIGN_OR_RETURN(const Graph checked, edit::Checked(alt.program, pass.name));
        MW_ASSIGN_OR_RETURN(const Planned* p, schedule(checked));
        sims.push_back(Simulate(p->plan, ctx.cost));
      }
      for (size_t k = 1; k < alts.size(); ++k)
        if (Prefer(sims[k], sims[kept], ctx)) kept = k;
      if (choice.forced) kept = alts.size() - 1;
      std::ostringstream said;
      said << std::fixed << std::setprecision(4);
      if (kept != 0) {
        said << alts[kept].kept << ": predicted step " << sims[kept].step_seconds << " s, against "
             << sims[0].step_seconds << " s " << alts[0].beside;
      } else {
        size_t rival = 1;  // the best of those not kept
        for (size_t k = 2; k < alts.size(); ++k)
          if (Prefer(sims[k], sims[rival], ctx)) rival = k;
        said << alts[0].kept << ": " << alts[rival].instead << " is predicted " << sims[rival].step_seconds
             << " s a step, against " << sims[0].step_seconds << " s"
             << (Fits(sims[0], ctx) && !Fits(sims[rival], ctx) ? ", and does not fit the budget" : "");
      }
      if (choices) choices->push_back(said.str());
    }
    g = std::move(alts[kept].program);
    if (dump) *dump << "== " << pass.name << " ==\n" << Print(g);
  }
  MW_ASSIGN_OR_RETURN(const Planned* final_plan, schedule(g));
  if (dump) *dump << final_plan->dump;
  return final_plan->plan;
}

}  // namespace meshwork::compiler
