// Pruning, defaulting and validation of custom resources: reasons, field paths and messages
// must read as kube-apiserver's do, since kubectl shows them to the user verbatim.
#include "controlplane/schema/openapi.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;

json Root(const json& spec_schema) {
  return {{"type", "object"}, {"properties", {{"spec", spec_schema}}}};
}
json Object(const json& spec) {
  return {{"apiVersion", "meshwork.dev/v1"}, {"kind", "TrainingJob"}, {"metadata", {{"name", "job"}}},
          {"spec", spec}};
}
std::string Describe(const std::vector<FieldCause>& causes) {
  std::string out;
  for (const auto& c : causes) out += "  " + c.reason + " | " + c.field + " | " + c.message + "\n";
  return out;
}

struct Case {
  const char* name;
  json schema;  // the schema of .spec
  json spec;
  std::vector<FieldCause> want;
};

class KeywordTest : public ::testing::TestWithParam<Case> {};

TEST_P(KeywordTest, ReportsKubeApiserverCauses) {
  const Case& c = GetParam();
  json obj = Object(c.spec);
  auto got = DefaultPruneAndValidate(Root(c.schema), obj);
  EXPECT_EQ(got, c.want) << "got:\n" << Describe(got) << "want:\n" << Describe(c.want);
}

const json kInt = {{"type", "integer"}};
const json kStr = {{"type", "string"}};

