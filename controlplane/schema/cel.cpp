// The CEL subset behind x-kubernetes-validations: lexer, recursive-descent parser with CEL's
// precedence, a schema-aware field check, and a tree-walking evaluator with a step budget.
// Errors inside this file are C++ exceptions; the public functions turn them into values.
#include "controlplane/schema/cel.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include "controlplane/schema/go_format.h"

namespace meshwork::controlplane::schema::cel {

using nlohmann::json;

// ---- AST ---------------------------------------------------------------------------------

enum class Op {
  kLiteral, kIdent, kSelect, kIndex, kCall, kMemberCall, kList, kMap, kHas, kMacro,
  kNot, kNeg, kBinary, kAnd, kOr, kCond
};

// Binary operators, resolved at parse time so evaluation does not compare operator strings.
enum class BinOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kAdd, kSub, kMul, kDiv, kMod };

struct Node {
  Op op = Op::kLiteral;
  BinOp bin = BinOp::kEq;  // kBinary
  size_t pos = 0;      // byte offset in the expression, for error carets
  json literal;        // kLiteral
  std::string name;    // identifier, field, function, operator or macro name
  std::string var;     // macro iteration variable
  std::vector<std::unique_ptr<Node>> kids;
};

struct Program {
  std::string text;
  std::unique_ptr<Node> root;
  bool never_bool = false;  // the checker found a result type other than bool
};

namespace {

// ---- errors ------------------------------------------------------------------------------

struct CompileError {
  size_t pos;
  std::string message;
};
struct EvalError {
  std::string message;
};
struct CostError {};

// cel-go's error block: "ERROR: <input>:L:C: msg\n | line\n | ....^" (C is 1-based, in runes).
std::string FormatCompileError(const std::string& text, const CompileError& e) {
  size_t line_start = 0;
  int line = 1;
  for (size_t i = 0; i < e.pos && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  size_t line_end = text.find('\n', line_start);
  if (line_end == std::string::npos) line_end = text.size();
  size_t col = 0;
  for (size_t i = line_start; i < e.pos && i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++col;
  }
  return "ERROR: <input>:" + std::to_string(line) + ":" + std::to_string(col + 1) + ": " + e.message +
         "\n | " + text.substr(line_start, line_end - line_start) + "\n | " + std::string(col, '.') + "^";
}

// ---- lexer -------------------------------------------------------------------------------

enum class Tok { kEnd, kInt, kUint, kDouble, kString, kIdent, kPunct };

struct Token {
  Tok kind = Tok::kEnd;
  size_t pos = 0;
  std::string text;     // identifier, punctuation, or decoded string
  uint64_t int_value = 0;
  double double_value = 0;
};

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& s) : s_(s) {}

  std::vector<Token> Run() {
    std::vector<Token> out;
    while (true) {
      SkipSpace();
      Token t;
      t.pos = i_;
      if (i_ >= s_.size()) {
        out.push_back(t);
        return out;
      }
      char c = s_[i_];
      if ((c == 'r' || c == 'R') && i_ + 1 < s_.size() && (s_[i_ + 1] == '\'' || s_[i_ + 1] == '"')) {
        ++i_;
        t.kind = Tok::kString;
        t.text = String(true);
      } else if ((c == 'b' || c == 'B') && i_ + 1 < s_.size() && (s_[i_ + 1] == '\'' || s_[i_ + 1] == '"')) {
        throw CompileError{i_, "Syntax error: bytes literals are not supported"};
      } else if (IsIdentStart(c)) {
        size_t start = i_;
        while (i_ < s_.size() && IsIdentChar(s_[i_])) ++i_;
        t.kind = Tok::kIdent;
        t.text = s_.substr(start, i_ - start);
      } else if (std::isdigit(static_cast<unsigned char>(c)) ||
                 (c == '.' && i_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_ + 1])))) {
        Number(t);
      } else if (c == '\'' || c == '"') {
        t.kind = Tok::kString;
        t.text = String(false);
      } else {
        static const char* const kTwo[] = {"==", "!=", "<=", ">=", "&&", "||"};
        t.kind = Tok::kPunct;
        for (const char* two : kTwo) {
          if (s_.compare(i_, 2, two) == 0) t.text = two;
        }
        if (t.text.empty()) {
          if (std::string("()[]{}.,:?!-+*/%<>").find(c) == std::string::npos) {
            throw CompileError{i_, std::string("Syntax error: token recognition error at: '") + c + "'"};
          }
          t.text = std::string(1, c);
        }
        i_ += t.text.size();
      }
      out.push_back(std::move(t));
    }
  }

 private:
  void SkipSpace() {
    while (i_ < s_.size()) {
      if (std::isspace(static_cast<unsigned char>(s_[i_]))) {
        ++i_;
      } else if (s_.compare(i_, 2, "//") == 0) {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        return;
      }
    }
  }

  void Number(Token& t) {
    size_t start = i_;
    if (s_.compare(i_, 2, "0x") == 0 || s_.compare(i_, 2, "0X") == 0) {
      i_ += 2;
      size_t digits = i_;
      while (i_ < s_.size() && std::isxdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (i_ == digits) throw CompileError{start, "Syntax error: invalid hex literal"};
      IntValue(t, s_.substr(digits, i_ - digits), 16, start);
      return;
    }
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    bool is_double = false;
    if (i_ + 1 < s_.size() && s_[i_] == '.' && std::isdigit(static_cast<unsigned char>(s_[i_ + 1]))) {
      is_double = true;
      ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      size_t save = i_++;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        is_double = true;
        while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      } else {
        i_ = save;
      }
    }
    if (is_double) {
      t.kind = Tok::kDouble;
      t.double_value = std::strtod(s_.substr(start, i_ - start).c_str(), nullptr);
      return;
    }
    IntValue(t, s_.substr(start, i_ - start), 10, start);
  }

  void IntValue(Token& t, const std::string& digits, int base, size_t start) {
    errno = 0;
    char* end = nullptr;
    unsigned long long v = std::strtoull(digits.c_str(), &end, base);
    if (errno == ERANGE) throw CompileError{start, "invalid int literal"};
    t.int_value = v;
    t.kind = Tok::kInt;
    if (i_ < s_.size() && (s_[i_] == 'u' || s_[i_] == 'U')) {
      ++i_;
      t.kind = Tok::kUint;
    }
  }

  std::string String(bool raw) {
    size_t start = i_;
    char q = s_[i_];
    bool triple = s_.compare(i_, 3, std::string(3, q)) == 0;
    i_ += triple ? 3 : 1;
    std::string out;
    while (true) {
      if (i_ >= s_.size()) throw CompileError{start, "Syntax error: unterminated string literal"};
      char c = s_[i_];
      if (triple ? s_.compare(i_, 3, std::string(3, q)) == 0 : c == q) {
        i_ += triple ? 3 : 1;
        return out;
      }
      if (!triple && (c == '\n' || c == '\r')) throw CompileError{start, "Syntax error: unterminated string literal"};
      if (c != '\\' || raw) {
        out += c;
        ++i_;
        continue;
      }
      if (i_ + 1 >= s_.size()) throw CompileError{start, "Syntax error: unterminated string literal"};
      char e = s_[i_ + 1];
      i_ += 2;
      switch (e) {
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '`': out += '`'; break;
        case '?': out += '?'; break;
        case 'x': case 'X': case 'u': case 'U': {
          size_t n = (e == 'x' || e == 'X') ? 2 : e == 'u' ? 4 : 8;
          if (i_ + n > s_.size()) throw CompileError{i_ - 2, "Syntax error: invalid escape sequence"};
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            char h = s_[i_ + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) throw CompileError{i_ - 2, "Syntax error: invalid escape sequence"};
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          i_ += n;
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) throw CompileError{i_ - n - 2, "Syntax error: invalid unicode code point"};
          AppendUtf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '3' && i_ + 1 < s_.size() && s_[i_] >= '0' && s_[i_] <= '7' && s_[i_ + 1] >= '0' &&
              s_[i_ + 1] <= '7') {
            AppendUtf8(out, static_cast<uint32_t>((e - '0') * 64 + (s_[i_] - '0') * 8 + (s_[i_ + 1] - '0')));
            i_ += 2;
            break;
          }
          throw CompileError{i_ - 2, "Syntax error: invalid escape sequence"};
      }
    }
  }

  const std::string& s_;
  size_t i_ = 0;
};

