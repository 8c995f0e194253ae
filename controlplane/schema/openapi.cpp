// Pruning, defaulting and validation of custom resources against a structural openAPIV3Schema,
// in kube-apiserver's order and wording (k8s.io/apiextensions-apiserver + kube-openapi), plus
// the checks a schema must pass before a CRD is accepted.
#include "controlplane/schema/openapi.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "controlplane/schema/go_format.h"
#include "controlplane/schema/validation_rules.h"

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;

// ---- field paths, as k8s.io/apimachinery's field.Path prints them ---------------------------

std::string Child(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}
std::string Index(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}
std::string Key(const std::string& path, const std::string& key) {
  return path + "[" + key + "]";
}

// ---- field.Error constructors: reason + ErrorBody ---------------------------------------------

FieldCause Required(const std::string& field, const std::string& detail = "") {
  return {"FieldValueRequired", field, detail.empty() ? "Required value" : "Required value: " + detail};
}
FieldCause Forbidden(const std::string& field, const std::string& detail) {
  return {"FieldValueForbidden", field, "Forbidden: " + detail};
}
// `rendered` is the bad value already rendered by gofmt::BadValue (or a quoted type name).
FieldCause Invalid(const std::string& field, const std::string& rendered, const std::string& detail) {
  return {"FieldValueInvalid", field, "Invalid value: " + rendered + ": " + detail};
}
FieldCause TypeInvalid(const std::string& field, const std::string& rendered,
                       const std::string& detail) {
  return {"FieldValueTypeInvalid", field, "Invalid value: " + rendered + ": " + detail};
}
FieldCause NotSupported(const std::string& field, const json& value, const json& allowed) {
  std::string detail;
  for (const auto& a : allowed) {
    detail += detail.empty() ? "supported values: " : ", ";
    detail += gofmt::Quote(a.is_string() ? a.get<std::string>() : a.dump());
  }
  std::string msg = "Unsupported value: " + gofmt::BadValue(value);
  if (!detail.empty()) msg += ": " + detail;
  return {"FieldValueNotSupported", field, msg};
}
FieldCause TooLong(const std::string& field, int64_t max) {
  return {"FieldValueTooLong", field, "Too long: may not be longer than " + std::to_string(max)};
}
FieldCause TooMany(const std::string& field, int64_t actual, int64_t max) {
  return {"FieldValueTooMany", field,
          "Too many: " + std::to_string(actual) + ": must have at most " + std::to_string(max) +
              " items"};
}
FieldCause Duplicate(const std::string& field, const json& value) {
  return {"FieldValueDuplicate", field, "Duplicate value: " + gofmt::BadValue(value)};
}

// ---- JSON helpers -------------------------------------------------------------------------

const json* Get(const json& node, const char* key) {
  if (!node.is_object()) return nullptr;
  auto it = node.find(key);
  return it == node.end() ? nullptr : &*it;
}
bool Flag(const json& node, const char* key) {
  const json* v = Get(node, key);
  return v && v->is_boolean() && v->get<bool>();
}
std::string TypeOf(const json& node) {
  const json* t = Get(node, "type");
  return t && t->is_string() ? t->get<std::string>() : "";
}
const json* SchemaAt(const json& node, const char* key) {
  const json* v = Get(node, key);
  return v && v->is_object() ? v : nullptr;
}
const json* PropertySchema(const json& node, const std::string& name) {
  const json* props = SchemaAt(node, "properties");
  if (!props) return nullptr;
  auto it = props->find(name);
  return it != props->end() && it->is_object() ? &*it : nullptr;
}

constexpr double kMaxJsonFloatInt = 9007199254740992.0;  // 2^53

bool IsWholeFloat(const json& v) {
  if (!v.is_number_float()) return false;
  double d = v.get<double>();
  return std::isfinite(d) && std::fabs(d) <= kMaxJsonFloatInt && d == std::trunc(d);
}
bool IsInt64(const json& v) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return v.is_number_integer();
}
// kube-openapi accepts a whole float64 where an integer is expected ("isFloatInt").
bool IsIntegerValue(const json& v) { return IsInt64(v) || IsWholeFloat(v); }

// The JSON type kube-openapi infers for a decoded value.
std::string DataType(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return IsInt64(v) ? "integer" : "number";
  }
}

double AsDouble(const json& v) { return v.get<double>(); }

// A schema count (maxLength, minItems, ...) as an integer, clamped so that an unchecked schema
// with 1e300 or -5 cannot overflow a conversion.
int64_t Count(const json& v) {
  if (IsInt64(v)) return v.get<int64_t>();
  if (v.is_number_unsigned()) return std::numeric_limits<int64_t>::max();
  double d = v.get<double>();
  if (!(d > -9.2e18)) return std::numeric_limits<int64_t>::min();
  if (!(d < 9.2e18)) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(d);
}

// How kube-openapi prints a schema bound (a *float64 with %v).
std::string Bound(const json& v) { return gofmt::Float(v.get<double>()); }

size_t RuneCount(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

// ---- patterns: compiled once, shared by all threads -------------------------------------------

struct CompiledPattern {
  std::unique_ptr<std::regex> re;  // null when the pattern does not compile
  std::string error;
};

// Kubernetes patterns are Go RE2. Map the RE2 spellings ECMAScript lacks or reads differently:
// a leading (?i), and the text anchors \A and \z (ECMAScript would read \z as a plain "z").
std::string TranslateRE2(const std::string& pattern, std::regex::flag_type* flags) {
  std::string in = pattern;
  if (in.rfind("(?i)", 0) == 0) {
    in = in.substr(4);
    *flags |= std::regex::icase;
  }
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '\\' && i + 1 < in.size()) {
      char n = in[++i];
      if (!in_class && n == 'A') {
        out += '^';
      } else if (!in_class && n == 'z') {
        out += '$';
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out += c;
  }
  return out;
}

// A process-wide cache is the point here: CRD patterns are few and compiling std::regex is slow.
class PatternCache {
 public:
  std::shared_ptr<const CompiledPattern> Get(const std::string& pattern) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(pattern);
      if (it != cache_.end()) return it->second;
    }
    auto compiled = std::make_shared<CompiledPattern>();
    auto flags = std::regex::ECMAScript;
    std::string body = TranslateRE2(pattern, &flags);
#if defined(__GLIBCXX__)
    // libstdc++'s BFS executor: no recursion per input character, so long strings are safe.
    flags |= std::regex_constants::__polynomial;
#endif
    try {
      compiled->re = std::make_unique<std::regex>(body, flags);
    } catch (const std::regex_error& e) {
      compiled->error = e.what();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.size() > 4096) cache_.clear();  // bound memory under adversarial schemas
    cache_.emplace(pattern, compiled);
    return compiled;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledPattern>> cache_;
};

