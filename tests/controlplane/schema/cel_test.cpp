// The CEL subset behind x-kubernetes-validations: parsing and precedence, every operator and
// function, CEL's error-absorbing && and ||, overflow, the step limit, and the rules' causes
// (messages, reasons, fieldPath, transition rules, CRD compile errors) as kube-apiserver words them.
#include "controlplane/schema/cel.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "controlplane/schema/openapi.h"
#include "controlplane/schema/validation_rules.h"

namespace meshwork::controlplane::schema {

// Readable failures for EXPECT_EQ on causes.
void PrintTo(const FieldCause& c, std::ostream* os) { *os << "{" << c.reason << " | " << c.field << " | " << c.message << "}"; }

namespace {

using nlohmann::json;

// "int 3", "bool true", "string \"ab\"", "error: no such key: x", "compile: ..."
std::string EvalText(const std::string& expr, const json& self = json::object(), const json* old = nullptr,
                const cel::Limits& limits = {}) {
  auto c = cel::Compile(expr, nullptr, false, limits);
  if (!c.program) return "compile: " + c.error;
  auto r = cel::Evaluate(*c.program, self, old, limits);
  if (!r.error.empty()) return "error: " + r.error;
  return cel::TypeName(r.value) + " " + r.value.dump();
}

struct ExprCase {
  const char* name;
  const char* expr;
  json self;
  const char* want;
};

class ExpressionTest : public ::testing::TestWithParam<ExprCase> {};

TEST_P(ExpressionTest, EvaluatesAsCel) {
  const ExprCase& c = GetParam();
  const std::string got = EvalText(c.expr, c.self);
  if (std::string(c.want).back() == ' ') {  // a prefix: the rest is the regex library's wording
    EXPECT_EQ(got.rfind(c.want, 0), 0u) << got;
  } else {
    EXPECT_EQ(got, c.want) << c.expr;
  }
}

const json kSelf = {{"replicas", 4},
                    {"ppr", 2},
                    {"name", "trainer-0"},
                    {"codes", {1, 2, 255}},
                    {"mesh", {{"dp", 2}, {"tp", 4}}},
                    {"env", {{"A", "1"}, {"B", "2"}}},
                    {"lr", 0.5},
                    {"on", true}};

std::vector<ExprCase> ExprCases() {
  const json o = json::object();
  return {
      // literals
      {"int", "42", o, "int 42"},
      {"negative_int", "-7", o, "int -7"},
      {"int64_min", "-9223372036854775808", o, "int -9223372036854775808"},
      {"hex", "0x1F", o, "int 31"},
      {"uint", "3u", o, "uint 3"},
      {"double", "1.5", o, "double 1.5"},
      {"double_exp", "2e3", o, "double 2000.0"},
      {"string_single", "'a\\'b'", o, "string \"a'b\""},
      {"string_double", "\"x\\ty\"", o, "string \"x\\ty\""},
      {"string_unicode_escape", "'\\u00e9'", o, "string \"é\""},
      {"string_raw", "r'a\\d'", o, "string \"a\\\\d\""},
      {"string_triple", "'''it's'''", o, "string \"it's\""},
      {"bool", "true", o, "bool true"},
      {"null", "null", o, "null_type null"},
      {"list", "[1, 'a', [true]]", o, "list [1,\"a\",[true]]"},
      {"list_trailing_comma", "[1, 2,]", o, "list [1,2]"},
      {"map_literal", "{'k': 1, 'j': 'v'}", o, "map {\"j\":\"v\",\"k\":1}"},
      // precedence
      {"mul_before_add", "1 + 2 * 3", o, "int 7"},
      {"parens", "(1 + 2) * 3", o, "int 9"},
      {"left_assoc_sub", "10 - 4 - 3", o, "int 3"},
      {"left_assoc_div", "64 / 4 / 2", o, "int 8"},
      {"and_before_or", "true || false && false", o, "bool true"},
      {"relation_before_and", "1 < 2 && 3 > 2", o, "bool true"},
      {"ternary_lowest", "1 < 2 ? 'y' : 'n'", o, "string \"y\""},
      {"ternary_right_assoc", "false ? 1 : true ? 2 : 3", o, "int 2"},
      {"not_binds_tight", "!false && true", o, "bool true"},
      {"double_not", "!!true", o, "bool true"},
      {"unary_minus_member", "-self.replicas", kSelf, "int -4"},
      // arithmetic
      {"int_mod", "7 % 3", o, "int 1"},
      {"int_div_truncates", "-7 / 2", o, "int -3"},
      {"uint_add", "2u + 3u", o, "uint 5"},
      {"double_div", "1.0 / 4.0", o, "double 0.25"},
      {"double_div_zero_is_inf", "1.0 / 0.0 > 1e308", o, "bool true"},
      {"string_concat", "'a' + 'b'", o, "string \"ab\""},
      {"list_concat", "[1] + [2, 3]", o, "list [1,2,3]"},
      {"int_plus_string", "dyn(1) + 'a'", o, "error: no such overload"},
      {"int_plus_double", "dyn(1) + 1.0", o, "error: no such overload"},
      {"int_plus_uint", "1 + dyn(1u)", o, "error: no such overload"},
      {"double_mod", "dyn(1.0) % 2.0", o, "error: no such overload"},
      {"div_zero", "1 / 0", o, "error: division by zero"},
      {"mod_zero", "1 % 0", o, "error: modulus by zero"},
      {"add_overflow", "9223372036854775807 + 1", o, "error: integer overflow"},
      {"sub_overflow", "-9223372036854775808 - 1", o, "error: integer overflow"},
      {"mul_overflow", "4611686018427387904 * 2", o, "error: integer overflow"},
      {"neg_overflow", "-(-9223372036854775808)", o, "error: integer overflow"},
      {"div_overflow", "-9223372036854775808 / -1", o, "error: integer overflow"},
      {"uint_underflow", "1u - 2u", o, "error: unsigned integer overflow"},
      {"negate_string", "-dyn('a')", o, "error: no such overload"},
      // comparison and equality
      {"lt", "1 < 2", o, "bool true"},
      {"le", "2 <= 2", o, "bool true"},
      {"gt", "'b' > 'a'", o, "bool true"},
      {"ge", "1.5 >= 2.0", o, "bool false"},
      {"cross_numeric_lt", "1 < 1.5", o, "bool true"},
      {"cross_numeric_eq", "1 == 1.0", o, "bool true"},
      {"uint_int_eq", "1u == 1", o, "bool true"},
      {"bool_order", "false < true", o, "bool true"},
      {"lt_mixed_types", "dyn(1) < 'a'", o, "error: no such overload"},
      {"eq_mixed_types_false", "dyn(1) == 'a'", o, "bool false"},
      {"ne", "'a' != 'b'", o, "bool true"},
      {"deep_list_eq", "[1, [2, 'x']] == [1, [2, 'x']]", o, "bool true"},
      {"deep_list_ne", "[1, 2] == [2, 1]", o, "bool false"},
      {"deep_map_eq", "{'a': [1], 'b': 2} == {'b': 2, 'a': [1]}", o, "bool true"},
      {"null_eq", "null == null", o, "bool true"},
      {"nan_ne", "0.0 / 0.0 == 0.0 / 0.0", o, "bool false"},
      // in
      {"in_list", "2 in [1, 2]", o, "bool true"},
      {"not_in_list", "3 in [1, 2]", o, "bool false"},
      {"in_map_keys", "'A' in self.env", kSelf, "bool true"},
      {"in_scalar", "1 in dyn(1)", o, "error: no such overload"},
      // && and ||: commutative, errors absorbed when the other side decides
      {"false_and_error", "false && 1/0 == 1", o, "bool false"},
      {"error_and_false", "1/0 == 1 && false", o, "bool false"},
      {"true_or_error", "true || self.missing", o, "bool true"},
      {"error_or_true", "self.missing || true", o, "bool true"},
      {"true_and_error", "true && self.missing", o, "error: no such key: missing"},
      {"error_or_false", "self.missing == 1 || false", o, "error: no such key: missing"},
      {"non_bool_and", "dyn(1) && true", o, "error: no such overload"},
      {"ternary_non_bool", "dyn(1) ? 2 : 3", o, "error: no such overload"},
      {"not_non_bool", "!dyn(1)", o, "error: no such overload"},
      // fields, indexing, has()
      {"select", "self.mesh.dp", kSelf, "int 2"},
      {"select_missing", "self.mesh.pp", kSelf, "error: no such key: pp"},
      {"select_on_scalar", "self.replicas.x", kSelf, "error: no such overload"},
      {"index_list", "self.codes[2]", kSelf, "int 255"},
      {"index_uint", "self.codes[0u]", kSelf, "int 1"},
      {"index_out_of_bounds", "self.codes[3]", kSelf, "error: index out of bounds: 3"},
      {"index_negative", "self.codes[-1]", kSelf, "error: index out of bounds: -1"},
      {"index_map", "self.env['B']", kSelf, "string \"2\""},
      {"index_map_missing", "self.env['C']", kSelf, "error: no such key: C"},
      {"index_literal", "[[1, 2], [3]][0][1]", o, "int 2"},
      {"select_literal_map", "{'a': {'b': 5}}.a.b", o, "int 5"},
      {"has_present", "has(self.mesh.dp)", kSelf, "bool true"},
      {"has_absent", "has(self.mesh.pp)", kSelf, "bool false"},
      {"has_top", "has(self.missing)", kSelf, "bool false"},
      {"has_on_scalar", "has(self.replicas.x)", kSelf, "error: no such overload"},
      {"has_missing_parent", "has(self.nope.x)", kSelf, "error: no such key: nope"},
      // functions
      {"size_string_runes", "size('héllo')", o, "int 5"},
      {"size_member", "self.codes.size()", kSelf, "int 3"},
      {"size_map", "size(self.env)", kSelf, "int 2"},
      {"size_int", "size(dyn(1))", o, "error: no such overload"},
      {"starts_with", "self.name.startsWith('trainer')", kSelf, "bool true"},
      {"starts_with_longer", "'a'.startsWith('abc')", o, "bool false"},
      {"ends_with", "self.name.endsWith('-0')", kSelf, "bool true"},
      {"contains", "self.name.contains('ner-')", kSelf, "bool true"},
      {"contains_non_string", "self.replicas.contains('a')", kSelf, "error: no such overload"},
      {"matches", "self.name.matches('^[a-z]+-[0-9]+$')", kSelf, "bool true"},
      {"matches_is_a_search", "'abc123'.matches('[0-9]')", o, "bool true"},
      {"matches_global", "matches('ABC', '(?i)^abc$')", o, "bool true"},
      {"matches_bad_dynamic_regex", "'a'.matches(self.name + '[')", kSelf,
       "error: invalid regex: trainer-0[: "},
      {"int_of_double", "int(2.9)", o, "int 2"},
      {"int_of_string", "int('-12')", o, "int -12"},
      {"int_of_bad_string", "int('1.5')", o, "error: cannot convert string \"1.5\" to int"},
      {"int_of_huge_double", "int(1e19)", o, "error: range error converting 1e+19 to int"},
      {"int_of_uint_overflow", "int(18446744073709551615u)", o, "error: integer overflow"},
      {"uint_of_negative", "uint(-1)", o, "error: unsigned integer overflow"},
      {"double_of_int", "double(3)", o, "double 3.0"},
      {"double_of_string", "double('2.5')", o, "double 2.5"},
      {"string_of_int", "string(42)", o, "string \"42\""},
      {"string_of_double", "string(1e6)", o, "string \"1e+06\""},
      {"string_of_bool", "string(true)", o, "string \"true\""},
      {"string_of_list", "string(dyn([1]))", o, "error: no such overload"},
      // macros
      {"all_true", "self.codes.all(c, c >= 0 && c <= 255)", kSelf, "bool true"},
      {"all_false", "self.codes.all(c, c < 255)", kSelf, "bool false"},
      {"all_empty", "[].all(c, false)", o, "bool true"},
      {"all_error_absorbed_by_false", "[0, 1].all(c, 1 / c > 5)", o, "bool false"},
      {"all_error_not_absorbed", "[0, 1].all(c, 1 / c < 5)", o, "error: division by zero"},
      {"exists", "self.codes.exists(c, c == 2)", kSelf, "bool true"},
      {"exists_error_absorbed_by_true", "[0, 1].exists(c, 1 / c == 1)", o, "bool true"},
      {"exists_one", "self.codes.exists_one(c, c > 1)", kSelf, "bool false"},
      {"exists_one_true", "self.codes.exists_one(c, c > 2)", kSelf, "bool true"},
      {"map", "self.codes.map(c, c * 2)", kSelf, "list [2,4,510]"},
      {"map_filter", "self.codes.map(c, c > 1, c + 1)", kSelf, "list [3,256]"},
      {"filter", "self.codes.filter(c, c % 2 == 1)", kSelf, "list [1,255]"},
      {"macro_over_map_keys", "self.env.all(k, k.size() == 1)", kSelf, "bool true"},
      {"macro_over_map_filter", "self.env.filter(k, self.env[k] == '2')", kSelf, "list [\"B\"]"},
      {"nested_macros", "[[1, 2], [3]].all(l, l.all(x, x > 0))", o, "bool true"},
      {"macro_var_shadows_self", "[1].all(self, self == 1)", kSelf, "bool true"},
      {"macro_over_scalar", "self.replicas.all(x, true)", kSelf, "error: no such overload"},
      // the rules the TrainingJob CRD uses
      {"mesh_product",
       "!has(self.mesh) || self.mesh.dp * self.mesh.tp == self.replicas * self.ppr", kSelf, "bool true"},
      {"has_xor", "has(self.env) != has(self.missing)", kSelf, "bool true"},
      {"path_prefix", "!has(self.path) || self.path.startsWith('/')", kSelf, "bool true"},
      {"cross_numeric_double_field", "self.lr < 1", kSelf, "bool true"},
      {"comment", "1 // one\n + 1", o, "int 2"},
  };
}

INSTANTIATE_TEST_SUITE_P(Cel, ExpressionTest, ::testing::ValuesIn(ExprCases()),
                         [](const auto& info) { return std::string(info.param.name); });

struct CompileCase {
  const char* name;
  const char* expr;
  const char* want;  // the whole error text
};

class CompileErrorTest : public ::testing::TestWithParam<CompileCase> {};

TEST_P(CompileErrorTest, ReportsWhereAndWhy) {
  const CompileCase& c = GetParam();
  auto r = cel::Compile(c.expr);
  EXPECT_EQ(r.program, nullptr);
  EXPECT_EQ(r.error, c.want);
}

std::vector<CompileCase> CompileCases() {
  return {
      {"unknown_variable", "foo == 1", "ERROR: <input>:1:1: undeclared reference to 'foo' (in container '')\n | foo == 1\n | ^"},
      {"unknown_function", "self.x.lowerAscii() == 'a'",
       "ERROR: <input>:1:18: undeclared reference to 'lowerAscii' (in container '')\n | self.x.lowerAscii() == 'a'\n | .................^"},
      {"wrong_arity", "size(1, 2) == 1",
       "ERROR: <input>:1:5: found no matching overload for 'size' applied to 2 argument(s)\n | size(1, 2) == 1\n | ....^"},
      {"unexpected_end", "self.a ==", "ERROR: <input>:1:10: Syntax error: unexpected end of expression\n | self.a ==\n | .........^"},
      {"unbalanced", "(1 + 2", "ERROR: <input>:1:7: Syntax error: unexpected end of expression, expecting ')'\n | (1 + 2\n | ......^"},
      // operand types known from literals
      {"type_int_plus_string", "1 + 'a' == 'b'",
       "ERROR: <input>:1:3: found no matching overload for '_+_' applied to '(int, string)'\n | 1 + 'a' == 'b'\n | ..^"},
      {"type_eq_int_string", "1 == 'a'",
       "ERROR: <input>:1:3: found no matching overload for '_==_' applied to '(int, string)'\n | 1 == 'a'\n | ..^"},
      {"type_not_int", "!1", "ERROR: <input>:1:1: found no matching overload for '!_' applied to '(int)'\n | !1\n | ^"},
      {"type_and_int", "true && 1",
       "ERROR: <input>:1:6: found no matching overload for '_&&_' applied to '(bool, int)'\n | true && 1\n | .....^"},
      {"type_size_int", "size(1) == 1",
       "ERROR: <input>:1:5: found no matching overload for 'size' applied to '(int)'\n | size(1) == 1\n | ....^"},
      {"type_starts_with_int", "'a'.startsWith(1)",
       "ERROR: <input>:1:15: found no matching overload for 'startsWith' applied to 'string.(int)'\n | 'a'.startsWith(1)\n | ..............^"},
      {"type_mod_double", "1.0 % 2.0 == 1.0",
       "ERROR: <input>:1:5: found no matching overload for '_%_' applied to '(double, double)'\n | 1.0 % 2.0 == 1.0\n | ....^"},
      {"type_in_int", "1 in 2", "ERROR: <input>:1:3: found no matching overload for '@in' applied to '(int, int)'\n | 1 in 2\n | ..^"},
      {"bad_char", "1 # 2", "ERROR: <input>:1:3: Syntax error: token recognition error at: '#'\n | 1 # 2\n | ..^"},
      {"unterminated_string", "'abc", "ERROR: <input>:1:1: Syntax error: unterminated string literal\n | 'abc\n | ^"},
      {"int_literal_too_big", "9223372036854775808", "ERROR: <input>:1:1: invalid int literal\n | 9223372036854775808\n | ^"},
      {"has_needs_select", "has(self)", "ERROR: <input>:1:4: invalid argument to has() macro\n | has(self)\n | ...^"},
      {"macro_needs_name", "self.all(1, true)", "ERROR: <input>:1:10: argument must be a simple name\n | self.all(1, true)\n | .........^"},
      {"reserved_word", "self.if", "ERROR: <input>:1:6: Syntax error: unexpected 'if'\n | self.if\n | .....^"},
      {"second_line", "true &&\n  nope", "ERROR: <input>:2:3: undeclared reference to 'nope' (in container '')\n |   nope\n | ..^"},
  };
}

INSTANTIATE_TEST_SUITE_P(Cel, CompileErrorTest, ::testing::ValuesIn(CompileCases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CelCompile, ConstantPatternsMustCompile) {
  auto r = cel::Compile("'a'.matches('[')");
  EXPECT_EQ(r.error.rfind("ERROR: <input>:1:13: invalid matches argument: invalid regex: [: ", 0), 0u) << r.error;
  EXPECT_TRUE(cel::Compile(R"('a'.matches('(?i)^A\\z'))").program);
}

TEST(CelCompile, ChecksFieldNamesAgainstTheSchema) {
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"mesh", {{"type", "object"}, {"properties", {{"tp", {{"type", "integer"}}}}}}},
                         {"env", {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}},
                         {"items", {{"type", "array"}, {"items", {{"type", "object"}, {"properties", {{"n", {{"type", "string"}}}}}}}}},
                         {"free", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}}}}};
  EXPECT_TRUE(cel::Compile("self.mesh.tp > 0 && self.env.anything == 'x' && self.free.what == 1", &schema).program);
  EXPECT_TRUE(cel::Compile("self.items.all(i, i.n != '')", &schema).program);
  auto bad = cel::Compile("has(self.mesh.pp)", &schema);
  EXPECT_EQ(bad.error, "ERROR: <input>:1:4: undefined field 'pp'\n | has(self.mesh.pp)\n | ...^");
  EXPECT_EQ(cel::Compile("self.mesh.pp == 1", &schema).error,
            "ERROR: <input>:1:10: undefined field 'pp'\n | self.mesh.pp == 1\n | .........^");
  EXPECT_NE(cel::Compile("self.items.all(i, i.m != '')", &schema).error.find("undefined field 'm'"), std::string::npos);
  EXPECT_NE(cel::Compile("oldSelf.nope == 1", &schema).error.find("undefined field 'nope'"), std::string::npos);
  // The resource root also has apiVersion, kind and metadata (name, generateName only).
  EXPECT_TRUE(cel::Compile("self.metadata.name.startsWith('a') && self.kind == 'X'", &schema, true).program);
  EXPECT_NE(cel::Compile("self.metadata.labels == {}", &schema, true).error.find("undefined field 'labels'"),
            std::string::npos);
  EXPECT_NE(cel::Compile("self.kind == 'X'", &schema, false).error.find("undefined field 'kind'"), std::string::npos);
  // Types come from the schema too; int-or-string and preserved fields stay dynamic.
  EXPECT_EQ(cel::Compile("self.mesh.tp == 'two'", &schema).error,
            "ERROR: <input>:1:14: found no matching overload for '_==_' applied to '(int, string)'\n"
            " | self.mesh.tp == 'two'\n | .............^");
  EXPECT_NE(cel::Compile("self.items.all(i, i.n > 0)", &schema).error.find("'_>_' applied to '(string, int)'"),
            std::string::npos);
  EXPECT_TRUE(cel::Compile("self.free.what + 1 == 2 && self.env.a.startsWith('x') && self.mesh.tp < 1.5", &schema).program);
  EXPECT_TRUE(cel::NeverBool(*cel::Compile("self.env.a", &schema).program));
  EXPECT_FALSE(cel::NeverBool(*cel::Compile("self.free.what", &schema).program));
}

