// The watch stream decoder: events split across chunks, partial lines, bookmarks, ERROR 410.
#include "operator/k8s/watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

namespace meshwork::k8s {
namespace {

using ::testing::HasSubstr;

std::string Event(const std::string& type, const std::string& name, const std::string& rv) {
  return R"({"type":")" + type + R"(","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":")" +
         name + R"(","namespace":"d","resourceVersion":")" + rv + R"("}}})";
}

TEST(WatchLineParserTest, WholeLinesInOneChunk) {
  WatchLineParser p;
  std::vector<WatchEvent> out;
  std::string data = Event("ADDED", "a", "1") + "\n" + Event("MODIFIED", "a", "2") + "\n" +
                     Event("DELETED", "a", "3") + "\n";
  ASSERT_TRUE(p.Feed(data, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].type, WatchEvent::Type::kAdded);
  EXPECT_EQ(out[1].type, WatchEvent::Type::kModified);
  EXPECT_EQ(out[2].type, WatchEvent::Type::kDeleted);
  EXPECT_EQ(out[2].resource_version, "3");
  EXPECT_EQ(out[0].object["metadata"]["name"], "a");
  EXPECT_EQ(p.buffered(), 0u);
}

// Every split point of a two-event stream yields the same two events, each as soon as its
// newline arrives.
TEST(WatchLineParserTest, EventsSplitAtEveryByteBoundary) {
  std::string data = Event("ADDED", "a", "1") + "\n" + Event("MODIFIED", "b", "2") + "\r\n";
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    WatchLineParser p;
    std::vector<WatchEvent> out;
    ASSERT_TRUE(p.Feed(std::string_view(data).substr(0, cut), &out).ok());
    size_t complete_lines = std::count(data.begin(), data.begin() + cut, '\n');
    EXPECT_EQ(out.size(), complete_lines) << "cut " << cut;
    ASSERT_TRUE(p.Feed(std::string_view(data).substr(cut), &out).ok());
    ASSERT_EQ(out.size(), 2u) << "cut " << cut;
    EXPECT_EQ(out[0].object["metadata"]["name"], "a");
    EXPECT_EQ(out[1].object["metadata"]["name"], "b");
  }
}

TEST(WatchLineParserTest, ByteByByteAndBlankLines) {
  std::string data = "\n" + Event("ADDED", "a", "1") + "\n\n  \n" + Event("ADDED", "b", "2") + "\n";
  WatchLineParser p;
  std::vector<WatchEvent> out;
  for (char c : data) ASSERT_TRUE(p.Feed(std::string_view(&c, 1), &out).ok());
  ASSERT_EQ(out.size(), 2u);
}

TEST(WatchLineParserTest, FinalLineWithoutNewlineOnFinish) {
  WatchLineParser p;
  std::vector<WatchEvent> out;
  ASSERT_TRUE(p.Feed(Event("ADDED", "a", "1"), &out).ok());
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(p.Finish(&out).ok());
  ASSERT_EQ(out.size(), 1u);
}

TEST(WatchLineParserTest, BookmarkCarriesOnlyAResourceVersion) {
  WatchLineParser p;
  std::vector<WatchEvent> out;
  ASSERT_TRUE(p.Feed(R"({"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1",)"
                     R"("metadata":{"resourceVersion":"12345","annotations":{"k8s.io/initial-events-end":"true"}}}})"
                     "\n",
                     &out)
                  .ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, WatchEvent::Type::kBookmark);
  EXPECT_EQ(out[0].resource_version, "12345");
}

TEST(WatchLineParserTest, Error410BecomesGone) {
  WatchLineParser p;
  std::vector<WatchEvent> out;
  ASSERT_TRUE(p.Feed(R"({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},)"
                     R"j("status":"Failure","message":"too old resource version: 1 (50)","reason":"Expired","code":410}})j"
                     "\n",
                     &out)
                  .ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, WatchEvent::Type::kError);
  EXPECT_TRUE(IsGone(out[0].error)) << out[0].error.ToString();
  EXPECT_THAT(out[0].error.message(), HasSubstr("too old"));
}

TEST(WatchLineParserTest, MalformedLinesAreErrorsNotCrashes) {
  const char* bad[] = {"not json\n", "[1,2]\n", R"({"type":"ADDED"})" "\n", R"({"type":"WHAT","object":{}})" "\n",
                       R"({"type":7,"object":{}})" "\n"};
  for (const char* b : bad) {
    WatchLineParser p;
    std::vector<WatchEvent> out;
    Error e = p.Feed(b, &out);
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidResponse) << b;
    EXPECT_TRUE(out.empty());
  }
}

TEST(WatchLineParserTest, OverlongLineIsRefused) {
  WatchLineParser p(/*max_line_bytes=*/100);
  std::vector<WatchEvent> out;
  Error e = p.Feed(std::string(150, 'x'), &out);
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidResponse);
  EXPECT_THAT(e.message(), HasSubstr("100 bytes"));
}

TEST(CancelTokenTest, CallbacksRunOnceAndLateRegistrationRunsAtOnce) {
  CancelToken t;
  int calls = 0;
  int id = t.OnCancel([&] { ++calls; });
  int other = t.OnCancel([&] { calls += 10; });
  t.Unregister(other);
  EXPECT_FALSE(t.cancelled());
  CancelToken copy = t;
  copy.Cancel();
  copy.Cancel();
  EXPECT_TRUE(t.cancelled());
  EXPECT_EQ(calls, 1);
  t.OnCancel([&] { calls += 100; });
  EXPECT_EQ(calls, 101);
  t.Unregister(id);
}

}  // namespace
}  // namespace meshwork::k8s
