// Byte-level encoding and PrepareTokens: documents, directory walking, the train/val split and
// its errors.
#include "trainer/data/prepare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "tests/trainer/data/temp_dir.h"
#include "trainer/data/token_source.h"

namespace meshwork::data {
namespace {

using ::meshwork::data::testing::TempDir;
using ::meshwork::data::testing::WriteBytes;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint32_t> ReadTokens(const std::string& path) {
  auto file = TokenFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return {};
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < (*file)->size(); ++i) out.push_back((*file)->at(i));
  return out;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(EncodeBytesTest, AsciiRoundTripsAndSpecialsWrapTheDocument) {
  EXPECT_THAT(EncodeBytes("hi", false, false), ElementsAre('h', 'i'));
  EXPECT_THAT(EncodeBytes("hi", true, true), ElementsAre(kBosToken, 'h', 'i', kEosToken));
  EXPECT_EQ(DecodeBytes(EncodeBytes("hello, world\n", false, false)), "hello, world\n");
  EXPECT_EQ(DecodeBytes(EncodeBytes("hi", true, true)), "<|bos|>hi<|eos|>");
}

TEST(EncodeBytesTest, Utf8TextIsItsBytesAndRoundTrips) {
  const std::string text = "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82";  // héllo 世界 🙂
  const std::vector<uint32_t> tokens = EncodeBytes(text, false, false);
  ASSERT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[1], 0xC3u);
  EXPECT_EQ(tokens[2], 0xA9u);
  for (uint32_t t : tokens) EXPECT_LT(t, 256u);
  EXPECT_EQ(DecodeBytes(tokens), text);
}

TEST(EncodeBytesTest, EveryByteValueRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::vector<uint32_t> tokens = EncodeBytes(all, false, false);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokens[b], static_cast<uint32_t>(b));
  EXPECT_EQ(DecodeBytes(tokens), all);
}

TEST(EncodeBytesTest, PadAndTokensAboveTheByteVocabularyRenderVisibly) {
  EXPECT_EQ(DecodeBytes({'a', static_cast<uint32_t>(kPadToken), 300, 'b'}), "a<|pad|><|300|>b");
  EXPECT_EQ(kByteVocabSize, 259);
}

// A corpus directory: two text documents, one binary file and one empty file.
class PrepareTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = dir_.File("corpus");
    WriteBytes(corpus_ + "/a.txt", "hello world");                                 // 13 tokens
    WriteBytes(corpus_ + "/sub/b.txt", "The quick brown fox jumps over the dog.");  // 41 tokens
    WriteBytes(corpus_ + "/bin.dat", std::string("\x7f" "ELF\0\0\x01", 7));
    WriteBytes(corpus_ + "/empty.txt", "");
  }
  TempDir dir_;
  std::string corpus_;
};

TEST_F(PrepareTokensTest, SplitsTheTailOfEachDocumentIntoVal) {
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = dir_.File("train.bin");
  options.val_out = dir_.File("val.bin");
  options.val_fraction = 0.25;
  auto report = PrepareTokens(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->documents, 2);
  EXPECT_EQ(report->skipped_binary_files, 1);
  EXPECT_EQ(report->skipped_empty_files, 1);
  // a: 13 tokens, floor(13 * 0.25) = 3 to val. b: 41 tokens, floor(10.25) = 10 to val.
  EXPECT_EQ(report->train_tokens, 10 + 31);
  EXPECT_EQ(report->val_tokens, 3 + 10);

  const std::string b = "The quick brown fox jumps over the dog.";
  const std::vector<uint32_t> a_tokens = EncodeBytes("hello world", true, true);
  const std::vector<uint32_t> b_tokens = EncodeBytes(b, true, true);
  // Sorted walk: a.txt before sub/b.txt.
  EXPECT_EQ(ReadTokens(options.train_out),
            Concat({a_tokens.begin(), a_tokens.begin() + 10}, {b_tokens.begin(), b_tokens.begin() + 31}));
  EXPECT_EQ(ReadTokens(options.val_out),
            Concat({a_tokens.begin() + 10, a_tokens.end()}, {b_tokens.begin() + 31, b_tokens.end()}));
  EXPECT_EQ(DecodeBytes(ReadTokens(options.val_out)), "ld<|eos|>" + b.substr(30) + "<|eos|>");
}

