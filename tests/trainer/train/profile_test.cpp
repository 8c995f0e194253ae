// train::Summarize: where a profiled step's time went.
#include <gtest/gtest.h>

#include <sstream>

#include "trainer/train/profile.h"

namespace meshwork::train {
namespace {

constexpr uint64_t kMs = 1000000;

TEST(ProfileSummary, DeviceBusyTimeIsTheUnionOfItsSpans) {
  const std::vector<ProfiledSpan> spans = {
      {"aten::mm", 0, 30 * kMs, false},     // host: not counted as device time
      {"gemm", 0, 10 * kMs, true},          //
      {"gemm", 5 * kMs, 12 * kMs, true},    // overlaps the first: 2 ms more
      {"softmax", 20 * kMs, 21 * kMs, true},
  };
  const ProfileSummary s = Summarize(spans, 0.040, 10);
  EXPECT_NEAR(s.device_busy_seconds, 0.013, 1e-12);
  EXPECT_EQ(s.device_spans, 3);
  ASSERT_EQ(s.top.size(), 2u);  // device rows only, once there are any
  EXPECT_EQ(s.top[0].name, "gemm");
  EXPECT_EQ(s.top[0].calls, 2);
  EXPECT_NEAR(s.top[0].seconds, 0.017, 1e-12);  // summed, overlap and all
  EXPECT_EQ(s.top[1].name, "softmax");
}

TEST(ProfileSummary, HostOperatorsWithoutDeviceSpansAndTheTopN) {
  std::vector<ProfiledSpan> spans;
  for (int i = 0; i < 5; ++i) spans.push_back({"op" + std::to_string(i), 0, static_cast<uint64_t>(i + 1) * kMs, false});
  spans.push_back({"op4", 10 * kMs, 11 * kMs, false});
  const ProfileSummary s = Summarize(spans, 0.1, 3);
  EXPECT_EQ(s.device_spans, 0);
  EXPECT_EQ(s.device_busy_seconds, 0);
  ASSERT_EQ(s.top.size(), 3u);
  EXPECT_EQ(s.top[0].name, "op4");
  EXPECT_EQ(s.top[0].calls, 2);
  EXPECT_NEAR(s.top[0].seconds, 0.006, 1e-12);
  EXPECT_EQ(s.top[1].name, "op3");
  EXPECT_EQ(s.top[2].name, "op2");

  std::ostringstream log;
  PrintProfile(s, 2, 2, "p.json", log);
  EXPECT_NE(log.str().find("profile: steps 3-4, 50.0 ms a step, trace in p.json"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("no device activity"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("op4"), std::string::npos) << log.str();
}

TEST(ProfileSummary, PrintsTheDeviceShareOfTheWallTime) {
  const ProfileSummary s = Summarize({{"gemm", 0, 30 * kMs, true}}, 0.120, 5);
  std::ostringstream log;
  PrintProfile(s, 4, 2, "p.json", log);
  EXPECT_NE(log.str().find("the device was busy 25.0% of the steps' wall time (1 kernels and copies, 15.0 ms a step)"),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("15.00 ms a step 100.0%"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace meshwork::train
