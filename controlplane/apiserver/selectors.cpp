// Label and field selector parsing and matching.
#include "controlplane/apiserver/selectors.h"

#include <algorithm>
#include <cctype>

namespace meshwork::controlplane {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Splits on commas that are not inside parentheses.
std::vector<std::string> SplitTopLevel(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

bool ValidLabelKey(const std::string& key) {
  if (key.empty() || key.size() > 317) return false;
  for (char c : key) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '/'))
      return false;
  }
  return true;
}

bool ValidLabelValue(const std::string& v) {
  if (v.size() > 63) return false;
  for (char c : v) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  }
  return true;
}

Status BadLabel(const std::string& part, const std::string& why) {
  return InvalidInput("unable to parse requirement: \"" + part + "\": " + why);
}

}  // namespace

Result<LabelSelector> LabelSelector::Parse(const std::string& text) {
  LabelSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string part = Trim(raw);
    if (part.empty()) return BadLabel(raw, "empty requirement");
    Requirement req;
    if (part[0] == '!') {
      req.key = Trim(part.substr(1));
      req.op = Op::kDoesNotExist;
    } else if (auto p = part.find("!="); p != std::string::npos) {
      req.key = Trim(part.substr(0, p));
      req.op = Op::kNotEquals;
      req.values.push_back(Trim(part.substr(p + 2)));
    } else if (auto p2 = part.find("=="); p2 != std::string::npos) {
      req.key = Trim(part.substr(0, p2));
      req.op = Op::kEquals;
      req.values.push_back(Trim(part.substr(p2 + 2)));
    } else if (auto p3 = part.find('='); p3 != std::string::npos) {
      req.key = Trim(part.substr(0, p3));
      req.op = Op::kEquals;
      req.values.push_back(Trim(part.substr(p3 + 1)));
    } else if (auto open = part.find('('); open != std::string::npos) {
      if (part.back() != ')') return BadLabel(part, "missing ')'");
      std::string head = Trim(part.substr(0, open));
      auto space = head.find_last_of(" \t");
      if (space == std::string::npos) return BadLabel(part, "expected 'in' or 'notin'");
      std::string op = head.substr(space + 1);
      req.key = Trim(head.substr(0, space));
      if (op == "in") {
        req.op = Op::kIn;
      } else if (op == "notin") {
        req.op = Op::kNotIn;
      } else {
        return BadLabel(part, "unknown operator '" + op + "', expected 'in' or 'notin'");
      }
      std::string inner = part.substr(open + 1, part.size() - open - 2);
      for (const std::string& v : SplitTopLevel(inner)) req.values.push_back(Trim(v));
      if (req.values.empty()) return BadLabel(part, "for 'in', 'notin' operators, values set can't be empty");
    } else {
      req.key = part;
      req.op = Op::kExists;
    }
    if (!ValidLabelKey(req.key)) return BadLabel(part, "invalid label key \"" + req.key + "\"");
    for (const std::string& v : req.values) {
      if (!ValidLabelValue(v)) return BadLabel(part, "invalid label value \"" + v + "\"");
    }
    sel.requirements_.push_back(std::move(req));
  }
  return sel;
}

bool LabelSelector::Matches(const nlohmann::json& object) const {
  const nlohmann::json* labels = nullptr;
  auto md = object.find("metadata");
  if (md != object.end() && md->is_object()) {
    auto l = md->find("labels");
    if (l != md->end() && l->is_object()) labels = &*l;
  }
  for (const Requirement& r : requirements_) {
    bool has = false;
    std::string value;
    if (labels) {
      auto it = labels->find(r.key);
      if (it != labels->end() && it->is_string()) {
        has = true;
        value = it->get<std::string>();
      }
    }
    bool in = std::find(r.values.begin(), r.values.end(), value) != r.values.end();
    switch (r.op) {
      case Op::kEquals:
      case Op::kIn:
        if (!has || !in) return false;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        if (has && in) return false;
        break;
      case Op::kExists:
        if (!has) return false;
        break;
      case Op::kDoesNotExist:
        if (has) return false;
        break;
    }
  }
  return true;
}

