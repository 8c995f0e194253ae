// A small subset of CEL (the Common Expression Language) for CRD x-kubernetes-validations rules:
// parse once, optionally check field names against the schema, evaluate many times under a step
// budget. The subset and where it differs from cel-go are in docs/controlplane-validation.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace meshwork::controlplane::schema::cel {

// Bounds that keep a hostile rule from hanging or crashing the server.
struct Limits {
  // Evaluation steps one expression may take (a step: one node evaluated, one comprehension
  // iteration, or per 8 bytes/items that a string or list operation touches).
  int64_t max_steps = 1'000'000;
  // Nesting depth of the parsed expression; evaluation recursion is bounded by it.
  int max_depth = 100;
  // Longest expression text accepted.
  size_t max_length = 100'000;
};

struct Program;  // a parsed expression; immutable, shareable between threads

struct CompileResult {
  std::shared_ptr<const Program> program;  // null when compilation failed
  // cel-go's wording: "ERROR: <input>:1:6: Syntax error: ...\n | <expr>\n | .....^" (one block
  // per problem, joined by newlines).
  std::string error;
  bool uses_old_self = false;  // a transition rule
};

// Parses and checks `expr`: declared names, known functions, and operand types where they are
// known (from literals, and from `self_schema` when given: the openAPIV3Schema node the rule sits
// on), e.g. "found no matching overload for '_+_' applied to '(int, string)'". With a schema,
// field selections on self/oldSelf and on macro variables bound to their elements are checked
// against the schema's properties ("undefined field 'x'"). `is_resource_root` adds apiVersion, kind and
// metadata (name, generateName) to the root node's fields, as kube-apiserver does.
CompileResult Compile(const std::string& expr, const nlohmann::json* self_schema = nullptr,
                      bool is_resource_root = false, const Limits& limits = {});

// The same, through a process-wide cache keyed by the text (no schema check): what object
// validation uses, so each rule is parsed once per process rather than per request.
std::shared_ptr<const CompileResult> CompileCached(const std::string& expr);

struct EvalResult {
  // Success: the value as JSON (int as a JSON integer, uint as unsigned, double as float).
  nlohmann::json value;
  // Evaluation error, cel-go's text: "no such key: x", "no such overload", "integer overflow",
  // "division by zero", "index out of bounds: 3", ...; empty on success.
  std::string error;
  // The step limit was reached; `error` says so.
  bool cost_exceeded = false;
  int64_t steps = 0;  // steps taken
};

// Evaluates `program` with `self` (and `old_self` for transition rules; null = not declared).
// Values must be CEL-normalised JSON: see ToCelValue.
EvalResult Evaluate(const Program& program, const nlohmann::json& self,
                    const nlohmann::json* old_self, const Limits& limits = {});

// CEL's name for the type of a value: "int", "uint", "double", "string", "bool", "list", "map",
// "null_type".
std::string TypeName(const nlohmann::json& value);

// Whether the checker found the expression's type and it is not bool (a non-bool literal, a
// list or map, arithmetic, a string field): kube-apiserver refuses such rules when the CRD is
// written.
bool NeverBool(const Program& program);

// Converts decoded JSON data under `schema_node` to the values CEL rules see, as
// kube-apiserver's UnstructuredToVal: integers are int64, `type: number` values are doubles
// (also when written as 2), object fields whose value is null are absent.
nlohmann::json ToCelValue(const nlohmann::json& schema_node, const nlohmann::json& data);

}  // namespace meshwork::controlplane::schema::cel
