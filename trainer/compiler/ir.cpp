#include "trainer/compiler/ir.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace meshwork::compiler {

std::string ShortestText(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

namespace {

std::string Num(double v) { return ShortestText(v); }

std::string IntList(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string t; in >> t;) w.push_back(t);
  return w;
}

class LineError {
 public:
  LineError(int line, std::string text) : line_(line), text_(std::move(text)) {}
  Status operator()(const std::string& what) const {
    return InvalidInput("IR line " + std::to_string(line_) + ": " + what + ": '" + text_ + "'");
  }

 private:
  int line_;
  std::string text_;
};

bool ParseInt64(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || v < 0) return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return *end == '\0' && *out >= 0;
}

bool ParseList(const std::string& s, std::vector<int>* out) {
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return false;
  out->clear();
  std::string body = s.substr(1, s.size() - 2);
  if (body.empty()) return true;
  std::istringstream in(body);
  for (std::string item; std::getline(in, item, ',');) {
    int64_t v = 0;
    if (!ParseInt64(item, &v)) return false;
    out->push_back(static_cast<int>(v));
  }
  return true;
}

// "<bytes>x<calls>/<bytes>x<calls>": a module's tensor-parallel exchanges, forward then backward.
bool ParseTpExchanges(const std::string& s, TpExchange* fwd, TpExchange* bwd) {
  const auto slash = s.find('/');
  if (slash == std::string::npos) return false;
  auto one = [](const std::string& part, TpExchange* out) {
    const auto x = part.find('x');
    int64_t bytes = 0, calls = 0;
    if (x == std::string::npos || !ParseInt64(part.substr(0, x), &bytes) || !ParseInt64(part.substr(x + 1), &calls) ||
        calls > 1000000 || (calls == 0) != (bytes == 0))
      return false;
    *out = {bytes, static_cast<int>(calls)};
    return true;
  };
  return one(s.substr(0, slash), fwd) && one(s.substr(slash + 1), bwd);
}

// "key=value" -> value, when the key matches.
bool KeyValue(const std::string& word, const std::string& key, std::string* value) {
  if (word.rfind(key + "=", 0) != 0) return false;
  *value = word.substr(key.size() + 1);
  return true;
}

bool IsId(const std::string& s) { return s.size() > 1 && s[0] == '%'; }

}  // namespace

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kWait: return "wait";
    case OpKind::kFree: return "free";
    case OpKind::kCompute: return "compute";
    case OpKind::kOptimizerStep: return "optimizer_step";
    case OpKind::kRowGather: return "row_gather";
    case OpKind::kRowReduce: return "row_reduce";
  }
  return "?";
}

int Graph::FindModule(std::string_view name) const {
  for (size_t i = 0; i < modules.size(); ++i)
    if (modules[i].name == name) return static_cast<int>(i);
  return -1;
}

bool Graph::CarriesTpExchanges() const {
  for (const ModuleInfo& m : modules)
    if (m.tp_fwd.calls > 0 || m.tp_bwd.calls > 0) return true;
  return false;
}

void Checkpoint(ModuleInfo& m) {
  if (m.checkpoint_input_bytes <= 0) return;
  m.bwd_seconds += m.fwd_seconds;
  m.tp_bwd.bytes += m.tp_fwd.bytes;  // the recomputed forward exchanges again
  m.tp_bwd.calls += m.tp_fwd.calls;
  m.backward_workspace_bytes = m.activation_bytes;
  m.activation_bytes = m.checkpoint_input_bytes;
  m.checkpoint_input_bytes = 0;
}

