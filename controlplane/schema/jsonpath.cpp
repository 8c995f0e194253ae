// The JSONPath subset CRD printer columns use: .a.b, .a[0], .a[-1], .a[*], .a['k'],
// .a[?(@.k=="v")] (== and !=, string/number/bool literals, or bare @.k for existence), and
// backslash-escaped dots in names (.metadata.labels.app\.kubernetes\.io/name).
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/schema/printer_columns.h"

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;

struct Step {
  enum Kind { kField, kIndex, kAll, kFilter } kind = kField;
  std::string name;               // kField
  long index = 0;                 // kIndex
  std::vector<std::string> lhs;   // kFilter: @.a.b
  std::string op;                 // kFilter: "==", "!=", "" (existence)
  json literal;                   // kFilter
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::vector<Step> Parse() {
    std::string body = s_;
    if (body.size() >= 2 && body.front() == '{' && body.back() == '}') body = body.substr(1, body.size() - 2);
    s_ = body;
    pos_ = 0;
    if (!s_.empty() && s_[0] == '$') ++pos_;
    std::vector<Step> steps;
    if (pos_ == s_.size()) Fail("empty path");
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '.') {
        ++pos_;
        if (pos_ < s_.size() && s_[pos_] == '.') Fail("recursive descent (..) is not supported");
        Step st;
        st.name = Name();
        if (st.name.empty()) {
          if (pos_ == s_.size()) break;  // a lone trailing "." (".") means the object itself
          Fail("expected a field name");
        }
        if (st.name == "*") st.kind = Step::kAll;
        steps.push_back(st);
      } else if (c == '[') {
        steps.push_back(Bracket());
      } else {
        Fail(std::string("unexpected character '") + c + "'");
      }
    }
    return steps;
  }

 private:
  [[noreturn]] void Fail(const std::string& why) const {
    throw std::invalid_argument("invalid JSONPath " + s_ + " at offset " + std::to_string(pos_) + ": " + why);
  }

  std::string Name() {
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '.' && s_[pos_] != '[') {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      if (s_[pos_] == ' ' || s_[pos_] == '{' || s_[pos_] == '}' || s_[pos_] == '(' || s_[pos_] == ')')
        Fail("unexpected character in a field name");
      out += s_[pos_++];
    }
    return out;
  }

  void Expect(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) Fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  std::string Quoted() {
    char q = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out += s_[pos_++];
    }
    Expect(q);
    return out;
  }

  void SkipSpaces() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }

  Step Bracket() {
    Expect('[');
    Step st;
    if (pos_ < s_.size() && (s_[pos_] == '\'' || s_[pos_] == '"')) {
      st.name = Quoted();
    } else if (pos_ < s_.size() && s_[pos_] == '*') {
      ++pos_;
      st.kind = Step::kAll;
    } else if (pos_ < s_.size() && s_[pos_] == '?') {
      ++pos_;
      Expect('(');
      SkipSpaces();
      Expect('@');
      st.kind = Step::kFilter;
      while (pos_ < s_.size() && s_[pos_] == '.') {
        ++pos_;
        std::string n;
        while (pos_ < s_.size() && s_[pos_] != '.' && s_[pos_] != ' ' && s_[pos_] != '=' &&
               s_[pos_] != '!' && s_[pos_] != ')') {
          if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
          n += s_[pos_++];
        }
        if (n.empty()) Fail("expected a field name in the filter");
        st.lhs.push_back(n);
      }
      SkipSpaces();
      if (pos_ + 1 < s_.size() && (s_.compare(pos_, 2, "==") == 0 || s_.compare(pos_, 2, "!=") == 0)) {
        st.op = s_.substr(pos_, 2);
        pos_ += 2;
        SkipSpaces();
        if (pos_ < s_.size() && (s_[pos_] == '\'' || s_[pos_] == '"')) {
          st.literal = Quoted();
        } else {
          std::string lit;
          while (pos_ < s_.size() && s_[pos_] != ')' && s_[pos_] != ' ') lit += s_[pos_++];
          if (lit == "true" || lit == "false") {
            st.literal = lit == "true";
          } else {
            char* end = nullptr;
            double d = std::strtod(lit.c_str(), &end);
            if (lit.empty() || *end != '\0') Fail("expected a quoted string, number or boolean");
            st.literal = d;
          }
        }
        SkipSpaces();
      } else if (pos_ < s_.size() && s_[pos_] != ')') {
        Fail("only == and != are supported in filters");
      }
      Expect(')');
    } else {
      size_t start = pos_;
      if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == start || (pos_ == start + 1 && s_[start] == '-')) Fail("expected an index, '*', a quoted name or a filter");
      if (pos_ < s_.size() && s_[pos_] == ':') Fail("slices are not supported");
      st.kind = Step::kIndex;
      st.index = std::strtol(s_.substr(start, pos_ - start).c_str(), nullptr, 10);
    }
    Expect(']');
    return st;
  }

  std::string s_;
  size_t pos_ = 0;
};

bool FilterMatches(const Step& st, const json& item) {
  const json* cur = &item;
  for (const auto& n : st.lhs) {
    if (!cur->is_object()) return false;
    auto it = cur->find(n);
    if (it == cur->end()) return false;
    cur = &*it;
  }
  if (st.op.empty()) return true;
  bool eq;
  if (st.literal.is_number() && cur->is_number()) {
    eq = cur->get<double>() == st.literal.get<double>();
  } else {
    eq = *cur == st.literal;
  }
  return st.op == "==" ? eq : !eq;
}

}  // namespace

std::vector<json> EvaluateJsonPath(const std::string& path, const json& object) {
  std::vector<Step> steps = Parser(path).Parse();
  std::vector<const json*> cur = {&object};
  for (const auto& st : steps) {
    std::vector<const json*> next;
    for (const json* v : cur) {
      switch (st.kind) {
        case Step::kField:
          if (v->is_object()) {
            auto it = v->find(st.name);
            if (it != v->end()) next.push_back(&*it);
          }
          break;
        case Step::kIndex:
          if (v->is_array()) {
            long n = static_cast<long>(v->size());
            long i = st.index < 0 ? n + st.index : st.index;
            if (i >= 0 && i < n) next.push_back(&(*v)[static_cast<size_t>(i)]);
          }
          break;
        case Step::kAll:
          if (v->is_array() || v->is_object()) {
            for (const auto& e : *v) next.push_back(&e);
          }
          break;
        case Step::kFilter:
          if (v->is_array()) {
            for (const auto& e : *v) {
              if (FilterMatches(st, e)) next.push_back(&e);
            }
          }
          break;
      }
    }
    cur.swap(next);
  }
  std::vector<json> out;
  out.reserve(cur.size());
  for (const json* v : cur) out.push_back(*v);
  return out;
}

std::string CheckJsonPath(const std::string& path) {
  try {
    Parser(path).Parse();
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

}  // namespace meshwork::controlplane::schema