// ---- parser ------------------------------------------------------------------------------

// Words CEL reserves: not usable as identifiers.
bool Reserved(const std::string& w) {
  static const char* const kWords[] = {"as", "break", "const", "continue", "else", "for", "function", "if",
                                       "import", "let", "loop", "package", "namespace", "return", "var",
                                       "void", "while", "in"};
  for (const char* k : kWords) {
    if (w == k) return true;
  }
  return false;
}

std::unique_ptr<Node> MakeNode(Op op, size_t pos) {
  auto n = std::make_unique<Node>();
  n->op = op;
  n->pos = pos;
  return n;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, int max_depth) : t_(std::move(toks)), max_depth_(max_depth) {}

  std::unique_ptr<Node> Run() {
    auto e = Expr();
    if (Peek().kind != Tok::kEnd) throw Unexpected(Peek());
    return e;
  }

 private:
  // Every nested production goes through here, so a deeply nested rule is refused instead of
  // overflowing the stack (here or in the evaluator, whose recursion follows the tree).
  struct DepthGuard {
    DepthGuard(Parser* p, size_t pos) : p_(p) {
      if (++p_->depth_ > p_->max_depth_) {
        throw CompileError{pos, "expression nested too deeply (more than " + std::to_string(p_->max_depth_) + " levels)"};
      }
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  // A left-deep chain (a + b + c ..., a.b.c ...) is as deep as it is long: each link counts as a
  // level until the production that builds the chain returns.
  struct ChainDepth {
    explicit ChainDepth(Parser* p) : p_(p) {}
    void Link(size_t pos) {
      ++links_;
      if (++p_->depth_ > p_->max_depth_) {
        throw CompileError{pos, "expression nested too deeply (more than " + std::to_string(p_->max_depth_) + " levels)"};
      }
    }
    ~ChainDepth() { p_->depth_ -= links_; }
    Parser* p_;
    int links_ = 0;
  };

  const Token& Peek() const { return t_[k_]; }
  bool IsPunct(const char* p) const { return Peek().kind == Tok::kPunct && Peek().text == p; }
  bool IsIn() const { return Peek().kind == Tok::kIdent && Peek().text == "in"; }
  Token Next() { return t_[k_ < t_.size() - 1 ? k_++ : k_]; }
  CompileError Unexpected(const Token& t) const {
    if (t.kind == Tok::kEnd) return {t.pos, "Syntax error: unexpected end of expression"};
    std::string shown = t.kind == Tok::kString ? "string literal" : t.kind == Tok::kPunct || t.kind == Tok::kIdent ? "'" + t.text + "'" : "number";
    return {t.pos, "Syntax error: unexpected " + shown};
  }
  void Expect(const char* p) {
    if (!IsPunct(p)) {
      CompileError e = Unexpected(Peek());
      e.message += std::string(", expecting '") + p + "'";
      throw e;
    }
    Next();
  }

  std::unique_ptr<Node> Expr() {
    DepthGuard guard(this, Peek().pos);
    auto cond = Or();
    if (!IsPunct("?")) return cond;
    size_t pos = Next().pos;
    auto a = Or();
    Expect(":");
    auto b = Expr();
    auto n = MakeNode(Op::kCond, pos);
    n->kids.push_back(std::move(cond));
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }

  std::unique_ptr<Node> Or() {
    auto l = And();
    ChainDepth chain(this);
    while (IsPunct("||")) {
      size_t pos = Next().pos;
      chain.Link(pos);
      auto n = MakeNode(Op::kOr, pos);
      n->kids.push_back(std::move(l));
      n->kids.push_back(And());
      l = std::move(n);
    }
    return l;
  }

  std::unique_ptr<Node> And() {
    auto l = Relation();
    ChainDepth chain(this);
    while (IsPunct("&&")) {
      size_t pos = Next().pos;
      chain.Link(pos);
      auto n = MakeNode(Op::kAnd, pos);
      n->kids.push_back(std::move(l));
      n->kids.push_back(Relation());
      l = std::move(n);
    }
    return l;
  }

  std::unique_ptr<Node> Binary(std::unique_ptr<Node> l, const std::string& op, size_t pos,
                               std::unique_ptr<Node> r) {
    static const std::pair<const char*, BinOp> kOps[] = {
        {"==", BinOp::kEq}, {"!=", BinOp::kNe}, {"<", BinOp::kLt},   {"<=", BinOp::kLe},
        {">", BinOp::kGt},  {">=", BinOp::kGe}, {"in", BinOp::kIn},  {"+", BinOp::kAdd},
        {"-", BinOp::kSub}, {"*", BinOp::kMul}, {"/", BinOp::kDiv}, {"%", BinOp::kMod}};
    auto n = MakeNode(Op::kBinary, pos);
    n->name = op;
    for (const auto& [text, code] : kOps) {
      if (op == text) n->bin = code;
    }
    n->kids.push_back(std::move(l));
    n->kids.push_back(std::move(r));
    return n;
  }

  std::unique_ptr<Node> Relation() {
    auto l = Addition();
    ChainDepth chain(this);
    while (IsPunct("<") || IsPunct("<=") || IsPunct(">") || IsPunct(">=") || IsPunct("==") || IsPunct("!=") ||
           IsIn()) {
      Token op = Next();
      chain.Link(op.pos);
      l = Binary(std::move(l), op.text, op.pos, Addition());
    }
    return l;
  }

  std::unique_ptr<Node> Addition() {
    auto l = Multiplication();
    ChainDepth chain(this);
    while (IsPunct("+") || IsPunct("-")) {
      Token op = Next();
      chain.Link(op.pos);
      l = Binary(std::move(l), op.text, op.pos, Multiplication());
    }
    return l;
  }

  std::unique_ptr<Node> Multiplication() {
    auto l = Unary();
    ChainDepth chain(this);
    while (IsPunct("*") || IsPunct("/") || IsPunct("%")) {
      Token op = Next();
      chain.Link(op.pos);
      l = Binary(std::move(l), op.text, op.pos, Unary());
    }
    return l;
  }

  std::unique_ptr<Node> Unary() {
    DepthGuard guard(this, Peek().pos);
    if (IsPunct("!")) {
      size_t pos = Next().pos;
      auto n = MakeNode(Op::kNot, pos);
      n->kids.push_back(Unary());
      return n;
    }
    if (IsPunct("-")) {
      size_t pos = Next().pos;
      // -9223372036854775808 is a valid int literal although 9223372036854775808 is not.
      if (Peek().kind == Tok::kInt && !(k_ + 1 < t_.size() && t_[k_ + 1].kind == Tok::kPunct &&
                                        (t_[k_ + 1].text == "." || t_[k_ + 1].text == "["))) {
        Token lit = Next();
        if (lit.int_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) {
          throw CompileError{lit.pos, "invalid int literal"};
        }
        auto n = MakeNode(Op::kLiteral, pos);
        n->literal = lit.int_value == static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1
                         ? std::numeric_limits<int64_t>::min()
                         : -static_cast<int64_t>(lit.int_value);
        return Postfix(std::move(n));
      }
      auto n = MakeNode(Op::kNeg, pos);
      n->kids.push_back(Unary());
      return n;
    }
    return Postfix(Primary());
  }

  std::vector<std::unique_ptr<Node>> Args(const char* close) {
    std::vector<std::unique_ptr<Node>> args;
    if (IsPunct(close)) {
      Next();
      return args;
    }
    while (true) {
      args.push_back(Expr());
      if (IsPunct(",")) {
        Next();
        if (IsPunct(close) && std::string(close) != ")") break;  // trailing comma in literals
        continue;
      }
      break;
    }
    Expect(close);
    return args;
  }

  std::unique_ptr<Node> Postfix(std::unique_ptr<Node> e) {
    ChainDepth chain(this);
    while (true) {
      if (IsPunct(".")) {
        size_t pos = Next().pos;
        chain.Link(pos);
        if (Peek().kind != Tok::kIdent || Reserved(Peek().text)) throw Unexpected(Peek());
        Token id = Next();
        if (IsPunct("(")) {
          size_t call_pos = Next().pos;
          auto args = Args(")");
          e = MemberCall(std::move(e), id.text, call_pos, std::move(args));
        } else {
          auto n = MakeNode(Op::kSelect, pos);
          n->name = id.text;
          n->kids.push_back(std::move(e));
          e = std::move(n);
        }
      } else if (IsPunct("[")) {
        size_t pos = Next().pos;
        chain.Link(pos);
        auto n = MakeNode(Op::kIndex, pos);
        n->kids.push_back(std::move(e));
        n->kids.push_back(Expr());
        Expect("]");
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  std::unique_ptr<Node> MemberCall(std::unique_ptr<Node> target, const std::string& name, size_t pos,
                                   std::vector<std::unique_ptr<Node>> args) {
    static const char* const kMacros[] = {"all", "exists", "exists_one", "map", "filter"};
    bool macro = false;
    for (const char* m : kMacros) macro = macro || name == m;
    if (macro && (args.size() == 2 || (name == "map" && args.size() == 3))) {
      if (args[0]->op != Op::kIdent) throw CompileError{args[0]->pos, "argument must be a simple name"};
      auto n = MakeNode(Op::kMacro, pos);
      n->name = name;
      n->var = args[0]->name;
      n->kids.push_back(std::move(target));
      for (size_t i = 1; i < args.size(); ++i) n->kids.push_back(std::move(args[i]));
      return n;
    }
    auto n = MakeNode(Op::kMemberCall, pos);
    n->name = name;
    n->kids.push_back(std::move(target));
    for (auto& a : args) n->kids.push_back(std::move(a));
    return n;
  }

  std::unique_ptr<Node> Primary() {
    Token t = Next();
    switch (t.kind) {
      case Tok::kInt: {
        if (t.int_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw CompileError{t.pos, "invalid int literal"};
        }
        auto n = MakeNode(Op::kLiteral, t.pos);
        n->literal = static_cast<int64_t>(t.int_value);
        return n;
      }
      case Tok::kUint: {
        auto n = MakeNode(Op::kLiteral, t.pos);
        n->literal = static_cast<uint64_t>(t.int_value);
        return n;
      }
      case Tok::kDouble: {
        auto n = MakeNode(Op::kLiteral, t.pos);
        n->literal = t.double_value;
        return n;
      }
      case Tok::kString: {
        auto n = MakeNode(Op::kLiteral, t.pos);
        n->literal = t.text;
        return n;
      }
      case Tok::kIdent: {
        if (t.text == "true" || t.text == "false") {
          auto n = MakeNode(Op::kLiteral, t.pos);
          n->literal = t.text == "true";
          return n;
        }
        if (t.text == "null") return MakeNode(Op::kLiteral, t.pos);
        if (Reserved(t.text)) throw Unexpected(t);
        if (IsPunct("(")) {
          size_t call_pos = Next().pos;
          auto args = Args(")");
          if (t.text == "has") {
            if (args.size() != 1 || args[0]->op != Op::kSelect) {
              throw CompileError{call_pos, "invalid argument to has() macro"};
            }
            auto n = MakeNode(Op::kHas, call_pos);
            n->kids.push_back(std::move(args[0]));
            return n;
          }
          auto n = MakeNode(Op::kCall, call_pos);
          n->name = t.text;
          n->kids = std::move(args);
          return n;
        }
        auto n = MakeNode(Op::kIdent, t.pos);
        n->name = t.text;
        return n;
      }
      case Tok::kPunct: {
        if (t.text == "(") {
          auto e = Expr();
          Expect(")");
          return e;
        }
        if (t.text == "[") {
          auto n = MakeNode(Op::kList, t.pos);
          n->kids = Args("]");
          return n;
        }
        if (t.text == "{") {
          auto n = MakeNode(Op::kMap, t.pos);
          if (IsPunct("}")) {
            Next();
            return n;
          }
          while (true) {
            n->kids.push_back(Expr());
            Expect(":");
            n->kids.push_back(Expr());
            if (IsPunct(",")) {
              Next();
              if (IsPunct("}")) break;
              continue;
            }
            break;
          }
          Expect("}");
          return n;
        }
        if (t.text == ".") {
          throw CompileError{t.pos, "Syntax error: qualified (leading '.') names are not supported"};
        }
        throw Unexpected(t);
      }
      case Tok::kEnd:
        break;
    }
    throw Unexpected(t);
  }

  std::vector<Token> t_;
  size_t k_ = 0;
  int depth_ = 0;
  int max_depth_;
};

// Regular expressions for matches(): RE2 spelled as ECMAScript (see openapi.cpp's patterns).
class RegexCache {
 public:
  std::shared_ptr<const std::regex> Get(const std::string& pattern) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(pattern);
    if (it != cache_.end()) return it->second;
    auto flags = std::regex::ECMAScript;
    std::string body = pattern;
    if (body.rfind("(?i)", 0) == 0) {
      body = body.substr(4);
      flags |= std::regex::icase;
    }
    std::string translated;
    bool in_class = false;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size()) {
        char n = body[++i];
        if (!in_class && n == 'A') {
          translated += '^';
        } else if (!in_class && n == 'z') {
          translated += '$';
        } else {
          translated += '\\';
          translated += n;
        }
        continue;
      }
      if (body[i] == '[') in_class = true;
      if (body[i] == ']') in_class = false;
      translated += body[i];
    }
#if defined(__GLIBCXX__)
    flags |= std::regex_constants::__polynomial;  // no per-character recursion on long inputs
#endif
    std::shared_ptr<const std::regex> re;
    try {
      re = std::make_shared<const std::regex>(translated, flags);
    } catch (const std::regex_error& e) {
      throw EvalError{"invalid regex: " + pattern + ": " + e.what()};
    }
    if (cache_.size() > 1024) cache_.clear();
    cache_.emplace(pattern, re);
    return re;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const std::regex>> cache_;
};

RegexCache& Regexes() {
  static RegexCache cache;
  return cache;
}

// ---- checker: names, functions, and fields known from the schema --------------------------

struct GlobalFn {
  const char* name;
  size_t arity;
};
const GlobalFn kGlobals[] = {{"size", 1}, {"int", 1}, {"uint", 1}, {"double", 1}, {"string", 1},
                             {"bool", 1}, {"matches", 2}, {"dyn", 1}};
const GlobalFn kMembers[] = {{"size", 0}, {"startsWith", 1}, {"endsWith", 1}, {"contains", 1}, {"matches", 1}};

const json* SchemaGet(const json* node, const char* key) {
  if (!node || !node->is_object()) return nullptr;
  auto it = node->find(key);
  return it == node->end() ? nullptr : &*it;
}

// Static types, where known: from literals and from the schema. kDyn (unknown: int-or-string,
// preserve-unknown-fields, map keys of dyn maps, ...) never produces an error.
enum class Ty { kDyn, kInt, kUint, kDouble, kString, kBool, kNull, kList, kMap };

const char* TyName(Ty t) {
  switch (t) {
    case Ty::kInt: return "int";
    case Ty::kUint: return "uint";
    case Ty::kDouble: return "double";
    case Ty::kString: return "string";
    case Ty::kBool: return "bool";
    case Ty::kNull: return "null_type";
    case Ty::kList: return "list";
    case Ty::kMap: return "map";
    default: return "dyn";
  }
}

bool Numeric(Ty t) { return t == Ty::kInt || t == Ty::kUint || t == Ty::kDouble; }

Ty TyOfSchema(const json* s) {
  if (!s) return Ty::kDyn;
  const json* t = SchemaGet(s, "type");
  if (!t || !t->is_string()) return Ty::kDyn;
  if (*t == "integer") return Ty::kInt;
  if (*t == "number") return Ty::kDouble;
  if (*t == "string") return Ty::kString;
  if (*t == "boolean") return Ty::kBool;
  if (*t == "array") return Ty::kList;
  if (*t == "object") return Ty::kMap;
  return Ty::kDyn;
}

Ty TyOfValue(const json& j) {
  if (j.is_null()) return Ty::kNull;
  if (j.is_boolean()) return Ty::kBool;
  if (j.is_number_unsigned()) return Ty::kUint;
  if (j.is_number_integer()) return Ty::kInt;
  if (j.is_number_float()) return Ty::kDouble;
  if (j.is_string()) return Ty::kString;
  return j.is_array() ? Ty::kList : Ty::kMap;
}

// What the checker knows about an expression: the schema node describing it and its type.
struct Info {
  const json* schema = nullptr;
  Ty type = Ty::kDyn;
};

Info FromSchema(const json* s) { return {s, TyOfSchema(s)}; }

class Checker {
 public:
  Checker(const json* self_schema, bool is_root) : self_schema_(self_schema), is_root_(is_root) {}

  std::vector<CompileError> errors;
  bool uses_old_self = false;

  Info Check(const Node& n) {
    switch (n.op) {
      case Op::kLiteral:
        return {nullptr, TyOfValue(n.literal)};
      case Op::kIdent: {
        for (auto it = scope_.rbegin(); it != scope_.rend(); ++it) {
          if (it->first == n.name) return it->second;
        }
        if (n.name == "self") return FromSchema(self_schema_);
        if (n.name == "oldSelf") {
          uses_old_self = true;
          return FromSchema(self_schema_);
        }
        errors.push_back({n.pos, "undeclared reference to '" + n.name + "' (in container '')"});
        return {};
      }
      case Op::kSelect:
        return FromSchema(Field(Check(*n.kids[0]).schema, n.name, n.pos, Root(*n.kids[0])));
      case Op::kHas: {
        // cel-go places has() errors at the macro's '(' rather than at the field.
        const Node& sel = *n.kids[0];
        Field(Check(*sel.kids[0]).schema, sel.name, n.pos, Root(*sel.kids[0]));
        return {nullptr, Ty::kBool};
      }
      case Op::kIndex: {
        const json* s = Check(*n.kids[0]).schema;
        Check(*n.kids[1]);
        if (!s) return {};
        if (const json* items = SchemaGet(s, "items")) return FromSchema(items);
        if (n.kids[1]->op == Op::kLiteral && n.kids[1]->literal.is_string()) {
          return FromSchema(Field(s, n.kids[1]->literal.get<std::string>(), n.kids[1]->pos, Root(*n.kids[0])));
        }
        const json* ap = SchemaGet(s, "additionalProperties");
        return FromSchema(ap && ap->is_object() ? ap : nullptr);
      }
      case Op::kMacro: {
        Info range = Check(*n.kids[0]);
        Info elem;
        if (const json* items = SchemaGet(range.schema, "items")) {
          elem = FromSchema(items);
        } else if (range.type == Ty::kMap) {
          elem.type = Ty::kString;  // maps iterate their keys
        }
        scope_.emplace_back(n.var, elem);
        for (size_t i = 1; i < n.kids.size(); ++i) {
          Info body = Check(*n.kids[i]);
          bool is_predicate = n.name != "map" || (n.kids.size() == 3 && i == 1);
          if (is_predicate) Want(body, Ty::kBool, n.name, n.pos);
        }
        scope_.pop_back();
        return {nullptr, n.name == "map" || n.name == "filter" ? Ty::kList : Ty::kBool};
      }
      case Op::kCall:
      case Op::kMemberCall:
        return Call(n);
      case Op::kNot: {
        Info v = Check(*n.kids[0]);
        Operands("!_", n.pos, {v.type}, v.type != Ty::kDyn && v.type != Ty::kBool);
        return {nullptr, Ty::kBool};
      }
      case Op::kNeg: {
        Info v = Check(*n.kids[0]);
        Operands("-_", n.pos, {v.type}, v.type != Ty::kDyn && v.type != Ty::kInt && v.type != Ty::kDouble);
        return {nullptr, v.type == Ty::kInt || v.type == Ty::kDouble ? v.type : Ty::kDyn};
      }
      case Op::kAnd:
      case Op::kOr: {
        Info a = Check(*n.kids[0]);
        Info b = Check(*n.kids[1]);
        auto bad = [](Ty t) { return t != Ty::kDyn && t != Ty::kBool; };
        Operands(n.op == Op::kAnd ? "_&&_" : "_||_", n.pos, {a.type, b.type}, bad(a.type) || bad(b.type));
        return {nullptr, Ty::kBool};
      }
      case Op::kCond: {
        Info c = Check(*n.kids[0]);
        Info a = Check(*n.kids[1]);
        Info b = Check(*n.kids[2]);
        Operands("_?_:_", n.pos, {c.type, a.type, b.type}, c.type != Ty::kDyn && c.type != Ty::kBool);
        return a.type == b.type ? a : Info{};
      }
      case Op::kBinary:
        return Binary(n);
      case Op::kList:
      case Op::kMap:
        for (const auto& k : n.kids) Check(*k);
        return {nullptr, n.op == Op::kList ? Ty::kList : Ty::kMap};
    }
    return {};
  }

 private:
  void Operands(const std::string& op, size_t pos, std::initializer_list<Ty> types, bool bad) {
    if (!bad) return;
    std::string list;
    for (Ty t : types) list += (list.empty() ? "" : ", ") + std::string(TyName(t));
    errors.push_back({pos, "found no matching overload for '" + op + "' applied to '(" + list + ")'"});
  }

  void Want(const Info& got, Ty want, const std::string& what, size_t pos) {
    if (got.type != Ty::kDyn && got.type != want) {
      errors.push_back({pos, "found no matching overload for '" + what + "' applied to '(" + TyName(got.type) + ")'"});
    }
  }

  Info Binary(const Node& n) {
    Info a = Check(*n.kids[0]);
    Info b = Check(*n.kids[1]);
    const Ty x = a.type, y = b.type;
    const bool known = x != Ty::kDyn && y != Ty::kDyn;
    const std::string op = n.name == "in" ? "@in" : "_" + n.name + "_";
    switch (n.bin) {
      case BinOp::kEq:
      case BinOp::kNe:
        // Numbers compare across types and null with anything; other pairs must match.
        Operands(op, n.pos, {x, y},
                 known && x != y && !(Numeric(x) && Numeric(y)) && x != Ty::kNull && y != Ty::kNull);
        return {nullptr, Ty::kBool};
      case BinOp::kLt:
      case BinOp::kLe:
      case BinOp::kGt:
      case BinOp::kGe: {
        auto orderable = [](Ty t) { return Numeric(t) || t == Ty::kString || t == Ty::kBool || t == Ty::kDyn; };
        Operands(op, n.pos, {x, y},
                 !orderable(x) || !orderable(y) || (known && x != y && !(Numeric(x) && Numeric(y))));
        return {nullptr, Ty::kBool};
      }
      case BinOp::kIn:
        Operands(op, n.pos, {x, y}, y != Ty::kDyn && y != Ty::kList && y != Ty::kMap);
        return {nullptr, Ty::kBool};
      case BinOp::kAdd:
        if (known && x == y && (x == Ty::kString || x == Ty::kList)) return {nullptr, x};
        [[fallthrough]];
      default: {
        bool arithmetic = Numeric(x) || x == Ty::kDyn;
        bool ok_pair = !known ? (x == Ty::kDyn || Numeric(x) || (n.bin == BinOp::kAdd && (x == Ty::kString || x == Ty::kList))) &&
                                    (y == Ty::kDyn || Numeric(y) || (n.bin == BinOp::kAdd && (y == Ty::kString || y == Ty::kList)))
                              : x == y && arithmetic && !(n.bin == BinOp::kMod && x == Ty::kDouble);
        Operands(op, n.pos, {x, y}, !ok_pair);
        return {nullptr, known && ok_pair ? x : Ty::kDyn};
      }
    }
    return {};
  }

  Info Call(const Node& n) {
    const bool member = n.op == Op::kMemberCall;
    const size_t arity = n.kids.size() - (member ? 1 : 0);
    bool known = false, arity_ok = false;
    const GlobalFn* begin = member ? std::begin(kMembers) : std::begin(kGlobals);
    const GlobalFn* end = member ? std::end(kMembers) : std::end(kGlobals);
    for (const GlobalFn* f = begin; f != end; ++f) {
      if (n.name == f->name) {
        known = true;
        arity_ok = arity_ok || f->arity == arity;
      }
    }
    std::vector<Info> args;
    for (const auto& k : n.kids) args.push_back(Check(*k));
    if (!known) {
      errors.push_back({n.pos, "undeclared reference to '" + n.name + "' (in container '')"});
      return {};
    }
    if (!arity_ok) {
      errors.push_back({n.pos, "found no matching overload for '" + n.name + "' applied to " +
                                   std::to_string(arity) + " argument(s)"});
      return {};
    }
    const std::string& f = n.name;
    auto types = [&] {
      std::string list;
      for (size_t i = member ? 1 : 0; i < args.size(); ++i) list += (list.empty() ? "" : ", ") + std::string(TyName(args[i].type));
      return member ? std::string(TyName(args[0].type)) + ".(" + list + ")" : "(" + list + ")";
    };
    auto mismatch = [&] { errors.push_back({n.pos, "found no matching overload for '" + f + "' applied to '" + types() + "'"}); };
    auto is = [&](size_t i, std::initializer_list<Ty> ok) {
      if (args[i].type == Ty::kDyn) return true;
      for (Ty t : ok) {
        if (args[i].type == t) return true;
      }
      return false;
    };
    if (f == "size") {
      if (!is(0, {Ty::kString, Ty::kList, Ty::kMap})) mismatch();
      return {nullptr, Ty::kInt};
    }
    if (f == "startsWith" || f == "endsWith" || f == "contains" || f == "matches") {
      if (!is(0, {Ty::kString}) || !is(1, {Ty::kString})) mismatch();
      // A constant pattern must compile, as kube-apiserver checks it when the CRD is written.
      const Node& pattern = *n.kids[1];
      if (f == "matches" && pattern.op == Op::kLiteral && pattern.literal.is_string()) {
        try {
          Regexes().Get(pattern.literal.get<std::string>());
        } catch (const EvalError& e) {
          errors.push_back({pattern.pos, "invalid matches argument: " + e.message});
        }
      }
      return {nullptr, Ty::kBool};
    }
    if (f == "int" || f == "uint" || f == "double") {
      if (!is(0, {Ty::kInt, Ty::kUint, Ty::kDouble, Ty::kString})) mismatch();
      return {nullptr, f == "int" ? Ty::kInt : f == "uint" ? Ty::kUint : Ty::kDouble};
    }
    if (f == "string") {
      if (!is(0, {Ty::kInt, Ty::kUint, Ty::kDouble, Ty::kString, Ty::kBool})) mismatch();
      return {nullptr, Ty::kString};
    }
    if (f == "bool") {
      if (!is(0, {Ty::kBool, Ty::kString})) mismatch();
      return {nullptr, Ty::kBool};
    }
    return {};  // dyn()
  }

  // Whether the node is self/oldSelf itself (the resource root has apiVersion/kind/metadata).
  bool Root(const Node& n) const {
    if (n.op != Op::kIdent || (n.name != "self" && n.name != "oldSelf")) return false;
    for (const auto& s : scope_) {
      if (s.first == n.name) return false;
    }
    return is_root_;
  }

  const json* Field(const json* s, const std::string& name, size_t pos, bool at_resource_root) {
    if (!s) return nullptr;
    if (at_resource_root && (name == "apiVersion" || name == "kind")) return nullptr;
    if (at_resource_root && name == "metadata") return &RootMetadata();
    // An embedded resource carries its own apiVersion, kind and metadata.
    const json* embedded = SchemaGet(s, "x-kubernetes-embedded-resource");
    if (embedded && *embedded == true && (name == "apiVersion" || name == "kind" || name == "metadata")) {
      const json* props = SchemaGet(s, "properties");
      if (!props || !props->contains(name)) return nullptr;
    }
    const json* props = SchemaGet(s, "properties");
    if (props && props->is_object()) {
      auto it = props->find(name);
      if (it != props->end()) return it->is_object() ? &*it : nullptr;
    }
    const json* ap = SchemaGet(s, "additionalProperties");
    if (ap && ap->is_object()) return ap;
    const json* preserve = SchemaGet(s, "x-kubernetes-preserve-unknown-fields");
    if ((preserve && preserve->is_boolean() && preserve->get<bool>()) || (ap && ap->is_boolean())) return nullptr;
    const json* type = SchemaGet(s, "type");
    if (type && *type == "object") errors.push_back({pos, "undefined field '" + name + "'"});
    return nullptr;
  }

  static const json& RootMetadata() {
    static const json kMeta = {{"type", "object"},
                               {"properties", {{"name", {{"type", "string"}}}, {"generateName", {{"type", "string"}}}}}};
    return kMeta;
  }

  const json* self_schema_;
  bool is_root_;
  std::vector<std::pair<std::string, Info>> scope_;
};

// ---- values ------------------------------------------------------------------------------

// A CEL value: JSON borrowed from the data (no copy on field selection) or owned.
class Value {
 public:
  Value() = default;
  explicit Value(json j) : own_(std::move(j)) {}
  static Value Ref(const json& j) {
    Value v;
    v.ref_ = &j;
    return v;
  }
  const json& get() const { return ref_ ? *ref_ : own_; }
  bool borrowed() const { return ref_ != nullptr; }
  json Take() { return ref_ ? *ref_ : std::move(own_); }

 private:
  const json* ref_ = nullptr;
  json own_;
};

bool IsInt(const json& j) { return j.is_number_integer() && !j.is_number_unsigned(); }
bool IsUint(const json& j) { return j.is_number_unsigned(); }
bool IsDouble(const json& j) { return j.is_number_float(); }

[[noreturn]] void NoOverload() { throw EvalError{"no such overload"}; }

size_t Runes(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

// Numbers of any CEL numeric type compared exactly (long double holds every int64 and uint64).
long double Num(const json& j) {
  if (IsInt(j)) return static_cast<long double>(j.get<int64_t>());
  if (IsUint(j)) return static_cast<long double>(j.get<uint64_t>());
  return static_cast<long double>(j.get<double>());
}

// ---- evaluator ---------------------------------------------------------------------------

class Evaluator {
 public:
  Evaluator(const json& self, const json* old_self, int64_t max_steps)
      : self_(self), old_self_(old_self), max_steps_(max_steps) {}

  int64_t steps() const { return steps_; }

  Value Eval(const Node& n) {
    Charge(1);
    switch (n.op) {
      case Op::kLiteral:
        return Value(n.literal);
      case Op::kIdent:
        return Ident(n.name);
      case Op::kSelect: {
        Value target = Eval(*n.kids[0]);
        return Child(std::move(target), n.name);
      }
      case Op::kIndex:
        return Index(Eval(*n.kids[0]), Eval(*n.kids[1]));
      case Op::kHas: {
        Value target = Eval(*n.kids[0]->kids[0]);
        if (!target.get().is_object()) NoOverload();
        return Value(json(target.get().contains(n.kids[0]->name)));
      }
      case Op::kList: {
        json out = json::array();
        for (const auto& k : n.kids) out.push_back(Eval(*k).Take());
        return Value(std::move(out));
      }
      case Op::kMap: {
        json out = json::object();
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          Value key = Eval(*n.kids[i]);
          if (!key.get().is_string()) throw EvalError{"unsupported map key type: only string keys are supported"};
          const std::string k = key.get().get<std::string>();
          if (out.contains(k)) throw EvalError{"Failed with repeated key: " + k};
          out[k] = Eval(*n.kids[i + 1]).Take();
        }
        return Value(std::move(out));
      }
      case Op::kNot: {
        Value v = Eval(*n.kids[0]);
        if (!v.get().is_boolean()) NoOverload();
        return Value(json(!v.get().get<bool>()));
      }
      case Op::kNeg: {
        Value v = Eval(*n.kids[0]);
        const json& j = v.get();
        if (IsInt(j)) {
          int64_t x = j.get<int64_t>();
          if (x == std::numeric_limits<int64_t>::min()) throw EvalError{"integer overflow"};
          return Value(json(-x));
        }
        if (IsDouble(j)) return Value(json(-j.get<double>()));
        NoOverload();
      }
      case Op::kAnd:
      case Op::kOr:
        return Logical(n, n.op == Op::kAnd);
      case Op::kCond: {
        Value c = Eval(*n.kids[0]);
        if (!c.get().is_boolean()) NoOverload();
        return Eval(*n.kids[c.get().get<bool>() ? 1 : 2]);
      }
      case Op::kBinary: {
        Value l = Eval(*n.kids[0]);  // left first: its error is the one reported
        Value r = Eval(*n.kids[1]);
        return Binary(n.bin, std::move(l), std::move(r));
      }
      case Op::kCall:
      case Op::kMemberCall:
        return Call(n);
      case Op::kMacro:
        return Macro(n);
    }
    NoOverload();
  }

 private:
  void Charge(int64_t n) {
    steps_ += n;
    if (steps_ > max_steps_) throw CostError{};
  }

  Value Ident(const std::string& name) {
    for (auto it = vars_.rbegin(); it != vars_.rend(); ++it) {
      if (it->first == name) return Value::Ref(*it->second);
    }
    if (name == "self") return Value::Ref(self_);
    if (name == "oldSelf" && old_self_) return Value::Ref(*old_self_);
    throw EvalError{"no such attribute: " + name};
  }

  // Selecting from a borrowed value borrows; from an owned one, moves the part out.
  static Value Part(Value whole, const json& part) {
    if (whole.borrowed()) return Value::Ref(part);
    return Value(json(part));
  }

  Value Child(Value target, const std::string& key) {
    const json& t = target.get();
    if (!t.is_object()) NoOverload();
    auto it = t.find(key);
    if (it == t.end()) throw EvalError{"no such key: " + key};
    // The child lives in heap storage that moving `target` hands over intact.
    const json& child = *it;
    return Part(std::move(target), child);
  }

  Value Index(Value target, Value index) {
    const json& t = target.get();
    const json& i = index.get();
    if (t.is_array()) {
      int64_t at;
      if (IsInt(i)) {
        at = i.get<int64_t>();
      } else if (IsUint(i)) {
        at = i.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(i.get<uint64_t>());
      } else {
        NoOverload();
      }
      if (at < 0 || static_cast<uint64_t>(at) >= t.size()) {
        throw EvalError{"index out of bounds: " + std::to_string(at)};
      }
      const json& elem = t[static_cast<size_t>(at)];
      return Part(std::move(target), elem);
    }
    if (t.is_object()) {
      if (!i.is_string()) throw EvalError{"no such key: " + i.dump()};
      return Child(std::move(target), i.get<std::string>());
    }
    NoOverload();
  }

  // CEL's && and ||: commutative, an error on one side is absorbed when the other side decides.
  Value Logical(const Node& n, bool is_and) {
    std::string first_error;
    for (const auto& k : n.kids) {
      try {
        Value v = Eval(*k);
        if (!v.get().is_boolean()) NoOverload();
        bool b = v.get().get<bool>();
        if (b != is_and) return Value(json(b));  // false for &&, true for ||: decided
      } catch (const EvalError& e) {
        if (first_error.empty()) first_error = e.message;
      }
    }
    if (!first_error.empty()) throw EvalError{first_error};
    return Value(json(is_and));
  }

  bool Equal(const json& a, const json& b) {
    Charge(1);
    if (a.is_number() && b.is_number()) {
      if ((IsDouble(a) && std::isnan(a.get<double>())) || (IsDouble(b) && std::isnan(b.get<double>()))) return false;
      return Num(a) == Num(b);
    }
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!Equal(a[i], b[i])) return false;
      }
      return true;
    }
    if (a.is_object()) {
      if (a.size() != b.size()) return false;
      for (auto it = a.begin(); it != a.end(); ++it) {
        auto f = b.find(it.key());
        if (f == b.end() || !Equal(*it, *f)) return false;
      }
      return true;
    }
    if (a.is_string()) Charge(static_cast<int64_t>(a.get_ref<const std::string&>().size() / 8));
    return a == b;
  }

  // <0, 0, >0; NaN compares as unordered (all relations false).
  bool Less(const json& a, const json& b, bool or_equal) {
    if (a.is_number() && b.is_number()) {
      if ((IsDouble(a) && std::isnan(a.get<double>())) || (IsDouble(b) && std::isnan(b.get<double>()))) return false;
      return or_equal ? Num(a) <= Num(b) : Num(a) < Num(b);
    }
    if (a.is_string() && b.is_string()) {
      Charge(static_cast<int64_t>(std::min(a.get_ref<const std::string&>().size(), b.get_ref<const std::string&>().size()) / 8));
      int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
      return or_equal ? c <= 0 : c < 0;
    }
    if (a.is_boolean() && b.is_boolean()) {
      return or_equal ? a.get<bool>() <= b.get<bool>() : a.get<bool>() < b.get<bool>();
    }
    NoOverload();
  }

  Value Arith(BinOp op, const json& a, const json& b) {
    if (IsInt(a) && IsInt(b)) {
      int64_t x = a.get<int64_t>(), y = b.get<int64_t>(), r = 0;
      bool overflow = false;
      if (op == BinOp::kAdd) {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == BinOp::kSub) {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == BinOp::kMul) {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else if (op == BinOp::kDiv || op == BinOp::kMod) {
        if (y == 0) throw EvalError{op == BinOp::kDiv ? "division by zero" : "modulus by zero"};
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == BinOp::kDiv) throw EvalError{"integer overflow"};
          return Value(json(int64_t{0}));
        }
        r = op == BinOp::kDiv ? x / y : x % y;
      }
      if (overflow) throw EvalError{"integer overflow"};
      return Value(json(r));
    }
    if (IsUint(a) && IsUint(b)) {
      uint64_t x = a.get<uint64_t>(), y = b.get<uint64_t>(), r = 0;
      bool overflow = false;
      if (op == BinOp::kAdd) {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == BinOp::kSub) {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == BinOp::kMul) {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else {
        if (y == 0) throw EvalError{op == BinOp::kDiv ? "division by zero" : "modulus by zero"};
        r = op == BinOp::kDiv ? x / y : x % y;
      }
      if (overflow) throw EvalError{"unsigned integer overflow"};
      return Value(json(r));
    }
    if (IsDouble(a) && IsDouble(b) && op != BinOp::kMod) {
      double x = a.get<double>(), y = b.get<double>();
      double r = op == BinOp::kAdd ? x + y : op == BinOp::kSub ? x - y : op == BinOp::kMul ? x * y : x / y;
      return Value(json(r));
    }
    NoOverload();
  }

  Value Binary(BinOp op, Value l, Value r) {
    const json& a = l.get();
    const json& b = r.get();
    switch (op) {
      case BinOp::kEq: return Value(json(Equal(a, b)));
      case BinOp::kNe: return Value(json(!Equal(a, b)));
      case BinOp::kLt: return Value(json(Less(a, b, false)));
      case BinOp::kLe: return Value(json(Less(a, b, true)));
      case BinOp::kGt: return Value(json(Less(b, a, false)));
      case BinOp::kGe: return Value(json(Less(b, a, true)));
      case BinOp::kIn:
        if (b.is_array()) {
          for (const auto& e : b) {
            if (Equal(a, e)) return Value(json(true));
          }
          return Value(json(false));
        }
        if (b.is_object()) return Value(json(a.is_string() && b.contains(a.get<std::string>())));
        NoOverload();
      case BinOp::kAdd:
        if (a.is_string() && b.is_string()) {
          Charge(static_cast<int64_t>((a.get_ref<const std::string&>().size() + b.get_ref<const std::string&>().size()) / 8));
          return Value(json(a.get<std::string>() + b.get<std::string>()));
        }
        if (a.is_array() && b.is_array()) {
          Charge(static_cast<int64_t>(a.size() + b.size()));
          json out = l.Take();
          for (const auto& e : b) out.push_back(e);
          return Value(std::move(out));
        }
        return Arith(op, a, b);
      default:
        return Arith(op, a, b);
    }
  }

  const std::string& Str(const json& j) {
    if (!j.is_string()) NoOverload();
    return j.get_ref<const std::string&>();
  }

  Value Call(const Node& n) {
    const bool member = n.op == Op::kMemberCall;
    std::vector<Value> args;
    args.reserve(n.kids.size());
    for (const auto& k : n.kids) args.push_back(Eval(*k));
    const std::string& f = n.name;
    // Member calls have the receiver first: x.size() and size(x) read the same from here on.
    const json& x = args[0].get();
    if (f == "size" && args.size() == 1) {
      if (x.is_string()) {
        Charge(static_cast<int64_t>(x.get_ref<const std::string&>().size() / 8));
        return Value(json(static_cast<int64_t>(Runes(x.get_ref<const std::string&>()))));
      }
      if (x.is_array() || x.is_object()) return Value(json(static_cast<int64_t>(x.size())));
      NoOverload();
    }
    if ((f == "startsWith" || f == "endsWith" || f == "contains") && member && args.size() == 2) {
      const std::string& s = Str(x);
      const std::string& p = Str(args[1].get());
      Charge(static_cast<int64_t>((s.size() + p.size()) / 8));
      if (f == "startsWith") return Value(json(s.compare(0, p.size(), p) == 0 && s.size() >= p.size()));
      if (f == "endsWith") return Value(json(s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0));
      Charge(static_cast<int64_t>(s.size() * std::max<size_t>(p.size(), 1) / 64));
      return Value(json(s.find(p) != std::string::npos));
    }
    if (f == "matches" && args.size() == 2) {
      const std::string& s = Str(x);
      const std::string& p = Str(args[1].get());
      Charge(static_cast<int64_t>(1 + s.size() * std::max<size_t>(p.size(), 1) / 8));
      auto re = Regexes().Get(p);
      try {
        return Value(json(std::regex_search(s, *re)));
      } catch (const std::regex_error& e) {
        throw EvalError{std::string("regex evaluation failed: ") + e.what()};
      }
    }
    if (!member && args.size() == 1) return Convert(f, args[0]);
    NoOverload();
  }

  Value Convert(const std::string& f, Value& arg) {
    const json& x = arg.get();
    if (f == "dyn") return std::move(arg);
    if (f == "int") {
      if (IsInt(x)) return std::move(arg);
      if (IsUint(x)) {
        if (x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) throw EvalError{"integer overflow"};
        return Value(json(static_cast<int64_t>(x.get<uint64_t>())));
      }
      if (IsDouble(x)) {
        double d = x.get<double>();
        // [-2^63, 2^63): exactly representable bounds.
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) throw EvalError{"range error converting " + gofmt::Float(d) + " to int"};
        return Value(json(static_cast<int64_t>(d)));
      }
      if (x.is_string()) {
        const std::string& s = x.get_ref<const std::string&>();
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE || std::isspace(static_cast<unsigned char>(s[0]))) {
          throw EvalError{"cannot convert string " + gofmt::Quote(s) + " to int"};
        }
        return Value(json(static_cast<int64_t>(v)));
      }
      NoOverload();
    }
    if (f == "uint") {
      if (IsUint(x)) return std::move(arg);
      if (IsInt(x)) {
        if (x.get<int64_t>() < 0) throw EvalError{"unsigned integer overflow"};
        return Value(json(static_cast<uint64_t>(x.get<int64_t>())));
      }
      if (IsDouble(x)) {
        double d = x.get<double>();
        if (!(d >= 0 && d < 18446744073709551616.0)) throw EvalError{"range error converting " + gofmt::Float(d) + " to uint"};
        return Value(json(static_cast<uint64_t>(d)));
      }
      if (x.is_string()) {
        const std::string& s = x.get_ref<const std::string&>();
        errno = 0;
        char* end = nullptr;
        unsigned long long v = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE || !std::isdigit(static_cast<unsigned char>(s[0]))) {
          throw EvalError{"cannot convert string " + gofmt::Quote(s) + " to uint"};
        }
        return Value(json(static_cast<uint64_t>(v)));
      }
      NoOverload();
    }
    if (f == "double") {
      if (IsDouble(x)) return std::move(arg);
      if (IsInt(x)) return Value(json(static_cast<double>(x.get<int64_t>())));
      if (IsUint(x)) return Value(json(static_cast<double>(x.get<uint64_t>())));
      if (x.is_string()) {
        const std::string& s = x.get_ref<const std::string&>();
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || std::isspace(static_cast<unsigned char>(s[0]))) {
          throw EvalError{"cannot convert string " + gofmt::Quote(s) + " to double"};
        }
        return Value(json(d));
      }
      NoOverload();
    }
    if (f == "string") {
      if (x.is_string()) return std::move(arg);
      if (IsInt(x)) return Value(json(std::to_string(x.get<int64_t>())));
      if (IsUint(x)) return Value(json(std::to_string(x.get<uint64_t>())));
      if (IsDouble(x)) return Value(json(gofmt::Float(x.get<double>())));
      if (x.is_boolean()) return Value(json(x.get<bool>() ? "true" : "false"));
      NoOverload();
    }
    if (f == "bool") {
      if (x.is_boolean()) return std::move(arg);
      if (x.is_string()) {
        static const char* const kTrue[] = {"1", "t", "true", "TRUE", "True"};
        static const char* const kFalse[] = {"0", "f", "false", "FALSE", "False"};
        for (const char* t : kTrue) {
          if (x == t) return Value(json(true));
        }
        for (const char* t : kFalse) {
          if (x == t) return Value(json(false));
        }
        throw EvalError{"type conversion error from 'string' to 'bool'"};
      }
      NoOverload();
    }
    NoOverload();
  }

  Value Macro(const Node& n) {
    Value range = Eval(*n.kids[0]);
    const json& r = range.get();
    if (!r.is_array() && !r.is_object()) NoOverload();
    // Map comprehensions range over the keys.
    json keys;
    const json* elems = &r;
    if (r.is_object()) {
      keys = json::array();
      for (auto it = r.begin(); it != r.end(); ++it) keys.push_back(it.key());
      elems = &keys;
    }
    const std::string& m = n.name;
    auto bind = [&](const json& e) { vars_.emplace_back(n.var, &e); };
    auto unbind = [&] { vars_.pop_back(); };
    auto predicate = [&](const Node& body) {
      Value v = Eval(body);
      if (!v.get().is_boolean()) NoOverload();
      return v.get().get<bool>();
    };
    if (m == "all" || m == "exists") {
      // Folded with && / ||, so an error is absorbed by a deciding element anywhere in the list.
      const bool is_all = m == "all";
      std::string first_error;
      for (const auto& e : *elems) {
        Charge(1);
        bind(e);
        try {
          bool b = predicate(*n.kids[1]);
          unbind();
          if (b != is_all) return Value(json(b));
        } catch (const EvalError& err) {
          unbind();
          if (first_error.empty()) first_error = err.message;
        } catch (...) {
          unbind();
          throw;
        }
      }
      if (!first_error.empty()) throw EvalError{first_error};
      return Value(json(is_all));
    }
    struct Unbind {
      std::vector<std::pair<std::string, const json*>>* vars;
      size_t size;
      ~Unbind() { vars->resize(size); }
    } guard{&vars_, vars_.size()};
    if (m == "exists_one") {
      int64_t count = 0;
      for (const auto& e : *elems) {
        Charge(1);
        bind(e);
        if (predicate(*n.kids[1])) ++count;
        unbind();
      }
      return Value(json(count == 1));
    }
    json out = json::array();
    for (const auto& e : *elems) {
      Charge(1);
      bind(e);
      if (m == "filter") {
        if (predicate(*n.kids[1])) out.push_back(e);
      } else if (n.kids.size() == 3) {  // map(x, filter, transform)
        if (predicate(*n.kids[1])) out.push_back(Eval(*n.kids[2]).Take());
      } else {
        out.push_back(Eval(*n.kids[1]).Take());
      }
      unbind();
    }
    return Value(std::move(out));
  }

  const json& self_;
  const json* old_self_;
  int64_t max_steps_;
  int64_t steps_ = 0;
  std::vector<std::pair<std::string, const json*>> vars_;
};

}  // namespace