PatternCache& Patterns() {
  static PatternCache cache;
  return cache;
}

// ---- string formats (strfmt's default registry, the common ones) ------------------------------

bool AllDigits(const std::string& s, size_t pos, size_t n) {
  if (pos + n > s.size()) return false;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}
int Num(const std::string& s, size_t pos, size_t n) { return std::stoi(s.substr(pos, n)); }

bool ValidDate(const std::string& s, size_t pos) {
  if (!AllDigits(s, pos, 4) || s.size() < pos + 10 || s[pos + 4] != '-' || !AllDigits(s, pos + 5, 2) ||
      s[pos + 7] != '-' || !AllDigits(s, pos + 8, 2))
    return false;
  int y = Num(s, pos, 4), m = Num(s, pos + 5, 2), d = Num(s, pos + 8, 2);
  static const int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (m < 1 || m > 12 || d < 1 || d > kDays[m - 1]) return false;
  bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return !(m == 2 && d == 29 && !leap);
}

bool ValidDateTime(const std::string& s) {
  if (s.size() < 19 || !ValidDate(s, 0)) return false;
  if (s[10] != 'T' && s[10] != 't' && s[10] != ' ') return false;
  if (!AllDigits(s, 11, 2) || s[13] != ':' || !AllDigits(s, 14, 2) || s[16] != ':' ||
      !AllDigits(s, 17, 2))
    return false;
  if (Num(s, 11, 2) > 23 || Num(s, 14, 2) > 59 || Num(s, 17, 2) > 60) return false;
  size_t i = 19;
  if (i < s.size() && s[i] == '.') {
    size_t start = ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start) return false;
  }
  if (i == s.size()) return true;  // strfmt also accepts a local time without zone
  if ((s[i] == 'Z' || s[i] == 'z') && i + 1 == s.size()) return true;
  if ((s[i] == '+' || s[i] == '-') && s.size() == i + 6 && AllDigits(s, i + 1, 2) &&
      s[i + 3] == ':' && AllDigits(s, i + 4, 2))
    return Num(s, i + 1, 2) <= 23 && Num(s, i + 4, 2) <= 59;
  return false;
}

bool ValidBase64(const std::string& s) {
  if (s.size() % 4 != 0) return false;
  size_t pad = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad) return false;
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/')) return false;
  }
  return pad <= 2;
}

bool ValidUUID(const std::string& s) {
  static const std::regex re("^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$");
  return std::regex_match(s, re);
}

bool ValidIPv4(const std::string& s) {
  in_addr a{};
  return inet_pton(AF_INET, s.c_str(), &a) == 1;
}
bool ValidIPv6(const std::string& s) {
  in6_addr a{};
  return s.find(':') != std::string::npos && inet_pton(AF_INET6, s.c_str(), &a) == 1;
}
bool ValidCIDR(const std::string& s) {
  size_t slash = s.find('/');
  if (slash == std::string::npos) return false;
  std::string ip = s.substr(0, slash), bits = s.substr(slash + 1);
  if (bits.empty() || bits.size() > 3 || !AllDigits(bits, 0, bits.size())) return false;
  int n = std::stoi(bits);
  if (ValidIPv4(ip)) return n <= 32;
  if (ValidIPv6(ip)) return n <= 128;
  return false;
}
bool ValidHostname(const std::string& s) {
  if (s.empty() || s.size() > 255) return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t dot = s.find('.', start);
    std::string label = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
      return dot == std::string::npos && label.empty() && start > 0;  // trailing dot is fine
    for (char c : label) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-')) return false;
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return true;
}
bool ValidEmail(const std::string& s) {
  static const std::regex re("^[^@\\s]+@[^@\\s]+$");
  return std::regex_match(s, re);
}
bool ValidURI(const std::string& s) {
  static const std::regex re("^([a-zA-Z][a-zA-Z0-9+.-]*:[^\\s]*|/[^\\s]*)$");
  return std::regex_match(s, re);
}
bool ValidMAC(const std::string& s) {
  static const std::regex re(
      "^([0-9a-fA-F]{2}[:-]){5}[0-9a-fA-F]{2}$|^([0-9a-fA-F]{4}\\.){2}[0-9a-fA-F]{4}$");
  return std::regex_match(s, re);
}
bool ValidDuration(const std::string& s) {
  static const std::regex go("^[-+]?([0-9]*(\\.[0-9]*)?(ns|us|\xC2\xB5s|ms|s|m|h|d|w))+$");
  static const std::regex words(
      "^[0-9]+\\s*(ns|us|ms|s|m|h|d|w|nanoseconds?|microseconds?|milliseconds?|seconds?|"
      "minutes?|hours?|days?|weeks?)$");
  return s != "" && (std::regex_match(s, go) || std::regex_match(s, words));
}

// Returns false only for a known format the value breaks; unknown formats are ignored, as
// kube-apiserver ignores them.
bool FormatOk(const std::string& format, const std::string& v) {
  if (format == "date-time" || format == "datetime") return ValidDateTime(v);
  if (format == "date") return v.size() == 10 && ValidDate(v, 0);
  if (format == "byte") return ValidBase64(v);
  if (format == "uuid" || format == "uuid3" || format == "uuid4" || format == "uuid5")
    return ValidUUID(v);
  if (format == "ipv4") return ValidIPv4(v);
  if (format == "ipv6") return ValidIPv6(v);
  if (format == "cidr") return ValidCIDR(v);
  if (format == "hostname") return ValidHostname(v);
  if (format == "email") return ValidEmail(v);
  if (format == "uri") return ValidURI(v);
  if (format == "mac") return ValidMAC(v);
  if (format == "duration") return ValidDuration(v);
  return true;
}

// ---- schema node access ------------------------------------------------------------------

// One pass over a schema node's keys (schema nodes are small) instead of a map lookup per
// keyword per value: validation runs on every write, so this is the hot path.
enum class K {k_type, k_format, k_maximum, k_exclusiveMaximum, k_minimum, k_exclusiveMinimum, k_maxLength, k_minLength, k_pattern, k_maxItems, k_minItems, k_multipleOf, k_enum, k_maxProperties, k_minProperties, k_required, k_items, k_allOf, k_oneOf, k_anyOf, k_not, k_properties, k_additionalProperties, k_nullable, k_default, k_x_preserve_unknown_fields, k_x_embedded_resource, k_x_int_or_string, k_x_list_type, k_x_list_map_keys, kCount};
const char* const kKeywordNames[] = {"type", "format", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf", "oneOf", "anyOf", "not", "properties", "additionalProperties", "nullable", "default", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys"};

