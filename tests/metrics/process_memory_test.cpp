// ReadProcessMemory: reads this process's resident memory from /proc.
#include "metrics/process_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
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

// A fake root with /proc/meminfo and, optionally, cgroup files.
class MemoryLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("meshwork-memlimit-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    Write("proc/meminfo", "MemTotal:       16384000 kB\nMemFree:         1000 kB\n");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    const auto path = root_ / rel;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::filesystem::path root_;
};

TEST_F(MemoryLimitTest, MachineTotalWithoutACgroupLimit) {
  EXPECT_EQ(ReadMemoryLimit(root_.string()), 16384000LL * 1024);
  Write("sys/fs/cgroup/memory.max", "max\n");
  EXPECT_EQ(ReadMemoryLimit(root_.string()), 16384000LL * 1024) << "\"max\" is no limit";
}

TEST_F(MemoryLimitTest, CgroupV2LimitBelowTheMachine) {
  Write("sys/fs/cgroup/memory.max", "8589934592\n");  // a Pod with limits.memory: 8Gi
  EXPECT_EQ(ReadMemoryLimit(root_.string()), 8589934592LL);
}

TEST_F(MemoryLimitTest, CgroupV1NoLimitValueIsIgnored) {
  Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(ReadMemoryLimit(root_.string()), 16384000LL * 1024);
  Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296\n");
  EXPECT_EQ(ReadMemoryLimit(root_.string()), 4294967296LL);
}

TEST_F(MemoryLimitTest, NothingReadableIsZero) {
  EXPECT_EQ(ReadMemoryLimit((root_ / "missing").string()), 0);
}

TEST(ProcessMemoryTest, ThisMachineHasALimit) { EXPECT_GT(ReadMemoryLimit(), 0); }

}  // namespace
}  // namespace meshwork::metrics
