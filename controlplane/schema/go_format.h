// Renders JSON values the way Go's fmt renders the decoded values kube-apiserver puts into its
// field errors (%v, %q, %#v), so our messages match the real server's text byte for byte.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace meshwork::controlplane::schema::gofmt {

// strconv.Quote / %q: a double-quoted Go string literal.
std::string Quote(const std::string& s);
// %v of a float64 (strconv 'g' shortest: 1, 0.5, 1e+06, 1.5e-07).
std::string Float(double d);
// %v of a number as decoded by Kubernetes (int64 when it fits, else float64).
std::string Number(const nlohmann::json& v);
// %#v of a decoded JSON value: map[string]interface {}{"a":1}, []interface {}{"x"}, "s", 1, true.
std::string SharpV(const nlohmann::json& v);
// How field.Error.ErrorBody prints a bad value: numbers and booleans plain, strings quoted,
// null as "null", objects and arrays with %#v.
std::string BadValue(const nlohmann::json& v);

}  // namespace meshwork::controlplane::schema::gofmt
