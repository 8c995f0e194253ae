// Tokenizer loading, separators, UTF-8 checks and the vocabulary recorded in token files. The
// comparison with the reference libraries on real trained tokenizers is tokenizer_e2e.sh.
#include "trainer/data/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/trainer/data/temp_dir.h"
#include "trainer/data/prepare.h"
#include "trainer/data/token_file.h"
#include "trainer/data/token_source.h"

namespace meshwork::data {
namespace {

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

const std::string kWordLevel = std::string(MESHWORK_SOURCE_DIR) + "/tests/trainer/data/testdata/wordlevel";

#define SKIP_WITHOUT_HF()                                                                        \
  if (!HaveHuggingFaceTokenizers()) GTEST_SKIP() << "this build has no Hugging Face tokenizers " \
                                                    "(no cargo at configure time)"

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("grüße 日本 🎉"), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("ab\xff"), 2u);
  EXPECT_EQ(FirstInvalidUtf8("a\xc3"), 1u);              // truncated sequence
  EXPECT_EQ(FirstInvalidUtf8("a\xc0\xaf"), 1u);          // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("a\xed\xa0\x80"), 1u);      // a surrogate, U+D800
  EXPECT_EQ(FirstInvalidUtf8("a\xf4\x90\x80\x80"), 1u);  // past U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xe2\x82"), 0u);
  EXPECT_EQ(FirstInvalidUtf8("ok \xf0\x9f\x8e\x89 \x80"), 8u);  // a lone continuation byte
}

TEST(Tokenizer, BytesIsTheByteVocabulary) {
  auto tok = LoadTokenizer("bytes");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->kind(), TokenizerKind::kBytes);
  EXPECT_EQ((*tok)->VocabSize(), kByteVocabSize);
  EXPECT_EQ((*tok)->bos(), std::optional<uint32_t>(kBosToken));
  EXPECT_EQ((*tok)->eos(), static_cast<uint32_t>(kEosToken));
  auto ids = (*tok)->Encode("h\xff");
  ASSERT_TRUE(ids.ok());  // any bytes
  EXPECT_EQ(*ids, (std::vector<uint32_t>{'h', 0xff}));
  EXPECT_EQ(LoadTokenizer("bytes", {"<s>", ""}).status().code(), StatusCode::kInvalidConfig);
}

TEST(Tokenizer, MissingAndUnknownFilesAreRefused) {
  TempDir dir;
  auto missing = LoadTokenizer(dir.path() + "/nope.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json' does not exist"), std::string::npos);
  auto empty_dir = LoadTokenizer(dir.path());
  EXPECT_EQ(empty_dir.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty_dir.status().message().find("neither tokenizer.json nor tokenizer.model"), std::string::npos);
  WriteBytes(dir.path() + "/vocab.txt", "a\nb\n");
  auto other = LoadTokenizer(dir.path() + "/vocab.txt");
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(other.status().message().find("vocab.txt"), std::string::npos);
}

TEST(HfTokenizer, EncodesWholeDocumentsWithoutTheFilesTruncation) {
  SKIP_WITHOUT_HF();
  auto tok = LoadTokenizer(kWordLevel);  // the directory: tokenizer.json inside
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->kind(), TokenizerKind::kHuggingFace);
  EXPECT_EQ((*tok)->VocabSize(), 8);
  // The file truncates to 2 tokens; a document must come out whole.
  auto ids = (*tok)->Encode("hello world ! grüße hello there <|sep|>");
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(*ids, (std::vector<uint32_t>{3, 4, 5, 6, 3, 0, 7}));
  auto batch = (*tok)->EncodeBatch({"hello", "", "world !"});
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  EXPECT_EQ(*batch, (std::vector<std::vector<uint32_t>>{{3}, {}, {4, 5}}));
  auto text = (*tok)->Decode({3, 4});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "hello world");
}

TEST(HfTokenizer, InvalidUtf8IsAnErrorNamingTheOffset) {
  SKIP_WITHOUT_HF();
  auto tok = LoadTokenizer(kWordLevel);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto ids = (*tok)->Encode("hello \xc3(");
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(ids.status().message().find("byte offset 6"), std::string::npos) << ids.status().message();
  auto batch = (*tok)->EncodeBatch({"hello", "wor\xffld"});
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(batch.status().message().find("text 1 of the batch"), std::string::npos) << batch.status().message();
}