TEST(CelCompile, TransitionRulesAreThoseThatMentionOldSelf) {
  EXPECT_TRUE(cel::Compile("self == oldSelf").uses_old_self);
  EXPECT_FALSE(cel::Compile("self == 1").uses_old_self);
  EXPECT_FALSE(cel::Compile("[1].all(oldSelf, oldSelf == 1)").uses_old_self);  // shadowed
  json old = 3;
  EXPECT_EQ(EvalText("self == oldSelf", 3, &old), "bool true");
  EXPECT_EQ(EvalText("self == oldSelf", 4, &old), "bool false");
}

TEST(CelLimits, StepLimitStopsAHostileRule) {
  // 1000^3 iterations would take minutes; the step limit ends it at once.
  cel::Limits limits;
  limits.max_steps = 100'000;
  json self = json::array();
  for (int i = 0; i < 1000; ++i) self.push_back(i);
  auto c = cel::Compile("self.all(a, self.all(b, self.all(c, a + b + c >= 0)))");
  ASSERT_TRUE(c.program);
  auto r = cel::Evaluate(*c.program, self, nullptr, limits);
  EXPECT_TRUE(r.cost_exceeded);
  EXPECT_EQ(r.error, "operation cancelled: actual cost limit exceeded");
  // Doubling a string each step cannot exhaust memory: its length is charged too.
  auto grow = cel::Compile("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32]"
                           ".map(x, 'ab' + 'ab').size() > 0");
  ASSERT_TRUE(grow.program);
  EXPECT_TRUE(cel::Evaluate(*grow.program, self, nullptr, {}).error.empty());
}