class NodeView {
 public:
  explicit NodeView(const json& node) {
    if (!node.is_object()) return;
    static const std::unordered_map<std::string, K> kIndex = [] {
      std::unordered_map<std::string, K> m;
      for (int i = 0; i < static_cast<int>(K::kCount); ++i) m.emplace(kKeywordNames[i], static_cast<K>(i));
      return m;
    }();
    for (auto it = node.begin(); it != node.end(); ++it) {
      auto found = kIndex.find(it.key());
      if (found != kIndex.end()) at_[static_cast<int>(found->second)] = &*it;
    }
  }
  const json* Get(K k) const { return at_[static_cast<int>(k)]; }
  bool Flag(K k) const {
    const json* v = Get(k);
    return v && v->is_boolean() && v->get<bool>();
  }
  const json* Schema(K k) const {
    const json* v = Get(k);
    return v && v->is_object() ? v : nullptr;
  }
  std::string Type() const {
    const json* t = Get(K::k_type);
    return t && t->is_string() ? t->get<std::string>() : "";
  }
  const json* Property(const std::string& name) const {
    const json* props = Schema(K::k_properties);
    if (!props) return nullptr;
    auto it = props->find(name);
    return it != props->end() && it->is_object() ? &*it : nullptr;
  }

 private:
  const json* at_[static_cast<int>(K::kCount)] = {};
};

// ---- prune -----------------------------------------------------------------------------------

void PruneNode(const json& node, json& value, bool is_root);

void PruneObject(const json& node, json& obj, bool is_root) {
  const NodeView view(node);
  const bool preserve = view.Flag(K::k_x_preserve_unknown_fields);
  const bool embedded = view.Flag(K::k_x_embedded_resource);
  const json* additional = view.Get(K::k_additionalProperties);
  for (auto it = obj.begin(); it != obj.end();) {
    const std::string& key = it.key();
    if ((is_root || embedded) && (key == "apiVersion" || key == "kind" || key == "metadata")) {
      ++it;  // always allowed; metadata is ObjectMeta's business, not the schema's
      continue;
    }
    if (const json* prop = view.Property(key)) {
      PruneNode(*prop, *it, false);
      ++it;
    } else if (additional && additional->is_object()) {
      PruneNode(*additional, *it, false);
      ++it;
    } else if (preserve || (additional && additional->is_boolean() && additional->get<bool>())) {
      ++it;
    } else {
      it = obj.erase(it);
    }
  }
}

void PruneNode(const json& node, json& value, bool is_root) {
  if (!node.is_object()) return;
  if (value.is_object()) {
    PruneObject(node, value, is_root);
  } else if (value.is_array()) {
    if (const json* items = SchemaAt(node, "items")) {
      for (auto& item : value) PruneNode(*items, item, false);
    }
  } else if (IsWholeFloat(value) &&
             (TypeOf(node) == "integer" || Flag(node, "x-kubernetes-int-or-string"))) {
    // Go decodes 2.0 as float64 and writes it back as 2; keep the stored form an integer too.
    value = static_cast<int64_t>(value.get<double>());
  }
}

// ---- default ---------------------------------------------------------------------------------

void DefaultNode(const json& node, json& value, bool is_root) {
  if (!node.is_object()) return;
  const NodeView view(node);
  if (value.is_object()) {
    if (const json* props = view.Schema(K::k_properties)) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        if (is_root && it.key() == "metadata") continue;
        const json* def = Get(*it, "default");
        if (!def) continue;
        auto found = value.find(it.key());
        if (found == value.end() || (found->is_null() && !Flag(*it, "nullable"))) {
          value[it.key()] = *def;
        }
      }
    }
    const json* additional = view.Schema(K::k_additionalProperties);
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (is_root && it.key() == "metadata") continue;
      if (const json* prop = view.Property(it.key())) {
        DefaultNode(*prop, *it, false);
      } else if (additional) {
        DefaultNode(*additional, *it, false);
      }
    }
  } else if (value.is_array()) {
    if (const json* items = view.Schema(K::k_items)) {
      for (auto& item : value) DefaultNode(*items, item, false);
    }
  }
}

// kube-apiserver drops `field: null` for non-nullable fields without a default instead of
// failing validation on it (PruneNonNullableNullsWithoutDefaults).
void DropNonNullableNulls(const json& node, json& value, bool is_root) {
  if (!node.is_object()) return;
  const NodeView view(node);
  if (value.is_object()) {
    const json* additional = view.Schema(K::k_additionalProperties);
    for (auto it = value.begin(); it != value.end();) {
      if (is_root && it.key() == "metadata") {
        ++it;
        continue;
      }
      const json* prop = view.Property(it.key());
      if (prop && it->is_null() && !Flag(*prop, "nullable") && !Get(*prop, "default")) {
        it = value.erase(it);
        continue;
      }
      if (prop) {
        DropNonNullableNulls(*prop, *it, false);
      } else if (additional) {
        DropNonNullableNulls(*additional, *it, false);
      }
      ++it;
    }
  } else if (value.is_array()) {
    if (const json* items = view.Schema(K::k_items)) {
      for (auto& item : value) DropNonNullableNulls(*items, item, false);
    }
  }
}

// ---- validate --------------------------------------------------------------------------------

// `name` is kube-openapi's name for the value ("spec.replicas"), which is also the field path.
void ValidateNode(const json& node, const json& value, const std::string& name, bool is_root,
                  std::vector<FieldCause>& out);

bool TypeMatches(const std::string& type, const json& v) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "integer") return IsIntegerValue(v);
  if (type == "number") return v.is_number();
  return true;  // unknown types are refused by CheckSchema
}

std::string InBody(const std::string& name) { return name + " in body"; }