std::vector<Case> KeywordCases() {
  return {
      // type
      {"integer_ok", {{"type", "object"}, {"properties", {{"replicas", kInt}}}}, {{"replicas", 3}}, {}},
      {"integer_from_string",
       {{"type", "object"}, {"properties", {{"replicas", kInt}}}},
       {{"replicas", "3"}},
       {{"FieldValueTypeInvalid", "spec.replicas",
         "Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\""}}},
      {"integer_from_fraction",
       {{"type", "object"}, {"properties", {{"replicas", kInt}}}},
       {{"replicas", 1.5}},
       {{"FieldValueTypeInvalid", "spec.replicas",
         "Invalid value: \"number\": spec.replicas in body must be of type integer: \"number\""}}},
      {"integer_above_int64_is_a_number",
       {{"type", "object"}, {"properties", {{"replicas", kInt}}}},
       {{"replicas", json::parse("18446744073709551615")}},
       {{"FieldValueTypeInvalid", "spec.replicas",
         "Invalid value: \"number\": spec.replicas in body must be of type integer: \"number\""}}},
      {"number_accepts_integer", {{"type", "object"}, {"properties", {{"lr", {{"type", "number"}}}}}}, {{"lr", 1}}, {}},
      {"boolean_from_string",
       {{"type", "object"}, {"properties", {{"on", {{"type", "boolean"}}}}}},
       {{"on", "yes"}},
       {{"FieldValueTypeInvalid", "spec.on", "Invalid value: \"string\": spec.on in body must be of type boolean: \"string\""}}},
      {"object_from_array",
       {{"type", "object"}, {"properties", {{"o", {{"type", "object"}}}}}},
       {{"o", json::array()}},
       {{"FieldValueTypeInvalid", "spec.o", "Invalid value: \"array\": spec.o in body must be of type object: \"array\""}}},
      // required
      {"required_missing",
       {{"type", "object"}, {"required", {"image", "replicas"}}, {"properties", {{"image", kStr}, {"replicas", kInt}}}},
       {{"replicas", 1}},
       {{"FieldValueRequired", "spec.image", "Required value"}}},
      {"required_null_is_dropped_then_missing",
       {{"type", "object"}, {"required", {"image"}}, {"properties", {{"image", kStr}}}},
       {{"image", nullptr}},
       {{"FieldValueRequired", "spec.image", "Required value"}}},
      {"nullable_null_ok",
       {{"type", "object"}, {"properties", {{"image", {{"type", "string"}, {"nullable", true}}}}}},
       {{"image", nullptr}},
       {}},
      // enum
      {"enum_ok", {{"type", "object"}, {"properties", {{"policy", {{"type", "string"}, {"enum", {"Never", "OnFailure"}}}}}}}, {{"policy", "Never"}}, {}},
      {"enum_bad",
       {{"type", "object"}, {"properties", {{"policy", {{"type", "string"}, {"enum", {"Never", "OnFailure"}}}}}}},
       {{"policy", "Always"}},
       {{"FieldValueNotSupported", "spec.policy",
         "Unsupported value: \"Always\": supported values: \"Never\", \"OnFailure\""}}},
      {"enum_integers",
       {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"enum", {1, 2}}}}}}},
       {{"n", 3}},
       {{"FieldValueNotSupported", "spec.n", "Unsupported value: 3: supported values: \"1\", \"2\""}}},
      // minimum / maximum
      {"minimum_ok", {{"type", "object"}, {"properties", {{"replicas", {{"type", "integer"}, {"minimum", 1}}}}}}, {{"replicas", 1}}, {}},
      {"minimum_bad",
       {{"type", "object"}, {"properties", {{"replicas", {{"type", "integer"}, {"minimum", 1}}}}}},
       {{"replicas", 0}},
       {{"FieldValueInvalid", "spec.replicas",
         "Invalid value: 0: spec.replicas in body should be greater than or equal to 1"}}},
      {"exclusive_minimum_bad",
       {{"type", "object"}, {"properties", {{"lr", {{"type", "number"}, {"minimum", 0}, {"exclusiveMinimum", true}}}}}},
       {{"lr", 0}},
       {{"FieldValueInvalid", "spec.lr", "Invalid value: 0: spec.lr in body should be greater than 0"}}},
      {"maximum_bad",
       {{"type", "object"}, {"properties", {{"replicas", {{"type", "integer"}, {"maximum", 1000000}}}}}},
       {{"replicas", 1000001}},
       {{"FieldValueInvalid", "spec.replicas",
         "Invalid value: 1000001: spec.replicas in body should be less than or equal to 1e+06"}}},
      {"exclusive_maximum_bad_float",
       {{"type", "object"}, {"properties", {{"p", {{"type", "number"}, {"maximum", 1}, {"exclusiveMaximum", true}}}}}},
       {{"p", 1.0}},
       {{"FieldValueInvalid", "spec.p", "Invalid value: 1: spec.p in body should be less than 1"}}},
      {"maximum_fraction_ok", {{"type", "object"}, {"properties", {{"p", {{"type", "number"}, {"maximum", 1}}}}}}, {{"p", 0.5}}, {}},
      {"multiple_of_bad",
       {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"multipleOf", 8}}}}}},
       {{"n", 12}},
       {{"FieldValueInvalid", "spec.n", "Invalid value: 12: spec.n in body should be a multiple of 8"}}},
      // strings
      {"max_length_bad",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"maxLength", 3}}}}}},
       {{"name", "abcd"}},
       {{"FieldValueTooLong", "spec.name", "Too long: may not be longer than 3"}}},
      {"max_length_counts_characters_not_bytes",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"maxLength", 3}}}}}},
       {{"name", "\xC3\xA9\xC3\xA9\xC3\xA9"}},
       {}},
      {"min_length_bad",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"minLength", 1}}}}}},
       {{"name", ""}},
       {{"FieldValueInvalid", "spec.name", "Invalid value: \"\": spec.name in body should be at least 1 chars long"}}},
      {"pattern_ok", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"pattern", "^[a-z]+$"}}}}}}, {{"name", "abc"}}, {}},
      {"pattern_bad",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"pattern", "^[a-z]+$"}}}}}},
       {{"name", "ABC"}},
       {{"FieldValueInvalid", "spec.name", "Invalid value: \"ABC\": spec.name in body should match '^[a-z]+$'"}}},
      {"pattern_is_a_search_not_a_full_match",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"pattern", "[0-9]"}}}}}},
       {{"name", "gpu8x"}},
       {}},
      {"pattern_re2_text_anchors",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"pattern", "\\A[a-z]+\\z"}}}}}},
       {{"name", "abz1"}},
       {{"FieldValueInvalid", "spec.name", "Invalid value: \"abz1\": spec.name in body should match '\\A[a-z]+\\z'"}}},
      {"pattern_re2_case_insensitive_flag",
       {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"pattern", "(?i)^abc$"}}}}}},
       {{"name", "ABC"}},
       {}},
      {"format_date_time_bad",
       {{"type", "object"}, {"properties", {{"at", {{"type", "string"}, {"format", "date-time"}}}}}},
       {{"at", "yesterday"}},
       {{"FieldValueTypeInvalid", "spec.at",
         "Invalid value: \"yesterday\": spec.at in body must be of type date-time: \"yesterday\""}}},
      {"format_date_time_ok", {{"type", "object"}, {"properties", {{"at", {{"type", "string"}, {"format", "date-time"}}}}}}, {{"at", "2024-02-29T10:00:00.5+01:00"}}, {}},
      {"format_byte_bad",
       {{"type", "object"}, {"properties", {{"b", {{"type", "string"}, {"format", "byte"}}}}}},
       {{"b", "not base64!"}},
       {{"FieldValueTypeInvalid", "spec.b", "Invalid value: \"not base64!\": spec.b in body must be of type byte: \"not base64!\""}}},
      {"format_int32_is_not_range_checked_like_kube_apiserver",
       {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"format", "int32"}}}}}},
       {{"n", 5000000000LL}},
       {}},
      {"format_unknown_is_ignored", {{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"format", "k8s-short-name"}}}}}}, {{"s", "x"}}, {}},
      // arrays
      {"min_items_bad",
       {{"type", "object"}, {"properties", {{"args", {{"type", "array"}, {"minItems", 1}, {"items", kStr}}}}}},
       {{"args", json::array()}},
       {{"FieldValueInvalid", "spec.args", "Invalid value: 0: spec.args in body should have at least 1 items"}}},
      {"max_items_bad",
       {{"type", "object"}, {"properties", {{"args", {{"type", "array"}, {"maxItems", 2}, {"items", kStr}}}}}},
       {{"args", {"a", "b", "c"}}},
       {{"FieldValueTooMany", "spec.args", "Too many: 3: must have at most 2 items"}}},
      {"item_type_bad",
       {{"type", "object"}, {"properties", {{"args", {{"type", "array"}, {"items", kStr}}}}}},
       {{"args", {"a", 2}}},
       {{"FieldValueTypeInvalid", "spec.args[1]", "Invalid value: \"integer\": spec.args[1] in body must be of type string: \"integer\""}}},
      {"null_item_is_a_type_error",
       {{"type", "object"}, {"properties", {{"args", {{"type", "array"}, {"items", kStr}}}}}},
       {{"args", {"a", nullptr}}},
       {{"FieldValueTypeInvalid", "spec.args[1]", "Invalid value: \"null\": spec.args[1] in body must be of type string: \"null\""}}},
      // objects
      {"max_properties_bad",
       {{"type", "object"}, {"properties", {{"env", {{"type", "object"}, {"maxProperties", 1}, {"additionalProperties", kStr}}}}}},
       {{"env", {{"A", "1"}, {"B", "2"}}}},
       {{"FieldValueTooMany", "spec.env", "Too many: 2: must have at most 1 items"}}},
      {"min_properties_bad",
       {{"type", "object"}, {"properties", {{"env", {{"type", "object"}, {"minProperties", 1}, {"additionalProperties", kStr}}}}}},
       {{"env", json::object()}},
       {{"FieldValueInvalid", "spec.env", "Invalid value: 1: spec.env in body should have at least 1 properties"}}},
      {"map_values_validated",
       {{"type", "object"}, {"properties", {{"env", {{"type", "object"}, {"additionalProperties", kStr}}}}}},
       {{"env", {{"A", 1}}}},
       {{"FieldValueTypeInvalid", "spec.env.A", "Invalid value: \"integer\": spec.env.A in body must be of type string: \"integer\""}}},
      // int-or-string
      {"int_or_string_int", {{"type", "object"}, {"properties", {{"port", {{"x-kubernetes-int-or-string", true}}}}}}, {{"port", 80}}, {}},
      {"int_or_string_string", {{"type", "object"}, {"properties", {{"port", {{"x-kubernetes-int-or-string", true}}}}}}, {{"port", "http"}}, {}},
      {"int_or_string_bool",
       {{"type", "object"}, {"properties", {{"port", {{"x-kubernetes-int-or-string", true}}}}}},
       {{"port", true}},
       {{"FieldValueTypeInvalid", "spec.port",
         "Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\""}}},
      {"int_or_string_pattern_on_strings",
       {{"type", "object"}, {"properties", {{"maxUnavailable", {{"x-kubernetes-int-or-string", true}, {"pattern", "^[0-9]+%$"}}}}}},
       {{"maxUnavailable", "ten"}},
       {{"FieldValueInvalid", "spec.maxUnavailable",
         "Invalid value: \"ten\": spec.maxUnavailable in body should match '^[0-9]+%$'"}}},
      // list types
      {"list_set_duplicate",
       {{"type", "object"}, {"properties", {{"hosts", {{"type", "array"}, {"x-kubernetes-list-type", "set"}, {"items", kStr}}}}}},
       {{"hosts", {"a", "b", "a"}}},
       {{"FieldValueDuplicate", "spec.hosts[2]", "Duplicate value: \"a\""}}},
      {"list_set_unique_ok",
       {{"type", "object"}, {"properties", {{"hosts", {{"type", "array"}, {"x-kubernetes-list-type", "set"}, {"items", kStr}}}}}},
       {{"hosts", {"a", "b"}}},
       {}},
      {"list_map_duplicate_key",
       {{"type", "object"},
        {"properties",
         {{"ports",
           {{"type", "array"},
            {"x-kubernetes-list-type", "map"},
            {"x-kubernetes-list-map-keys", {"name"}},
            {"items", {{"type", "object"}, {"required", {"name"}}, {"properties", {{"name", kStr}, {"port", kInt}}}}}}}}}},
       {{"ports", {{{"name", "http"}, {"port", 80}}, {{"name", "grpc"}, {"port", 90}}, {{"name", "http"}, {"port", 81}}}}},
       {{"FieldValueDuplicate", "spec.ports[2]", "Duplicate value: map[string]interface {}{\"name\":\"http\"}"}}},
      // combinators
      {"any_of_none",
       {{"type", "object"},
        {"properties", {{"size", {{"type", "string"}, {"anyOf", {{{"pattern", "^[0-9]+Gi$"}}, {{"enum", {"auto"}}}}}}}}}},
       {{"size", "big"}},
       {{"FieldValueInvalid", "spec.size", "Invalid value: \"\": \"spec.size\" must validate at least one schema (anyOf)"},
        {"FieldValueInvalid", "spec.size", "Invalid value: \"big\": spec.size in body should match '^[0-9]+Gi$'"}}},
      {"any_of_one", {{"type", "object"}, {"properties", {{"size", {{"type", "string"}, {"anyOf", {{{"pattern", "^[0-9]+Gi$"}}, {{"enum", {"auto"}}}}}}}}}}, {{"size", "auto"}}, {}},
      {"one_of_two_valid",
       {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"oneOf", {{{"minimum", 0}}, {{"maximum", 10}}}}}}}}},
       {{"n", 5}},
       {{"FieldValueInvalid", "spec.n",
         "Invalid value: \"\": \"spec.n\" must validate one and only one schema (oneOf). Found 2 valid alternatives"}}},
      {"not_matching",
       {{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"not", {{"enum", {"root"}}}}}}}}},
       {{"s", "root"}},
       {{"FieldValueInvalid", "spec.s", "Invalid value: \"\": \"spec.s\" must not validate the schema (not)"}}},
      {"all_of_one_fails",
       {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"allOf", {{{"minimum", 0}}, {{"maximum", 10}}}}}}}}},
       {{"n", 11}},
       {{"FieldValueInvalid", "spec.n", "Invalid value: 11: spec.n in body should be less than or equal to 10"},
        {"FieldValueInvalid", "spec.n", "Invalid value: \"\": \"spec.n\" must validate all the schemas (allOf)"}}},
  };
}