TEST(CelLimits, DeepNestingIsRefusedAtCompileTime) {
  std::string deep(5000, '(');
  deep += "1";
  deep += std::string(5000, ')');
  auto r = cel::Compile(deep);
  EXPECT_EQ(r.program, nullptr);
  EXPECT_NE(r.error.find("expression nested too deeply"), std::string::npos);
  std::string nots(5000, '!');
  EXPECT_NE(cel::Compile(nots + "true").error.find("nested too deeply"), std::string::npos);
  std::string chain = "1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_NE(cel::Compile(chain).error.find("nested too deeply"), std::string::npos);
}

// Random token soup (fixed seed): compiling and evaluating never throws or crashes.
TEST(CelFuzz, RandomExpressionsNeverCrash) {
  const char* const kTokens[] = {"self", "oldSelf", "x", ".", "a", "b", "[", "]", "(", ")", "{", "}", ",", ":", "?",
                                 "!", "-", "+", "*", "/", "%", "<", "<=", "==", "!=", "&&", "||", " in ", "1", "0",
                                 "9223372036854775807", "2u", "1.5", "'s'", "\"t\"", "null", "true", "size", "has",
                                 "all", "map", "filter", "exists_one", "int", "string", "double", "matches", "'['",
                                 "startsWith"};
  const json self = {{"a", {1, 2, {{"b", "c"}}}}, {"b", {{"a", 0}}}, {"s", "text"}};
  std::mt19937 rng(7);
  int compiled = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string expr;
    int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) expr += kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))];
    cel::CompileResult c;
    ASSERT_NO_THROW(c = cel::Compile(expr)) << expr;
    if (!c.program) continue;
    ++compiled;
    cel::EvalResult r;
    ASSERT_NO_THROW(r = cel::Evaluate(*c.program, self, &self)) << expr;
    EXPECT_EQ(r.error.find("internal error"), std::string::npos) << expr << ": " << r.error;
  }
  EXPECT_GT(compiled, 100);
}

