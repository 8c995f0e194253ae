// x-kubernetes-validations: the CRD-write checks (k8s.io/apiextensions-apiserver's
// validation.go) and the per-object evaluation walk (its schema/cel/validation.go), worded as
// kube-apiserver words them.
#include "controlplane/schema/validation_rules.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "controlplane/schema/go_format.h"

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;

std::string Child(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}
std::string Index(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }
std::string Key(const std::string& path, const std::string& key) { return path + "[" + key + "]"; }
// field.Path.String() of the nil root path.
std::string FieldOrNil(const std::string& path) { return path.empty() ? "<nil>" : path; }

const json* Get(const json& node, const char* key) {
  if (!node.is_object()) return nullptr;
  auto it = node.find(key);
  return it == node.end() ? nullptr : &*it;
}
std::string Str(const json& node, const char* key) {
  const json* v = Get(node, key);
  return v && v->is_string() ? v->get<std::string>() : "";
}
std::string TrimSpace(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n\r\f\v");
  return s.substr(b, e - b + 1);
}

// Sorted, as kube-apiserver lists them in its Unsupported value message.
const char* const kReasons[] = {"FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid",
                                "FieldValueRequired"};

// %#v of an apiextensions.ValidationRule, as kube-apiserver puts it in a CRD's compile errors.
// Go prints a set *Reason / *OptionalOldSelf as a pointer address; ours is a fixed placeholder.
std::string GoValidationRule(const json& rule) {
  auto ptr = [&](const char* key, const char* type) {
    return std::string("(") + type + ")(" + (Get(rule, key) ? "0xc000000000" : "nil") + ")";
  };
  return "apiextensions.ValidationRule{Rule:" + gofmt::Quote(Str(rule, "rule")) +
         ", Message:" + gofmt::Quote(Str(rule, "message")) +
         ", MessageExpression:" + gofmt::Quote(Str(rule, "messageExpression")) +
         ", Reason:" + ptr("reason", "*apiextensions.FieldValueErrorReason") +
         ", FieldPath:" + gofmt::Quote(Str(rule, "fieldPath")) +
         ", OptionalOldSelf:" + ptr("optionalOldSelf", "*bool") + "}";
}

// cel.ValidFieldPath: ".a.b", ".m['key']" against the schema; returns the normalised path
// ("a.b", "m[key]") or sets `error`.
std::string NormalizeFieldPath(const std::string& fp, const json& node, std::string* error) {
  const json* s = &node;
  std::string out;
  size_t i = 0;
  auto append = [&](const std::string& name) -> bool {
    const json* props = Get(*s, "properties");
    const json* ap = Get(*s, "additionalProperties");
    if (props && props->is_object()) {
      auto it = props->find(name);
      if (it == props->end()) {
        *error = "does not refer to a valid field";
        return false;
      }
      out = Child(out, name);
      s = &*it;
    } else if (ap && ap->is_object()) {
      out = Key(out, name);
      s = ap;
    } else {
      *error = "does not refer to a valid field";
      return false;
    }
    return true;
  };
  while (i < fp.size()) {
    if (fp[i] == '.') {
      size_t start = ++i;
      while (i < fp.size() && fp[i] != '.' && fp[i] != '[' && fp[i] != ']') ++i;
      if (i == start) {
        *error = "unexpected end of JSON path";
        return "";
      }
      if (!append(fp.substr(start, i - start))) return "";
    } else if (fp[i] == '[') {
      ++i;
      if (i >= fp.size() || fp[i] != '\'') {
        size_t end = fp.find(']', i);
        *error = "expected single quoted string but got " + fp.substr(i, end == std::string::npos ? std::string::npos : end - i);
        return "";
      }
      std::string name;
      ++i;
      bool closed = false;
      for (; i < fp.size(); ++i) {
        if (fp[i] == '\\' && i + 1 < fp.size()) {
          name += fp[++i];
        } else if (fp[i] == '\'') {
          closed = true;
          ++i;
          break;
        } else {
          name += fp[i];
        }
      }
      if (!closed || i >= fp.size() || fp[i] != ']') {
        *error = "unexpected end of JSON path";
        return "";
      }
      ++i;
      if (!append(name)) return "";
    } else {
      size_t end = fp.find_first_of(".[", i);
      *error = "expected [ or . but got: " + fp.substr(i, end == std::string::npos ? std::string::npos : end - i);
      return "";
    }
  }
  return out;
}

