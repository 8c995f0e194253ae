// Kubernetes resource quantities ("250m", "1.5Gi", "1e3"), parsed as the API server reads them.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "common/quantity.h"

namespace meshwork {
namespace {

// Parses <digits>[.<digits>][suffix] into a non-negative value; false for anything else.
bool ParseQuantity(const std::string& s, long double* out) {
  size_t i = 0;
  if (i < s.size() && s[i] == '+') ++i;
  size_t digits_begin = i;
  int digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  long double mantissa = std::strtold(s.substr(digits_begin, i - digits_begin).c_str(), nullptr);
  std::string suffix = s.substr(i);
  long double mult = 1;
  static const std::pair<const char*, long double> kSuffixes[] = {
      {"", 1},       {"n", 1e-9L}, {"u", 1e-6L}, {"m", 1e-3L}, {"k", 1e3L},
      {"M", 1e6L},   {"G", 1e9L},  {"T", 1e12L}, {"P", 1e15L}, {"E", 1e18L},
      {"Ki", 1024.0L}, {"Mi", 1048576.0L}, {"Gi", 1073741824.0L}, {"Ti", 1099511627776.0L},
      {"Pi", 1125899906842624.0L}, {"Ei", 1152921504606846976.0L}};
  bool known = false;
  for (const auto& [name, m] : kSuffixes) {
    if (suffix == name) {
      mult = m;
      known = true;
      break;
    }
  }
  if (!known) {
    // Decimal exponent: e|E, an optional sign, digits.
    if (suffix.size() < 2 || (suffix[0] != 'e' && suffix[0] != 'E')) return false;
    size_t j = 1;
    if (suffix[j] == '+' || suffix[j] == '-') ++j;
    if (j >= suffix.size() || suffix.size() - j > 3) return false;
    for (size_t k = j; k < suffix.size(); ++k) {
      if (!std::isdigit(static_cast<unsigned char>(suffix[k]))) return false;
    }
    mult = std::pow(10.0L, std::strtol(suffix.c_str() + 1, nullptr, 10));
  }
  *out = mantissa * mult;
  return std::isfinite(*out);
}

std::string Describe(const std::string& q) {
  return "invalid quantity \"" + q +
         "\": expected a non-negative number with an optional suffix (m, k, M, G, T, Ki, Mi, Gi, "
         "Ti, or e<exponent>)";
}

std::string JsonText(const nlohmann::json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

}  // namespace

Result<double> ParseCpu(const std::string& quantity) {
  long double v = 0;
  if (!ParseQuantity(quantity, &v)) return InvalidInput(Describe(quantity));
  if (v > 1e15L) return InvalidInput("quantity \"" + quantity + "\" is too large for cpu");
  return static_cast<double>(v);
}

Result<int64_t> ParseBytes(const std::string& quantity) {
  long double v = 0;
  if (!ParseQuantity(quantity, &v)) return InvalidInput(Describe(quantity));
  // Round up a fractional byte count, but not long double noise in an exact one ("1.5Gi").
  long double nearest = std::round(v);
  v = std::fabs(v - nearest) <= 1e-9L * std::max(1.0L, v) ? nearest : std::ceil(v);
  if (v >= static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    return InvalidInput("quantity \"" + quantity + "\" is too large for a byte count");
  }
  return static_cast<int64_t>(v);
}

Result<double> ParseCpu(const nlohmann::json& quantity) {
  if (!quantity.is_string() && !quantity.is_number()) {
    return InvalidInput(Describe(JsonText(quantity)));
  }
  if (quantity.is_number() && quantity.get<double>() < 0) return InvalidInput(Describe(JsonText(quantity)));
  return ParseCpu(JsonText(quantity));
}

Result<int64_t> ParseBytes(const nlohmann::json& quantity) {
  if (!quantity.is_string() && !quantity.is_number()) {
    return InvalidInput(Describe(JsonText(quantity)));
  }
  if (quantity.is_number() && quantity.get<double>() < 0) return InvalidInput(Describe(JsonText(quantity)));
  return ParseBytes(JsonText(quantity));
}

}  // namespace meshwork