TEST(CelValues, DataIsSeenThroughTheSchema) {
  const json schema = {{"type", "object"},
                       {"properties", {{"lr", {{"type", "number"}}}, {"n", {{"type", "integer"}}}, {"s", {{"type", "string"}, {"nullable", true}}}}}};
  json v = cel::ToCelValue(schema, json::parse(R"({"lr": 2, "n": 3, "s": null})"));
  EXPECT_TRUE(v["lr"].is_number_float());
  EXPECT_EQ(cel::TypeName(v["n"]), "int");
  EXPECT_FALSE(v.contains("s"));  // null fields are absent
}

// ---- rules on custom resources -----------------------------------------------------------------

json Rule(const std::string& rule, const json& extra = json::object()) {
  json r = extra;
  r["rule"] = rule;
  return r;
}

// A TrainingJob-like schema with the rules the operator's CRD uses.
json JobSchema() {
  json spec = json::parse(R"({
    "type": "object",
    "properties": {
      "replicas": {"type": "integer", "minimum": 1},
      "processesPerReplica": {"type": "integer", "default": 1},
      "restartPolicy": {"type": "string", "enum": ["Never", "ExitCode"]},
      "permanentExitCodes": {"type": "array", "items": {"type": "integer"}},
      "mesh": {"type": "object", "properties": {
        "dpReplicate": {"type": "integer"}, "dpShard": {"type": "integer"}, "tp": {"type": "integer"}}},
      "config": {"type": "object", "properties": {
        "inline": {"type": "string"}, "configMapRef": {"type": "string"}}},
      "checkpoint": {"type": "object", "properties": {"path": {"type": "string"}}},
      "image": {"type": "string"}
    }})");
  spec["x-kubernetes-validations"] = json::array(
      {Rule("!has(self.mesh) || self.mesh.dpReplicate * self.mesh.dpShard * self.mesh.tp == self.replicas * "
            "self.processesPerReplica",
            {{"message", "mesh: dpReplicate x dpShard x tp must equal replicas x processesPerReplica"}}),
       Rule("self.restartPolicy == 'ExitCode' || !has(self.permanentExitCodes) || size(self.permanentExitCodes) == 0",
            {{"message", "permanentExitCodes needs restartPolicy ExitCode"}, {"fieldPath", ".permanentExitCodes"}})});
  spec["properties"]["config"]["x-kubernetes-validations"] =
      json::array({Rule("has(self.inline) != has(self.configMapRef)")});
  spec["properties"]["permanentExitCodes"]["x-kubernetes-validations"] =
      json::array({Rule("self.all(c, c >= 0 && c <= 255)", {{"message", "exit codes are 0..255"}})});
  spec["properties"]["checkpoint"]["properties"]["path"]["x-kubernetes-validations"] =
      json::array({Rule("self.startsWith('/')", {{"reason", "FieldValueForbidden"}, {"message", "must be absolute"}})});
  spec["properties"]["checkpoint"]["x-kubernetes-validations"] =
      json::array({Rule("!has(self.path) || self.path.startsWith('/')")});
  spec["properties"]["image"]["x-kubernetes-validations"] =
      json::array({Rule("self == oldSelf", {{"message", "is immutable"}})});
  return {{"type", "object"}, {"properties", {{"spec", spec}}}};
}