Result<FieldSelector> FieldSelector::Parse(const std::string& text) {
  FieldSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string part = Trim(raw);
    Requirement req;
    size_t op_pos, op_len;
    if ((op_pos = part.find("!=")) != std::string::npos) {
      req.equals = false;
      op_len = 2;
    } else if ((op_pos = part.find("==")) != std::string::npos) {
      req.equals = true;
      op_len = 2;
    } else if ((op_pos = part.find('=')) != std::string::npos) {
      req.equals = true;
      op_len = 1;
    } else {
      return InvalidInput("invalid selector: '" + part + "'; can't understand '" + part + "'");
    }
    req.field = Trim(part.substr(0, op_pos));
    req.value = Trim(part.substr(op_pos + op_len));
    if (req.field.empty()) return InvalidInput("invalid selector: '" + part + "': empty field name");
    sel.requirements_.push_back(std::move(req));
  }
  return sel;
}

std::string FieldValue(const nlohmann::json& object, const std::string& dotted_path) {
  const nlohmann::json* cur = &object;
  size_t start = 0;
  while (start <= dotted_path.size()) {
    size_t dot = dotted_path.find('.', start);
    std::string key = dotted_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object()) return "";
    auto it = cur->find(key);
    if (it == cur->end()) return "";
    cur = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_null()) return "";
  return cur->dump();
}

bool FieldSelector::Matches(const nlohmann::json& object) const {
  for (const Requirement& r : requirements_) {
    bool eq = FieldValue(object, r.field) == r.value;
    if (eq != r.equals) return false;
  }
  return true;
}

std::string FieldSelector::Pinned(const std::string& field) const {
  for (const Requirement& r : requirements_) {
    if (r.equals && r.field == field) return r.value;
  }
  return "";
}

Result<std::string> LabelSelectorText(const nlohmann::json& selector) {
  if (!selector.is_object()) return InvalidInput("must be an object, got " + selector.dump());
  std::vector<std::string> parts;
  if (selector.contains("matchLabels") && !selector["matchLabels"].is_null()) {
    const nlohmann::json& ml = selector["matchLabels"];
    if (!ml.is_object()) return InvalidInput("matchLabels: must be a map, got " + ml.dump());
    for (const auto& [k, v] : ml.items()) {
      if (!v.is_string()) return InvalidInput("matchLabels." + k + ": must be a string, got " + v.dump());
      parts.push_back(k + "=" + v.get<std::string>());
    }
  }
  if (selector.contains("matchExpressions") && !selector["matchExpressions"].is_null()) {
    const nlohmann::json& exprs = selector["matchExpressions"];
    if (!exprs.is_array()) return InvalidInput("matchExpressions: must be a list, got " + exprs.dump());
    for (size_t i = 0; i < exprs.size(); ++i) {
      const nlohmann::json& e = exprs[i];
      std::string at = "matchExpressions[" + std::to_string(i) + "]";
      if (!e.is_object() || !e.contains("key") || !e["key"].is_string()) {
        return InvalidInput(at + ".key: Required value");
      }
      std::string key = e["key"].get<std::string>();
      std::string op = e.contains("operator") && e["operator"].is_string() ? e["operator"].get<std::string>() : "";
      std::vector<std::string> values;
      if (e.contains("values") && e["values"].is_array()) {
        for (const nlohmann::json& v : e["values"]) {
          if (!v.is_string()) return InvalidInput(at + ".values: must be strings, got " + v.dump());
          values.push_back(v.get<std::string>());
        }
      }
      std::string joined;
      std::sort(values.begin(), values.end());
      for (const std::string& v : values) joined += (joined.empty() ? "" : ",") + v;
      if (op == "In" || op == "NotIn") {
        if (values.empty()) return InvalidInput(at + ".values: Required value: must be specified when `operator` is 'In' or 'NotIn'");
        parts.push_back(key + (op == "In" ? " in (" : " notin (") + joined + ")");
      } else if (op == "Exists" || op == "DoesNotExist") {
        if (!values.empty()) return InvalidInput(at + ".values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'");
        parts.push_back((op == "Exists" ? "" : "!") + key);
      } else {
        return InvalidInput(at + ".operator: Invalid value: " + nlohmann::json(op).dump() +
                            ": not a valid selector operator");
      }
    }
  }
  std::string text;
  for (const std::string& p : parts) text += (text.empty() ? "" : ",") + p;
  // Parsing checks the keys and values.
  auto parsed = LabelSelector::Parse(text);
  if (!parsed.ok()) return parsed.status();
  return text;
}

}  // namespace meshwork::controlplane
