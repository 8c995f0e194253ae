// Label and field selectors as the Kubernetes API parses them (`labelSelector=app=x,tier in (a,b)`,
// `fieldSelector=metadata.name=x,status.phase!=Running`), used by list, watch and deletecollection.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace meshwork::controlplane {

class LabelSelector {
 public:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };

  // Parses the labelSelector query syntax; an error names the bad part. "" selects everything.
  static Result<LabelSelector> Parse(const std::string& text);
  // Matches the object's metadata.labels.
  bool Matches(const nlohmann::json& object) const;
  bool Empty() const { return requirements_.empty(); }

 private:
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  struct Requirement {
    std::string field;  // dotted path: metadata.name, spec.nodeName, involvedObject.uid
    bool equals;        // = / == versus !=
    std::string value;
  };

  // Parses `a=b,c!=d`; an error names the bad part. "" selects everything.
  static Result<FieldSelector> Parse(const std::string& text);
  // A field missing from the object compares as "".
  bool Matches(const nlohmann::json& object) const;
  bool Empty() const { return requirements_.empty(); }
  // The value an `x=value` requirement pins `field` to ("" when none): metadata.name for
  // single-object gets and watches.
  std::string Pinned(const std::string& field) const;

 private:
  std::vector<Requirement> requirements_;
};

// The query form of a metav1.LabelSelector object ({matchLabels, matchExpressions}), as
// metav1.LabelSelectorAsSelector prints it: "app=x,tier in (a,b)". An error names the field
// (relative to the selector) and the value.
Result<std::string> LabelSelectorText(const nlohmann::json& selector);

// The string form of a field at a dotted path ("" when missing; numbers and booleans printed).
std::string FieldValue(const nlohmann::json& object, const std::string& dotted_path);

}  // namespace meshwork::controlplane