json Job(const json& spec) {
  return {{"apiVersion", "meshwork.dev/v1"}, {"kind", "TrainingJob"}, {"metadata", {{"name", "job"}}}, {"spec", spec}};
}

std::string Describe(const std::vector<FieldCause>& causes) {
  std::string out;
  for (const auto& c : causes) out += "  " + c.reason + " | " + c.field + " | " + c.message + "\n";
  return out;
}

struct RuleCase {
  const char* name;
  json spec;
  std::vector<FieldCause> want;
};

class RuleTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(RuleTest, ReportsKubeApiserverCauses) {
  const RuleCase& c = GetParam();
  const json schema = JobSchema();
  ASSERT_TRUE(CheckSchema(schema, "spec.validation.openAPIV3Schema").empty())
      << Describe(CheckSchema(schema, "spec.validation.openAPIV3Schema"));
  json obj = Job(c.spec);
  auto got = DefaultPruneAndValidate(schema, obj);
  EXPECT_EQ(got, c.want) << "got:\n" << Describe(got) << "want:\n" << Describe(c.want);
}

std::vector<RuleCase> RuleCases() {
  return {
      {"valid", json::parse(R"({"replicas": 4, "mesh": {"dpReplicate": 2, "dpShard": 1, "tp": 2},
                                "config": {"inline": "x"}, "restartPolicy": "ExitCode", "permanentExitCodes": [1, 255],
                                "checkpoint": {"path": "/ckpt"}})"),
       {}},
      {"mesh_uses_defaulted_processes_per_replica",
       json::parse(R"({"replicas": 4, "mesh": {"dpReplicate": 2, "dpShard": 2, "tp": 2}})"),
       {{"FieldValueInvalid", "spec",
         "Invalid value: \"object\": mesh: dpReplicate x dpShard x tp must equal replicas x processesPerReplica"}}},
      {"mesh_absent_is_fine", json::parse(R"({"replicas": 3})"), {}},
      {"default_message_is_the_rule", json::parse(R"({"replicas": 1, "config": {}})"),
       {{"FieldValueInvalid", "spec.config", "Invalid value: \"object\": failed rule: has(self.inline) != has(self.configMapRef)"}}},
      {"both_set", json::parse(R"({"replicas": 1, "config": {"inline": "a", "configMapRef": "b"}})"),
       {{"FieldValueInvalid", "spec.config", "Invalid value: \"object\": failed rule: has(self.inline) != has(self.configMapRef)"}}},
      {"field_path_appended", json::parse(R"({"replicas": 1, "restartPolicy": "Never", "permanentExitCodes": [3]})"),
       {{"FieldValueInvalid", "spec.permanentExitCodes",
         "Invalid value: \"object\": permanentExitCodes needs restartPolicy ExitCode"}}},
      {"empty_exit_codes_allowed", json::parse(R"({"replicas": 1, "restartPolicy": "Never", "permanentExitCodes": []})"), {}},
      {"list_rule_on_array_node", json::parse(R"({"replicas": 1, "restartPolicy": "ExitCode", "permanentExitCodes": [1, 256]})"),
       {{"FieldValueInvalid", "spec.permanentExitCodes", "Invalid value: \"array\": exit codes are 0..255"}}},
      {"forbidden_reason_on_scalar", json::parse(R"({"replicas": 1, "checkpoint": {"path": "rel"}})"),
       {{"FieldValueInvalid", "spec.checkpoint",
         "Invalid value: \"object\": failed rule: !has(self.path) || self.path.startsWith('/')"},
        {"FieldValueForbidden", "spec.checkpoint.path", "Forbidden: must be absolute"}}},
      {"transition_rule_skipped_on_create", json::parse(R"({"replicas": 1, "image": "a"})"), {}},
      {"schema_error_blocks_rules", json::parse(R"({"replicas": "x", "config": {}})"),
       {{"FieldValueTypeInvalid", "spec.replicas",
         "Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\""},
        {"FieldValueInvalid", "<nil>",
         "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct "
         "the existing errors to complete validation"}}},
      {"non_blocking_schema_error_still_runs_rules", json::parse(R"({"replicas": 0, "config": {}})"),
       {{"FieldValueInvalid", "spec.replicas",
         "Invalid value: 0: spec.replicas in body should be greater than or equal to 1"},
        {"FieldValueInvalid", "spec.config", "Invalid value: \"object\": failed rule: has(self.inline) != has(self.configMapRef)"}}},
  };
}

