// Resource quantities as Kubernetes writes them, good and bad.
#include <gtest/gtest.h>

#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

TEST(ParseCpu, ReadsKubernetesQuantities) {
  struct Case {
    const char* text;
    double cores;
  } cases[] = {{"2", 2},        {"250m", 0.25}, {"1.5", 1.5}, {"0.1", 0.1}, {"1e3", 1000},
               {"1E2", 100},    {"100000u", 0.1}, {"500000000n", 0.5}, {"1k", 1000}, {"+3", 3},
               {".5", 0.5},     {"2.", 2},      {"1e-3", 0.001}};
  for (const auto& c : cases) {
    auto v = ParseCpu(std::string(c.text));
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.status().ToString();
    EXPECT_NEAR(*v, c.cores, 1e-12) << c.text;
  }
}

TEST(ParseBytes, ReadsBinaryAndDecimalSuffixes) {
  struct Case {
    const char* text;
    int64_t bytes;
  } cases[] = {{"8Gi", 8LL << 30},   {"512M", 512000000}, {"1e3", 1000},     {"1Ki", 1024},
               {"1.5Gi", 1610612736}, {"128974848", 128974848}, {"129e6", 129000000}, {"123Mi", 128974848},
               {"1Ti", 1LL << 40},   {"100m", 1},  // a fraction of a byte rounds up
               {"0", 0}};
  for (const auto& c : cases) {
    auto v = ParseBytes(std::string(c.text));
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.status().ToString();
    EXPECT_EQ(*v, c.bytes) << c.text;
  }
}

TEST(ParseQuantity, RefusesMalformedValuesAndNamesThem) {
  for (const char* bad : {"", "abc", "-1", "1.2.3", "5x", "1 Gi", " 1", "Gi", "1e", "1e+", "1ee3", "1KiB", "m",
                          "0x10", "1e99999"}) {
    auto cpu = ParseCpu(std::string(bad));
    EXPECT_FALSE(cpu.ok()) << "cpu \"" << bad << "\"";
    if (!cpu.ok()) {
      EXPECT_NE(cpu.status().message().find(std::string("\"") + bad + "\""), std::string::npos);
    }
    auto bytes = ParseBytes(std::string(bad));
    EXPECT_FALSE(bytes.ok()) << "bytes \"" << bad << "\"";
  }
  EXPECT_FALSE(ParseBytes(std::string("9Ei")).ok()) << "over int64";
}

TEST(ParseQuantity, AcceptsJsonNumbersAndRefusesOtherJson) {
  EXPECT_DOUBLE_EQ(*ParseCpu(nlohmann::json(2)), 2.0);
  EXPECT_DOUBLE_EQ(*ParseCpu(nlohmann::json(0.5)), 0.5);
  EXPECT_EQ(*ParseBytes(nlohmann::json(1024)), 1024);
  EXPECT_EQ(*ParseBytes(nlohmann::json("1Mi")), 1048576);
  EXPECT_FALSE(ParseCpu(nlohmann::json(-1)).ok());
  EXPECT_FALSE(ParseCpu(nlohmann::json::array()).ok());
  EXPECT_FALSE(ParseBytes(nlohmann::json(true)).ok());
}

}  // namespace
}  // namespace meshwork::controlplane::agent
