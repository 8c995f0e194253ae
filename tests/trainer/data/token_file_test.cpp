// Token file formats: writing, reading back, auto detection and every malformed-file error.
#include "trainer/data/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/trainer/data/temp_dir.h"

namespace meshwork::data {
namespace {

using ::meshwork::data::testing::AppendLe;
using ::meshwork::data::testing::LlmcHeader;
using ::meshwork::data::testing::ReadBytes;
using ::meshwork::data::testing::TempDir;
using ::meshwork::data::testing::WriteBytes;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<uint32_t> ReadAll(const TokenFile& file) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < file.size(); ++i) out.push_back(file.at(i));
  return out;
}

struct RoundTripCase {
  TokenFormat format;
  std::vector<uint32_t> tokens;
  int expected_bytes_per_token;
  int64_t expected_file_bytes;
};

class TokenFileRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(TokenFileRoundTripTest, WrittenTokensReadBackUnchanged) {
  const RoundTripCase& c = GetParam();
  TempDir dir;
  const std::string path = dir.File("tokens.bin");
  ASSERT_TRUE(WriteTokenFile(path, c.tokens, c.format).ok());
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(path)), c.expected_file_bytes);

  auto file = TokenFile::Open(path, c.format);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->format(), c.format);
  EXPECT_EQ((*file)->bytes_per_token(), c.expected_bytes_per_token);
  EXPECT_EQ((*file)->size(), static_cast<int64_t>(c.tokens.size()));
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ(ReadAll(**file), c.tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, TokenFileRoundTripTest,
    ::testing::Values(
        RoundTripCase{TokenFormat::kLlmc, {0, 1, 256, 65535, 7}, 2, 1024 + 5 * 2},
        RoundTripCase{TokenFormat::kLlmc, {0, 65536, 128000, 4294967295u}, 4, 1024 + 4 * 4},
        RoundTripCase{TokenFormat::kRawU16, {0, 1, 256, 65535, 7}, 2, 5 * 2},
        RoundTripCase{TokenFormat::kRawU32, {0, 65536, 128000, 4294967295u}, 4, 4 * 4}),
    [](const ::testing::TestParamInfo<RoundTripCase>& info) {
      return std::string(TokenFormatName(info.param.format)) + "_" +
             std::to_string(info.param.expected_bytes_per_token) + "byte";
    });

TEST(TokenFileTest, WrittenLlmcHeaderHasMagicVersionAndCountThenZeros) {
  TempDir dir;
  const std::string path = dir.File("small.bin");
  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 3}, TokenFormat::kLlmc).ok());
  std::string expected = LlmcHeader(20240520, 1, 3);
  AppendLe(expected, 1, 2);
  AppendLe(expected, 2, 2);
  AppendLe(expected, 3, 2);
  EXPECT_EQ(ReadBytes(path), expected);

  const std::string wide = dir.File("wide.bin");
  ASSERT_TRUE(WriteTokenFile(wide, {70000}, TokenFormat::kLlmc).ok());
  std::string expected_wide = LlmcHeader(20240520, 2, 1);
  AppendLe(expected_wide, 70000, 4);
  EXPECT_EQ(ReadBytes(wide), expected_wide);
}

TEST(TokenFileTest, ReadsHandWrittenLittleEndianFiles) {
  TempDir dir;
  std::string llmc = LlmcHeader(20240520, 2, 2);
  AppendLe(llmc, 0x01020304, 4);
  AppendLe(llmc, 100000, 4);
  WriteBytes(dir.File("llmc.bin"), llmc);
  auto a = TokenFile::Open(dir.File("llmc.bin"), TokenFormat::kLlmc);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(ReadAll(**a), (std::vector<uint32_t>{0x01020304, 100000}));

  WriteBytes(dir.File("raw.bin"), std::string("\x01\x02\xff\xff", 4));
  auto b = TokenFile::Open(dir.File("raw.bin"), TokenFormat::kRawU16);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(ReadAll(**b), (std::vector<uint32_t>{0x0201, 0xffff}));
}

