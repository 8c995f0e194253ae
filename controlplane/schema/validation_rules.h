// x-kubernetes-validations over a CRD schema, as kube-apiserver applies them: checked (compiled)
// when the CRD is written, evaluated on every create and update of a custom resource.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/schema/cel.h"
#include "controlplane/schema/openapi.h"

namespace meshwork::controlplane::schema {

// Whether any node of `schema` carries x-kubernetes-validations.
bool HasValidationRules(const nlohmann::json& schema);

// CRD-write checks of every rule under `schema` (a structural openAPIV3Schema; field paths start
// with `field_prefix`): the rule compiles, names only fields the schema declares, yields a bool;
// reason, fieldPath, message and messageExpression are well formed; oldSelf is used only where
// old and new values correlate. Compiled rules are cached for object validation.
std::vector<FieldCause> CheckValidationRules(const nlohmann::json& schema,
                                             const std::string& field_prefix);

struct RuleBudget {
  cel::Limits per_rule;                  // steps one rule (or messageExpression) may take
  int64_t per_object_steps = 10'000'000;  // steps all rules on one object may take together
};

// Evaluates every rule against `object` (pruned, defaulted and schema-valid) and, for an update,
// `old_object` (null on create: transition rules are skipped). Causes as kube-apiserver words
// them, e.g. {FieldValueInvalid, "spec", `Invalid value: "object": failed rule: <rule>`}.
std::vector<FieldCause> EvaluateValidationRules(const nlohmann::json& schema,
                                                const nlohmann::json& object,
                                                const nlohmann::json* old_object,
                                                const RuleBudget& budget = {});

}  // namespace meshwork::controlplane::schema