std::string Print(const Graph& g) {
  std::ostringstream out;
  out << "meshwork-ir 1\n";
  out << "mesh dp_shard=" << g.dp_shard << " dp_replicate=" << g.dp_replicate;
  if (g.tp > 1) out << " tp=" << g.tp;
  out << (g.reduce_scatter_receives_input ? " rs_recv=full" : "") << "\n";
  for (size_t i = 0; i < g.params.size(); ++i) {
    const auto& p = g.params[i];
    out << "param " << i << " " << p.name << " gathered=" << p.gathered_bytes << " grad=" << p.grad_bytes
        << " shard=" << p.shard_bytes;
    if (p.group >= 0) out << " group=" << p.group;
    if (p.row_bytes > 0) out << " rows=" << p.row_bytes;
    out << "\n";
  }
  for (const auto& m : g.modules) {
    out << "module " << m.name << " fwd=" << Num(m.fwd_seconds) << " bwd=" << Num(m.bwd_seconds)
        << " act=" << m.activation_bytes;
    if (m.backward_workspace_bytes != 0) out << " ws=" << m.backward_workspace_bytes;
    if (m.checkpoint_input_bytes != 0) out << " ckpt=" << m.checkpoint_input_bytes;
    if (m.backward_temp_bytes != 0) out << " tmp=" << m.backward_temp_bytes;
    if (m.transient_bytes != 0) out << " tr=" << m.transient_bytes;
    if (m.vocab_transient_bytes != 0) out << " vtr=" << m.vocab_transient_bytes;
    if (m.tp_fwd.calls > 0 || m.tp_bwd.calls > 0) {
      out << " tp=" << m.tp_fwd.bytes << "x" << m.tp_fwd.calls << "/" << m.tp_bwd.bytes << "x" << m.tp_bwd.calls
          << " gemm=" << Num(m.tp_gemm_share);
    }
    if (m.tp_chunks > 1) out << " atp=" << m.tp_chunks;
    if (!m.rows.empty()) out << " rows=" << IntList(m.rows);
    if (!m.vocab.empty()) out << " vocab=" << IntList(m.vocab);
    out << " params=" << IntList(m.params) << "\n";
  }
  for (const auto& op : g.ops) {
    switch (op.kind) {
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
      case OpKind::kRowGather:
      case OpKind::kRowReduce:
        out << op.id << " = " << OpKindName(op.kind) << " " << IntList(op.params) << "\n";
        break;
      case OpKind::kAllReduce:
        out << op.id << " = all_reduce " << op.source << "\n";
        break;
      case OpKind::kWait:
      case OpKind::kFree:
        out << OpKindName(op.kind) << " " << op.id << "\n";
        break;
      case OpKind::kCompute:
        out << "compute " << (op.phase == Phase::kForward ? "fwd " : "bwd ")
            << (op.module >= 0 && op.module < static_cast<int>(g.modules.size()) ? g.modules[op.module].name : "?")
            << "\n";
        break;
      case OpKind::kOptimizerStep:
        out << "optimizer_step\n";
        break;
    }
  }
  return out.str();
}

