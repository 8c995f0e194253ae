// Resident memory of this process, for the cpu series of the memory gauges.
#pragma once

#include <cstdint>

namespace meshwork::metrics {

struct ProcessMemory {
  int64_t current_rss_bytes = 0;  // VmRSS
  int64_t peak_rss_bytes = 0;     // VmHWM: the high-water mark since the process started
};

// Reads /proc/self/status. Zeros where it is unreadable (non-Linux, sandboxed /proc): a missing
// memory reading must never stop training.
ProcessMemory ReadProcessMemory();

}  // namespace meshwork::metrics
