// Batch sampling: rows as a pure function of (seed, step, row), shifted targets, rank slicing,
// vocabulary checks and contiguous evaluation windows.
#include "trainer/data/token_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "tests/trainer/data/temp_dir.h"

namespace meshwork::data {
namespace {

using ::meshwork::data::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kSeqLen = 16;
constexpr int64_t kNumTokens = 5000;
constexpr int64_t kVocab = 65536;

// Token i of the file is i, so a window's content reveals where it starts.
class FileTokenSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint32_t> tokens(kNumTokens);
    for (int64_t i = 0; i < kNumTokens; ++i) tokens[i] = static_cast<uint32_t>(i);
    path_ = dir_.File("positions.bin");
    ASSERT_TRUE(WriteTokenFile(path_, tokens, TokenFormat::kLlmc).ok());
  }

  std::unique_ptr<FileTokenSource> Source(uint64_t seed, int64_t seq_len = kSeqLen) {
    auto file = TokenFile::Open(path_);
    EXPECT_TRUE(file.ok());
    auto source = FileTokenSource::Create(std::move(file).value(), seq_len, kVocab, seed);
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    return std::move(source).value();
  }

  static Batch MustRows(TokenSource& source, int64_t step, int64_t first, int64_t n) {
    auto batch = source.Rows(step, first, n);
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
    return std::move(batch).value();
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(FileTokenSourceTest, RowsAreInt64WithSeqLenColumns) {
  auto source = Source(1);
  Batch b = MustRows(*source, 0, 0, 3);
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{3, kSeqLen}));
  EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{3, kSeqLen}));
  EXPECT_EQ(b.inputs.scalar_type(), torch::kLong);
  EXPECT_EQ(b.targets.scalar_type(), torch::kLong);
  EXPECT_TRUE(b.inputs.is_contiguous());
  EXPECT_TRUE(b.targets.is_contiguous());
  EXPECT_TRUE(b.inputs.device().is_cpu());
}

TEST_F(FileTokenSourceTest, SameSeedStepAndRowsGiveIdenticalBatchesAcrossInstances) {
  auto a = Source(42);
  auto b = Source(42);
  Batch x = MustRows(*a, 7, 0, 8);
  Batch y = MustRows(*b, 7, 0, 8);
  EXPECT_TRUE(torch::equal(x.inputs, y.inputs));
  EXPECT_TRUE(torch::equal(x.targets, y.targets));
  // Asking again (e.g. after resuming at step 7) repeats it too.
  Batch z = MustRows(*a, 7, 0, 8);
  EXPECT_TRUE(torch::equal(x.inputs, z.inputs));
}

TEST_F(FileTokenSourceTest, DifferentStepOrSeedGivesDifferentRows) {
  auto a = Source(42);
  auto other_seed = Source(43);
  Batch s7 = MustRows(*a, 7, 0, 8);
  EXPECT_FALSE(torch::equal(s7.inputs, MustRows(*a, 8, 0, 8).inputs));
  EXPECT_FALSE(torch::equal(s7.inputs, MustRows(*other_seed, 7, 0, 8).inputs));
}

TEST_F(FileTokenSourceTest, RankSlicesConcatenateToTheGlobalBatch) {
  auto source = Source(3);
  Batch global = MustRows(*source, 11, 0, 8);
  Batch first = MustRows(*source, 11, 0, 4);
  Batch second = MustRows(*source, 11, 4, 4);
  EXPECT_TRUE(torch::equal(global.inputs, torch::cat({first.inputs, second.inputs})));
  EXPECT_TRUE(torch::equal(global.targets, torch::cat({first.targets, second.targets})));
  // Uneven slices, as with gradient accumulation micro-batches of different sizes.
  Batch a = MustRows(*source, 11, 0, 3);
  Batch b = MustRows(*source, 11, 3, 1);
  Batch c = MustRows(*source, 11, 4, 4);
  EXPECT_TRUE(torch::equal(global.inputs, torch::cat({a.inputs, b.inputs, c.inputs})));
}

TEST_F(FileTokenSourceTest, TargetsAreInputsShiftedByOneInsideTheWindow) {
  auto source = Source(5);
  Batch b = MustRows(*source, 2, 10, 6);
  EXPECT_TRUE(torch::equal(b.targets.narrow(1, 0, kSeqLen - 1), b.inputs.narrow(1, 1, kSeqLen - 1)));
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t start = source->WindowStart(2, 10 + r);
    // The file holds its positions, so the window is start, start + 1, ...
    EXPECT_TRUE(torch::equal(b.inputs[r], torch::arange(start, start + kSeqLen, torch::kLong)));
    EXPECT_TRUE(
        torch::equal(b.targets[r], torch::arange(start + 1, start + 1 + kSeqLen, torch::kLong)));
  }
}