INSTANTIATE_TEST_SUITE_P(Rules, RuleTest, ::testing::ValuesIn(RuleCases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Compiled rules and patterns are shared through process-wide caches: many request threads at
// once must see the same answers.
TEST(Rules, ConcurrentValidationAgrees) {
  const json schema = JobSchema();
  const json bad = Job(json::parse(R"({"replicas": 1, "config": {}, "checkpoint": {"path": "x"}})"));
  json probe = bad;
  const auto want = DefaultPruneAndValidate(schema, probe);
  ASSERT_EQ(want.size(), 3u) << Describe(want);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        json obj = bad;
        // Distinct texts per thread too, so the caches are written while being read.
        json extra = schema;
        extra["properties"]["spec"]["x-kubernetes-validations"].push_back(
            Rule("self.replicas != " + std::to_string(1000 + t * 1000 + i) + " && 'a'.matches('^a" + std::to_string(t) + "?')"));
        if (DefaultPruneAndValidate(extra, obj) != want) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Rules, TransitionRuleComparesWithTheOldObject) {
  const json schema = JobSchema();
  json old = Job({{"replicas", 1}, {"image", "a"}});
  ASSERT_TRUE(DefaultPruneAndValidate(schema, old).empty());
  json same = Job({{"replicas", 2}, {"image", "a"}});
  EXPECT_TRUE(DefaultPruneAndValidate(schema, same, &old).empty());
  json changed = Job({{"replicas", 1}, {"image", "b"}});
  EXPECT_EQ(DefaultPruneAndValidate(schema, changed, &old),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec.image", "Invalid value: \"string\": is immutable"}}));
  // Not set before: no old value at that node, so the rule does not run.
  json before = Job({{"replicas", 1}});
  ASSERT_TRUE(DefaultPruneAndValidate(schema, before).empty());
  EXPECT_TRUE(DefaultPruneAndValidate(schema, changed, &before).empty());
}

TEST(Rules, TransitionRulesFollowListMapKeys) {
  json schema = json::parse(R"({"type": "object", "properties": {"spec": {"type": "object", "properties": {
    "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
      "items": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"},
        "port": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "may only grow"}]}}}}}}}})");
  ASSERT_TRUE(CheckSchema(schema, "").empty()) << Describe(CheckSchema(schema, ""));
  json old = Job(json::parse(R"({"ports": [{"name": "a", "port": 10}, {"name": "b", "port": 20}]})"));
  json next = Job(json::parse(R"({"ports": [{"name": "b", "port": 15}, {"name": "c", "port": 1}, {"name": "a", "port": 11}]})"));
  EXPECT_EQ(DefaultPruneAndValidate(schema, next, &old),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec.ports[0].port", "Invalid value: \"integer\": may only grow"}}));
}

TEST(Rules, ReasonsAndMessageExpression) {
  auto run = [](const json& rule, const json& value) {
    json schema = {{"type", "object"},
                   {"properties", {{"spec", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}, {"opt", {{"type", "integer"}}},
                                                                           {"any", {{"x-kubernetes-int-or-string", true}}}}},
                                             {"x-kubernetes-validations", json::array({rule})}}}}}};
    EXPECT_TRUE(CheckSchema(schema, "").empty()) << Describe(CheckSchema(schema, ""));
    json obj = Job(value);
    return DefaultPruneAndValidate(schema, obj);
  };
  const json spec = {{"n", 5}, {"any", "x"}};
  EXPECT_EQ(run(Rule("self.n < 3", {{"reason", "FieldValueRequired"}, {"message", "n too big"}}), spec),
            (std::vector<FieldCause>{{"FieldValueRequired", "spec", "Required value: n too big"}}));
  EXPECT_EQ(run(Rule("self.n < 3", {{"reason", "FieldValueDuplicate"}}), spec),
            (std::vector<FieldCause>{{"FieldValueDuplicate", "spec", "Duplicate value: \"object\""}}));
  EXPECT_EQ(run(Rule("self.n < 3", {{"reason", "FieldValueInvalid"}, {"message", "  padded  "}}), spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec", "Invalid value: \"object\": padded"}}));
  EXPECT_EQ(run(Rule("self.n < 3", {{"messageExpression", "'n is ' + string(self.n) + ', want < 3'"},
                                    {"message", "static"}}),
                spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec", "Invalid value: \"object\": n is 5, want < 3"}}));
  // A messageExpression that fails, or is empty, falls back to message.
  EXPECT_EQ(run(Rule("self.n < 3", {{"messageExpression", "string(self.opt)"}, {"message", "static"}}), spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec", "Invalid value: \"object\": static"}}));
  EXPECT_EQ(run(Rule("self.n < 3", {{"messageExpression", "'  '"}}), spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec", "Invalid value: \"object\": failed rule: self.n < 3"}}));
  // Evaluation errors.
  EXPECT_EQ(run(Rule("self.opt == 1"), spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec",
                                      "Invalid value: \"object\": no such key: opt evaluating rule: self.opt == 1"}}));
  EXPECT_EQ(run(Rule("self.any + 1 == 2", {{"message", "m"}}), spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec",
                                      "Invalid value: \"object\": 'no such overload': call arguments did not match a "
                                      "supported operator, function or macro signature for rule: m"}}));
  EXPECT_EQ(run(Rule("self.n * 9223372036854775807 > 0"), spec),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec",
                                      "Invalid value: \"object\": integer overflow evaluating rule: self.n * 9223372036854775807 > 0"}}));
}

