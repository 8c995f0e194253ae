// safetensors reader/writer: round trips, the on-disk layout, and malformed files that must
// come back as InvalidInput naming the file and tensor rather than crash.
#include "trainer/io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/trainer/io/temp_dir.h"

namespace meshwork::io {
namespace {

using ::testing::HasSubstr;
using testing::ReadBytes;
using testing::ScopedTempDir;
using testing::WriteBytes;

std::string LittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (auto& c : out) {
    c = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

// A file with the given header text and data buffer, for hand-made malformed inputs.
std::string RawFile(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

void ExpectSame(const torch::Tensor& expected, const torch::Tensor& actual) {
  ASSERT_TRUE(actual.defined());
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.device().is_cpu());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_TRUE(torch::equal(actual, expected));
}

TEST(SafetensorsTest, RoundTripKeepsEveryDtypeShapeAndValue) {
  ScopedTempDir dir;
  torch::manual_seed(0);
  TensorMap tensors = {
      {"f32", torch::randn({3, 5})},
      {"bf16", torch::randn({4, 2}).to(torch::kBFloat16)},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"f64", torch::randn({2, 2, 2}, torch::kDouble)},
      {"i64", torch::arange(-5, 7, torch::kLong).reshape({3, 4})},
      {"i32", torch::arange(0, 9, torch::kInt)},
      {"i16", torch::arange(-3, 3, torch::kShort)},
      {"i8", torch::arange(-128, 127, 17, torch::kChar)},
      {"u8", torch::arange(0, 255, 31, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::empty({0, 3})},
  };
  ASSERT_TRUE(WriteSafetensors(dir.File("t.safetensors"), tensors).ok());

  auto read = ReadSafetensors(dir.File("t.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ExpectSame(t, read->at(name));
  }
  EXPECT_EQ(read->at("scalar").dim(), 0);
}

// The example of the safetensors reference tests, written out by hand from the spec.
TEST(SafetensorsTest, ReadsHandWrittenSpecExample) {
  ScopedTempDir dir;
  const int32_t values[] = {1, 2, 3, -4};
  WriteBytes(dir.File("spec.safetensors"),
             RawFile(R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})",
                     std::string(reinterpret_cast<const char*>(values), sizeof(values))));
  auto r = ReadSafetensors(dir.File("spec.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSame(torch::tensor({1, 2, 3, -4}, torch::kInt).reshape({2, 2}), r->at("test"));
}

TEST(SafetensorsTest, WriteRejectsNamesThatAreNotUtf8) {
  ScopedTempDir dir;
  const Status s = WriteSafetensors(dir.File("u.safetensors"), {{"bad\xff", torch::ones({1})}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_FALSE(std::filesystem::exists(dir.File("u.safetensors")));
}

TEST(SafetensorsTest, RoundTripKeepsMetadata) {
  ScopedTempDir dir;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "42"}};
  ASSERT_TRUE(WriteSafetensors(dir.File("m.safetensors"), {{"w", torch::ones({2})}}, metadata)
                  .ok());
  auto header = ReadSafetensorsHeader(dir.File("m.safetensors"));
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->metadata, metadata);
  ASSERT_EQ(header->tensors.size(), 1u);
  EXPECT_EQ(header->tensors[0].name, "w");
}

TEST(SafetensorsTest, WritesNonContiguousTensorsInLogicalOrder) {
  ScopedTempDir dir;
  const torch::Tensor t = torch::arange(12, torch::kFloat).reshape({3, 4}).t();  // a view
  ASSERT_FALSE(t.is_contiguous());
  ASSERT_TRUE(WriteSafetensors(dir.File("t.safetensors"), {{"t", t}}).ok());
  auto read = ReadSafetensors(dir.File("t.safetensors"));
  ASSERT_TRUE(read.ok());
  ExpectSame(t.contiguous(), read->at("t"));
}

TEST(SafetensorsTest, HeaderBytesFollowTheSpec) {
  ScopedTempDir dir;
  TensorMap tensors = {
      {"a", torch::ones({3}, torch::kHalf)},  // 6 bytes: would misalign a later F32
      {"b", torch::ones({2, 3})},
      {"c", torch::ones({5}, torch::kLong)},
  };
  ASSERT_TRUE(WriteSafetensors(dir.File("h.safetensors"), tensors, {{"format", "pt"}}).ok());
  const std::string bytes = ReadBytes(dir.File("h.safetensors"));
  ASSERT_GE(bytes.size(), 8u);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header is padded to 8-byte alignment";
  ASSERT_LE(8 + n, bytes.size());
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["a"]["dtype"], "F16");
  EXPECT_EQ(header["c"]["dtype"], "I64");

  // Offsets tile the buffer exactly, and each tensor starts at a multiple of its element size.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, t] : tensors) {
    const auto& off = header[name]["data_offsets"];
    const uint64_t begin = off[0], end = off[1];
    EXPECT_EQ(end - begin, static_cast<uint64_t>(t.numel() * t.element_size())) << name;
    EXPECT_EQ(begin % t.element_size(), 0u) << name;
    ranges.emplace_back(begin, end);
  }
  std::sort(ranges.begin(), ranges.end());
  EXPECT_EQ(ranges.front().first, 0u);
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
  EXPECT_EQ(ranges.back().second, bytes.size() - 8 - n);