void ValidateJunctors(const NodeView& view, const json& value, const std::string& name,
                      std::vector<FieldCause>& out) {
  auto run = [&](const json& sub) {
    std::vector<FieldCause> errs;
    ValidateNode(sub, value, name, false, errs);
    return errs;
  };
  auto quoted = [&] { return gofmt::Quote(name); };  // only when there is an error
  if (const json* any = view.Get(K::k_anyOf); any && any->is_array() && !any->empty()) {
    std::vector<FieldCause> best;
    bool ok = false;
    for (const auto& sub : *any) {
      auto errs = run(sub);
      if (errs.empty()) {
        ok = true;
        break;
      }
      if (best.empty() || errs.size() < best.size()) best = std::move(errs);
    }
    if (!ok) {
      out.push_back(Invalid(name, "\"\"", quoted() + " must validate at least one schema (anyOf)"));
      out.insert(out.end(), best.begin(), best.end());
    }
  }
  if (const json* one = view.Get(K::k_oneOf); one && one->is_array() && !one->empty()) {
    std::vector<FieldCause> best;
    int valid = 0;
    for (const auto& sub : *one) {
      auto errs = run(sub);
      if (errs.empty()) {
        ++valid;
      } else if (valid == 0 && (best.empty() || errs.size() < best.size())) {
        best = std::move(errs);
      }
    }
    if (valid != 1) {
      std::string extra =
          valid == 0 ? "Found none valid" : "Found " + std::to_string(valid) + " valid alternatives";
      out.push_back(
          Invalid(name, "\"\"", quoted() + " must validate one and only one schema (oneOf). " + extra));
      if (valid == 0) out.insert(out.end(), best.begin(), best.end());
    }
  }
  if (const json* all = view.Get(K::k_allOf); all && all->is_array() && !all->empty()) {
    size_t valid = 0;
    std::vector<FieldCause> errs_all;
    for (const auto& sub : *all) {
      auto errs = run(sub);
      if (errs.empty()) ++valid;
      errs_all.insert(errs_all.end(), errs.begin(), errs.end());
    }
    out.insert(out.end(), errs_all.begin(), errs_all.end());
    if (valid != all->size()) {
      out.push_back(Invalid(name, "\"\"",
                            quoted() + " must validate all the schemas (allOf)" +
                                (valid == 0 ? ". None validated" : "")));
    }
  }
  if (const json* nt = view.Schema(K::k_not)) {
    if (run(*nt).empty()) out.push_back(Invalid(name, "\"\"", quoted() + " must not validate the schema (not)"));
  }
}

void ValidateString(const NodeView& view, const std::string& s, const json& value,
                    const std::string& name, std::vector<FieldCause>& out) {
  const size_t len = RuneCount(s);
  if (const json* max = view.Get(K::k_maxLength); max && max->is_number() &&
                                                 static_cast<double>(len) > AsDouble(*max)) {
    out.push_back(TooLong(name, Count(*max)));
  }
  if (const json* min = view.Get(K::k_minLength); min && min->is_number() &&
                                                 static_cast<double>(len) < AsDouble(*min)) {
    out.push_back(Invalid(name, gofmt::BadValue(value),
                          InBody(name) + " should be at least " +
                              std::to_string(Count(*min)) + " chars long"));
  }
  if (const json* pat = view.Get(K::k_pattern); pat && pat->is_string()) {
    auto compiled = Patterns().Get(pat->get<std::string>());
    if (compiled->re) {
      bool matched = false;
      try {
        matched = std::regex_search(s, *compiled->re);
      } catch (const std::regex_error&) {
        matched = false;  // complexity limits: treat as a mismatch rather than crash
      }
      if (!matched) {
        out.push_back(Invalid(name, gofmt::BadValue(value),
                              InBody(name) + " should match '" + pat->get<std::string>() + "'"));
      }
    }
  }
  if (const json* fmt = view.Get(K::k_format); fmt && fmt->is_string()) {
    const std::string f = fmt->get<std::string>();
    if (!FormatOk(f, s)) {
      out.push_back(TypeInvalid(name, gofmt::BadValue(value),
                                InBody(name) + " must be of type " + f + ": " + gofmt::Quote(s)));
    }
  }
}

void ValidateNumber(const NodeView& view, const json& value, const std::string& name,
                    std::vector<FieldCause>& out) {
  const double v = AsDouble(value);
  const std::string rendered = gofmt::BadValue(value);
  if (const json* mult = view.Get(K::k_multipleOf); mult && mult->is_number() && AsDouble(*mult) > 0) {
    double q = v / AsDouble(*mult);
    if (std::fabs(q - std::round(q)) > 1e-9 * std::max(1.0, std::fabs(q))) {
      out.push_back(Invalid(name, rendered, InBody(name) + " should be a multiple of " + Bound(*mult)));
    }
  }
  if (const json* max = view.Get(K::k_maximum); max && max->is_number()) {
    bool excl = view.Flag(K::k_exclusiveMaximum);
    double m = AsDouble(*max);
    bool bad = excl ? v >= m : v > m;
    // Compare exactly when both are integers (doubles lose int64 precision).
    if (IsInt64(value) && IsInt64(*max)) {
      int64_t iv = value.get<int64_t>(), im = Count(*max);
      bad = excl ? iv >= im : iv > im;
    }
    if (bad) {
      out.push_back(Invalid(name, rendered,
                            InBody(name) + (excl ? " should be less than " : " should be less than or equal to ") +
                                Bound(*max)));
    }
  }
  if (const json* min = view.Get(K::k_minimum); min && min->is_number()) {
    bool excl = view.Flag(K::k_exclusiveMinimum);
    double m = AsDouble(*min);
    bool bad = excl ? v <= m : v < m;
    if (IsInt64(value) && IsInt64(*min)) {
      int64_t iv = value.get<int64_t>(), im = Count(*min);
      bad = excl ? iv <= im : iv < im;
    }
    if (bad) {
      out.push_back(Invalid(name, rendered,
                            InBody(name) +
                                (excl ? " should be greater than " : " should be greater than or equal to ") +
                                Bound(*min)));
    }
  }
}

// x-kubernetes-list-type set / map: items must be unique (by value, or by the map keys).
void ValidateListType(const NodeView& view, const json& arr, const std::string& name,
                      std::vector<FieldCause>& out) {
  const json* lt = view.Get(K::k_x_list_type);
  if (!lt || !lt->is_string()) return;
  const std::string type = lt->get<std::string>();
  if (type == "set") {
    std::vector<const json*> seen;
    for (size_t i = 0; i < arr.size(); ++i) {
      bool dup = false;
      for (const json* s : seen) {
        if (*s == arr[i]) {
          dup = true;
          break;
        }
      }
      if (dup) {
        out.push_back(Duplicate(Index(name, i), arr[i]));
      } else {
        seen.push_back(&arr[i]);
      }
    }
  } else if (type == "map") {
    const json* keys = view.Get(K::k_x_list_map_keys);
    if (!keys || !keys->is_array() || keys->empty()) return;
    const json* items = view.Schema(K::k_items);
    std::set<std::string> seen;
    for (size_t i = 0; i < arr.size(); ++i) {
      if (!arr[i].is_object()) continue;
      json key = json::object();
      for (const auto& k : *keys) {
        if (!k.is_string()) continue;
        const std::string kn = k.get<std::string>();
        auto found = arr[i].find(kn);
        if (found != arr[i].end()) {
          key[kn] = *found;
        } else if (items) {
          // A missing key with a schema default counts as that default.
          if (const json* prop = PropertySchema(*items, kn)) {
            if (const json* def = Get(*prop, "default")) key[kn] = *def;
          }
        }
      }
      if (!seen.insert(key.dump()).second) out.push_back(Duplicate(Index(name, i), key));
    }
  }
}

