// Byte counts as people read them in logs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace meshwork {

// "381 MiB" (rounded to the nearest MiB).
inline std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// "512 B", "40.0 KiB", "3.50 MiB", "73.96 GiB": three significant digits in the largest unit
// that keeps the number at least 1 (a tiny model's plan and a 70B one's read alike).
inline std::string HumanBytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (unit < 4 && (v >= 1024 || v <= -1024)) v /= 1024, ++unit;
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    const double a = v < 0 ? -v : v;
    std::snprintf(buf, sizeof buf, a >= 100 ? "%.0f %s" : a >= 10 ? "%.1f %s" : "%.2f %s", v, kUnits[unit]);
  }
  return buf;
}

}  // namespace meshwork
