// Go fmt look-alikes for the values kube-apiserver quotes in validation messages.
#include "controlplane/schema/go_format.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace meshwork::controlplane::schema::gofmt {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\a': out += "\\a"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\v': out += "\\v"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through, as Go keeps printable runes
        }
    }
  }
  out += '"';
  return out;
}

std::string Float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
  if (d == 0) return std::signbit(d) ? "-0" : "0";
  // Shortest digit string that reads back to the same double.
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf is like "-1.2345e+06": split mantissa digits and exponent.
  std::string s(buf);
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  size_t epos = s.find('e');
  std::string mant = s.substr(0, epos);
  int exp = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 6) {  // Go's %v switches to %e here for the shortest precision
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
    return out;
  }
  if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exp + 1) {
    out += digits + std::string(static_cast<size_t>(exp + 1 - static_cast<int>(digits.size())), '0');
  } else {
    out += digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
           digits.substr(static_cast<size_t>(exp + 1));
  }
  return out;
}

std::string Number(const nlohmann::json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return std::to_string(v.get<int64_t>());
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::to_string(u);
    return Float(static_cast<double>(u));  // Kubernetes decodes it as a float64
  }
  return Float(v.get<double>());
}

std::string SharpV(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "interface {}(nil)";
    case nlohmann::json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::string: return Quote(v.get<std::string>());
    case nlohmann::json::value_t::object: {
      std::string out = "map[string]interface {}{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {  // nlohmann keeps keys sorted, like %#v
        if (!first) out += ", ";
        first = false;
        out += Quote(it.key()) + ":" + SharpV(it.value());
      }
      return out + "}";
    }
    case nlohmann::json::value_t::array: {
      std::string out = "[]interface {}{";
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        out += SharpV(v[i]);
      }
      return out + "}";
    }
    default: return Number(v);
  }
}

std::string BadValue(const nlohmann::json& v) {
  if (v.is_null()) return "\"null\"";
  if (v.is_string()) return Quote(v.get<std::string>());
  if (v.is_boolean() || v.is_number()) return SharpV(v);
  return SharpV(v);
}

}  // namespace meshwork::controlplane::schema::gofmt