TEST_F(FileTokenSourceTest, WindowStartIsTheDocumentedHash) {
  auto source = Source(9);
  for (int64_t row = 0; row < 20; ++row) {
    EXPECT_EQ(source->WindowStart(4, row),
              static_cast<int64_t>(RowHash(9, 4, row) % (kNumTokens - kSeqLen)));
  }
}

TEST_F(FileTokenSourceTest, WindowsStayInsideTheFileAndSpreadOverIt) {
  auto source = Source(1234);
  std::set<int64_t> starts;
  for (int64_t row = 0; row < 2000; ++row) {
    const int64_t s = source->WindowStart(0, row);
    ASSERT_GE(s, 0);
    ASSERT_LE(s + kSeqLen + 1, kNumTokens);
    starts.insert(s);
  }
  EXPECT_GT(starts.size(), 1000u);
  EXPECT_LT(*starts.begin(), 50);
  EXPECT_GT(*starts.rbegin(), kNumTokens - kSeqLen - 50);
}

TEST_F(FileTokenSourceTest, WindowOfTheWholeFileIsTheOnlyStart) {
  auto source = Source(77, kNumTokens - 1);
  Batch b = MustRows(*source, 3, 0, 2);
  EXPECT_EQ(b.inputs[0][0].item<int64_t>(), 0);
  EXPECT_EQ(b.targets[1][kNumTokens - 2].item<int64_t>(), kNumTokens - 1);
}

TEST_F(FileTokenSourceTest, ZeroRowsGiveAnEmptyBatch) {
  auto source = Source(1);
  Batch b = MustRows(*source, 0, 5, 0);
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{0, kSeqLen}));
}

TEST_F(FileTokenSourceTest, NegativeArgumentsAreInternalErrors) {
  auto source = Source(1);
  EXPECT_EQ(source->Rows(-1, 0, 1).status().code(), StatusCode::kInternal);
  EXPECT_EQ(source->Rows(0, -1, 1).status().code(), StatusCode::kInternal);
  EXPECT_EQ(source->Rows(0, 0, -1).status().code(), StatusCode::kInternal);
}

TEST_F(FileTokenSourceTest, FileShorterThanOneWindowIsRejectedAtCreate) {
  auto file = TokenFile::Open(path_);
  ASSERT_TRUE(file.ok());
  auto source = FileTokenSource::Create(std::move(file).value(), kNumTokens, kVocab, 1);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(source.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("5000 tokens"), HasSubstr("5001")));
}

TEST_F(FileTokenSourceTest, NonPositiveSeqLenOrVocabIsInvalidConfig) {
  using SeqLenVocab = std::pair<int64_t, int64_t>;
  for (auto [seq_len, vocab] : {SeqLenVocab{0, kVocab}, SeqLenVocab{kSeqLen, 0}}) {
    auto file = TokenFile::Open(path_);
    ASSERT_TRUE(file.ok());
    auto source = FileTokenSource::Create(std::move(file).value(), seq_len, vocab, 1);
    ASSERT_FALSE(source.ok());
    EXPECT_EQ(source.status().code(), StatusCode::kInvalidConfig);
  }
}

// --- data.order: epochs -------------------------------------------------------------------

TEST(PermuteIndexTest, IsABijectionForManySizesAndKeys) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 311ull, 1000ull, 4097ull}) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
      std::set<uint64_t> seen;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t p = PermuteIndex(i, n, key);
        ASSERT_LT(p, n);
        seen.insert(p);
      }
      EXPECT_EQ(seen.size(), n) << "n " << n << " key " << key;
    }
  }
  // Another key, another order (for a size with room for many).
  int moved = 0;
  for (uint64_t i = 0; i < 1000; ++i) moved += PermuteIndex(i, 1000, 1) != PermuteIndex(i, 1000, 2);
  EXPECT_GT(moved, 900);
}

// The first token of each row of steps [0, steps), in order, from a source at `rows` rows a step
// that started (or resumed) at `from_step` with `samples` before it.
std::vector<int64_t> EpochStarts(FileTokenSource& source, int64_t from_step, int64_t steps, int64_t rows) {
  std::vector<int64_t> starts;
  for (int64_t s = from_step; s < steps; ++s) {
    auto batch = source.Rows(s, 0, rows);
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
    for (int64_t r = 0; r < rows; ++r) starts.push_back(batch->inputs[r][0].item<int64_t>());
  }
  return starts;
}