std::string TypeName(const json& j) {
  if (j.is_null()) return "null_type";
  if (j.is_boolean()) return "bool";
  if (IsInt(j)) return "int";
  if (IsUint(j)) return "uint";
  if (IsDouble(j)) return "double";
  if (j.is_string()) return "string";
  if (j.is_array()) return "list";
  return "map";
}

CompileResult Compile(const std::string& expr, const json* self_schema, bool is_resource_root,
                      const Limits& limits) {
  CompileResult out;
  try {
    if (expr.size() > limits.max_length) {
      throw CompileError{0, "expression longer than " + std::to_string(limits.max_length) + " bytes"};
    }
    auto program = std::make_shared<Program>();
    program->text = expr;
    program->root = Parser(Lexer(expr).Run(), limits.max_depth).Run();
    Checker checker(self_schema, is_resource_root);
    Info result = checker.Check(*program->root);
    program->never_bool = result.type != Ty::kDyn && result.type != Ty::kBool;
    if (!checker.errors.empty()) {
      std::string all;
      for (const auto& e : checker.errors) all += (all.empty() ? "" : "\n") + FormatCompileError(expr, e);
      out.error = all;
      return out;
    }
    out.uses_old_self = checker.uses_old_self;
    out.program = std::move(program);
  } catch (const CompileError& e) {
    out.error = FormatCompileError(expr, e);
  } catch (const std::exception& e) {  // a bug here must not take the API server down
    out.program.reset();
    out.error = FormatCompileError(expr, {0, std::string("internal error: ") + e.what()});
  }
  return out;
}