bool IsListMap(const json& node) {
  const json* lt = Get(node, "x-kubernetes-list-type");
  return lt && *lt == "map";
}

// ---- CRD write --------------------------------------------------------------------------------

struct RuleChecker {
  std::vector<FieldCause>& out;

  // `uncorrelatable`: the schema path of the outermost list (not listType=map) above this node,
  // where oldSelf has no value to correlate with; empty when every parent correlates.
  void Walk(const json& node, const std::string& path, bool is_root, const std::string& uncorrelatable,
            bool in_junctor) {
    if (!node.is_object()) return;
    if (const json* rules = Get(node, "x-kubernetes-validations"); rules && rules->is_array()) {
      if (in_junctor) {
        out.push_back({"FieldValueForbidden", Child(path, "x-kubernetes-validations"),
                       "Forbidden: x-kubernetes-validations inside allOf, anyOf, oneOf or not are not "
                       "supported by the local control plane"});
      } else {
        for (size_t i = 0; i < rules->size(); ++i) {
          CheckRule(node, (*rules)[i], Index(Child(path, "x-kubernetes-validations"), i), is_root, uncorrelatable);
        }
      }
    }
    if (const json* props = Get(node, "properties"); props && props->is_object()) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        Walk(*it, Key(Child(path, "properties"), it.key()), false, uncorrelatable, in_junctor);
      }
    }
    if (const json* ap = Get(node, "additionalProperties"); ap && ap->is_object()) {
      Walk(*ap, Child(path, "additionalProperties"), false, uncorrelatable, in_junctor);
    }
    if (const json* items = Get(node, "items"); items && items->is_object()) {
      std::string items_path = Child(path, "items");
      Walk(*items, items_path, false,
           !uncorrelatable.empty() || IsListMap(node) ? uncorrelatable : items_path, in_junctor);
    }
    for (const char* j : {"allOf", "anyOf", "oneOf"}) {
      if (const json* arr = Get(node, j); arr && arr->is_array()) {
        for (size_t i = 0; i < arr->size(); ++i) Walk((*arr)[i], Index(Child(path, j), i), false, uncorrelatable, true);
      }
    }
    if (const json* nt = Get(node, "not")) Walk(*nt, Child(path, "not"), false, uncorrelatable, true);
  }

  void CheckRule(const json& node, const json& rule, const std::string& at, bool is_root,
                 const std::string& uncorrelatable) {
    if (!rule.is_object()) {
      out.push_back({"FieldValueInvalid", at, "Invalid value: " + gofmt::BadValue(rule) + ": must be an object"});
      return;
    }
    for (auto it = rule.begin(); it != rule.end(); ++it) {
      static const char* const kFields[] = {"rule", "message", "messageExpression", "reason", "fieldPath", "optionalOldSelf"};
      if (std::none_of(std::begin(kFields), std::end(kFields), [&](const char* f) { return it.key() == f; })) {
        out.push_back({"FieldValueForbidden", Child(at, it.key()), "Forbidden: unknown field " + gofmt::Quote(it.key())});
      }
    }
    for (const char* f : {"message", "messageExpression", "reason", "fieldPath"}) {
      if (const json* v = Get(rule, f); v && !v->is_string()) {
        out.push_back({"FieldValueTypeInvalid", Child(at, f), "Invalid value: " + gofmt::BadValue(*v) + ": must be a string"});
      }
    }
    const json* r = Get(rule, "rule");
    if (!r || !r->is_string() || r->get<std::string>().empty()) return;  // CheckSchema: Required value
    const std::string text = r->get<std::string>();

    auto compiled = cel::Compile(text, &node, is_root);
    if (!compiled.program) {
      out.push_back({"FieldValueInvalid", Child(at, "rule"),
                     "Invalid value: " + GoValidationRule(rule) + ": compilation failed: " + compiled.error});
    } else if (cel::NeverBool(*compiled.program)) {
      out.push_back({"FieldValueInvalid", Child(at, "rule"),
                     "Invalid value: " + GoValidationRule(rule) + ": cel expression must evaluate to a bool"});
    } else {
      cel::CompileCached(text);  // compiled once here, at CRD write, not per request
      if (compiled.uses_old_self && !uncorrelatable.empty()) {
        out.push_back({"FieldValueInvalid", Child(at, "rule"),
                       "Invalid value: " + gofmt::Quote(text) +
                           ": oldSelf cannot be used on the uncorrelatable portion of the schema within " +
                           uncorrelatable});
      }
    }
    if (Get(rule, "optionalOldSelf")) {
      // optionalOldSelf makes oldSelf a CEL optional (oldSelf.hasValue(), .orValue()), which this
      // subset does not have: refusing beats evaluating it differently from a real cluster.
      out.push_back({"FieldValueForbidden", Child(at, "optionalOldSelf"),
                     "Forbidden: optionalOldSelf is not supported by the local control plane"});
    }
    if (const json* reason = Get(rule, "reason"); reason && reason->is_string()) {
      if (std::none_of(std::begin(kReasons), std::end(kReasons), [&](const char* k) { return *reason == k; })) {
        std::string msg = "Unsupported value: " + gofmt::Quote(reason->get<std::string>()) + ": supported values: ";
        for (size_t i = 0; i < 4; ++i) msg += (i ? ", " : "") + gofmt::Quote(kReasons[i]);
        out.push_back({"FieldValueNotSupported", Child(at, "reason"), msg});
      }
    }
    if (const json* m = Get(rule, "message"); m && m->is_string()) {
      const std::string msg = m->get<std::string>();
      const std::string trimmed = TrimSpace(msg);
      if (!msg.empty() && trimmed.empty()) {
        out.push_back({"FieldValueInvalid", Child(at, "message"),
                       "Invalid value: " + gofmt::Quote(msg) + ": message must be non-empty if specified"});
      } else if (trimmed.find_first_of("\n\r") != std::string::npos) {
        out.push_back({"FieldValueInvalid", Child(at, "message"),
                       "Invalid value: " + gofmt::Quote(msg) + ": message must not contain line breaks"});
      }
    }
    if (TrimSpace(text).find_first_of("\n\r") != std::string::npos && TrimSpace(Str(rule, "message")).empty()) {
      out.push_back({"FieldValueRequired", Child(at, "message"),
                     "Required value: message must be specified if rule contains line breaks"});
    }
    if (const json* me = Get(rule, "messageExpression"); me && me->is_string() && !me->get<std::string>().empty()) {
      const std::string expr = me->get<std::string>();
      if (TrimSpace(expr).empty()) {
        out.push_back({"FieldValueRequired", Child(at, "messageExpression"),
                       "Required value: messageExpression must be non-empty if specified"});
      } else if (auto c = cel::Compile(expr, &node, is_root); !c.program) {
        out.push_back({"FieldValueInvalid", Child(at, "messageExpression"),
                       "Invalid value: " + GoValidationRule(rule) + ": messageExpression compilation failed: " + c.error});
      } else {
        cel::CompileCached(expr);
      }
    }
    if (const json* fp = Get(rule, "fieldPath"); fp && fp->is_string() && !fp->get<std::string>().empty()) {
      const std::string path = fp->get<std::string>();
      std::string error;
      if (TrimSpace(path).empty()) {
        out.push_back({"FieldValueInvalid", Child(at, "fieldPath"),
                       "Invalid value: " + gofmt::Quote(path) + ": fieldPath must be non-empty if specified"});
      } else if (path.find_first_of("\n\r") != std::string::npos) {
        out.push_back({"FieldValueInvalid", Child(at, "fieldPath"),
                       "Invalid value: " + gofmt::Quote(path) + ": fieldPath must not contain line breaks"});
      } else if (NormalizeFieldPath(path, node, &error), !error.empty()) {
        // Worded as kube-apiserver words it, without saying which part of the path is wrong.
        out.push_back({"FieldValueInvalid", Child(at, "fieldPath"),
                       "Invalid value: " + gofmt::Quote(path) + ": fieldPath must be a valid path"});
      }
    }
  }
};