INSTANTIATE_TEST_SUITE_P(Keywords, KeywordTest, ::testing::ValuesIn(KeywordCases()),
                         [](const auto& info) { return std::string(info.param.name); });

// A TrainingJob-like schema with nested arrays of objects, defaults and maps.
json TrainingJobSchema() {
  return json::parse(R"({
    "type": "object",
    "properties": {
      "spec": {
        "type": "object",
        "required": ["replicas", "template"],
        "properties": {
          "replicas": {"type": "integer", "minimum": 1},
          "restartPolicy": {"type": "string", "enum": ["Never", "OnFailure"], "default": "OnFailure"},
          "backoff": {"type": "object", "default": {},
                      "properties": {"limit": {"type": "integer", "default": 6},
                                     "seconds": {"type": "integer", "default": 10}}},
          "resume": {"type": "object",
                     "properties": {"from": {"type": "string", "default": "latest"}}},
          "template": {
            "type": "object",
            "properties": {
              "containers": {
                "type": "array", "minItems": 1,
                "items": {
                  "type": "object", "required": ["name", "image"],
                  "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9-]+$"},
                    "image": {"type": "string"},
                    "pullPolicy": {"type": "string", "default": "IfNotPresent"},
                    "ports": {"type": "array",
                              "items": {"type": "object", "properties": {
                                "containerPort": {"type": "integer", "maximum": 65535},
                                "protocol": {"type": "string", "default": "TCP"}}}}
                  }
                }
              }
            }
          },
          "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
          "embedded": {"type": "object", "x-kubernetes-embedded-resource": true,
                       "x-kubernetes-preserve-unknown-fields": true}
        }
      },
      "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
    }
  })");
}