TEST_F(PrepareTokensTest, WithoutValOutEverythingGoesToTrain) {
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = dir_.File("train.bin");
  auto report = PrepareTokens(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->train_tokens, 13 + 41);
  EXPECT_EQ(report->val_tokens, 0);
  EXPECT_EQ(DecodeBytes(ReadTokens(options.train_out)),
            "<|bos|>hello world<|eos|><|bos|>The quick brown fox jumps over the dog.<|eos|>");
}

TEST_F(PrepareTokensTest, NamedFilesKeepTheirCommandLineOrder) {
  PrepareOptions options;
  options.inputs = {corpus_ + "/sub/b.txt", corpus_ + "/a.txt"};
  options.train_out = dir_.File("train.bin");
  options.format = TokenFormat::kRawU16;
  auto report = PrepareTokens(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(std::filesystem::file_size(options.train_out), 2u * (41 + 13));
  EXPECT_EQ(ReadTokens(options.train_out),
            Concat(EncodeBytes("The quick brown fox jumps over the dog.", true, true),
                   EncodeBytes("hello world", true, true)));
}

TEST_F(PrepareTokensTest, SplitPointMovesPastUtf8ContinuationBytes) {
  // 12 tokens: BOS a..h C3 A9 EOS. floor(12 * 0.2) = 2 would start val at A9, mid-character.
  const std::string text = "abcdefgh\xc3\xa9";
  WriteBytes(dir_.File("utf8.txt"), text);
  PrepareOptions options;
  options.inputs = {dir_.File("utf8.txt")};
  options.train_out = dir_.File("train.bin");
  options.val_out = dir_.File("val.bin");
  options.val_fraction = 0.2;
  auto report = PrepareTokens(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(DecodeBytes(ReadTokens(options.train_out)), "<|bos|>" + text);
  EXPECT_EQ(ReadTokens(options.val_out), std::vector<uint32_t>{static_cast<uint32_t>(kEosToken)});
}

TEST_F(PrepareTokensTest, PreparedFileFeedsAFileTokenSource) {
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = dir_.File("train.bin");
  ASSERT_TRUE(PrepareTokens(options).ok());
  auto source = MakeTokenSource(options.train_out, TokenFormat::kAuto, 8, 320, 1);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto batch = (*source)->Rows(0, 0, 4);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_LT(batch->inputs.max().item<int64_t>(), kByteVocabSize);
}

TEST_F(PrepareTokensTest, MissingInputIsNotFoundNamingIt) {
  PrepareOptions options;
  options.inputs = {corpus_, dir_.File("missing.txt")};
  options.train_out = dir_.File("train.bin");
  auto report = PrepareTokens(options);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(report.status().message(), HasSubstr(dir_.File("missing.txt")));
  EXPECT_FALSE(std::filesystem::exists(options.train_out));
}

TEST_F(PrepareTokensTest, ValFractionOutsideZeroToOneIsInvalidConfig) {
  for (double bad : {1.0, -0.1, 1.5}) {
    PrepareOptions options;
    options.inputs = {corpus_};
    options.train_out = dir_.File("train.bin");
    options.val_out = dir_.File("val.bin");
    options.val_fraction = bad;
    auto report = PrepareTokens(options);
    ASSERT_FALSE(report.ok());
    EXPECT_EQ(report.status().code(), StatusCode::kInvalidConfig);
    std::ostringstream value;
    value << bad;
    EXPECT_THAT(report.status().message(), AllOf(HasSubstr("val_fraction"), HasSubstr(value.str())));
  }
}

TEST_F(PrepareTokensTest, ZeroValFractionWithValOutIsInvalidConfig) {
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = dir_.File("train.bin");
  options.val_out = dir_.File("val.bin");
  options.val_fraction = 0.0;
  EXPECT_EQ(PrepareTokens(options).status().code(), StatusCode::kInvalidConfig);
}

TEST_F(PrepareTokensTest, DocumentsTooShortForAnyValTokenAreInvalidInput) {
  WriteBytes(dir_.File("short.txt"), "hi");  // 4 tokens: floor(4 * 0.1) = 0
  PrepareOptions options;
  options.inputs = {dir_.File("short.txt")};
  options.train_out = dir_.File("train.bin");
  options.val_out = dir_.File("val.bin");
  auto report = PrepareTokens(options);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(report.status().message(), HasSubstr("val split is empty"));
}

TEST_F(PrepareTokensTest, NoTextAtAllIsInvalidInput) {
  const std::string only_junk = dir_.File("junk");
  WriteBytes(only_junk + "/empty.txt", "");
  WriteBytes(only_junk + "/blob.bin", std::string("\0\1\2", 3));
  PrepareOptions options;
  options.inputs = {only_junk};
  options.train_out = dir_.File("train.bin");
  auto report = PrepareTokens(options);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(report.status().message(),
              AllOf(HasSubstr(only_junk), HasSubstr("1 empty"), HasSubstr("1 binary")));
}

TEST_F(PrepareTokensTest, BinaryFileNamedDirectlyIsInvalidInput) {
  PrepareOptions options;
  options.inputs = {corpus_ + "/bin.dat"};
  options.train_out = dir_.File("train.bin");
  auto report = PrepareTokens(options);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(report.status().message(), AllOf(HasSubstr("bin.dat"), HasSubstr("NUL")));
}

// JSON Lines: one document per line in the named field; blank lines and empty strings skipped;
// every malformed line named by file and line, with nothing written.
TEST_F(PrepareTokensTest, JsonLinesTakeOneDocumentPerLineFromTheField) {
  WriteBytes(dir_.File("docs.jsonl"),
             "{\"text\": \"hi\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"gr\\u00fc\\u00dfe\\n\"}\r\n{\"text\": \"\"}\n");
  PrepareOptions options;
  options.inputs = {dir_.File("docs.jsonl")};
  options.train_out = dir_.File("train.bin");
  options.field = "text";
  auto report = PrepareTokens(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->documents, 2);
  EXPECT_EQ(report->skipped_empty_documents, 1);
  EXPECT_EQ(DecodeBytes(ReadTokens(options.train_out)), "<|bos|>hi<|eos|><|bos|>grüße\n<|eos|>");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"text\": \"ok\"}\n{\"body\": \"x\"}\n", "line 2 has no field 'text' (--field)"},
      {"{\"text\": \"ok\"}\n[1, 2]\n", "line 2 is not a JSON object"},
      {"{\"text\": 7}\n", "line 1: field 'text' is number, not a string"},
      {"\n\n{\"text\": \"unterminated}\n", "line 3 is not JSON"},
      {"{\"text\": \"bad \xff\"}\n", "line 1 is not JSON"},
  };
  for (const auto& [content, want] : bad) {
    WriteBytes(dir_.File("bad.jsonl"), content);
    options.inputs = {dir_.File("bad.jsonl")};
    options.train_out = dir_.File("bad.bin");
    auto refused = PrepareTokens(options);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidInput) << content;
    EXPECT_THAT(refused.status().message(), AllOf(HasSubstr("bad.jsonl"), HasSubstr(want))) << content;
    EXPECT_FALSE(std::filesystem::exists(options.train_out)) << content;
  }
}