void ValidateEnum(const NodeView& view, const json& value, const std::string& name,
                  std::vector<FieldCause>& out) {
  const json* en = view.Get(K::k_enum);
  if (!en || !en->is_array()) return;
  for (const auto& allowed : *en) {
    if (allowed == value) return;
  }
  out.push_back(NotSupported(name, value, *en));
}

void ValidateObject(const NodeView& view, const json& obj, const std::string& name, bool is_root,
                    std::vector<FieldCause>& out) {
  const size_t n = obj.size();
  if (const json* max = view.Get(K::k_maxProperties); max && max->is_number() &&
                                                     static_cast<double>(n) > AsDouble(*max)) {
    out.push_back(TooMany(name, static_cast<int64_t>(n), Count(*max)));
  }
  if (const json* min = view.Get(K::k_minProperties); min && min->is_number() &&
                                                     static_cast<double>(n) < AsDouble(*min)) {
    out.push_back(Invalid(name, std::to_string(Count(*min)),
                          InBody(name) + " should have at least " +
                              std::to_string(Count(*min)) + " properties"));
  }
  const json* additional = view.Get(K::k_additionalProperties);
  if (additional && additional->is_boolean() && !additional->get<bool>() && !view.Get(K::k_properties)) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (is_root && (it.key() == "apiVersion" || it.key() == "kind" || it.key() == "metadata")) continue;
      out.push_back(Forbidden(Child(name, it.key()),
                              name + "." + it.key() + " in body is a forbidden property"));
    }
  }
  if (const json* req = view.Get(K::k_required); req && req->is_array()) {
    for (const auto& r : *req) {
      if (r.is_string() && !obj.contains(r.get<std::string>())) {
        out.push_back(Required(Child(name, r.get<std::string>())));
      }
    }
  }
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& key = it.key();
    if (const json* prop = view.Property(key)) {
      if (is_root && key == "metadata") {
        // Only metadata.name and metadata.generateName may be restricted by a CRD schema.
        for (const char* f : {"name", "generateName"}) {
          const json* fs = PropertySchema(*prop, f);
          if (fs && it->is_object() && it->contains(f)) {
            ValidateNode(*fs, (*it)[f], Child(Child(name, "metadata"), f), false, out);
          }
        }
        continue;
      }
      ValidateNode(*prop, *it, Child(name, key), false, out);
    } else if (additional && additional->is_object()) {
      ValidateNode(*additional, *it, Child(name, key), false, out);
    }
  }
  if (view.Flag(K::k_x_embedded_resource)) {
    auto nonempty = [&](const char* k) {
      auto f = obj.find(k);
      return f != obj.end() && f->is_string() && !f->get<std::string>().empty();
    };
    if (!nonempty("apiVersion")) out.push_back(Required(Child(name, "apiVersion"), "must not be empty"));
    if (!nonempty("kind")) out.push_back(Required(Child(name, "kind"), "must not be empty"));
  }
}

void ValidateNode(const json& node, const json& value, const std::string& name, bool is_root,
                  std::vector<FieldCause>& out) {
  if (!node.is_object()) return;
  const NodeView view(node);
  const std::string type = view.Type();
  const bool int_or_string = view.Flag(K::k_x_int_or_string);
  if (value.is_null()) {
    if (view.Flag(K::k_nullable)) return;
    if (!type.empty() || int_or_string) {
      const std::string want = int_or_string ? "integer,string" : type;
      out.push_back(TypeInvalid(name, "\"null\"", InBody(name) + " must be of type " + want + ": \"null\""));
    }
    return;
  }
  // Type first; a value of the wrong type gets no further checks, as in kube-openapi.
  if (int_or_string) {
    if (!(IsIntegerValue(value) || value.is_string())) {
      const std::string got = DataType(value);
      out.push_back(TypeInvalid(name, gofmt::Quote(got),
                                InBody(name) + " must be of type integer,string: " + gofmt::Quote(got)));
      return;
    }
  } else if (!type.empty() && !TypeMatches(type, value)) {
    const std::string got = DataType(value);
    out.push_back(TypeInvalid(name, gofmt::Quote(got),
                              InBody(name) + " must be of type " + type + ": " + gofmt::Quote(got)));
    return;
  }
  ValidateJunctors(view, value, name, out);
  if (value.is_string()) {
    ValidateString(view, value.get_ref<const std::string&>(), value, name, out);
  } else if (value.is_number()) {
    ValidateNumber(view, value, name, out);
  } else if (value.is_array()) {
    if (const json* items = view.Schema(K::k_items)) {
      for (size_t i = 0; i < value.size(); ++i) ValidateNode(*items, value[i], Index(name, i), false, out);
    }
    if (const json* min = view.Get(K::k_minItems); min && min->is_number() &&
                                                  static_cast<double>(value.size()) < AsDouble(*min)) {
      out.push_back(Invalid(name, std::to_string(value.size()),
                            InBody(name) + " should have at least " +
                                std::to_string(Count(*min)) + " items"));
    }
    if (const json* max = view.Get(K::k_maxItems); max && max->is_number() &&
                                                  static_cast<double>(value.size()) > AsDouble(*max)) {
      out.push_back(TooMany(name, static_cast<int64_t>(value.size()), Count(*max)));
    }
    ValidateListType(view, value, name, out);
  }
  ValidateEnum(view, value, name, out);
  if (value.is_object()) ValidateObject(view, value, name, is_root, out);
}

// ---- CheckSchema -----------------------------------------------------------------------------

const std::set<std::string>& KnownKeywords() {
  static const std::set<std::string> k = {
      "type", "format", "title", "description", "default", "example", "externalDocs",
      "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength",
      "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf", "enum", "maxProperties",
      "minProperties", "required", "items", "allOf", "oneOf", "anyOf", "not", "properties",
      "additionalProperties", "nullable", "x-kubernetes-preserve-unknown-fields",
      "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
      "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type",
      "x-kubernetes-validations"};
  return k;
}
// In apiextensions' JSONSchemaProps but refused for v1 structural schemas.
const std::set<std::string>& UnsupportedKeywords() {
  static const std::set<std::string> k = {"$ref", "$schema", "id", "definitions", "dependencies",
                                          "patternProperties", "additionalItems"};
  return k;
}