TEST(DefaultPruneAndValidateTest, NestedArraysOfObjectsNameTheExactIndex) {
  json obj = Object(json::parse(R"({"replicas": 2, "template": {"containers": [
      {"name": "ok", "image": "x"},
      {"name": "Bad_Name", "ports": [{"containerPort": 80}, {"containerPort": 70000}]}]}})"));
  auto got = DefaultPruneAndValidate(TrainingJobSchema(), obj);
  std::vector<FieldCause> want = {
      {"FieldValueRequired", "spec.template.containers[1].image", "Required value"},
      {"FieldValueInvalid", "spec.template.containers[1].name",
       "Invalid value: \"Bad_Name\": spec.template.containers[1].name in body should match '^[a-z0-9-]+$'"},
      {"FieldValueInvalid", "spec.template.containers[1].ports[1].containerPort",
       "Invalid value: 70000: spec.template.containers[1].ports[1].containerPort in body should be less "
       "than or equal to 65535"},
  };
  EXPECT_EQ(got, want) << Describe(got);
}

TEST(DefaultPruneAndValidateTest, AppliesDefaultsAtEveryLevel) {
  json obj = Object(json::parse(R"({"replicas": 1, "template": {"containers": [
      {"name": "a", "image": "x", "ports": [{"containerPort": 80}]}]}})"));
  auto got = DefaultPruneAndValidate(TrainingJobSchema(), obj);
  ASSERT_TRUE(got.empty()) << Describe(got);
  EXPECT_EQ(obj["spec"]["restartPolicy"], "OnFailure");
  // A defaulted parent object gets its own nested defaults.
  EXPECT_EQ(obj["spec"]["backoff"], json::parse(R"({"limit": 6, "seconds": 10})"));
  EXPECT_EQ(obj["spec"]["template"]["containers"][0]["pullPolicy"], "IfNotPresent");
  EXPECT_EQ(obj["spec"]["template"]["containers"][0]["ports"][0]["protocol"], "TCP");
}