// The pipeline reads in ~4 MB chunks and encodes them on several threads: the file written is
// the same whatever the thread count, no line is lost or doubled at a chunk boundary, and line
// numbers past the first chunk are the file's.
TEST_F(PrepareTokensTest, ChunkedParallelOutputIsTheSameAtAnyThreadCount) {
  std::string jsonl;
  int64_t lines = 0;
  std::string expected;
  while (jsonl.size() < (size_t{9} << 20)) {  // three chunks and a bit
    const std::string text = "document " + std::to_string(lines) + std::string(lines % 97, 'x');
    jsonl += "{\"text\": \"" + text + "\"}\n";
    expected += "<|bos|>" + text + "<|eos|>";
    ++lines;
  }
  WriteBytes(dir_.File("big.jsonl"), jsonl);
  WriteBytes(dir_.File("small.jsonl"), "{\"text\": \"last\"}");  // no final newline
  expected += "<|bos|>last<|eos|>";
  std::vector<std::vector<uint32_t>> outputs;
  for (int threads : {1, 2, 5}) {
    PrepareOptions options;
    options.inputs = {dir_.File("big.jsonl"), dir_.File("small.jsonl")};
    options.train_out = dir_.File("t" + std::to_string(threads) + ".bin");
    options.field = "text";
    options.threads = threads;
    auto report = PrepareTokens(options);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->documents, lines + 1);
    EXPECT_EQ(report->input_bytes, static_cast<int64_t>(jsonl.size()) + 16);
    outputs.push_back(ReadTokens(options.train_out));
  }
  EXPECT_EQ(DecodeBytes(outputs[0]), expected);
  EXPECT_EQ(outputs[1], outputs[0]);
  EXPECT_EQ(outputs[2], outputs[0]);

  // A bad line in the third chunk is named by its line in the file, and nothing is written.
  const size_t third = jsonl.find('\n', size_t{8} << 20) + 1;
  const int64_t bad_line = 1 + std::count(jsonl.begin(), jsonl.begin() + static_cast<std::ptrdiff_t>(third), '\n');
  jsonl.insert(third, "{\"title\": \"no text\"}\n");
  WriteBytes(dir_.File("big.jsonl"), jsonl);
  PrepareOptions options;
  options.inputs = {dir_.File("big.jsonl")};
  options.train_out = dir_.File("bad.bin");
  options.val_out = dir_.File("bad_val.bin");
  options.field = "text";
  options.threads = 3;
  auto refused = PrepareTokens(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(refused.status().message(), HasSubstr("big.jsonl' line " + std::to_string(bad_line) + " has no field"));
  EXPECT_FALSE(std::filesystem::exists(options.train_out));
  EXPECT_FALSE(std::filesystem::exists(options.val_out));
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr("bad"))) << "a temporary was left behind";
  }
}