struct SchemaChecker {
  std::vector<FieldCause>& out;

  void NonNegativeInt(const json& node, const char* key, const std::string& path) {
    const json* v = Get(node, key);
    if (v && !(IsInt64(*v) && v->get<int64_t>() >= 0)) {
      out.push_back(Invalid(Child(path, key), gofmt::BadValue(*v), "must be a non-negative integer"));
    }
  }
  void Bool(const json& node, const char* key, const std::string& path) {
    const json* v = Get(node, key);
    if (v && !v->is_boolean()) out.push_back(Invalid(Child(path, key), gofmt::BadValue(*v), "must be a boolean"));
  }
  void Number(const json& node, const char* key, const std::string& path) {
    const json* v = Get(node, key);
    if (v && !v->is_number()) out.push_back(Invalid(Child(path, key), gofmt::BadValue(*v), "must be a number"));
  }
  void String(const json& node, const char* key, const std::string& path) {
    const json* v = Get(node, key);
    if (v && !v->is_string()) out.push_back(Invalid(Child(path, key), gofmt::BadValue(*v), "must be a string"));
  }

  // kind: "root", "property", "items", "additional", "junctor"; value_name is the data path the
  // node describes, used in the messages of a default that does not validate.
  void Check(const json& node, const std::string& path, const std::string& kind,
             const std::string& value_name, bool in_junctor) {
    if (!node.is_object()) {
      out.push_back(Invalid(path, gofmt::BadValue(node), "must be a schema object"));
      return;
    }
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (UnsupportedKeywords().count(it.key())) {
        out.push_back(Forbidden(Child(path, it.key()), it.key() + " is not supported"));
      } else if (!KnownKeywords().count(it.key())) {
        out.push_back(Forbidden(Child(path, it.key()), "unknown schema keyword " + gofmt::Quote(it.key())));
      }
    }
    const bool int_or_string = Flag(node, "x-kubernetes-int-or-string");
    const bool preserve = Flag(node, "x-kubernetes-preserve-unknown-fields");
    for (const char* b : {"nullable", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
                          "x-kubernetes-int-or-string", "exclusiveMinimum", "exclusiveMaximum", "uniqueItems"}) {
      Bool(node, b, path);
    }
    for (const char* s : {"format", "title", "description", "pattern", "x-kubernetes-list-type",
                          "x-kubernetes-map-type"}) {
      String(node, s, path);
    }
    for (const char* n : {"maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties"}) {
      NonNegativeInt(node, n, path);
    }
    for (const char* n : {"minimum", "maximum", "multipleOf"}) Number(node, n, path);
    if (const json* m = Get(node, "multipleOf"); m && m->is_number() && m->get<double>() <= 0) {
      out.push_back(Invalid(Child(path, "multipleOf"), gofmt::BadValue(*m), "must be greater than zero"));
    }
    if (const json* p = Get(node, "x-kubernetes-preserve-unknown-fields"); p && p->is_boolean() && !p->get<bool>()) {
      out.push_back(Invalid(Child(path, "x-kubernetes-preserve-unknown-fields"), "false",
                            "must be true or undefined"));
    }
    if (Flag(node, "uniqueItems")) {
      out.push_back(Forbidden(Child(path, "uniqueItems"),
                              "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"));
    }

    // type
    const json* type = Get(node, "type");
    std::string t;
    if (type) {
      static const json kTypes = {"array", "boolean", "integer", "number", "object", "string"};
      if (!type->is_string() ||
          std::find(kTypes.begin(), kTypes.end(), *type) == kTypes.end()) {
        out.push_back(NotSupported(Child(path, "type"), *type, kTypes));
      } else {
        t = type->get<std::string>();
      }
    }
    if (in_junctor) {
      for (const char* k : {"type", "default", "description", "nullable", "additionalProperties",
                            "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
                            "x-kubernetes-int-or-string"}) {
        if (Get(node, k) && !(std::string(k) == "type" && InIntOrStringPattern())) {
          out.push_back(Forbidden(Child(path, k), "must be empty to be structural"));
        }
      }
    } else if (!type && !int_or_string && !preserve) {
      const char* why = kind == "root" ? "must not be empty at the root"
                        : kind == "items" ? "must not be empty for specified array items"
                                          : "must not be empty for specified object fields";
      out.push_back(Required(Child(path, "type"), why));
    }
    if (kind == "root" && type && t != "object" && !t.empty()) {
      out.push_back(Invalid(Child(path, "type"), gofmt::Quote(t), "must be object at the root"));
    }
    if (int_or_string && !t.empty()) {
      out.push_back(Invalid(Child(path, "type"), gofmt::Quote(t),
                            "must be empty if x-kubernetes-int-or-string is true"));
    }

    // pattern
    if (const json* p = Get(node, "pattern"); p && p->is_string()) {
      auto compiled = Patterns().Get(p->get<std::string>());
      if (!compiled->re) {
        out.push_back(Invalid(Child(path, "pattern"), gofmt::Quote(p->get<std::string>()),
                              "must be a valid regular expression, but isn't: " + compiled->error));
      }
    }
    if (const json* e = Get(node, "enum"); e && !e->is_array()) {
      out.push_back(Invalid(Child(path, "enum"), gofmt::BadValue(*e), "must be an array"));
    }

    // required
    if (const json* req = Get(node, "required")) {
      if (!req->is_array()) {
        out.push_back(Invalid(Child(path, "required"), gofmt::BadValue(*req), "must be an array of strings"));
      } else {
        std::set<std::string> seen;
        for (size_t i = 0; i < req->size(); ++i) {
          if (!(*req)[i].is_string()) {
            out.push_back(Invalid(Index(Child(path, "required"), i), gofmt::BadValue((*req)[i]), "must be a string"));
          } else if (!seen.insert((*req)[i].get<std::string>()).second) {
            out.push_back(Duplicate(Index(Child(path, "required"), i), (*req)[i]));
          }
        }
      }
    }