  // The data bytes are the raw little-endian values.
  const auto& c_off = header["c"]["data_offsets"];
  int64_t first = 0;
  std::memcpy(&first, bytes.data() + 8 + n + static_cast<uint64_t>(c_off[0]), sizeof(first));
  EXPECT_EQ(first, 1);
}

TEST(SafetensorsTest, WriteReplacesFileAndLeavesNoTemporary) {
  ScopedTempDir dir;
  const std::string path = dir.File("w.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"old", torch::zeros({4})}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"new", torch::ones({2})}}).ok());
  EXPECT_FALSE(meshwork::testing::AnyNameContains(dir.path(), ".tmp"));
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->count("old"), 0u);
  EXPECT_EQ(read->count("new"), 1u);
}

TEST(SafetensorsTest, WriteIntoMissingDirectoryIsIOErrorNamingPath) {
  ScopedTempDir dir;
  const std::string path = dir.File("no/such/dir/w.safetensors");
  const Status s = WriteSafetensors(path, {{"w", torch::ones({1})}});
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST(SafetensorsTest, WriteRejectsReservedNameAndUnsupportedDtype) {
  ScopedTempDir dir;
  Status s = WriteSafetensors(dir.File("a"), {{"__metadata__", torch::ones({1})}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  s = WriteSafetensors(dir.File("b"), {{"z", torch::ones({1}, torch::kComplexFloat)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("'z'"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("b")));
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  ScopedTempDir dir;
  auto r = ReadSafetensors(dir.File("absent.safetensors"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("absent.safetensors"));
}

// --- malformed files ------------------------------------------------------------------------

class MalformedSafetensorsTest : public ::testing::Test {
 protected:
  // Writes `bytes` and expects ReadSafetensors to fail with InvalidInput whose message names the
  // file and contains every one of `substrings`.
  void ExpectInvalid(const std::string& bytes, const std::vector<std::string>& substrings) {
    const std::string path = dir_.File("bad.safetensors");
    WriteBytes(path, bytes);
    auto r = ReadSafetensors(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(path));
    for (const auto& s : substrings) EXPECT_THAT(r.status().message(), HasSubstr(s));
    // The header-only reader must agree.
    EXPECT_EQ(ReadSafetensorsHeader(path).status().code(), StatusCode::kInvalidInput);
  }

  ScopedTempDir dir_;
};

TEST_F(MalformedSafetensorsTest, FileShorterThanLengthPrefixIsInvalidInput) {
  ExpectInvalid("", {"truncated"});
  ExpectInvalid("\x10\x00\x00", {"truncated"});
}

TEST_F(MalformedSafetensorsTest, HeaderLengthLargerThanFileIsInvalidInput) {
  ExpectInvalid(LittleEndian64(1000) + "{}", {"header length 1000"});
  ExpectInvalid(LittleEndian64(~uint64_t{0}) + "{}", {"header length"});
}

TEST_F(MalformedSafetensorsTest, InvalidJsonIsInvalidInput) {
  ExpectInvalid(RawFile("{\"w\": {\"dtype\": ", ""), {"not valid JSON"});
  ExpectInvalid(RawFile("[1, 2]", ""), {"not a JSON object"});
}

TEST_F(MalformedSafetensorsTest, UnknownDtypeNamesTensorAndDtype) {
  ExpectInvalid(RawFile(R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})",
                        std::string(2, '\0')),
                {"'w'", "\"Q4\""});
}

TEST_F(MalformedSafetensorsTest, ByteCountNotMatchingShapeNamesTensor) {
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
                        std::string(20, '\0')),
                {"'w'", "20 bytes", "needs 24"});
}

TEST_F(MalformedSafetensorsTest, OffsetsOutOfRangeNameTensor) {
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                        std::string(8, '\0')),
                {"'w'", "out of range"});
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})",
                        std::string(8, '\0')),
                {"'w'", "out of range"});
}

