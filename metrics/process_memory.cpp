// ReadProcessMemory: parses VmRSS / VmHWM (reported in kB) from /proc/self/status.
#include "metrics/process_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace meshwork::metrics {
namespace {

// "VmRSS:\t   12345 kB" -> 12345 * 1024; anything unexpected reads as 0.
int64_t ParseKilobytes(const std::string& line, size_t key_length) {
  const char* begin = line.c_str() + key_length;
  char* end = nullptr;
  const long long kb = std::strtoll(begin, &end, 10);
  if (end == begin || kb < 0) return 0;
  return static_cast<int64_t>(kb) * 1024;
}

}  // namespace

ProcessMemory ReadProcessMemory() {
  ProcessMemory memory;
  std::ifstream status("/proc/self/status");
  if (!status) return memory;
  static constexpr char kRss[] = "VmRSS:";
  static constexpr char kHwm[] = "VmHWM:";
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(kRss, 0) == 0) {
      memory.current_rss_bytes = ParseKilobytes(line, sizeof(kRss) - 1);
    } else if (line.rfind(kHwm, 0) == 0) {
      memory.peak_rss_bytes = ParseKilobytes(line, sizeof(kHwm) - 1);
    }
  }
  return memory;
}

}  // namespace meshwork::metrics