    // properties
    const json* props = Get(node, "properties");
    if (props) {
      if (!props->is_object()) {
        out.push_back(Invalid(Child(path, "properties"), gofmt::BadValue(*props), "must be an object of schemas"));
        props = nullptr;
      } else {
        for (auto it = props->begin(); it != props->end(); ++it) {
          const std::string ppath = Key(Child(path, "properties"), it.key());
          if (kind == "root" && it.key() == "metadata" && it->is_object()) {
            CheckRootMetadata(*it, ppath);
          }
          Check(*it, ppath, in_junctor ? "junctor" : "property", Child(value_name, it.key()), in_junctor);
        }
      }
    }
    // additionalProperties
    if (const json* ap = Get(node, "additionalProperties")) {
      if (props) {
        out.push_back(Forbidden(Child(path, "additionalProperties"),
                                "additionalProperties and properties are mutual exclusive"));
      }
      if (ap->is_boolean()) {
        if (!ap->get<bool>()) {
          out.push_back(Forbidden(Child(path, "additionalProperties"), "additionalProperties cannot be set to false"));
        }
      } else {
        Check(*ap, Child(path, "additionalProperties"), in_junctor ? "junctor" : "additional",
              Child(value_name, "*"), in_junctor);
      }
    }
    // items
    if (const json* items = Get(node, "items")) {
      if (items->is_array()) {
        out.push_back(Forbidden(Child(path, "items"), "items must be a schema object and not an array"));
      } else {
        Check(*items, Child(path, "items"), in_junctor ? "junctor" : "items", Index(value_name, 0), in_junctor);
      }
    } else if (t == "array" && !in_junctor) {
      out.push_back(Required(Child(path, "items"), "must be specified"));
    }

    // junctors: value validation only, and everything they name must also be specified outside
    for (const char* j : {"allOf", "anyOf", "oneOf"}) {
      const json* arr = Get(node, j);
      if (!arr) continue;
      if (!arr->is_array()) {
        out.push_back(Invalid(Child(path, j), gofmt::BadValue(*arr), "must be an array of schemas"));
        continue;
      }
      for (size_t i = 0; i < arr->size(); ++i) {
        CheckJunctor(node, (*arr)[i], Index(Child(path, j), i), value_name, int_or_string);
      }
    }
    if (const json* nt = Get(node, "not")) CheckJunctor(node, *nt, Child(path, "not"), value_name, int_or_string);

    CheckExtensions(node, path, t);

    if (const json* v = Get(node, "x-kubernetes-validations")) {
      // Shape only here; CheckValidationRules compiles the rules once the schema is sound.
      if (!v->is_array()) {
        out.push_back(Invalid(Child(path, "x-kubernetes-validations"), gofmt::BadValue(*v), "must be an array"));
      } else {
        for (size_t i = 0; i < v->size(); ++i) {
          const json& rule = (*v)[i];
          const json* r = Get(rule, "rule");
          if (!r || !r->is_string() ||
              r->get<std::string>().find_first_not_of(" \t\n\r\f\v") == std::string::npos) {
            out.push_back(Required(Child(Index(Child(path, "x-kubernetes-validations"), i), "rule"),
                                   "rule is not specified"));
          }
        }
      }
    }

    if (const json* def = Get(node, "default"); def && !in_junctor) CheckDefault(node, *def, path, value_name);
  }

  bool int_or_string_junctor_ = false;
  bool InIntOrStringPattern() const { return int_or_string_junctor_; }

  void CheckJunctor(const json& outer, const json& sub, const std::string& path,
                    const std::string& value_name, bool outer_int_or_string) {
    bool saved = int_or_string_junctor_;
    int_or_string_junctor_ = outer_int_or_string;  // anyOf: [{type: integer}, {type: string}] is fine
    Check(sub, path, "junctor", value_name, true);
    int_or_string_junctor_ = saved;
    if (!sub.is_object()) return;
    if (const json* props = SchemaAt(sub, "properties")) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        if (!PropertySchema(outer, it.key()) && !Flag(outer, "x-kubernetes-preserve-unknown-fields")) {
          out.push_back(Required(Key(Child(path.substr(0, path.rfind('.')), "properties"), it.key()),
                                 "because it is defined in " + path.substr(path.rfind('.') + 1) +
                                     ".properties[" + it.key() + "]"));
        }
      }
    }
    if (Get(sub, "items") && !Get(outer, "items")) {
      out.push_back(Required(Child(path.substr(0, path.rfind('.')), "items"),
                             "because it is defined in " + path.substr(path.rfind('.') + 1) + ".items"));
    }
  }

  void CheckRootMetadata(const json& meta, const std::string& path) {
    for (auto it = meta.begin(); it != meta.end(); ++it) {
      if (it.key() == "type" || it.key() == "description") continue;
      if (it.key() == "properties" && it->is_object()) {
        for (auto p = it->begin(); p != it->end(); ++p) {
          if (p.key() != "name" && p.key() != "generateName") {
            out.push_back(Forbidden(Key(Child(path, "properties"), p.key()),
                                    "must not specify anything other than name and generateName, but "
                                    "metadata is implicitly specified"));
          } else if (TypeOf(*p) != "string") {
            out.push_back(Invalid(Child(Key(Child(path, "properties"), p.key()), "type"),
                                  gofmt::Quote(TypeOf(*p)), "must be string"));
          }
        }
        continue;
      }
      out.push_back(Forbidden(Child(path, it.key()),
                              "must not specify anything other than name and generateName, but metadata "
                              "is implicitly specified"));
    }
  }

  void CheckExtensions(const json& node, const std::string& path, const std::string& t) {
    if (Flag(node, "x-kubernetes-embedded-resource")) {
      if (t != "object") {
        out.push_back(Invalid(Child(path, "type"), gofmt::Quote(t),
                              "must be object if x-kubernetes-embedded-resource is true"));
      }
      if (!Get(node, "properties") && !Flag(node, "x-kubernetes-preserve-unknown-fields")) {
        out.push_back(Required(Child(path, "properties"),
                               "must not be empty if x-kubernetes-embedded-resource is true without "
                               "x-kubernetes-preserve-unknown-fields"));
      }
    }
    if (const json* mt = Get(node, "x-kubernetes-map-type"); mt && mt->is_string()) {
      static const json kMapTypes = {"atomic", "granular"};
      if (std::find(kMapTypes.begin(), kMapTypes.end(), *mt) == kMapTypes.end()) {
        out.push_back(NotSupported(Child(path, "x-kubernetes-map-type"), *mt, kMapTypes));
      } else if (!t.empty() && t != "object") {
        out.push_back(Invalid(Child(path, "type"), gofmt::Quote(t),
                              "must be object if x-kubernetes-map-type is specified"));
      }
    }
    const json* lt = Get(node, "x-kubernetes-list-type");
    const json* keys = Get(node, "x-kubernetes-list-map-keys");
    std::string list_type = lt && lt->is_string() ? lt->get<std::string>() : "";
    if (lt && lt->is_string()) {
      static const json kListTypes = {"atomic", "map", "set"};
      if (std::find(kListTypes.begin(), kListTypes.end(), *lt) == kListTypes.end()) {
        out.push_back(NotSupported(Child(path, "x-kubernetes-list-type"), *lt, kListTypes));
        return;
      }
      if (t != "array") {
        out.push_back(Invalid(Child(path, "type"), gofmt::Quote(t),
                              "must be array if x-kubernetes-list-type is specified"));
        return;
      }
    }
    if (keys && list_type != "map") {
      out.push_back(Forbidden(Child(path, "x-kubernetes-list-map-keys"),
                              "must not be specified if x-kubernetes-list-type is not map"));
    }
    const json* items = SchemaAt(node, "items");
    if (list_type == "set" && items) {
      const std::string it = TypeOf(*items);
      const json* mt = Get(*items, "x-kubernetes-map-type");
      bool atomic_object = it == "object" && mt && *mt == "atomic";
      if (it == "array" || (it == "object" && !atomic_object)) {
        out.push_back(Invalid(Child(Child(path, "items"), "type"), gofmt::Quote(it),
                              "must be a scalar type if x-kubernetes-list-type is set"));
      }
    }
    if (list_type == "map") {
      if (!keys || !keys->is_array() || keys->empty()) {
        out.push_back(Required(Child(path, "x-kubernetes-list-map-keys"),
                               "must not be empty if x-kubernetes-list-type is map"));
        return;
      }
      if (!items || TypeOf(*items) != "object") {
        out.push_back(Invalid(Child(Child(path, "items"), "type"), gofmt::Quote(items ? TypeOf(*items) : ""),
                              "must be object if parent array's x-kubernetes-list-type is map"));
        return;
      }
      std::set<std::string> required;
      if (const json* req = Get(*items, "required"); req && req->is_array()) {
        for (const auto& r : *req) {
          if (r.is_string()) required.insert(r.get<std::string>());
        }
      }
      for (size_t i = 0; i < keys->size(); ++i) {
        const std::string kpath = Index(Child(path, "x-kubernetes-list-map-keys"), i);
        if (!(*keys)[i].is_string()) {
          out.push_back(Invalid(kpath, gofmt::BadValue((*keys)[i]), "must be a string"));
          continue;
        }
        const std::string k = (*keys)[i].get<std::string>();
        const json* prop = PropertySchema(*items, k);
        if (!prop) {
          out.push_back(Invalid(kpath, gofmt::Quote(k), "entries must all be names of item properties"));
          continue;
        }
        const std::string pt = TypeOf(*prop);
        if (pt == "object" || pt == "array") {
          out.push_back(Invalid(kpath, gofmt::Quote(k), "must be a scalar type property"));
        }
        if (!required.count(k) && !Get(*prop, "default")) {
          out.push_back(Invalid(kpath, gofmt::Quote(k),
                                "all map keys must be required or have a default value"));
        }
      }
    }
  }

  void CheckDefault(const json& node, const json& def, const std::string& path,
                    const std::string& value_name) {
    const std::string dpath = Child(path, "default");
    if (def.is_null()) {
      if (!Flag(node, "nullable")) out.push_back(Invalid(dpath, "\"null\"", "must not be null for non-nullable"));
      return;
    }
    json pruned = def;
    PruneNode(node, pruned, false);
    if (pruned != def && !(IsWholeFloat(def) && pruned.is_number())) {
      out.push_back(Invalid(dpath, gofmt::BadValue(def), "must not have unknown fields"));
      return;
    }
    DefaultNode(node, pruned, false);
    std::vector<FieldCause> errs;
    ValidateNode(node, pruned, value_name, false, errs);
    for (auto& e : errs) out.push_back({e.reason, dpath, e.message});
  }
};

}  // namespace