bool AnyRules(const json& node) {
  if (!node.is_object()) return false;
  if (const json* v = Get(node, "x-kubernetes-validations"); v && v->is_array() && !v->empty()) return true;
  if (const json* props = Get(node, "properties"); props && props->is_object()) {
    for (const auto& p : *props) {
      if (AnyRules(p)) return true;
    }
  }
  if (const json* ap = Get(node, "additionalProperties"); ap && AnyRules(*ap)) return true;
  if (const json* items = Get(node, "items"); items && AnyRules(*items)) return true;
  return false;
}

// ---- per object -------------------------------------------------------------------------------

class RuleWalker {
 public:
  explicit RuleWalker(const RuleBudget& budget) : budget_(budget) {}

  std::vector<FieldCause> out;

  void Walk(const json& node, const json& value, const json* old, const std::string& path, bool is_root) {
    if (stopped_ || !node.is_object() || value.is_null()) return;  // null values are not validated
    if (const json* rules = Get(node, "x-kubernetes-validations"); rules && rules->is_array()) {
      for (const auto& rule : *rules) {
        if (stopped_) return;
        Evaluate(node, rule, value, old, path);
      }
    }
    if (value.is_object()) {
      const json* props = Get(node, "properties");
      const json* ap = Get(node, "additionalProperties");
      for (auto it = value.begin(); it != value.end() && !stopped_; ++it) {
        const std::string& k = it.key();
        if (is_root && (k == "apiVersion" || k == "kind" || k == "metadata")) continue;
        const json* old_v = nullptr;
        if (old && old->is_object()) {
          auto f = old->find(k);
          if (f != old->end()) old_v = &*f;
        }
        if (props && props->is_object() && props->contains(k)) {
          Walk((*props)[k], *it, old_v, Child(path, k), false);
        } else if (ap && ap->is_object()) {
          Walk(*ap, *it, old_v, Key(path, k), false);
        }
      }
    } else if (value.is_array()) {
      const json* items = Get(node, "items");
      if (!items) return;
      const bool correlate = IsListMap(node) && old && old->is_array();
      for (size_t i = 0; i < value.size() && !stopped_; ++i) {
        Walk(*items, value[i], correlate ? OldListMapItem(node, value[i], *old) : nullptr, Index(path, i), false);
      }
    }
  }