TEST(Rules, RootRulesHaveNoFieldPath) {
  json schema = {{"type", "object"},
                 {"properties", {{"spec", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}}}}},
                 {"x-kubernetes-validations", json::array({Rule("self.metadata.name.startsWith('x')")})}};
  ASSERT_TRUE(CheckSchema(schema, "").empty()) << Describe(CheckSchema(schema, ""));
  json obj = Job({{"n", 1}});
  EXPECT_EQ(DefaultPruneAndValidate(schema, obj),
            (std::vector<FieldCause>{{"FieldValueInvalid", "<nil>",
                                      "Invalid value: \"object\": failed rule: self.metadata.name.startsWith('x')"}}));
  EXPECT_EQ(InvalidMessage("TrainingJob.meshwork.dev", "job", DefaultPruneAndValidate(schema, obj)),
            "TrainingJob.meshwork.dev \"job\" is invalid: <nil>: Invalid value: \"object\": failed rule: "
            "self.metadata.name.startsWith('x')");
}

TEST(Rules, StepBudgetEndsEvaluationWithAClearError) {
  json schema = {{"type", "object"},
                 {"properties", {{"spec", {{"type", "object"},
                                           {"properties", {{"l", {{"type", "array"}, {"items", {{"type", "integer"}}}}}}},
                                           {"x-kubernetes-validations",
                                            json::array({Rule("self.l.all(a, self.l.all(b, self.l.all(c, a + b + c >= 0)))"),
                                                         Rule("false")})}}}}}};
  ASSERT_TRUE(CheckSchema(schema, "").empty());
  json l = json::array();
  for (int i = 0; i < 500; ++i) l.push_back(i);
  json obj = Job({{"l", l}});
  auto got = DefaultPruneAndValidate(schema, obj);
  EXPECT_EQ(got, (std::vector<FieldCause>{
                     {"FieldValueInvalid", "spec",
                      "Invalid value: \"object\": 'operation cancelled: actual cost limit exceeded': no further "
                      "validation rules will be run due to call cost exceeds limit for rule: "
                      "self.l.all(a, self.l.all(b, self.l.all(c, a + b + c >= 0)))"}}))
      << Describe(got);
  // The per-object budget is shared by all rules.
  RuleBudget budget;
  budget.per_object_steps = 10;
  json small = Job({{"l", {1, 2, 3, 4, 5, 6}}});
  Prune(schema, small);
  auto out = EvaluateValidationRules(schema, small, nullptr, budget);
  ASSERT_EQ(out.size(), 1u) << Describe(out);
  EXPECT_EQ(out[0].message,
            "Invalid value: \"object\": validation failed due to running out of cost budget, no further validation "
            "rules will be run");
}

// ---- CRD write ------------------------------------------------------------------------------

std::vector<FieldCause> CheckSpecRules(const json& rules, const json& spec_extra = json::object()) {
  json spec = {{"type", "object"},
               {"properties", {{"n", {{"type", "integer"}}}, {"m", {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}},
                               {"l", {{"type", "array"}, {"items", {{"type", "object"}, {"properties", {{"k", {{"type", "string"}}}}},
                                                                    {"x-kubernetes-validations", spec_extra.value("items_rules", json::array())}}}}}}},
               {"x-kubernetes-validations", rules}};
  return CheckSchema({{"type", "object"}, {"properties", {{"spec", spec}}}}, "spec.validation.openAPIV3Schema");
}

TEST(CrdRules, CompileFailuresMakeTheCrdInvalid) {
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0"), Rule("has(self.nope)", {{"message", "m"}})})),
            (std::vector<FieldCause>{
                {"FieldValueInvalid", "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule",
                 "Invalid value: apiextensions.ValidationRule{Rule:\"has(self.nope)\", Message:\"m\", MessageExpression:\"\", "
                 "Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\"\", OptionalOldSelf:(*bool)(nil)}: "
                 "compilation failed: ERROR: <input>:1:4: undefined field 'nope'\n | has(self.nope)\n | ...^"}}));
  auto syntax = CheckSpecRules(json::array({Rule("self.n >")}));
  ASSERT_EQ(syntax.size(), 1u);
  EXPECT_NE(syntax[0].message.find("compilation failed: ERROR: <input>:1:9: Syntax error"), std::string::npos);
  auto not_bool = CheckSpecRules(json::array({Rule("self.n + 1")}));
  ASSERT_EQ(not_bool.size(), 1u);
  EXPECT_NE(not_bool[0].message.find(": cel expression must evaluate to a bool"), std::string::npos);
  EXPECT_TRUE(CheckSpecRules(json::array({Rule("self.m.all(k, self.m[k] != '') && self.l.all(i, i.k != '')")})).empty());
}

TEST(CrdRules, RuleFieldsAreChecked) {
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0", {{"reason", "FieldValueOops"}})})),
            (std::vector<FieldCause>{{"FieldValueNotSupported",
                                      "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].reason",
                                      "Unsupported value: \"FieldValueOops\": supported values: \"FieldValueDuplicate\", "
                                      "\"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\""}}));
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0", {{"fieldPath", ".nope"}})})),
            (std::vector<FieldCause>{{"FieldValueInvalid",
                                      "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].fieldPath",
                                      "Invalid value: \".nope\": fieldPath must be a valid path"}}));
  EXPECT_TRUE(CheckSpecRules(json::array({Rule("self.n > 0", {{"fieldPath", ".m['a.b']"}})})).empty());
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0", {{"optionalOldSelf", true}})}))[0].message,
            "Forbidden: optionalOldSelf is not supported by the local control plane");
  auto me = CheckSpecRules(json::array({Rule("self.n > 0", {{"messageExpression", "'n=' + nope"}})}));
  ASSERT_EQ(me.size(), 1u);
  EXPECT_NE(me[0].message.find("messageExpression compilation failed: ERROR: <input>:1:8: undeclared reference to 'nope'"),
            std::string::npos)
      << me[0].message;
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0", {{"message", "two\nlines"}})}))[0].message,
            "Invalid value: \"two\\nlines\": message must not contain line breaks");
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0", {{"message", "  "}})}))[0].message,
            "Invalid value: \"  \": message must be non-empty if specified");
  EXPECT_EQ(CheckSpecRules(json::array({Rule("self.n > 0 &&\n self.n < 9")}))[0].message,
            "Required value: message must be specified if rule contains line breaks");
  EXPECT_EQ(CheckSpecRules(json::array({Rule("  ")}))[0].message, "Required value: rule is not specified");
}