TEST(HfTokenizer, SeparatorsByUsualNameByConfigAndByFlag) {
  SKIP_WITHOUT_HF();
  TempDir dir;
  const std::string json = ReadBytes(kWordLevel + "/tokenizer.json");
  WriteBytes(dir.path() + "/tokenizer.json", json);
  auto usual = LoadTokenizer(dir.path());
  ASSERT_TRUE(usual.ok()) << usual.status().message();
  EXPECT_EQ((*usual)->bos(), std::optional<uint32_t>(1));
  EXPECT_EQ((*usual)->eos(), 2u);
  EXPECT_NE((*usual)->specials_source().find("the usual name </s>"), std::string::npos);

  // tokenizer_config.json: an AddedToken object for eos, null bos (then the usual name).
  WriteBytes(dir.path() + "/tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "<|sep|>"}})");
  auto config = LoadTokenizer(dir.path());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ((*config)->eos(), 7u);
  EXPECT_EQ((*config)->bos(), std::optional<uint32_t>(1));
  EXPECT_NE((*config)->specials_source().find("tokenizer_config.json"), std::string::npos);

  auto flag = LoadTokenizer(dir.path(), {"<|sep|>", "<s>"});
  ASSERT_TRUE(flag.ok()) << flag.status().message();
  EXPECT_EQ((*flag)->bos(), std::optional<uint32_t>(7));
  EXPECT_EQ((*flag)->eos(), 1u);
  EXPECT_EQ((*flag)->specials_source(), "--bos-token, --eos-token");

  auto unknown = LoadTokenizer(dir.path(), {"", "<|nope|>"});
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(unknown.status().message().find("--eos-token '<|nope|>' is not a token of"), std::string::npos)
      << unknown.status().message();

  WriteBytes(dir.path() + "/tokenizer_config.json", R"({"eos_token": "<|missing|>"})");
  auto bad_config = LoadTokenizer(dir.path());
  EXPECT_EQ(bad_config.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(bad_config.status().message().find("eos_token '<|missing|>' is not a token of"), std::string::npos)
      << bad_config.status().message();
  WriteBytes(dir.path() + "/tokenizer_config.json", "{not json");
  EXPECT_EQ(LoadTokenizer(dir.path()).status().code(), StatusCode::kInvalidInput);
}

TEST(HfTokenizer, NoEndOfDocumentTokenIsRefused) {
  SKIP_WITHOUT_HF();
  TempDir dir;
  std::string json = ReadBytes(kWordLevel + "/tokenizer.json");
  for (const std::string from : {"\"</s>\"", "\"<s>\""}) {
    for (size_t at = json.find(from); at != std::string::npos; at = json.find(from)) {
      json.replace(at, from.size(), from == "\"</s>\"" ? "\"[END]\"" : "\"[BEGIN]\"");
    }
  }
  WriteBytes(dir.path() + "/tokenizer.json", json);
  auto tok = LoadTokenizer(dir.path());
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(tok.status().message().find("names no end-of-document token"), std::string::npos) << tok.status().message();
  auto named = LoadTokenizer(dir.path(), {"", "[END]"});
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_FALSE((*named)->bos().has_value());  // documents then are text + eos
}

TEST(TokenFileVocab, RecordedInTheHeaderAndCheckedAgainstTheModel) {
  TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 70000, 4}, TokenFormat::kLlmc, 128256).ok());
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->tokenizer_vocab_size(), 128256);
  EXPECT_EQ((*file)->bytes_per_token(), 4);
  EXPECT_TRUE(CheckTokenizerFitsModel(**file, 128256).ok());
  const Status small = CheckTokenizerFitsModel(**file, 32000);
  EXPECT_EQ(small.code(), StatusCode::kInvalidInput);
  EXPECT_NE(small.message().find("tokenizer of 128256 tokens (its header), but the model's vocab_size is 32000"),
            std::string::npos)
      << small.message();
  // A file that records nothing (llm.c's own, raw files) passes.
  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 3}, TokenFormat::kLlmc).ok());
  auto plain = TokenFile::Open(path);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->tokenizer_vocab_size(), 0);
  EXPECT_TRUE(CheckTokenizerFitsModel(**plain, 4).ok());
  // A token the tokenizer cannot have made is refused before anything is written.
  const Status outside = WriteTokenFile(dir.path() + "/u.bin", {1, 9}, TokenFormat::kLlmc, 8);
  EXPECT_EQ(outside.code(), StatusCode::kInvalidInput);
  EXPECT_NE(outside.message().find("token 9 at position 1 is outside the tokenizer's 8 ids"), std::string::npos)
      << outside.message();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/u.bin"));
}

TEST(PrepareWithTokenizer, DocumentsAreFramedAndInvalidUtf8NamesFileAndLine) {
  SKIP_WITHOUT_HF();
  auto tok = LoadTokenizer(kWordLevel);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  TempDir dir;
  WriteBytes(dir.path() + "/a.txt", "hello world");
  WriteBytes(dir.path() + "/b.txt", "grüße !");
  PrepareOptions o;
  o.inputs = {dir.path() + "/a.txt", dir.path() + "/b.txt"};
  o.train_out = dir.path() + "/out.bin";
  o.tokenizer = tok->get();
  auto report = PrepareTokens(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->train_tokens, 8);
  auto file = TokenFile::Open(o.train_out);
  ASSERT_TRUE(file.ok());
  std::vector<uint32_t> got;
  for (int64_t i = 0; i < (*file)->size(); ++i) got.push_back((*file)->at(i));
  EXPECT_EQ(got, (std::vector<uint32_t>{1, 3, 4, 2, 1, 6, 5, 2}));
  EXPECT_EQ((*file)->tokenizer_vocab_size(), 8);

  WriteBytes(dir.path() + "/bad.txt", "hello\nworld \xff\n");
  o.inputs = {dir.path() + "/bad.txt"};
  o.train_out = dir.path() + "/bad.bin";
  auto bad = PrepareTokens(o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(bad.status().message().find("bad.txt' is not UTF-8: invalid byte 0xff at line 2, byte offset 12"),
            std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(std::filesystem::exists(o.train_out));
}

}  // namespace
}  // namespace meshwork::data