// With several bad inputs the error is the first in input order, whichever worker saw its own first.
TEST_F(PrepareTokensTest, TheFirstErrorInInputOrderIsTheOneReported) {
  std::vector<std::string> inputs;
  for (int i = 0; i < 12; ++i) {
    const std::string name = dir_.File("f" + std::to_string(10 + i) + ".jsonl");
    // Files 15 and 20 are bad; file 20 is short, so a worker is done with it first.
    const std::string good = "{\"text\": \"" + std::string(200000, 'a') + "\"}\n";
    WriteBytes(name, i == 5 ? good + "{\"text\": 5}\n" : i == 10 ? "nope\n" : good);
    inputs.push_back(name);
  }
  for (int threads : {1, 4}) {
    PrepareOptions options;
    options.inputs = inputs;
    options.train_out = dir_.File("out.bin");
    options.field = "text";
    options.threads = threads;
    auto refused = PrepareTokens(options);
    EXPECT_THAT(refused.status().message(), HasSubstr("f15.jsonl' line 2")) << threads;
  }
}

TEST_F(PrepareTokensTest, ProgressLinesSayDocumentsTokensAndRate) {
  std::ostringstream progress;
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = dir_.File("train.bin");
  options.progress = &progress;
  options.progress_seconds = 1e-9;  // after every chunk
  auto report = PrepareTokens(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(progress.str(), AllOf(HasSubstr("prepare-data: 2 documents, 54 tokens, 0.0 MB in"), HasSubstr("MB/s)")));
  EXPECT_EQ(report->input_bytes, 11 + 39);
}

// A tokenizer with ids past 65535 is written as uint32 (llm.c version 2) even when this corpus's
// ids happen to be small; raw_u16 cannot hold such a vocabulary and says so before reading.
TEST_F(PrepareTokensTest, VocabulariesPast65535AreWrittenAsUint32) {
  class WideBytes : public Tokenizer {
   public:
    explicit WideBytes(std::unique_ptr<Tokenizer> bytes)
        : Tokenizer(TokenizerKind::kBytes, "wide"), bytes_(std::move(bytes)) {
      bos_ = bytes_->bos();
      eos_ = bytes_->eos();
    }
    Result<std::vector<uint32_t>> Encode(std::string_view text) const override { return bytes_->Encode(text); }
    Result<std::string> Decode(const std::vector<uint32_t>& ids) const override { return bytes_->Decode(ids); }
    int64_t VocabSize() const override { return 128256; }
   private:
    std::unique_ptr<Tokenizer> bytes_;
  };
  auto bytes = LoadTokenizer("bytes");
  ASSERT_TRUE(bytes.ok());
  WideBytes wide(std::move(*bytes));
  PrepareOptions options;
  options.inputs = {corpus_ + "/a.txt"};
  options.train_out = dir_.File("wide.bin");
  options.tokenizer = &wide;
  ASSERT_TRUE(PrepareTokens(options).ok());
  auto file = TokenFile::Open(options.train_out);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->bytes_per_token(), 4);
  EXPECT_EQ((*file)->tokenizer_vocab_size(), 128256);

  options.format = TokenFormat::kRawU16;
  options.train_out = dir_.File("narrow.bin");
  auto refused = PrepareTokens(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(refused.status().message(), AllOf(HasSubstr("narrow.bin"), HasSubstr("16 bits")));
}

// Reading a directory that holds an earlier run's output: that token file is binary and skipped,
// not refused as "the output is an input".
TEST_F(PrepareTokensTest, ASecondRunOverTheDirectoryHoldingItsOutputSkipsIt) {
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = corpus_ + "/train.bin";
  ASSERT_TRUE(PrepareTokens(options).ok());
  auto again = PrepareTokens(options);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->skipped_binary_files, 2);  // bin.dat and the first run's train.bin
  EXPECT_EQ(again->documents, 2);
  // A text file in the directory that is also the output is still refused.
  options.train_out = corpus_ + "/a.txt";
  EXPECT_EQ(PrepareTokens(options).status().code(), StatusCode::kInvalidConfig);
}