 private:
  // listType=map: the old item with the same key values is this item's old self.
  static const json* OldListMapItem(const json& node, const json& item, const json& old) {
    const json* keys = Get(node, "x-kubernetes-list-map-keys");
    if (!keys || !keys->is_array() || !item.is_object()) return nullptr;
    for (const auto& candidate : old) {
      if (!candidate.is_object()) continue;
      bool same = true;
      for (const auto& k : *keys) {
        if (!k.is_string()) continue;
        const std::string key = k.get<std::string>();
        auto a = item.find(key);
        auto b = candidate.find(key);
        bool has_a = a != item.end(), has_b = b != candidate.end();
        if (has_a != has_b || (has_a && *a != *b)) {
          same = false;
          break;
        }
      }
      if (same) return &candidate;
    }
    return nullptr;
  }

  // Steps left for the next expression, or a cause and a stop when the object's budget is gone.
  bool BudgetFor(cel::Limits* limits, const std::string& path, const std::string& type) {
    int64_t left = budget_.per_object_steps - used_;
    if (left <= 0) {
      out.push_back({"FieldValueInvalid", FieldOrNil(path),
                     "Invalid value: " + gofmt::Quote(type) +
                         ": validation failed due to running out of cost budget, no further validation rules will be run"});
      stopped_ = true;
      return false;
    }
    *limits = budget_.per_rule;
    limits->max_steps = std::min(limits->max_steps, left);
    return true;
  }

