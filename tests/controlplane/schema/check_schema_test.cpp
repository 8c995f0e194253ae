// CheckSchema: the structural-schema rules a CRD's openAPIV3Schema must pass, each refusal
// naming the schema node's field path.
#include "controlplane/schema/openapi.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;

const std::string kPrefix = "spec.versions[0].schema.openAPIV3Schema";

std::string Describe(const std::vector<FieldCause>& causes) {
  std::string out;
  for (const auto& c : causes) out += "  " + c.reason + " | " + c.field + " | " + c.message + "\n";
  return out;
}

json WithSpec(const json& spec) { return {{"type", "object"}, {"properties", {{"spec", spec}}}}; }

struct BadSchema {
  const char* name;
  json schema;
  FieldCause want;  // the first cause
};

class CheckSchemaRefusesTest : public ::testing::TestWithParam<BadSchema> {};

TEST_P(CheckSchemaRefusesTest, NamesTheBadNode) {
  const BadSchema& c = GetParam();
  auto got = CheckSchema(c.schema, kPrefix);
  ASSERT_FALSE(got.empty()) << "schema was accepted: " << c.schema.dump();
  EXPECT_EQ(got.front(), c.want) << Describe(got);
}

std::vector<BadSchema> BadSchemas() {
  const std::string spec = kPrefix + ".properties[spec]";
  return {
      {"unknown_type", WithSpec({{"type", "map"}}),
       {"FieldValueNotSupported", spec + ".type",
        "Unsupported value: \"map\": supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""}},
      {"missing_type", WithSpec({{"type", "object"}, {"properties", {{"replicas", {{"minimum", 1}}}}}}),
       {"FieldValueRequired", spec + ".properties[replicas].type", "Required value: must not be empty for specified object fields"}},
      {"missing_item_type", WithSpec({{"type", "array"}, {"items", json::object()}}),
       {"FieldValueRequired", spec + ".items.type", "Required value: must not be empty for specified array items"}},
      {"root_not_object", {{"type", "string"}},
       {"FieldValueInvalid", kPrefix + ".type", "Invalid value: \"string\": must be object at the root"}},
      {"root_without_type", {{"properties", json::object()}},
       {"FieldValueRequired", kPrefix + ".type", "Required value: must not be empty at the root"}},
      {"bad_regex", WithSpec({{"type", "string"}, {"pattern", "[a-z"}}),
       {"FieldValueInvalid", spec + ".pattern", ""}},  // message checked separately
      {"unknown_keyword", WithSpec({{"type", "string"}, {"maxlength", 3}}),
       {"FieldValueForbidden", spec + ".maxlength", "Forbidden: unknown schema keyword \"maxlength\""}},
      {"ref_unsupported", WithSpec({{"type", "object"}, {"$ref", "#/definitions/x"}}),
       {"FieldValueForbidden", spec + ".$ref", "Forbidden: $ref is not supported"}},
      {"default_fails_validation",
       WithSpec({{"type", "object"}, {"properties", {{"replicas", {{"type", "integer"}, {"minimum", 1}, {"default", 0}}}}}}),
       {"FieldValueInvalid", spec + ".properties[replicas].default",
        "Invalid value: 0: spec.replicas in body should be greater than or equal to 1"}},
      {"default_wrong_type",
       WithSpec({{"type", "object"}, {"properties", {{"policy", {{"type", "string"}, {"default", 3}}}}}}),
       {"FieldValueTypeInvalid", spec + ".properties[policy].default",
        "Invalid value: \"integer\": spec.policy in body must be of type string: \"integer\""}},
      {"default_with_unknown_fields",
       WithSpec({{"type", "object"}, {"properties", {{"backoff", {{"type", "object"}, {"default", {{"limt", 3}}}, {"properties", {{"limit", {{"type", "integer"}}}}}}}}}}),
       {"FieldValueInvalid", spec + ".properties[backoff].default",
        "Invalid value: map[string]interface {}{\"limt\":3}: must not have unknown fields"}},
      {"unique_items", WithSpec({{"type", "array"}, {"uniqueItems", true}, {"items", {{"type", "string"}}}}),
       {"FieldValueForbidden", spec + ".uniqueItems",
        "Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"}},
      {"additional_properties_false",
       WithSpec({{"type", "object"}, {"additionalProperties", false}}),
       {"FieldValueForbidden", spec + ".additionalProperties", "Forbidden: additionalProperties cannot be set to false"}},
      {"properties_and_additional_properties",
       WithSpec({{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"additionalProperties", {{"type", "string"}}}}),
       {"FieldValueForbidden", spec + ".additionalProperties",
        "Forbidden: additionalProperties and properties are mutual exclusive"}},
      {"type_inside_junctor",
       WithSpec({{"type", "string"}, {"anyOf", {{{"type", "string"}}}}}),
       {"FieldValueForbidden", spec + ".anyOf[0].type", "Forbidden: must be empty to be structural"}},
      {"junctor_property_not_specified_outside",
       WithSpec({{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"allOf", {{{"properties", {{"b", {{"minLength", 1}}}}}}}}}),
       {"FieldValueRequired", spec + ".properties[b]", "Required value: because it is defined in allOf[0].properties[b]"}},
      {"list_map_without_keys",
       WithSpec({{"type", "array"}, {"x-kubernetes-list-type", "map"}, {"items", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}}}}}}),
       {"FieldValueRequired", spec + ".x-kubernetes-list-map-keys", "Required value: must not be empty if x-kubernetes-list-type is map"}},
      {"list_map_key_not_required",
       WithSpec({{"type", "array"}, {"x-kubernetes-list-type", "map"}, {"x-kubernetes-list-map-keys", {"name"}},
                 {"items", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}}}}}}),
       {"FieldValueInvalid", spec + ".x-kubernetes-list-map-keys[0]",
        "Invalid value: \"name\": all map keys must be required or have a default value"}},
      {"list_type_unknown",
       WithSpec({{"type", "array"}, {"x-kubernetes-list-type", "bag"}, {"items", {{"type", "string"}}}}),
       {"FieldValueNotSupported", spec + ".x-kubernetes-list-type",
        "Unsupported value: \"bag\": supported values: \"atomic\", \"map\", \"set\""}},
      {"metadata_beyond_name",
       {{"type", "object"}, {"properties", {{"metadata", {{"type", "object"}, {"properties", {{"labels", {{"type", "object"}}}}}}}}}},
       {"FieldValueForbidden", kPrefix + ".properties[metadata].properties[labels]",
        "Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"}},
      {"preserve_unknown_false",
       WithSpec({{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", false}}),
       {"FieldValueInvalid", spec + ".x-kubernetes-preserve-unknown-fields", "Invalid value: false: must be true or undefined"}},
      {"negative_max_length", WithSpec({{"type", "string"}, {"maxLength", -1}}),
       {"FieldValueInvalid", spec + ".maxLength", "Invalid value: -1: must be a non-negative integer"}},
      {"array_without_items", WithSpec({{"type", "array"}}),
       {"FieldValueRequired", spec + ".items", "Required value: must be specified"}},
      {"schema_not_an_object", WithSpec("string"),
       {"FieldValueInvalid", spec, "Invalid value: \"string\": must be a schema object"}},
  };
}

INSTANTIATE_TEST_SUITE_P(BadSchemas, CheckSchemaRefusesTest,
                         ::testing::ValuesIn([] {
                           auto v = BadSchemas();
                           // The regex error text is the library's; checked in its own test.
                           v.erase(std::remove_if(v.begin(), v.end(), [](const BadSchema& b) {
                                     return std::string(b.name) == "bad_regex";
                                   }),
                                   v.end());
                           return v;
                         }()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CheckSchemaTest, BadRegexNamesThePatternNode) {
  auto got = CheckSchema(WithSpec({{"type", "string"}, {"pattern", "[a-z"}}), kPrefix);
  ASSERT_EQ(got.size(), 1u) << Describe(got);
  EXPECT_EQ(got[0].reason, "FieldValueInvalid");
  EXPECT_EQ(got[0].field, kPrefix + ".properties[spec].pattern");
  EXPECT_EQ(got[0].message.rfind("Invalid value: \"[a-z\": must be a valid regular expression, but isn't: ", 0), 0u)
      << got[0].message;
}

TEST(CheckSchemaTest, AcceptsARealisticTrainingJobSchema) {
  json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 63}}},
      "spec": {
        "type": "object", "required": ["replicas"],
        "x-kubernetes-validations": [{"rule": "self.replicas >= 1", "message": "at least one"}],
        "properties": {
          "replicas": {"type": "integer", "format": "int32", "minimum": 1, "default": 1},
          "lr": {"type": "number", "exclusiveMinimum": true, "minimum": 0},
          "policy": {"type": "string", "enum": ["Never", "OnFailure"], "default": "Never"},
          "port": {"x-kubernetes-int-or-string": true,
                   "anyOf": [{"type": "integer"}, {"type": "string"}]},
          "backoff": {"type": "object", "default": {},
                      "properties": {"limit": {"type": "integer", "default": 6}}},
          "env": {"type": "object", "additionalProperties": {"type": "string"}},
          "hosts": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
          "ports": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name", "protocol"],
                    "items": {"type": "object", "required": ["name"],
                              "properties": {"name": {"type": "string"},
                                             "protocol": {"type": "string", "default": "TCP"}}}},
          "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
          "pod": {"type": "object", "x-kubernetes-embedded-resource": true,
                  "x-kubernetes-preserve-unknown-fields": true},
          "created": {"type": "string", "format": "date-time", "nullable": true}
        }
      },
      "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    }
  })");
  auto got = CheckSchema(schema, kPrefix);
  EXPECT_TRUE(got.empty()) << Describe(got);
}

TEST(CheckSchemaTest, DefaultOnNestedObjectIsValidatedWithItsNestedDefaults) {
  // {} is valid because the nested default fills the required field.
  json schema = WithSpec({{"type", "object"},
                          {"properties", {{"b", {{"type", "object"}, {"default", json::object()}, {"required", {"limit"}},
                                                 {"properties", {{"limit", {{"type", "integer"}, {"default", 6}}}}}}}}}});
  auto got = CheckSchema(schema, kPrefix);
  EXPECT_TRUE(got.empty()) << Describe(got);
}

TEST(CheckSchemaTest, ReportsEveryProblemNotJustTheFirst) {
  json schema = WithSpec({{"type", "object"},
                          {"properties", {{"a", {{"type", "bogus"}}}, {"b", {{"type", "string"}, {"pattern", "("}}}}}});
  auto got = CheckSchema(schema, kPrefix);
  ASSERT_EQ(got.size(), 2u) << Describe(got);
  EXPECT_EQ(got[0].field, kPrefix + ".properties[spec].properties[a].type");
  EXPECT_EQ(got[1].field, kPrefix + ".properties[spec].properties[b].pattern");
}

}  // namespace
}  // namespace meshwork::controlplane::schema