Result<Graph> Parse(std::string_view text) {
  Graph g;
  std::istringstream in{std::string(text)};
  std::string line;
  int n = 0;
  bool header = false, mesh = false;
  while (std::getline(in, line)) {
    ++n;
    const LineError err(n, line);
    const auto hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    const auto w = Words(line);
    if (w.empty()) continue;
    if (!header) {
      if (w.size() != 2 || w[0] != "meshwork-ir" || w[1] != "1") return err("expected 'meshwork-ir 1' first");
      header = true;
      continue;
    }
    std::string v;
    if (w[0] == "mesh") {
      int64_t s = 0, r = 0, t = 1;
      size_t k = 3;
      const bool has_tp = w.size() > k && KeyValue(w[k], "tp", &v);
      if (has_tp && (!ParseInt64(v, &t) || t < 2 || t > 1000000)) return err("bad tp= (tensor parallel ranks, 2 or more)");
      if (has_tp) ++k;
      if (w.size() < 3 || w.size() > k + 1 || !KeyValue(w[1], "dp_shard", &v) || !ParseInt64(v, &s) || s < 1 ||
          !KeyValue(w[2], "dp_replicate", &v) || !ParseInt64(v, &r) || r < 1 ||
          (w.size() == k + 1 && w[k] != "rs_recv=full"))
        return err("expected 'mesh dp_shard=<n> dp_replicate=<n> [tp=<n>] [rs_recv=full]'");
      g.reduce_scatter_receives_input = w.size() == k + 1;
      g.tp = static_cast<int>(t);
      g.dp_shard = static_cast<int>(s);
      g.dp_replicate = static_cast<int>(r);
      mesh = true;
    } else if (w[0] == "param") {
      int64_t index = 0;
      ParamInfo p;
      if (w.size() < 6 || w.size() > 8 || !ParseInt64(w[1], &index) ||
          index != static_cast<int64_t>(g.params.size()))
        return err("expected 'param " + std::to_string(g.params.size()) +
                   " <name> gathered=<bytes> grad=<bytes> shard=<bytes> [group=<n>] [rows=<bytes>]'");
      p.name = w[2];
      if (!KeyValue(w[3], "gathered", &v) || !ParseInt64(v, &p.gathered_bytes)) return err("bad gathered=");
      if (!KeyValue(w[4], "grad", &v) || !ParseInt64(v, &p.grad_bytes)) return err("bad grad=");
      if (!KeyValue(w[5], "shard", &v) || !ParseInt64(v, &p.shard_bytes)) return err("bad shard=");
      size_t k = 6;
      if (k < w.size() && KeyValue(w[k], "group", &v)) {
        int64_t group = -1;
        if (!ParseInt64(v, &group) || group > 1000000) return err("bad group= (a group number, 0 or more)");
        p.group = static_cast<int>(group);
        ++k;
      }
      if (k < w.size() && KeyValue(w[k], "rows", &v)) {
        if (!ParseInt64(v, &p.row_bytes) || p.row_bytes == 0) return err("bad rows= (bytes, more than 0)");
        ++k;
      }
      if (k != w.size()) return err("unexpected '" + w[k] + "' (optional keys: group=, then rows=)");
      g.params.push_back(std::move(p));
    } else if (w[0] == "module") {
      ModuleInfo m;
      if (w.size() < 6 || w.size() > 16) {
        return err(
            "expected 'module <name> fwd=<s> bwd=<s> act=<bytes> [ws=<bytes>] [ckpt=<bytes>] [tmp=<bytes>] "
            "[tr=<bytes>] [vtr=<bytes>] [tp=<bytes>x<n>/<bytes>x<n> gemm=<share>] [atp=<chunks>] [rows=[..]] "
            "[vocab=[..]] params=[..]'");
      }
      m.name = w[1];
      if (g.FindModule(m.name) >= 0) return err("module defined twice");
      if (!KeyValue(w[2], "fwd", &v) || !ParseDouble(v, &m.fwd_seconds)) return err("bad fwd=");
      if (!KeyValue(w[3], "bwd", &v) || !ParseDouble(v, &m.bwd_seconds)) return err("bad bwd=");
      if (!KeyValue(w[4], "act", &v) || !ParseInt64(v, &m.activation_bytes)) return err("bad act=");
      // The optional keys, in this order.
      size_t k = 5;
      if (k + 1 < w.size() && KeyValue(w[k], "ws", &v)) {
        if (!ParseInt64(v, &m.backward_workspace_bytes)) return err("bad ws=");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "ckpt", &v)) {
        if (!ParseInt64(v, &m.checkpoint_input_bytes)) return err("bad ckpt=");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "tmp", &v)) {
        if (!ParseInt64(v, &m.backward_temp_bytes)) return err("bad tmp=");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "tr", &v)) {
        if (!ParseInt64(v, &m.transient_bytes)) return err("bad tr=");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "vtr", &v)) {
        if (!ParseInt64(v, &m.vocab_transient_bytes)) return err("bad vtr=");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "tp", &v)) {
        if (!ParseTpExchanges(v, &m.tp_fwd, &m.tp_bwd)) return err("bad tp= (<bytes>x<calls>/<bytes>x<calls>)");
        ++k;
        if (!(k + 1 < w.size() && KeyValue(w[k], "gemm", &v) && ParseDouble(v, &m.tp_gemm_share) &&
              m.tp_gemm_share >= 0 && m.tp_gemm_share <= 1))
          return err("tp= needs gemm=<share of the compute, 0 to 1> after it");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "atp", &v)) {
        int64_t chunks = 0;
        if (!ParseInt64(v, &chunks) || chunks < 2 || chunks > 1024) return err("bad atp= (chunks, 2 to 1024)");
        m.tp_chunks = static_cast<int>(chunks);
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "rows", &v)) {
        if (!ParseList(v, &m.rows) || m.rows.empty()) return err("bad rows= (a parameter list like [0])");
        ++k;
      }
      if (k + 1 < w.size() && KeyValue(w[k], "vocab", &v)) {
        if (!ParseList(v, &m.vocab) || m.vocab.empty()) return err("bad vocab= (a parameter list like [0])");
        ++k;
      }
      if (k + 1 != w.size())
        return err("unexpected '" + w[k] + "' (optional keys: ws=, ckpt=, tmp=, tr=, vtr=, tp= gemm=, atp=, rows=, then vocab=)");
      if (!KeyValue(w.back(), "params", &v) || !ParseList(v, &m.params)) return err("bad params=");
      for (const auto* list : {&m.params, &m.rows, &m.vocab})
        for (int p : *list)
          if (p < 0 || p >= static_cast<int>(g.params.size())) return err("unknown param " + std::to_string(p));
      for (const auto* list : {&m.rows, &m.vocab})
        for (int p : *list)
          if (g.params[p].row_bytes <= 0)
            return err("param " + std::to_string(p) + " is read by rows but has no rows= size");
      g.modules.push_back(std::move(m));
    } else if (IsId(w[0])) {
      Op op;
      op.id = w[0];
      if (w.size() != 4 || w[1] != "=") return err("expected '<%id> = <collective> <operand>'");
      if (w[2] == "all_gather" || w[2] == "reduce_scatter" || w[2] == "row_gather" || w[2] == "row_reduce") {
        op.kind = w[2] == "all_gather"       ? OpKind::kAllGather
                  : w[2] == "reduce_scatter" ? OpKind::kReduceScatter
                  : w[2] == "row_gather"     ? OpKind::kRowGather
                                             : OpKind::kRowReduce;
        if (!ParseList(w[3], &op.params) || op.params.empty()) return err("expected a parameter list like [0,1]");
        for (int p : op.params)
          if (p < 0 || p >= static_cast<int>(g.params.size())) return err("unknown param " + std::to_string(p));
      } else if (w[2] == "all_reduce") {
        op.kind = OpKind::kAllReduce;
        if (!IsId(w[3])) return err("all_reduce takes a reduce_scatter's %id");
        op.source = w[3];
      } else {
        return err("unknown collective '" + w[2] + "'");
      }
      g.ops.push_back(std::move(op));
    } else if (w[0] == "wait" || w[0] == "free") {
      Op op;
      op.kind = w[0] == "wait" ? OpKind::kWait : OpKind::kFree;
      if (w.size() != 2 || !IsId(w[1])) return err("expected '" + w[0] + " <%id>'");
      op.id = w[1];
      g.ops.push_back(std::move(op));
    } else if (w[0] == "compute") {
      Op op;
      op.kind = OpKind::kCompute;
      if (w.size() != 3 || (w[1] != "fwd" && w[1] != "bwd")) return err("expected 'compute fwd|bwd <module>'");
      op.phase = w[1] == "fwd" ? Phase::kForward : Phase::kBackward;
      op.module = g.FindModule(w[2]);
      if (op.module < 0) return err("unknown module '" + w[2] + "'");
      g.ops.push_back(std::move(op));
    } else if (w[0] == "optimizer_step") {
      if (w.size() != 1) return err("optimizer_step takes no operand");
      Op op;
      op.kind = OpKind::kOptimizerStep;
      g.ops.push_back(std::move(op));
    } else {
      return err("unknown statement '" + w[0] + "'");
    }
  }
  if (!header) return InvalidInput("IR: empty text (expected 'meshwork-ir 1')");
  if (!mesh) return InvalidInput("IR: no 'mesh' line");
  return g;
}

