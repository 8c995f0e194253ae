// Byte counts as the logs print them.
#include <gtest/gtest.h>

#include "common/units.h"

namespace meshwork {
namespace {

TEST(Units, MibRoundsToTheNearestMib) {
  EXPECT_EQ(Mib(0), "0 MiB");
  EXPECT_EQ(Mib(int64_t{3} << 20), "3 MiB");
  EXPECT_EQ(Mib((int64_t{5} << 20) + (int64_t{6} << 19)), "8 MiB");
}

TEST(Units, HumanBytesPicksTheLargestUnitThatKeepsTheNumberAtLeastOne) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.00 KiB");
  EXPECT_EQ(HumanBytes(40 * 1024 + 512), "40.5 KiB");
  EXPECT_EQ(HumanBytes(int64_t{3} << 19), "1.50 MiB");
  EXPECT_EQ(HumanBytes(int64_t{250} << 20), "250 MiB");
  EXPECT_EQ(HumanBytes(static_cast<int64_t>(73.96 * (1 << 30))), "74.0 GiB");
  EXPECT_EQ(HumanBytes(int64_t{2} << 40), "2.00 TiB");
  EXPECT_EQ(HumanBytes(-2048), "-2.00 KiB");
}

}  // namespace
}  // namespace meshwork