// An output that is a directory is refused before anything is written, so the other output is
// not replaced either.
TEST_F(PrepareTokensTest, AnOutputThatIsADirectoryIsRefusedAndNothingIsReplaced) {
  WriteBytes(dir_.File("train.bin"), "old");
  std::filesystem::create_directories(dir_.File("val.bin"));
  PrepareOptions options;
  options.inputs = {corpus_};
  options.train_out = dir_.File("train.bin");
  options.val_out = dir_.File("val.bin");
  auto refused = PrepareTokens(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(refused.status().message(), HasSubstr("val.bin' is a directory"));
  EXPECT_EQ(std::filesystem::file_size(options.train_out), 3u);
}

// A bad line before a NUL byte in the same (not first) chunk is the error reported.
TEST_F(PrepareTokensTest, ABadLineBeforeANulInOneChunkIsReportedFirst) {
  std::string jsonl;
  while (jsonl.size() < (size_t{5} << 20)) jsonl += "{\"text\": \"a line of text\"}\n";
  const int64_t lines = std::count(jsonl.begin(), jsonl.end(), '\n');
  jsonl += "not json\n";
  jsonl += std::string("{\"text\": \"x\0y\"}\n", 16);
  WriteBytes(dir_.File("nul.jsonl"), jsonl);
  PrepareOptions options;
  options.inputs = {dir_.File("nul.jsonl")};
  options.train_out = dir_.File("out.bin");
  options.field = "text";
  auto refused = PrepareTokens(options);
  EXPECT_THAT(refused.status().message(), HasSubstr("line " + std::to_string(lines + 1) + " is not JSON"));
  // Without the bad line, the NUL is named at its line.
  jsonl.erase(jsonl.find("not json\n"), 9);
  WriteBytes(dir_.File("nul.jsonl"), jsonl);
  refused = PrepareTokens(options);
  EXPECT_THAT(refused.status().message(), HasSubstr("line " + std::to_string(lines + 1) + " has a NUL byte"));
  EXPECT_FALSE(std::filesystem::exists(options.train_out));
}

}  // namespace
}  // namespace meshwork::data