TEST(TokenFileTest, AutoDetectsLlmcHeaderByMagic) {
  TempDir dir;
  const std::string path = dir.File("llmc.bin");
  ASSERT_TRUE(WriteTokenFile(path, {5, 6, 70000}, TokenFormat::kLlmc).ok());
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->format(), TokenFormat::kLlmc);
  EXPECT_EQ(ReadAll(**file), (std::vector<uint32_t>{5, 6, 70000}));
}

// Truncated in place while mapped (a `>` redirect, `truncate`): reading the mapping past the new
// end would be SIGBUS; the check before each batch says what happened instead.
TEST(TokenFileTest, AFileTruncatedWhileOpenIsReportedNotRead) {
  TempDir dir;
  const std::string path = dir.File("shrinks.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>(5000, 7), TokenFormat::kLlmc).ok());
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->CheckNotTruncated().ok());
  std::filesystem::resize_file(path, 100);
  const Status s = (*file)->CheckNotTruncated();
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("truncated while in use"), HasSubstr("has 100 now")));
  // Replaced by rename (prepare-data's way): the mapped file is the old one, whole.
  ASSERT_TRUE(WriteTokenFile(path + ".new", {1, 2, 3}, TokenFormat::kLlmc).ok());
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>(5000, 7), TokenFormat::kLlmc).ok());
  auto again = TokenFile::Open(path);
  ASSERT_TRUE(again.ok());
  std::filesystem::rename(path + ".new", path);
  EXPECT_TRUE((*again)->CheckNotTruncated().ok());
  EXPECT_EQ((*again)->at(4999), 7u);
}

TEST(TokenFileTest, AutoReadsHeaderlessFileAsRawU16) {
  TempDir dir;
  const std::string path = dir.File("nanogpt.bin");
  ASSERT_TRUE(WriteTokenFile(path, {50256, 1, 2, 3}, TokenFormat::kRawU16).ok());
  auto file = TokenFile::Open(path, TokenFormat::kAuto);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->format(), TokenFormat::kRawU16);
  EXPECT_EQ(ReadAll(**file), (std::vector<uint32_t>{50256, 1, 2, 3}));
}

TEST(TokenFileTest, CopyRangeMatchesAt) {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 300; ++i) tokens.push_back(i * 7);
  const std::string path = dir.File("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFormat::kLlmc).ok());
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok());
  std::vector<int64_t> out(50);
  (*file)->CopyRange(100, 50, out.data());
  for (int64_t k = 0; k < 50; ++k) EXPECT_EQ(out[k], static_cast<int64_t>(tokens[100 + k]));
}

TEST(TokenFileTest, TruncatedLlmcFileSaysExpectedAndActualBytes) {
  TempDir dir;
  const std::string path = dir.File("truncated.bin");
  std::string bytes = LlmcHeader(20240520, 1, 100);  // wants 1024 + 200 = 1224 bytes
  bytes.append(76, '\x01');                          // has 1100
  WriteBytes(path, bytes);
  auto file = TokenFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("100 tokens"),
                    HasSubstr("1224 bytes"), HasSubstr("1100 bytes")));
}

TEST(TokenFileTest, LlmcHeaderCountBelowFileSizeIsRejected) {
  TempDir dir;
  const std::string path = dir.File("long.bin");
  std::string bytes = LlmcHeader(20240520, 1, 10);  // wants 1044 bytes
  bytes.append(60, '\x00');                         // has 1084
  WriteBytes(path, bytes);
  auto file = TokenFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("1084 bytes"),
                                             HasSubstr("10 tokens"), HasSubstr("1044 bytes")));
}

TEST(TokenFileTest, LlmcFileShorterThanHeaderIsRejected) {
  TempDir dir;
  const std::string path = dir.File("short.bin");
  WriteBytes(path, LlmcHeader(20240520, 1, 0).substr(0, 100));
  auto file = TokenFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(),
              AllOf(HasSubstr(path), HasSubstr("100 bytes"), HasSubstr("1024-byte")));
}