std::shared_ptr<const CompileResult> CompileCached(const std::string& expr) {
  // Process-wide on purpose, like openapi.cpp's pattern cache: rules are few and fixed per CRD.
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const CompileResult>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(expr);
    if (it != cache.end()) return it->second;
  }
  auto compiled = std::make_shared<const CompileResult>(Compile(expr));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 4096) cache.clear();  // bound memory under adversarial CRDs
  cache.emplace(expr, compiled);
  return compiled;
}

EvalResult Evaluate(const Program& program, const json& self, const json* old_self, const Limits& limits) {
  EvalResult out;
  Evaluator ev(self, old_self, limits.max_steps);
  try {
    out.value = ev.Eval(*program.root).Take();
  } catch (const EvalError& e) {
    out.error = e.message;
  } catch (const CostError&) {
    out.cost_exceeded = true;
    out.error = "operation cancelled: actual cost limit exceeded";
  } catch (const std::exception& e) {  // a bug here must not take the API server down
    out.error = std::string("internal error: ") + e.what();
  }
  out.steps = ev.steps();
  return out;
}

json ToCelValue(const json& node, const json& data) {
  const json* type = SchemaGet(&node, "type");
  if (data.is_number()) {
    if (type && *type == "number") return data.get<double>();
    if (data.is_number_unsigned()) {
      uint64_t u = data.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(u);
      return static_cast<double>(u);
    }
    return data;
  }
  if (data.is_array()) {
    const json* items = SchemaGet(&node, "items");
    static const json kNone = json::object();
    json out = json::array();
    for (const auto& e : data) out.push_back(ToCelValue(items && items->is_object() ? *items : kNone, e));
    return out;
  }
  if (data.is_object()) {
    const json* props = SchemaGet(&node, "properties");
    const json* ap = SchemaGet(&node, "additionalProperties");
    static const json kNone = json::object();
    json out = json::object();
    for (auto it = data.begin(); it != data.end(); ++it) {
      if (it->is_null()) continue;  // null fields are absent to CEL
      const json* sub = &kNone;
      if (props && props->is_object() && props->contains(it.key()) && (*props)[it.key()].is_object()) {
        sub = &(*props)[it.key()];
      } else if (ap && ap->is_object()) {
        sub = ap;
      }
      out[it.key()] = ToCelValue(*sub, *it);
    }
    return out;
  }
  return data;
}

bool NeverBool(const Program& program) { return program.never_bool; }

}  // namespace meshwork::controlplane::schema::cel
