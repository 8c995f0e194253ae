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

// The first line of a file as a byte count; nullopt-like -1 for "max", a missing file or garbage.
int64_t ReadBytesFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return -1;
  char* end = nullptr;
  const long long bytes = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || bytes <= 0) return -1;
  return static_cast<int64_t>(bytes);
}

}  // namespace

int64_t ReadMemoryLimit(const std::string& root) {
  int64_t limit = 0;
  std::ifstream meminfo(root + "/proc/meminfo");
  static constexpr char kTotal[] = "MemTotal:";
  std::string line;
  while (meminfo && std::getline(meminfo, line)) {
    if (line.rfind(kTotal, 0) == 0) {
      limit = ParseKilobytes(line, sizeof(kTotal) - 1);
      break;
    }
  }
  // cgroup v1 reports "no limit" as a huge page-aligned number; the min with MemTotal drops it.
  for (const char* file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t cgroup = ReadBytesFile(root + file);
    if (cgroup > 0 && (limit == 0 || cgroup < limit)) limit = cgroup;
  }
  return limit;
}

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