  void Evaluate(const json& node, const json& rule, const json& value, const json* old, const std::string& path) {
    const std::string type = Str(node, "type");
    const std::string text = Str(rule, "rule");
    if (text.empty()) return;
    const std::string message = TrimSpace(Str(rule, "message"));
    const std::string rule_error_string = message.empty() ? TrimSpace(text) : message;
    auto invalid = [&](const std::string& at, const std::string& detail) {
      out.push_back({"FieldValueInvalid", FieldOrNil(at), "Invalid value: " + gofmt::Quote(type) + ": " + detail});
    };
    auto compiled = cel::CompileCached(text);
    if (!compiled->program) {
      invalid(path, "rule compile error: " + compiled->error);
      return;
    }
    if (compiled->uses_old_self && old == nullptr) return;  // transition rules need an old value
    cel::Limits limits;
    if (!BudgetFor(&limits, path, type)) return;
    cel::EvalResult r = cel::Evaluate(*compiled->program, value, old, limits);
    used_ += r.steps;
    if (r.cost_exceeded) {
      if (limits.max_steps < budget_.per_rule.max_steps) {
        invalid(path, "validation failed due to running out of cost budget, no further validation rules will be run");
      } else {
        invalid(path, "'" + r.error + "': no further validation rules will be run due to call cost exceeds limit for rule: " +
                          rule_error_string);
      }
      stopped_ = true;
      return;
    }
    if (r.error.empty() && !r.value.is_boolean()) r.error = "no such overload";  // a non-bool result
    if (!r.error.empty()) {
      if (r.error.rfind("no such overload", 0) == 0) {
        invalid(path, "'" + r.error + "': call arguments did not match a supported operator, function or macro signature for rule: " +
                          rule_error_string);
      } else {
        invalid(path, r.error + " evaluating rule: " + rule_error_string);
      }
      return;
    }
    if (r.value.get<bool>()) return;

    std::string at = path;
    if (std::string fp = Str(rule, "fieldPath"); !fp.empty()) {
      std::string error;
      std::string normalized = NormalizeFieldPath(fp, node, &error);
      if (error.empty() && !normalized.empty()) at = Child(path, normalized);
    }
    std::string detail;
    if (std::string me = Str(rule, "messageExpression"); !me.empty()) detail = MessageExpression(me, value, old, at, type);
    if (stopped_) return;
    if (detail.empty()) detail = message.empty() ? "failed rule: " + TrimSpace(text) : message;

    const std::string reason = Str(rule, "reason");
    if (reason == "FieldValueForbidden") {
      out.push_back({reason, FieldOrNil(at), "Forbidden: " + detail});
    } else if (reason == "FieldValueRequired") {
      out.push_back({reason, FieldOrNil(at), "Required value: " + detail});
    } else if (reason == "FieldValueDuplicate") {
      out.push_back({reason, FieldOrNil(at), "Duplicate value: " + gofmt::Quote(type)});
    } else {
      invalid(at, detail);
    }
  }

  // The message from messageExpression, or "" to fall back to message / the default (as
  // kube-apiserver does when it fails, is empty, has a line break or is too long).
  std::string MessageExpression(const std::string& expr, const json& value, const json* old, const std::string& at,
                                const std::string& type) {
    auto compiled = cel::CompileCached(expr);
    if (!compiled->program) return "";
    cel::Limits limits;
    if (!BudgetFor(&limits, at, type)) return "";
    cel::EvalResult r = cel::Evaluate(*compiled->program, value, old, limits);
    used_ += r.steps;
    if (r.cost_exceeded) {
      out.push_back({"FieldValueInvalid", FieldOrNil(at),
                     "Invalid value: " + gofmt::Quote(type) +
                         ": messageExpression evaluation failed due to running out of cost budget, no further "
                         "validation rules will be run"});
      stopped_ = true;
      return "";
    }
    if (!r.error.empty() || !r.value.is_string()) return "";
    std::string msg = TrimSpace(r.value.get<std::string>());
    if (msg.size() > 5 * 1024 || msg.find('\n') != std::string::npos) return "";
    return msg;
  }

  const RuleBudget& budget_;
  int64_t used_ = 0;
  bool stopped_ = false;
};

// What rules at the resource root see: metadata carries only name and generateName.
json RootCelValue(const json& schema, const json& object) {
  json v = cel::ToCelValue(schema, object);
  if (v.is_object() && v.contains("metadata") && v["metadata"].is_object()) {
    json meta = json::object();
    for (const char* f : {"name", "generateName"}) {
      if (v["metadata"].contains(f)) meta[f] = v["metadata"][f];
    }
    v["metadata"] = std::move(meta);
  }
  return v;
}

}  // namespace

bool HasValidationRules(const json& schema) { return AnyRules(schema); }

std::vector<FieldCause> CheckValidationRules(const json& schema, const std::string& field_prefix) {
  std::vector<FieldCause> out;
  RuleChecker checker{out};
  checker.Walk(schema, field_prefix, true, "", false);
  return out;
}

std::vector<FieldCause> EvaluateValidationRules(const json& schema, const json& object, const json* old_object,
                                                const RuleBudget& budget) {
  if (!AnyRules(schema)) return {};
  // Converted once per request; the walk borrows from these trees.
  const json self = RootCelValue(schema, object);
  json old;
  if (old_object) old = RootCelValue(schema, *old_object);
  RuleWalker walker(budget);
  walker.Walk(schema, self, old_object ? &old : nullptr, "", true);
  return std::move(walker.out);
}

}  // namespace meshwork::controlplane::schema
