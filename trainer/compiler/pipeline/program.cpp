#include "trainer/compiler/pipeline/program.h"

#include <cctype>
#include <sstream>

namespace meshwork::compiler::pipeline {
namespace {

struct KindName {
  ActionKind kind;
  const char* name;
};
// Longest names first: Parse matches prefixes.
constexpr KindName kKindNames[] = {
    {ActionKind::kSendActivation, "sa"}, {ActionKind::kRecvActivation, "ra"}, {ActionKind::kSendGrad, "sg"},
    {ActionKind::kRecvGrad, "rg"},       {ActionKind::kForward, "F"},         {ActionKind::kBackward, "B"},
    {ActionKind::kBackwardInput, "I"},   {ActionKind::kBackwardWeight, "W"},   {ActionKind::kUpdate, "U"},
    {ActionKind::kGather, "ag"},         {ActionKind::kReduceScatter, "rs"},
};

const char* NameOf(ActionKind kind) {
  for (const auto& k : kKindNames)
    if (k.kind == kind) return k.name;
  return "?";
}

// A non-negative decimal at s[*i], advancing *i; -1 where there is none.
int ReadNumber(std::string_view s, size_t* i) {
  if (*i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[*i]))) return -1;
  long long v = 0;
  while (*i < s.size() && std::isdigit(static_cast<unsigned char>(s[*i]))) {
    v = v * 10 + (s[*i] - '0');
    if (v > 1'000'000'000) return -1;
    ++*i;
  }
  return static_cast<int>(v);
}

Result<Action> ParseAction(std::string_view token) {
  for (const auto& k : kKindNames) {
    const std::string_view name = k.name;
    if (token.substr(0, name.size()) != name) continue;
    size_t i = name.size();
    Action a;
    a.kind = k.kind;
    a.microbatch = ReadNumber(token, &i);
    if (a.microbatch < 0 || i >= token.size() || token[i] != '@') break;
    ++i;
    a.stage = ReadNumber(token, &i);
    if (a.stage < 0 || i != token.size()) break;
    return a;
  }
  return InvalidInput("'" + std::string(token) +
                      "' is not an action (F, B, I, W, U, sa, ra, sg or rg, then <micro-batch>@<stage>; ag or rs, "
                      "then <unit>@<stage>)");
}

// The value of `key=<int>` among a header's words; -1 where absent or not a number.
int HeaderValue(const std::vector<std::string>& words, const std::string& key) {
  for (const std::string& w : words) {
    if (w.rfind(key + "=", 0) != 0) continue;
    size_t i = key.size() + 1;
    const int v = ReadNumber(w, &i);
    return i == w.size() ? v : -1;
  }
  return -1;
}

}  // namespace

bool IsCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput ||
         kind == ActionKind::kBackwardWeight;
}

bool IsTransfer(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kRecvActivation || kind == ActionKind::kSendGrad ||
         kind == ActionKind::kRecvGrad;
}

bool IsFsdp(ActionKind kind) { return kind == ActionKind::kGather || kind == ActionKind::kReduceScatter; }

bool IsBackward(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}

std::string ToString(const Action& a) {
  return std::string(NameOf(a.kind)) + std::to_string(a.microbatch) + "@" + std::to_string(a.stage);
}

std::string Print(const Program& p) {
  std::ostringstream out;
  out << "pipeline pp=" << p.shape.pp << " virtual=" << p.shape.virtual_stages
      << " microbatches=" << p.shape.microbatches;
  if (p.shape.per_update > 0) out << " per_update=" << p.shape.per_update;
  out << "\n";
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    out << "rank " << r << ":";
    for (const Action& a : p.ranks[r]) out << " " << ToString(a);
    out << "\n";
  }
  return out.str();
}

Result<Program> Parse(std::string_view text) {
  Program p;
  std::istringstream in{std::string(text)};
  std::string line;
  int line_no = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream words_in(line);
    std::vector<std::string> words;
    for (std::string w; words_in >> w;) words.push_back(w);
    if (words.empty()) continue;
    const std::string where = "pipeline program line " + std::to_string(line_no) + ": ";
    if (!header) {
      if (words[0] != "pipeline") return InvalidInput(where + "expected 'pipeline pp=<n> virtual=<n> microbatches=<n>'");
      p.shape.pp = HeaderValue(words, "pp");
      p.shape.virtual_stages = HeaderValue(words, "virtual");
      p.shape.microbatches = HeaderValue(words, "microbatches");
      if (p.shape.pp < 1 || p.shape.virtual_stages < 1 || p.shape.microbatches < 1)
        return InvalidInput(where + "pp, virtual and microbatches must each be a number >= 1: '" + line + "'");
      const bool has_per_update = line.find("per_update=") != std::string::npos;
      p.shape.per_update = has_per_update ? HeaderValue(words, "per_update") : 0;
      if (p.shape.per_update < 0 || (has_per_update && p.shape.per_update == 0))
        return InvalidInput(where + "per_update must be a number >= 1 where given: '" + line + "'");
      header = true;
      continue;
    }
    if (words[0] != "rank" || words.size() < 2 || words[1] != std::to_string(p.ranks.size()) + ":") {
      return InvalidInput(where + "expected 'rank " + std::to_string(p.ranks.size()) + ": <actions>', got '" + line + "'");
    }
    std::vector<Action> actions;
    for (size_t w = 2; w < words.size(); ++w) {
      auto a = ParseAction(words[w]);
      if (!a.ok()) return InvalidInput(where + a.status().message());
      actions.push_back(*a);
    }
    p.ranks.push_back(std::move(actions));
  }
  if (!header) return InvalidInput("pipeline program: no 'pipeline' header");
  return p;
}

}  // namespace meshwork::compiler::pipeline
