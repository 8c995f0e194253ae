#include "common/chrome_trace.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

namespace meshwork {
namespace {

using nlohmann::json;

// The events of one lane (by its thread_name), in the order written.
std::vector<json> LaneEvents(const json& doc, int pid, const std::string& lane) {
  int tid = -1;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == pid && e["args"]["name"] == lane) tid = e["tid"];
  std::vector<json> out;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid) out.push_back(e);
  return out;
}

TEST(ChromeTraceTest, SpansAreMicrosecondsFromTheOriginOnNamedLanes) {
  ChromeTrace t(0, "rank 0", 100.0);
  t.Span("compute", "fwd layers.0", 100.5, 100.75);
  t.Span("communication", "all_gather %ag1", 100.25, 101.0, {{"bytes", "4096"}});
  t.Span("compute", "bwd layers.0", 101.0, 101.5);
  const json doc = json::parse(ChromeTrace::Document({t.EventsJson()}));
  EXPECT_EQ(doc["displayTimeUnit"], "ms");

  const auto compute = LaneEvents(doc, 0, "compute");
  ASSERT_EQ(compute.size(), 2u);
  EXPECT_EQ(compute[0]["name"], "fwd layers.0");
  EXPECT_DOUBLE_EQ(compute[0]["ts"].get<double>(), 500000.0);
  EXPECT_DOUBLE_EQ(compute[0]["dur"].get<double>(), 250000.0);
  EXPECT_EQ(compute[1]["name"], "bwd layers.0");

  const auto comm = LaneEvents(doc, 0, "communication");
  ASSERT_EQ(comm.size(), 1u);
  EXPECT_EQ(comm[0]["args"]["bytes"], "4096");
  EXPECT_DOUBLE_EQ(comm[0]["dur"].get<double>(), 750000.0);
  EXPECT_EQ(t.events(), 3);
}

TEST(ChromeTraceTest, SeveralRanksAreProcessesOfOneDocument) {
  ChromeTrace a(0, "rank 0", 0), b(1, "rank 1", 0);
  a.Span("compute", "x", 0, 1);
  b.Span("compute", "y", 0, 2);
  b.Counter("gathered parameters (MiB)", 0.5, 12.5);
  const json doc = json::parse(ChromeTrace::Document({a.EventsJson(), b.EventsJson()}));
  std::set<std::string> processes;
  for (const auto& e : doc["traceEvents"])
    if (e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
  EXPECT_EQ(processes, (std::set<std::string>{"rank 0", "rank 1"}));
  ASSERT_EQ(LaneEvents(doc, 1, "compute").size(), 1u);
  EXPECT_EQ(LaneEvents(doc, 1, "compute")[0]["name"], "y");
  int counters = 0;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "C") {
      ++counters;
      EXPECT_DOUBLE_EQ(e["args"]["value"].get<double>(), 12.5);
    }
  EXPECT_EQ(counters, 1);
}

TEST(ChromeTraceTest, NamesAreEscapedAndNegativeDurationsClampToZero) {
  ChromeTrace t(3, "rank \"3\"\n", 0);
  t.Span("lane\\1", "a \"quoted\"\tname\x01", 2.0, 1.0);
  const json doc = json::parse(ChromeTrace::Document({t.EventsJson()}));
  const auto events = LaneEvents(doc, 3, "lane\\1");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["name"], "a \"quoted\"\tname\x01");
  EXPECT_DOUBLE_EQ(events[0]["dur"].get<double>(), 0.0);
  EXPECT_EQ(JsonQuote("é"), "\"é\"");
}

}  // namespace
}  // namespace meshwork