TEST(DefaultPruneAndValidateTest, DoesNotCreateAMissingParentWithoutADefault) {
  json obj = Object(json::parse(R"({"replicas": 1, "template": {"containers": [{"name": "a", "image": "x"}]}})"));
  ASSERT_TRUE(DefaultPruneAndValidate(TrainingJobSchema(), obj).empty());
  EXPECT_FALSE(obj["spec"].contains("resume"));
  // ...but fills in the nested default once the parent exists.
  json obj2 = Object(json::parse(R"({"replicas": 1, "resume": {}, "template": {"containers": [{"name": "a", "image": "x"}]}})"));
  ASSERT_TRUE(DefaultPruneAndValidate(TrainingJobSchema(), obj2).empty());
  EXPECT_EQ(obj2["spec"]["resume"]["from"], "latest");
}

TEST(DefaultPruneAndValidateTest, ExplicitValuesWinOverDefaultsAndNullTakesTheDefault) {
  json obj = Object(json::parse(R"({"replicas": 1, "restartPolicy": "Never", "backoff": {"limit": null},
      "template": {"containers": [{"name": "a", "image": "x"}]}})"));
  ASSERT_TRUE(DefaultPruneAndValidate(TrainingJobSchema(), obj).empty());
  EXPECT_EQ(obj["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(obj["spec"]["backoff"]["limit"], 6);
}

TEST(DefaultPruneAndValidateTest, PrunesUnknownFieldsButKeepsTypeMetaAndMetadata) {
  json obj = Object(json::parse(R"({"replicas": 1, "unknown": 1,
      "template": {"containers": [{"name": "a", "image": "x", "typo": true}]},
      "extra": {"anything": {"goes": 1}, "known": {"a": "x", "b": "pruned"}},
      "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}}})"));
  obj["metadata"]["labels"] = {{"app", "x"}};
  obj["topLevelJunk"] = 1;
  obj["status"] = {{"phase", "Running"}, {"junk", 1}};
  ASSERT_TRUE(DefaultPruneAndValidate(TrainingJobSchema(), obj).empty());
  EXPECT_FALSE(obj["spec"].contains("unknown"));
  EXPECT_FALSE(obj.contains("topLevelJunk"));
  EXPECT_FALSE(obj["status"].contains("junk"));
  EXPECT_FALSE(obj["spec"]["template"]["containers"][0].contains("typo"));
  EXPECT_EQ(obj["spec"]["extra"]["anything"], json::parse(R"({"goes": 1})"));
  EXPECT_EQ(obj["spec"]["extra"]["known"], json::parse(R"({"a": "x"})"));  // specified nodes still prune
  EXPECT_EQ(obj["spec"]["embedded"]["spec"], json::parse(R"({"x": 1})"));
  EXPECT_EQ(obj["apiVersion"], "meshwork.dev/v1");
  EXPECT_EQ(obj["kind"], "TrainingJob");
  EXPECT_EQ(obj["metadata"]["labels"]["app"], "x");
}

TEST(DefaultPruneAndValidateTest, EmbeddedResourceNeedsApiVersionAndKind) {
  json obj = Object(json::parse(R"({"replicas": 1, "template": {"containers": [{"name": "a", "image": "x"}]},
      "embedded": {"spec": {}}})"));
  auto got = DefaultPruneAndValidate(TrainingJobSchema(), obj);
  std::vector<FieldCause> want = {
      {"FieldValueRequired", "spec.embedded.apiVersion", "Required value: must not be empty"},
      {"FieldValueRequired", "spec.embedded.kind", "Required value: must not be empty"}};
  EXPECT_EQ(got, want) << Describe(got);
}

TEST(DefaultPruneAndValidateTest, WholeFloatIsAnIntegerAndIsStoredAsOne) {
  // kube-openapi accepts 2.0 for an integer field (Go decodes it as float64 and writes back 2).
  json obj = Object(json::parse(R"({"replicas": 2.0, "template": {"containers": [{"name": "a", "image": "x"}]}})"));
  ASSERT_TRUE(DefaultPruneAndValidate(TrainingJobSchema(), obj).empty());
  EXPECT_TRUE(obj["spec"]["replicas"].is_number_integer());
  EXPECT_EQ(obj["spec"]["replicas"].dump(), "2");
}

TEST(DefaultPruneAndValidateTest, MetadataNameRestrictionsApply) {
  json schema = {{"type", "object"},
                 {"properties", {{"metadata", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}, {"maxLength", 5}}}}}}}}}};
  json obj = Object(json::object());
  obj["metadata"]["name"] = "toolongname";
  obj["metadata"]["labels"] = {{"a", "b"}};
  auto got = DefaultPruneAndValidate(schema, obj);
  std::vector<FieldCause> want = {{"FieldValueTooLong", "metadata.name", "Too long: may not be longer than 5"}};
  EXPECT_EQ(got, want) << Describe(got);
  EXPECT_EQ(obj["metadata"]["labels"]["a"], "b");
}