TEST_F(FileTokenSourceTest, EpochsVisitEveryWindowOnceAndReshuffleEachEpoch) {
  auto file = TokenFile::Open(path_);
  ASSERT_TRUE(file.ok());
  auto source = FileTokenSource::Create(std::move(file).value(), kSeqLen, kVocab, 7, SampleOrder::kEpochs);
  ASSERT_TRUE(source.ok());
  const int64_t windows = (*source)->NumEpochWindows();  // (5000 - 1) / 16 = 312
  EXPECT_EQ(windows, 312);
  ASSERT_TRUE((*source)->SetPosition(0, 0, 8).ok());
  const auto starts = EpochStarts(**source, 0, 78, 8);  // 624 rows: two epochs
  ASSERT_EQ(starts.size(), 624u);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen(starts.begin() + epoch * windows, starts.begin() + (epoch + 1) * windows);
    EXPECT_EQ(seen.size(), static_cast<size_t>(windows)) << "epoch " << epoch;
    for (int64_t start : seen) EXPECT_EQ(start % kSeqLen, 0);
  }
  EXPECT_NE(std::vector<int64_t>(starts.begin(), starts.begin() + windows),
            std::vector<int64_t>(starts.begin() + windows, starts.end()));
  // Rows of another step than the position allows, or past a step's rows, are refused.
  EXPECT_EQ((*source)->Rows(3, 4, 5).status().code(), StatusCode::kInternal);
}

// Resumed at step 10 with twice the rows a step (another data-parallel size), the run continues
// the very sequence of samples: nothing twice, nothing skipped.
TEST_F(FileTokenSourceTest, EpochsContinueTheGlobalOrderUnderAnotherBatch) {
  auto open = [&]() {
    auto file = TokenFile::Open(path_);
    EXPECT_TRUE(file.ok());
    return std::move(FileTokenSource::Create(std::move(file).value(), kSeqLen, kVocab, 3, SampleOrder::kEpochs).value());
  };
  auto whole = open();
  ASSERT_TRUE(whole->SetPosition(0, 0, 4).ok());
  const auto want = EpochStarts(*whole, 0, 60, 4);  // 240 samples
  auto first = open();
  ASSERT_TRUE(first->SetPosition(0, 0, 4).ok());
  auto got = EpochStarts(*first, 0, 10, 4);
  EXPECT_EQ(first->SamplesBefore(10), 40);
  auto resumed = open();
  ASSERT_TRUE(resumed->SetPosition(10, 40, 8).ok());
  const auto rest = EpochStarts(*resumed, 10, 35, 8);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(resumed->SamplesBefore(35), 240);
  EXPECT_THAT(resumed->Describe(), HasSubstr("epochs of 312 non-overlapping windows"));
}

TEST(TokenSourceVocabTest, OutOfVocabTokenErrorNamesFileTokenAndPosition) {
  TempDir dir;
  const std::string path = dir.File("bad.bin");
  std::vector<uint32_t> tokens(40, 1);
  tokens[37] = 999;
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFormat::kLlmc).ok());
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok());
  // seq_len 39: the only window is the whole file, so every row covers position 37.
  auto source = FileTokenSource::Create(std::move(file).value(), 39, 320, 1);
  ASSERT_TRUE(source.ok());
  auto batch = (*source)->Rows(0, 0, 1);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(batch.status().message(), AllOf(HasSubstr(path), HasSubstr("token 999"),
                                              HasSubstr("position 37"), HasSubstr("320")));
}