TEST(TokenFileTest, UnknownLlmcVersionIsRejected) {
  TempDir dir;
  const std::string path = dir.File("v3.bin");
  std::string bytes = LlmcHeader(20240520, 3, 1);
  bytes.append(4, '\x00');
  WriteBytes(path, bytes);
  auto file = TokenFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("version 3")));
}

TEST(TokenFileTest, LlmcHeaderWithZeroTokensIsRejected) {
  TempDir dir;
  const std::string path = dir.File("none.bin");
  WriteBytes(path, LlmcHeader(20240520, 1, 0));
  auto file = TokenFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("no tokens")));
}

TEST(TokenFileTest, ExplicitLlmcWithoutMagicIsRejected) {
  TempDir dir;
  const std::string path = dir.File("raw.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>(600, 9), TokenFormat::kRawU16).ok());
  auto file = TokenFile::Open(path, TokenFormat::kLlmc);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("magic")));
}

TEST(TokenFileTest, RawFileWithPartialTokenIsRejected) {
  TempDir dir;
  const std::string odd = dir.File("odd.bin");
  WriteBytes(odd, std::string(1001, 'a'));
  auto u16 = TokenFile::Open(odd, TokenFormat::kRawU16);
  ASSERT_FALSE(u16.ok());
  EXPECT_EQ(u16.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(u16.status().message(),
              AllOf(HasSubstr(odd), HasSubstr("1001 bytes"), HasSubstr("2-byte")));

  const std::string six = dir.File("six.bin");
  WriteBytes(six, std::string(6, 'a'));
  auto u32 = TokenFile::Open(six, TokenFormat::kRawU32);
  ASSERT_FALSE(u32.ok());
  EXPECT_THAT(u32.status().message(),
              AllOf(HasSubstr(six), HasSubstr("6 bytes"), HasSubstr("4-byte")));
}

TEST(TokenFileTest, EmptyFileIsRejected) {
  TempDir dir;
  const std::string path = dir.File("empty.bin");
  WriteBytes(path, "");
  for (TokenFormat f : {TokenFormat::kAuto, TokenFormat::kLlmc, TokenFormat::kRawU16}) {
    auto file = TokenFile::Open(path, f);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
    EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("empty")));
  }
}

TEST(TokenFileTest, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.File("nope/missing.bin");
  auto file = TokenFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
}

TEST(TokenFileTest, DirectoryIsNotATokenFile) {
  TempDir dir;
  auto file = TokenFile::Open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(file.status().message(), HasSubstr(dir.path()));
}

TEST(TokenFileTest, RawU16WriteRejectsTokenAbove16BitsNamingIt) {
  TempDir dir;
  const std::string path = dir.File("t.bin");
  Status s = WriteTokenFile(path, {1, 2, 70000, 3}, TokenFormat::kRawU16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("70000"), HasSubstr("position 2")));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TokenFileTest, WriteRefusesEmptyTokenList) {
  TempDir dir;
  Status s = WriteTokenFile(dir.File("t.bin"), {}, TokenFormat::kLlmc);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
}

TEST(TokenFileTest, WriteReplacesExistingFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.File("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>(1000, 1), TokenFormat::kLlmc).ok());
  ASSERT_TRUE(WriteTokenFile(path, {4, 5}, TokenFormat::kLlmc).ok());
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(ReadAll(**file), (std::vector<uint32_t>{4, 5}));
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(TokenFileTest, WriteIntoMissingDirectoryIsIOError) {
  TempDir dir;
  const std::string path = dir.File("no/such/dir/t.bin");
  Status s = WriteTokenFile(path, {1}, TokenFormat::kLlmc);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST(TokenFileTest, ParseTokenFormatAcceptsEachNameAndNamesKeyOnError) {
  for (TokenFormat f :
       {TokenFormat::kAuto, TokenFormat::kLlmc, TokenFormat::kRawU16, TokenFormat::kRawU32}) {
    auto parsed = ParseTokenFormat(TokenFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  auto bad = ParseTokenFormat("u16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("data.token_format"), HasSubstr("'u16'")));
}

}  // namespace
}  // namespace meshwork::data