std::vector<FieldCause> CheckSchema(const json& schema, const std::string& field_prefix) {
  std::vector<FieldCause> out;
  SchemaChecker checker{out};
  checker.Check(schema, field_prefix, "root", "", false);
  // As kube-apiserver: rules are compiled only against an otherwise valid schema, whose errors
  // would only make the compiler's messages confusing.
  if (out.empty()) out = CheckValidationRules(schema, field_prefix);
  return out;
}

void Prune(const json& schema, json& object) { PruneNode(schema, object, true); }

void ApplyDefaults(const json& schema, json& object) {
  DefaultNode(schema, object, true);
  DropNonNullableNulls(schema, object, true);
}

std::vector<FieldCause> Validate(const json& schema, const json& object, const json* old_object) {
  std::vector<FieldCause> out;
  ValidateNode(schema, object, "", true, out);
  if (!HasValidationRules(schema)) return out;
  // kube-apiserver's hasBlockingErr: the rules were written for objects of the schema's shape.
  for (const auto& c : out) {
    if (c.reason == "FieldValueNotSupported" || c.reason == "FieldValueRequired" || c.reason == "FieldValueTooLong" ||
        c.reason == "FieldValueTooMany" || c.reason == "FieldValueTypeInvalid") {
      out.push_back({"FieldValueInvalid", "<nil>",
                     "Invalid value: \"null\": some validation rules were not checked because the object was "
                     "invalid; correct the existing errors to complete validation"});
      return out;
    }
  }
  auto rules = EvaluateValidationRules(schema, object, old_object);
  out.insert(out.end(), rules.begin(), rules.end());
  return out;
}

std::vector<FieldCause> DefaultPruneAndValidate(const json& schema, json& object, const json* old_object) {
  if (!object.is_object()) {
    return {TypeInvalid("", gofmt::Quote(DataType(object)),
                        "must be of type object: " + gofmt::Quote(DataType(object)))};
  }
  Prune(schema, object);
  ApplyDefaults(schema, object);
  return Validate(schema, object, old_object);
}

std::string InvalidMessage(const std::string& kind_dot_group, const std::string& name,
                           const std::vector<FieldCause>& causes) {
  std::string head = kind_dot_group + " " + gofmt::Quote(name) + " is invalid";
  if (causes.empty()) return head;
  // utilerrors.NewAggregate: duplicates are printed once; brackets only for more than one.
  std::vector<std::string> msgs;
  std::set<std::string> seen;
  for (const auto& c : causes) {
    std::string m = c.field.empty() ? c.message : c.field + ": " + c.message;
    if (seen.insert(m).second) msgs.push_back(m);
  }
  if (msgs.size() == 1) return head + ": " + msgs[0];
  std::string joined;
  for (size_t i = 0; i < msgs.size(); ++i) joined += (i ? ", " : "") + msgs[i];
  return head + ": [" + joined + "]";
}

json CausesToJson(const std::vector<FieldCause>& causes) {
  json arr = json::array();
  for (const auto& c : causes) arr.push_back({{"reason", c.reason}, {"message", c.message}, {"field", c.field}});
  return arr;
}

}  // namespace meshwork::controlplane::schema