TEST(CrdRules, OldSelfOnlyWhereValuesCorrelate) {
  auto got = CheckSpecRules(json::array(), {{"items_rules", json::array({Rule("self == oldSelf")})}});
  EXPECT_EQ(got, (std::vector<FieldCause>{
                     {"FieldValueInvalid",
                      "spec.validation.openAPIV3Schema.properties[spec].properties[l].items.x-kubernetes-validations[0].rule",
                      "Invalid value: \"self == oldSelf\": oldSelf cannot be used on the uncorrelatable portion of the "
                      "schema within spec.validation.openAPIV3Schema.properties[spec].properties[l].items"}}));
  EXPECT_TRUE(CheckSpecRules(json::array({Rule("self.n == oldSelf.n")})).empty());
}

// Plain YAML scalars resolved as YAML 1.2's core schema does (enough for a CRD).
json FromYaml(const YAML::Node& n) {
  if (n.IsMap()) {
    json out = json::object();
    for (const auto& kv : n) out[kv.first.as<std::string>()] = FromYaml(kv.second);
    return out;
  }
  if (n.IsSequence()) {
    json out = json::array();
    for (const auto& e : n) out.push_back(FromYaml(e));
    return out;
  }
  if (!n.IsScalar()) return nullptr;
  const std::string v = n.Scalar();
  if (n.Tag() == "!") return v;  // quoted
  if (v == "true" || v == "false") return v == "true";
  if (v == "null" || v == "~") return nullptr;
  char* end = nullptr;
  long long i = std::strtoll(v.c_str(), &end, 10);
  if (!v.empty() && *end == '\0') return static_cast<int64_t>(i);
  double d = std::strtod(v.c_str(), &end);
  if (!v.empty() && *end == '\0') return d;
  return v;
}

// The operator's real CRD: every rule compiles, and the rules behave on TrainingJobs.
TEST(CrdRules, TheTrainingJobCrdRulesWork) {
  json crd = FromYaml(YAML::LoadFile(std::string(MESHWORK_SOURCE_DIR) + "/crds/trainingjob.yaml"));
  const json& schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
  ASSERT_TRUE(HasValidationRules(schema));
  EXPECT_TRUE(CheckSchema(schema, "spec.versions[0].schema.openAPIV3Schema").empty())
      << Describe(CheckSchema(schema, "spec.versions[0].schema.openAPIV3Schema"));
  auto job = [](const json& spec) {
    json j = Job(spec);
    j["apiVersion"] = "meshwork.dev/v1alpha1";
    return j;
  };
  json ok = job(json::parse(R"({"image": "i", "replicas": 2, "processesPerReplica": 4,
                                "mesh": {"dpReplicate": 2, "dpShard": 4}})"));
  EXPECT_TRUE(DefaultPruneAndValidate(schema, ok).empty()) << Describe(DefaultPruneAndValidate(schema, ok));
  json bad_mesh = job(json::parse(R"({"image": "i", "replicas": 2, "mesh": {"dpReplicate": 2, "dpShard": 2}})"));
  EXPECT_EQ(DefaultPruneAndValidate(schema, bad_mesh),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec.mesh",
                                      "Invalid value: \"object\": mesh: dpReplicate x dpShard x tp must equal replicas x "
                                      "processesPerReplica"}}));
  // mesh: auto, alone: admitted; with a dim beside it: refused with the rule's message.
  json auto_mesh = job(json::parse(R"({"image": "i", "replicas": 2, "processesPerReplica": 4, "mesh": {"auto": true}})"));
  EXPECT_TRUE(DefaultPruneAndValidate(schema, auto_mesh).empty()) << Describe(DefaultPruneAndValidate(schema, auto_mesh));
  json auto_and_dim =
      job(json::parse(R"({"image": "i", "replicas": 2, "processesPerReplica": 4, "mesh": {"auto": true, "dpShard": 4}})"));
  EXPECT_EQ(DefaultPruneAndValidate(schema, auto_and_dim),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec.mesh",
                                      "Invalid value: \"object\": set either auto: true (the trainer chooses the mesh) or "
                                      "dpShard (and optionally dpReplicate, tp), not both"}}));
  json no_dims = job(json::parse(R"({"image": "i", "replicas": 2, "mesh": {}})"));
  EXPECT_EQ(DefaultPruneAndValidate(schema, no_dims).size(), 1u) << Describe(DefaultPruneAndValidate(schema, no_dims));
  json shard_only = job(json::parse(R"({"image": "i", "replicas": 2, "processesPerReplica": 4, "mesh": {"dpShard": 8}})"));
  EXPECT_TRUE(DefaultPruneAndValidate(schema, shard_only).empty()) << Describe(DefaultPruneAndValidate(schema, shard_only));
  json changed = ok;
  changed["spec"]["processesPerReplica"] = 8;
  changed["spec"]["mesh"]["dpShard"] = 8;
  EXPECT_EQ(DefaultPruneAndValidate(schema, changed, &ok),
            (std::vector<FieldCause>{{"FieldValueInvalid", "spec.processesPerReplica",
                                      "Invalid value: \"object\": processesPerReplica is immutable; create a new TrainingJob"}}));
}

TEST(CrdRules, RulesAreNotCompiledOnAnUnsoundSchema) {
  json schema = {{"type", "object"},
                 {"properties", {{"spec", {{"properties", json::object()}, {"x-kubernetes-validations", {Rule("nope")}}}}}}};
  auto got = CheckSchema(schema, "");
  ASSERT_EQ(got.size(), 1u) << Describe(got);
  EXPECT_EQ(got[0].field, "properties[spec].type");
}

}  // namespace
}  // namespace meshwork::controlplane::schema