Status Validate(const Graph& g) {
  auto fail = [&](size_t i, const std::string& what) {
    const Op& op = g.ops[i];
    std::string text = OpKindName(op.kind);
    if (!op.id.empty()) text += " " + op.id;
    if (op.kind == OpKind::kCompute && op.module >= 0 && op.module < static_cast<int>(g.modules.size()))
      text += std::string(op.phase == Phase::kForward ? " fwd " : " bwd ") + g.modules[op.module].name;
    return Internal("schedule op " + std::to_string(i) + " (" + text + "): " + what);
  };
  const int np = static_cast<int>(g.params.size());
  // Last backward use of each parameter, and which modules use it.
  std::vector<int> last_bwd(np, -1), last_bwd_rows(np, -1);
  std::vector<bool> read_by_rows(np, false);
  if (g.tp < 1) return Internal("schedule: tp=" + std::to_string(g.tp) + " must be at least 1");
  for (const ModuleInfo& m : g.modules) {
    if ((m.tp_fwd.calls > 0 || m.tp_bwd.calls > 0) && g.tp < 2)
      return Internal("schedule: module " + m.name + " exchanges over tensor parallel ranks, but the mesh has tp=1");
    if (m.tp_chunks < 1) return Internal("schedule: module " + m.name + " has " + std::to_string(m.tp_chunks) + " chunks");
    for (int p : m.rows)
      if (p >= 0 && p < np) read_by_rows[p] = true;
    for (int p : m.vocab) {
      if (p < 0 || p >= np || g.params[p].row_bytes <= 0)
        return Internal("schedule: module " + m.name + " splits param " + std::to_string(p) +
                        " by vocabulary, which has no rows= size");
      if (std::count(m.params.begin(), m.params.end(), p) > 0)
        return Internal("schedule: module " + m.name + " uses param " + std::to_string(p) +
                        " both whole and split by vocabulary");
    }
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind == OpKind::kCompute) {
      if (op.module < 0 || op.module >= static_cast<int>(g.modules.size())) return fail(i, "unknown module");
      if (op.phase == Phase::kBackward) {
        for (int p : g.modules[op.module].params) last_bwd[p] = static_cast<int>(i);
        for (int p : g.modules[op.module].rows) last_bwd_rows[p] = static_cast<int>(i);
      }
    }
  }
  std::map<int, int> group_size;  // flat group -> its parameters
  for (const auto& p : g.params)
    if (p.group >= 0) ++group_size[p.group];
  struct Value {
    OpKind kind;
    std::vector<int> params;
    bool waited = false;
    bool freed = false;
    std::string source;
  };
  std::map<std::string, Value> values;
  std::vector<std::string> gathered_by(np);  // the live, waited all-gather holding each param
  std::vector<std::string> pending_by(np);   // an all-gather in flight for each param
  std::vector<int> reduced(np, 0), row_reduced(np, 0);
  std::vector<std::string> rows_by(np), rows_pending_by(np);  // row_gather ids: waited, in flight
  bool stepped = false;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (stepped) return fail(i, "after optimizer_step");
    switch (op.kind) {
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
      case OpKind::kRowGather:
      case OpKind::kRowReduce: {
        if (values.count(op.id)) return fail(i, "id defined twice");
        if (op.params.empty()) return fail(i, "no parameters");
        std::set<int> seen;
        for (int p : op.params) {
          if (p < 0 || p >= np) return fail(i, "unknown param " + std::to_string(p));
          if (!seen.insert(p).second) return fail(i, "param " + std::to_string(p) + " listed twice");
          switch (op.kind) {
            case OpKind::kAllGather:
              if (!gathered_by[p].empty() || !pending_by[p].empty())
                return fail(i, "param " + std::to_string(p) + " is already gathered by " +
                                   (gathered_by[p].empty() ? pending_by[p] : gathered_by[p]));
              pending_by[p] = op.id;
              break;
            case OpKind::kReduceScatter:
              if (reduced[p]++) return fail(i, "param " + std::to_string(p) + " reduce-scattered twice");
              if (static_cast<int>(i) < last_bwd[p])
                return fail(i, "param " + std::to_string(p) + " is still used by a later backward (op " +
                                   std::to_string(last_bwd[p]) + ")");
              break;
            case OpKind::kRowGather:
              if (!read_by_rows[p]) return fail(i, "param " + std::to_string(p) + " is read by rows by no module");
              if (!rows_by[p].empty() || !rows_pending_by[p].empty())
                return fail(i, "param " + std::to_string(p) + "'s rows are already gathered");
              rows_pending_by[p] = op.id;
              break;
            default:  // kRowReduce
              if (!read_by_rows[p]) return fail(i, "param " + std::to_string(p) + " is read by rows by no module");
              if (row_reduced[p]++) return fail(i, "param " + std::to_string(p) + " row-reduced twice");
              if (static_cast<int>(i) < last_bwd_rows[p])
                return fail(i, "param " + std::to_string(p) + "'s rows are still read by a later backward (op " +
                                   std::to_string(last_bwd_rows[p]) + ")");
              break;
          }
        }
        // A flat group is communicated whole: its parameters share one sharded vector. (Rows are
        // read per parameter.)
        std::map<int, int> listed;  // group -> its parameters in this op
        if (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter)
          for (int p : op.params)
            if (g.params[p].group >= 0) ++listed[g.params[p].group];
        for (const auto& [group, n] : listed)
          if (n != group_size[group])
            return fail(i, "flat group " + std::to_string(group) + " has " + std::to_string(group_size[group]) +
                               " parameters, this collective lists " + std::to_string(n) +
                               " (a group is communicated whole)");
        values[op.id] = Value{op.kind, op.params, false, false, ""};
        break;
      }
      case OpKind::kAllReduce: {
        if (values.count(op.id)) return fail(i, "id defined twice");
        auto it = values.find(op.source);
        if (it == values.end() || it->second.kind != OpKind::kReduceScatter)
          return fail(i, "source " + op.source + " is not an earlier reduce_scatter");
        if (!it->second.waited) return fail(i, "source " + op.source + " not waited for yet");
        values[op.id] = Value{op.kind, it->second.params, false, false, op.source};
        break;
      }
      case OpKind::kWait: {
        auto it = values.find(op.id);
        if (it == values.end()) return fail(i, "waits for an undefined id");
        if (it->second.waited) return fail(i, "waited for twice");
        it->second.waited = true;
        if (it->second.kind == OpKind::kAllGather)
          for (int p : it->second.params) {
            pending_by[p].clear();
            gathered_by[p] = op.id;
          }
        if (it->second.kind == OpKind::kRowGather)
          for (int p : it->second.params) {
            rows_pending_by[p].clear();
            rows_by[p] = op.id;
          }
        break;
      }
      case OpKind::kFree: {
        auto it = values.find(op.id);
        if (it == values.end() || it->second.kind != OpKind::kAllGather)
          return fail(i, "frees something that is not an all_gather");
        if (!it->second.waited) return fail(i, "frees before the all_gather was waited for");
        if (it->second.freed) return fail(i, "freed twice");
        it->second.freed = true;
        for (int p : it->second.params) gathered_by[p].clear();
        break;
      }
      case OpKind::kCompute:
        for (int p : g.modules[op.module].params) {
          if (gathered_by[p].empty())
            return fail(i, "param " + std::to_string(p) + " (" + g.params[p].name + ") is not gathered" +
                               (pending_by[p].empty() ? "" : " (" + pending_by[p] + " not waited for)"));
        }
        for (int p : g.modules[op.module].rows) {
          if (rows_by[p].empty())
            return fail(i, "param " + std::to_string(p) + " (" + g.params[p].name + ") has no rows gathered" +
                               (rows_pending_by[p].empty() ? "" : " (" + rows_pending_by[p] + " not waited for)"));
        }
        break;
      case OpKind::kOptimizerStep:
        stepped = true;
        break;
    }
  }
  for (const auto& [id, v] : values) {
    if (!v.waited) return Internal("schedule: " + id + " is never waited for");
  }
  for (int p = 0; p < np; ++p) {
    if (last_bwd[p] >= 0 && !reduced[p])
      return Internal("schedule: param " + std::to_string(p) + " (" + g.params[p].name + ") is never reduce-scattered");
    if (last_bwd_rows[p] >= 0 && !row_reduced[p])
      return Internal("schedule: param " + std::to_string(p) + " (" + g.params[p].name + ") is never row-reduced");
  }
  if (!g.ops.empty() && !stepped) return Internal("schedule: no optimizer_step at the end");
  return Status::Ok();
}

}  // namespace meshwork::compiler
