// Resident memory of this process, for the cpu series of the memory gauges.
#pragma once

#include <cstdint>
#include <string>

namespace meshwork::metrics {

struct ProcessMemory {
  int64_t current_rss_bytes = 0;  // VmRSS
  int64_t peak_rss_bytes = 0;     // VmHWM: the high-water mark since the process started
};

// Reads /proc/self/status. Zeros where it is unreadable (non-Linux, sandboxed /proc): a missing
// memory reading must never stop training.
ProcessMemory ReadProcessMemory();

// The most memory this process may use: the smaller of the machine's MemTotal
// (/proc/meminfo) and its cgroup's limit (v2 /sys/fs/cgroup/memory.max, or v1
// /sys/fs/cgroup/memory/memory.limit_in_bytes), which in a Pod is the container's memory limit.
// "max" and v1's "no limit" value mean no cgroup limit. 0 when nothing is readable. `root`
// prefixes every path (tests).
int64_t ReadMemoryLimit(const std::string& root = "");

}  // namespace meshwork::metrics
