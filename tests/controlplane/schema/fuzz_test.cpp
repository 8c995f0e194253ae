// Random schemas, objects and JSONPaths (fixed seeds, bounded sizes): nothing may throw or crash,
// whatever a client or a CRD author sends.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "controlplane/schema/openapi.h"
#include "controlplane/schema/printer_columns.h"

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  json Scalar() {
    switch (Pick(9)) {
      case 0: return nullptr;
      case 1: return Pick(2) == 0;
      case 2: return Pick(200) - 100;
      case 3: return (Pick(2000) - 1000) / 7.0;
      case 4: return 1e300;
      case 5: return json::parse("18446744073709551615");
      case 6: return Word();
      case 7: return std::string("^[a-z(]+$").substr(0, static_cast<size_t>(Pick(9)));
      default: return "2024-05-01T11:00:00Z";
    }
  }

  std::string Word() {
    static const char* kWords[] = {"type", "object", "array", "string", "integer", "number", "boolean",
                                   "properties", "items", "required", "default", "enum", "a", "b",
                                   "spec", "status", "metadata", "name", "set", "map", "atomic", ""};
    return kWords[Pick(static_cast<int>(sizeof kWords / sizeof *kWords))];
  }

  json Value(int depth) {
    if (depth <= 0 || Pick(3) == 0) return Scalar();
    if (Pick(2) == 0) {
      json arr = json::array();
      for (int i = Pick(4); i > 0; --i) arr.push_back(Value(depth - 1));
      return arr;
    }
    json obj = json::object();
    for (int i = Pick(4); i > 0; --i) obj[Word()] = Value(depth - 1);
    return obj;
  }

  json Schema(int depth) {
    static const char* kKeys[] = {"type", "format", "default", "maximum", "exclusiveMaximum", "minimum",
                                  "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems",
                                  "minItems", "multipleOf", "enum", "maxProperties", "minProperties",
                                  "required", "nullable", "x-kubernetes-preserve-unknown-fields",
                                  "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
                                  "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "$ref"};
    static const char* kTypes[] = {"object", "array", "string", "integer", "number", "boolean", "bogus"};
    json s = json::object();
    s["type"] = kTypes[Pick(7)];
    for (int i = Pick(5); i > 0; --i) {
      std::string k = kKeys[Pick(static_cast<int>(sizeof kKeys / sizeof *kKeys))];
      s[k] = Pick(2) ? Scalar() : Value(1);
    }
    if (depth > 0) {
      if (Pick(2)) {
        for (int i = Pick(3); i > 0; --i) s["properties"][Word()] = Schema(depth - 1);
      }
      if (Pick(3) == 0) s["items"] = Schema(depth - 1);
      if (Pick(4) == 0) s["additionalProperties"] = Pick(2) ? json(Schema(depth - 1)) : json(Pick(2) == 0);
      if (Pick(5) == 0) s[Pick(2) ? "anyOf" : "allOf"] = json::array({Schema(depth - 1), Schema(depth - 1)});
      if (Pick(6) == 0) s["not"] = Schema(depth - 1);
    }
    return s;
  }

  std::string Path() {
    static const char* kParts[] = {".a", ".b", ".spec", "[0]", "[*]", "[-1]", "[?(@.a==\"x\")]", "[?(@.b)]",
                                   "['a']", "[", "]", "..", ".", "\\.", "[?(@.a > 1)]", "{", "}", "[1:2]"};
    std::string p;
    for (int i = Pick(5); i >= 0; --i) p += kParts[Pick(static_cast<int>(sizeof kParts / sizeof *kParts))];
    return p;
  }

 private:
  std::mt19937 rng_;
};

TEST(SchemaFuzzTest, RandomSchemasAndObjectsNeverThrow) {
  Generator g(12345);
  for (int i = 0; i < 3000; ++i) {
    json schema = g.Schema(3);
    json obj = g.Value(4);
    if (!obj.is_object()) obj = json::object({{"spec", obj}});
    EXPECT_NO_THROW(CheckSchema(schema, "s")) << schema.dump();
    json copy = obj;
    std::vector<FieldCause> causes;
    EXPECT_NO_THROW(causes = DefaultPruneAndValidate(schema, copy)) << schema.dump() << "\n" << obj.dump();
    EXPECT_NO_THROW(InvalidMessage("K.g", "n", causes));
  }
}

TEST(SchemaFuzzTest, RandomPathsAndObjectsInTablesNeverThrow) {
  Generator g(777);
  const auto now = std::chrono::system_clock::now();
  for (int i = 0; i < 3000; ++i) {
    std::vector<json> objs = {g.Value(4), g.Value(4)};
    PrinterColumn col{"C", i % 2 ? "string" : (i % 3 ? "integer" : "date"), "", "", g.Path(), 0};
    EXPECT_NO_THROW(BuildTable({col}, objs, "Metadata", now)) << col.json_path;
    EXPECT_NO_THROW(CheckJsonPath(col.json_path));
    for (const char* r : {"pods", "services", "events", "configmaps", "namespaces", "leases", "other"}) {
      EXPECT_NO_THROW(BuiltinTable(r, objs, "Object", now)) << r << " " << objs[0].dump();
    }
    EXPECT_NO_THROW(CheckPrinterColumns(g.Value(3), "c"));
  }
}

}  // namespace
}  // namespace meshwork::controlplane::schema