TEST(DefaultPruneAndValidateTest, NonObjectBodyIsATypeError) {
  json obj = json::array();
  auto got = DefaultPruneAndValidate(TrainingJobSchema(), obj);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].reason, "FieldValueTypeInvalid");
}

TEST(DefaultPruneAndValidateTest, LongStringAgainstPatternDoesNotCrash) {
  json schema = Root({{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"pattern", "^(a|b)*c$"}}}}}});
  json obj = Object({{"s", std::string(200000, 'a')}});
  auto got = DefaultPruneAndValidate(schema, obj);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].field, "spec.s");
}

TEST(DefaultPruneAndValidateTest, IsSafeToCallFromManyThreads) {
  const json schema = TrainingJobSchema();
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        json obj = Object(json::parse(R"({"replicas": 0, "template": {"containers": [{"name": "A", "image": "x"}]}})"));
        if (DefaultPruneAndValidate(schema, obj).size() != 2) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(InvalidMessageTest, OneCauseHasNoBrackets) {
  std::vector<FieldCause> c = {{"FieldValueRequired", "spec.image", "Required value"}};
  EXPECT_EQ(InvalidMessage("TrainingJob.meshwork.dev", "job", c),
            "TrainingJob.meshwork.dev \"job\" is invalid: spec.image: Required value");
}

TEST(InvalidMessageTest, SeveralCausesAreBracketedAndDeduplicated) {
  std::vector<FieldCause> c = {
      {"FieldValueRequired", "spec.image", "Required value"},
      {"FieldValueInvalid", "spec.replicas", "Invalid value: 0: spec.replicas in body should be greater than or equal to 1"},
      {"FieldValueRequired", "spec.image", "Required value"}};
  EXPECT_EQ(InvalidMessage("TrainingJob.meshwork.dev", "job", c),
            "TrainingJob.meshwork.dev \"job\" is invalid: [spec.image: Required value, spec.replicas: Invalid "
            "value: 0: spec.replicas in body should be greater than or equal to 1]");
  EXPECT_EQ(InvalidMessage("TrainingJob.meshwork.dev", "job", {}), "TrainingJob.meshwork.dev \"job\" is invalid");
}

TEST(InvalidMessageTest, CausesToJsonUsesStatusCauseFields) {
  json j = CausesToJson({{"FieldValueRequired", "spec.image", "Required value"}});
  EXPECT_EQ(j, json::parse(R"([{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.image"}])"));
}

}  // namespace
}  // namespace meshwork::controlplane::schema
