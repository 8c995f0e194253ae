#include "trainer/compiler/passes/program_edit.h"

#include <algorithm>
#include <map>

#include "trainer/compiler/simulator.h"

namespace meshwork::compiler::edit {

bool UsesAny(const Graph& g, const Op& compute, const std::vector<int>& params) {
  if (compute.kind != OpKind::kCompute) return false;
  for (int p : g.modules[compute.module].params)
    if (std::find(params.begin(), params.end(), p) != params.end()) return true;
  return false;
}

int IndexOf(const Graph& g, OpKind kind, const std::string& id, size_t from) {
  for (size_t i = from; i < g.ops.size(); ++i)
    if (g.ops[i].kind == kind && g.ops[i].id == id) return static_cast<int>(i);
  return -1;
}

void Erase(Graph& g, const std::set<size_t>& indices) {
  std::vector<Op> kept;
  kept.reserve(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (!indices.count(i)) kept.push_back(std::move(g.ops[i]));
  g.ops = std::move(kept);
}

void StripFrees(Graph& g) {
  std::set<size_t> frees;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == OpKind::kFree) frees.insert(i);
  Erase(g, frees);
}

void MoveBefore(Graph& g, size_t from, size_t to) {
  Op op = std::move(g.ops[from]);
  g.ops.erase(g.ops.begin() + static_cast<std::ptrdiff_t>(from));
  g.ops.insert(g.ops.begin() + static_cast<std::ptrdiff_t>(to), std::move(op));
}

// One linear scan: a bucket stops collecting uses once one of its parameters is re-gathered.
Graph PlaceFrees(Graph g) {
  StripFrees(g);
  std::map<std::string, int> last_use;  // all-gather id -> op index its free follows
  std::map<std::string, bool> closed;
  std::vector<std::string> holder(g.params.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& o = g.ops[i];
    if (o.kind == OpKind::kAllGather) {
      for (int p : o.params) {
        if (!holder[p].empty()) closed[holder[p]] = true;
        holder[p] = o.id;
      }
      closed[o.id] = false;
    } else if (o.kind == OpKind::kWait && closed.count(o.id) && !last_use.count(o.id)) {
      last_use[o.id] = static_cast<int>(i);
    } else if (o.kind == OpKind::kCompute) {
      for (int p : g.modules[o.module].params) {
        const std::string& h = holder[p];
        if (!h.empty() && !closed[h] && last_use.count(h)) last_use[h] = std::max(last_use[h], static_cast<int>(i));
      }
    }
  }
  std::map<int, std::vector<std::string>> after;  // op index -> ids to free after it
  for (size_t i = 0; i < g.ops.size(); ++i)  // in issue order
    if (g.ops[i].kind == OpKind::kAllGather && last_use.count(g.ops[i].id))
      after[last_use[g.ops[i].id]].push_back(g.ops[i].id);
  std::vector<Op> out;
  out.reserve(g.ops.size() + last_use.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    out.push_back(g.ops[i]);
    auto it = after.find(static_cast<int>(i));
    if (it == after.end()) continue;
    for (const auto& id : it->second) {
      Op f;
      f.kind = OpKind::kFree;
      f.id = id;
      out.push_back(f);
    }
  }
  g.ops = std::move(out);
  return g;
}

bool WithinBudget(const Graph& g, const PassContext& ctx) {
  return ctx.memory_budget_bytes <= 0 || PeakBytes(g) <= ctx.memory_budget_bytes;
}

void MergeInto(Graph& g, size_t keeper, size_t victim) {
  const std::string vid = g.ops[victim].id;
  auto& kp = g.ops[keeper].params;
  kp.insert(kp.end(), g.ops[victim].params.begin(), g.ops[victim].params.end());
  std::set<size_t> drop{victim};
  std::string ar_id;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& o = g.ops[i];
    if (o.kind == OpKind::kWait && o.id == vid) drop.insert(i);
    if (o.kind == OpKind::kAllReduce && o.source == vid) {
      drop.insert(i);
      ar_id = o.id;
    }
  }
  if (!ar_id.empty())
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].kind == OpKind::kWait && g.ops[i].id == ar_id) drop.insert(i);
  Erase(g, drop);
}

std::vector<size_t> Collectives(const Graph& g, OpKind kind) {
  std::vector<size_t> v;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == kind) v.push_back(i);
  return v;
}

int PrevCompute(const Graph& g, size_t i) {
  for (size_t j = i; j-- > 0;)
    if (g.ops[j].kind == OpKind::kCompute) return static_cast<int>(j);
  return -1;
}

bool Acceptable(const Graph& placed, const PassContext& ctx) {
  return WithinBudget(placed, ctx) && Validate(placed).ok();
}

double StepSeconds(const Graph& g, const PassContext& ctx) { return Simulate(g, ctx.cost).step_seconds; }

Result<Graph> Checked(Graph g, const std::string& pass) {
  if (Status s = Validate(g); !s.ok()) return Internal(pass + " produced an invalid program: " + s.message());
  return g;
}

}  // namespace meshwork::compiler::edit
