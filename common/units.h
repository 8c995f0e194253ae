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

}  // namespace meshwork