TEST_F(MalformedSafetensorsTest, TruncatedDataNamesTensor) {
  const std::string path = dir_.File("good.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"weight", torch::ones({16})}}).ok());
  const std::string good = ReadBytes(path);
  ExpectInvalid(good.substr(0, good.size() - 4), {"'weight'", "truncated"});
}

TEST_F(MalformedSafetensorsTest, OverlappingOffsetsNameBothTensors) {
  ExpectInvalid(RawFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        std::string(12, '\0')),
                {"'a'", "'b'", "overlap"});
}

TEST_F(MalformedSafetensorsTest, BadShapesNameTensor) {
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
                        std::string(4, '\0')),
                {"'w'", "shape"});
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})",
                        std::string(4, '\0')),
                {"'w'", "shape"});
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})",
                        std::string(16, '\0')),
                {"'w'", "shape"});
  // numel * element size overflows 64 bits: must not wrap around to a small allocation.
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],)"
                        R"( "data_offsets": [0, 0]}})",
                        ""),
                {"'w'", "too large"});
  // Also when another dimension is 0 (libtorch would throw on such a shape).
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296],)"
                        R"( "data_offsets": [0, 0]}})",
                        ""),
                {"'w'", "too large"});
}

TEST_F(MalformedSafetensorsTest, MissingFieldsNameTensor) {
  ExpectInvalid(RawFile(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", std::string(4, 0)),
                {"'w'", "dtype"});
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32", "shape": [1]}})", std::string(4, 0)),
                {"'w'", "data_offsets"});
  ExpectInvalid(RawFile(R"({"w": [1, 2]})", ""), {"'w'"});
}

TEST_F(MalformedSafetensorsTest, NonStringMetadataIsInvalidInput) {
  ExpectInvalid(RawFile(R"({"__metadata__": {"step": 3}})", ""), {"__metadata__", "step"});
}

TEST(SafetensorsTest, ZeroSizedTensorsMayShareAnOffset) {
  ScopedTempDir dir;
  const std::string path = dir.File("z.safetensors");
  WriteBytes(path, RawFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                           R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}})",
                           std::string(4, '\0')));
  auto r = ReadSafetensors(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->at("b").numel(), 0);
}

// Every truncation and many random byte flips of a valid file either read cleanly or give
// InvalidInput; none may crash or throw.
TEST(SafetensorsTest, CorruptedFilesNeverCrash) {
  ScopedTempDir dir;
  const std::string path = dir.File("c.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a", torch::randn({3, 2})},
                                {"b", torch::ones({4}, torch::kBFloat16)},
                                {"flag", torch::tensor({true, false})}},
                               {{"format", "pt"}})
                  .ok());
  const std::string good = ReadBytes(path);
  const std::string corrupt = dir.File("corrupt.safetensors");

  auto expect_handled = [&](const std::string& bytes) {
    WriteBytes(corrupt, bytes);
    auto r = ReadSafetensors(corrupt);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput) << r.status().ToString();
    }
  };
  for (size_t len = 0; len < good.size(); ++len) expect_handled(good.substr(0, len));

  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pos(0, good.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 500; ++i) {
    std::string bytes = good;
    for (int k = 0; k < 1 + i % 4; ++k) bytes[pos(rng)] = static_cast<char>(byte(rng));
    expect_handled(bytes);
  }
}

}  // namespace
}  // namespace meshwork::io
