// Validation, defaulting and pruning of custom resources against a CRD version's openAPIV3Schema,
// worded as kube-apiserver words it. Pure functions (JSON in, JSON out), thread-safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshwork::controlplane::schema {

// One entry of a Status's details.causes.
struct FieldCause {
  // "FieldValueRequired", "FieldValueInvalid", "FieldValueNotSupported", "FieldValueTypeInvalid",
  // "FieldValueTooLong", "FieldValueTooMany", "FieldValueDuplicate", "FieldValueForbidden".
  std::string reason;
  // Kubernetes field path: "spec.replicas", "spec.containers[0].name", "metadata.labels[app]".
  std::string field;
  // As kube-apiserver words it, e.g.
  // `Invalid value: 0: spec.replicas in body should be greater than or equal to 1`.
  std::string message;

  bool operator==(const FieldCause& o) const {
    return reason == o.reason && field == o.field && message == o.message;
  }
};

// Checks an apiextensions.k8s.io/v1 openAPIV3Schema before a CRD is accepted: structural (every
// node has a type unless x-kubernetes-int-or-string / x-kubernetes-preserve-unknown-fields),
// known keywords only, valid patterns, defaults that validate against their node. Field paths
// start with `field_prefix`, e.g. "spec.versions[0].schema.openAPIV3Schema". Empty = acceptable.
// When the schema is otherwise acceptable, its x-kubernetes-validations rules are compiled (a CEL
// subset, see cel.h and validation_rules.h): one that does not compile makes the schema invalid.
std::vector<FieldCause> CheckSchema(const nlohmann::json& schema, const std::string& field_prefix);

// Validates `object` (a whole custom resource: apiVersion/kind/metadata/spec/status) against the
// version's schema after pruning unknown fields and applying defaults in place, in
// kube-apiserver's order: prune, default, validate (schema keywords, then the
// x-kubernetes-validations rules on the defaulted object). metadata is not pruned; apiVersion,
// kind and metadata are always allowed. `old_object` is the stored object on an update (for
// transition rules, which use oldSelf), null on create. Empty result = valid.
std::vector<FieldCause> DefaultPruneAndValidate(const nlohmann::json& schema,
                                                nlohmann::json& object,
                                                const nlohmann::json* old_object = nullptr);

// The parts of DefaultPruneAndValidate, for callers that need them separately (e.g. validating a
// status-subresource update). Each works on the whole object, rooted at "".
void Prune(const nlohmann::json& schema, nlohmann::json& object);
void ApplyDefaults(const nlohmann::json& schema, nlohmann::json& object);
// Schema keywords first; the x-kubernetes-validations rules only when those found nothing that
// blocks them (a type, required, enum or size error), as kube-apiserver orders it.
std::vector<FieldCause> Validate(const nlohmann::json& schema, const nlohmann::json& object,
                                 const nlohmann::json* old_object = nullptr);

// The Status message kube-apiserver builds from causes:
// `<Kind>.<group> "<name>" is invalid: [<field>: <message>, ...]` (no brackets for one cause).
std::string InvalidMessage(const std::string& kind_dot_group, const std::string& name,
                           const std::vector<FieldCause>& causes);

// The Status's details.causes array: [{"reason":..,"message":..,"field":..}, ...].
nlohmann::json CausesToJson(const std::vector<FieldCause>& causes);

}  // namespace meshwork::controlplane::schema