TEST(SyntheticTokenSourceTest, IsDeterministicSliceableAndInsideTheVocab) {
  auto a = SyntheticTokenSource::Create(320, 32, 7);
  auto b = SyntheticTokenSource::Create(320, 32, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  Batch x = (*a)->Rows(5, 0, 8).value();
  Batch y = (*b)->Rows(5, 0, 8).value();
  EXPECT_TRUE(torch::equal(x.inputs, y.inputs));
  Batch lo = (*b)->Rows(5, 0, 4).value();
  Batch hi = (*b)->Rows(5, 4, 4).value();
  EXPECT_TRUE(torch::equal(x.inputs, torch::cat({lo.inputs, hi.inputs})));
  EXPECT_TRUE(torch::equal(x.targets, torch::cat({lo.targets, hi.targets})));
  EXPECT_FALSE(torch::equal(x.inputs, (*a)->Rows(6, 0, 8).value().inputs));
  EXPECT_TRUE(torch::equal(x.targets.narrow(1, 0, 31), x.inputs.narrow(1, 1, 31)));
  EXPECT_GE(x.inputs.min().item<int64_t>(), 0);
  EXPECT_LT(x.inputs.max().item<int64_t>(), 320);
  // 8 x 32 uniform draws from 320 values use a good part of the vocabulary.
  const auto* data = x.inputs.data_ptr<int64_t>();
  EXPECT_GT(std::set<int64_t>(data, data + x.inputs.numel()).size(), 150u);
}

TEST(SyntheticTokenSourceTest, RejectsNonPositiveSizes) {
  EXPECT_EQ(SyntheticTokenSource::Create(0, 32, 1).status().code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(SyntheticTokenSource::Create(320, 0, 1).status().code(), StatusCode::kInvalidConfig);
}

TEST(RowHashTest, MatchesSplitMix64ReferenceValues) {
  // The first outputs of Vigna's splitmix64.c seeded with 0: pins the documented hash.
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(RowHash(1, 2, 3), SplitMix64(SplitMix64(SplitMix64(1) ^ 2) ^ 3));
  EXPECT_NE(RowHash(1, 2, 3), RowHash(1, 3, 2));
}

TEST(MakeTokenSourceTest, SyntheticNameAndFilePathPickTheSource) {
  auto synthetic = MakeTokenSource("synthetic", TokenFormat::kAuto, 8, 320, 1);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().ToString();
  EXPECT_THAT((*synthetic)->Describe(), HasSubstr("synthetic"));

  TempDir dir;
  const std::string path = dir.File("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>(100, 3), TokenFormat::kRawU16).ok());
  auto from_file = MakeTokenSource(path, TokenFormat::kRawU16, 8, 320, 1);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_THAT((*from_file)->Describe(), AllOf(HasSubstr(path), HasSubstr("raw_u16")));
  auto batch = (*from_file)->Rows(0, 0, 2);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(torch::equal(batch->inputs, torch::full({2, 8}, 3, torch::kLong)));

  auto missing = MakeTokenSource(dir.File("missing.bin"), TokenFormat::kAuto, 8, 320, 1);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// 105 tokens holding their positions; seq_len 9 makes windows of 10: 10 of them fit.
class EvalWindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint32_t> tokens(105);
    for (uint32_t i = 0; i < 105; ++i) tokens[i] = i;
    path_ = dir_.File("val.bin");
    ASSERT_TRUE(WriteTokenFile(path_, tokens, TokenFormat::kLlmc).ok());
    auto file = TokenFile::Open(path_);
    ASSERT_TRUE(file.ok());
    file_ = std::move(file).value();
  }
  TempDir dir_;
  std::string path_;
  std::unique_ptr<TokenFile> file_;
};

TEST_F(EvalWindowsTest, CountsWholeWindowsOnly) {
  EXPECT_EQ(NumEvalWindows(*file_, 9), 10);
  EXPECT_EQ(NumEvalWindows(*file_, 104), 1);
  EXPECT_EQ(NumEvalWindows(*file_, 105), 0);
}

TEST_F(EvalWindowsTest, WindowsAreContiguousAndNonOverlapping) {
  auto batch = EvalWindows(*file_, 9, 2, 3, 320);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  for (int64_t w = 0; w < 3; ++w) {
    const int64_t start = (2 + w) * 10;
    EXPECT_TRUE(torch::equal(batch->inputs[w], torch::arange(start, start + 9, torch::kLong)));
    EXPECT_TRUE(
        torch::equal(batch->targets[w], torch::arange(start + 1, start + 10, torch::kLong)));
  }
  auto all = EvalWindows(*file_, 9, 0, 10, 320);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->inputs.sizes(), (std::vector<int64_t>{10, 9}));
}

TEST_F(EvalWindowsTest, AskingBeyondTheFileSaysHowManyFit) {
  auto batch = EvalWindows(*file_, 9, 8, 3, 320);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(batch.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("[8, 11)"), HasSubstr("only 10 windows")));
}

TEST_F(EvalWindowsTest, OutOfVocabTokenIsNamed) {
  auto batch = EvalWindows(*file_, 9, 0, 10, 50);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(batch.status().message(), AllOf(HasSubstr("token 50"), HasSubstr("position 50")));
}

}  // namespace
}  // namespace meshwork::data
