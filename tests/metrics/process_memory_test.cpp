// ReadProcessMemory: reads this process's resident memory from /proc.
#include "metrics/process_memory.h"

#include <gtest/gtest.h>

#include <vector>

namespace meshwork::metrics {
namespace {

TEST(ProcessMemoryTest, ReportsPositiveRssWithPeakAtLeastCurrent) {
  const ProcessMemory memory = ReadProcessMemory();
  EXPECT_GT(memory.current_rss_bytes, 0);
  EXPECT_GE(memory.peak_rss_bytes, memory.current_rss_bytes);
  EXPECT_EQ(memory.current_rss_bytes % 1024, 0) << "kB must be converted to bytes";
}

TEST(ProcessMemoryTest, PeakFollowsATouchedAllocation) {
  const int64_t before = ReadProcessMemory().peak_rss_bytes;
  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes, 1);  // written, so the pages are resident
  const ProcessMemory during = ReadProcessMemory();
  EXPECT_GE(during.peak_rss_bytes, before);
  EXPECT_GE(during.current_rss_bytes, static_cast<int64_t>(kBytes));
  EXPECT_EQ(block[kBytes - 1], 1);
}

}  // namespace
}  // namespace meshwork::metrics
