// Stateless batch sampling: rows are computed from (seed, step, row), never drawn from an RNG.
#include "trainer/data/token_source.h"

#include <utility>

namespace meshwork::data {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// Rows() arguments come from the trainer, not from users: a bad value is a bug.
Status CheckRowRange(int64_t step, int64_t first_row, int64_t num_rows) {
  if (step < 0 || first_row < 0 || num_rows < 0) {
    return Internal("TokenSource::Rows: step, first_row and num_rows must be >= 0, got step " +
                    std::to_string(step) + ", first_row " + std::to_string(first_row) +
                    ", num_rows " + std::to_string(num_rows));
  }
  return Status::Ok();
}

Status CheckSeqLenAndVocab(int64_t seq_len, int64_t vocab_size) {
  if (seq_len <= 0) {
    return InvalidConfig("seq_len must be positive, got " + std::to_string(seq_len));
  }
  if (vocab_size <= 0) {
    return InvalidConfig("vocab_size must be positive, got " + std::to_string(vocab_size));
  }
  return Status::Ok();
}

}  // namespace

Status CheckTokenizerFitsModel(const TokenFile& file, int64_t vocab_size) {
  const int64_t tokenizer = file.tokenizer_vocab_size();
  if (tokenizer > vocab_size) {
    return InvalidInput("token file '" + file.path() + "' was written by a tokenizer of " + std::to_string(tokenizer) +
                        " tokens (its header), but the model's vocab_size is " + std::to_string(vocab_size) +
                        ": the model must have at least as many ids as the tokenizer");
  }
  return Status::Ok();
}

namespace {

// A model indexes its embedding with these tokens: one out of range would be a device-side
// assert on a GPU, far from its cause, so it is reported here with the file position.
Status CheckVocab(const int64_t* tokens, int64_t count, int64_t vocab_size, const TokenFile& file,
                  int64_t file_position) {
  for (int64_t k = 0; k < count; ++k) {
    if (tokens[k] >= vocab_size) {
      return InvalidInput("token file '" + file.path() + "' has token " +
                          std::to_string(tokens[k]) + " at position " +
                          std::to_string(file_position + k) + ", outside the model's vocab_size " +
                          std::to_string(vocab_size));
    }
  }
  return Status::Ok();
}

// [rows, seq_len + 1] windows into the shifted pair. Contiguous copies, so callers can view()
// them; the copy is small next to a training step.
Batch SplitWindows(const torch::Tensor& windows, int64_t seq_len) {
  return Batch{windows.narrow(1, 0, seq_len).contiguous(),
               windows.narrow(1, 1, seq_len).contiguous()};
}

std::string FileSummary(const TokenFile& file) {
  return "token file '" + file.path() + "' (" + TokenFormatName(file.format()) + ", " +
         std::to_string(file.size()) + " tokens of " + std::to_string(file.bytes_per_token()) +
         " bytes)";
}

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t RowHash(uint64_t seed, int64_t step, int64_t row) {
  uint64_t h = SplitMix64(seed);
  h = SplitMix64(h ^ static_cast<uint64_t>(step));
  return SplitMix64(h ^ static_cast<uint64_t>(row));
}

uint64_t PermuteIndex(uint64_t i, uint64_t n, uint64_t key) {
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  // A Feistel network is a bijection of [0, 2^bits) whatever its round function; walking the
  // cycle until the value falls below n makes it one of [0, n) (at most 4 tries expected).
  do {
    uint64_t left = i >> half, right = i & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = SplitMix64(right ^ SplitMix64(key + round)) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    i = (left << half) | right;
  } while (i >= n);
  return i;
}

TokenSource::~TokenSource() = default;

Status TokenSource::SetPosition(int64_t step, int64_t samples_before, int64_t rows_per_step) {
  if (rows_per_step < 1 || step < 0 || samples_before < 0) {
    return InvalidConfig("data position: step " + std::to_string(step) + ", samples before it " +
                         std::to_string(samples_before) + ", rows a step " + std::to_string(rows_per_step) +
                         " (each must be >= 0, rows >= 1)");
  }
  base_step_ = step;
  base_samples_ = samples_before;
  rows_per_step_ = rows_per_step;
  return Status::Ok();
}

// --- FileTokenSource ------------------------------------------------------------------------

FileTokenSource::FileTokenSource(PrivateTag, std::unique_ptr<TokenFile> file, int64_t seq_len,
                                 int64_t vocab_size, uint64_t seed, SampleOrder order)
    : file_(std::move(file)), seq_len_(seq_len), vocab_size_(vocab_size), seed_(seed), order_(order) {}

Result<std::unique_ptr<FileTokenSource>> FileTokenSource::Create(std::unique_ptr<TokenFile> file,
                                                                 int64_t seq_len,
                                                                 int64_t vocab_size,
                                                                 uint64_t seed,
                                                                 SampleOrder order) {
  if (file == nullptr) return Internal("FileTokenSource::Create: no token file");
  MW_RETURN_IF_ERROR(CheckSeqLenAndVocab(seq_len, vocab_size));
  MW_RETURN_IF_ERROR(CheckTokenizerFitsModel(*file, vocab_size));
  if (file->size() < seq_len + 1) {
    return InvalidInput("token file '" + file->path() + "' holds " + std::to_string(file->size()) +
                        " tokens, fewer than one training window of seq_len + 1 = " +
                        std::to_string(seq_len + 1));
  }
  return std::make_unique<FileTokenSource>(PrivateTag{}, std::move(file), seq_len, vocab_size,
                                           seed, order);
}

int64_t FileTokenSource::WindowStart(int64_t step, int64_t row) const {
  if (order_ == SampleOrder::kEpochs) {
    // Global sample g: epoch g / W, and within it the permuted window of index g mod W.
    const auto windows = static_cast<uint64_t>(NumEpochWindows());
    const auto g = static_cast<uint64_t>(SamplesBefore(step) + row);
    const uint64_t epoch = g / windows;
    return static_cast<int64_t>(PermuteIndex(g % windows, windows, SplitMix64(seed_ ^ SplitMix64(epoch)))) * seq_len_;
  }
  // Starts in [0, size - seq_len) keep the whole seq_len + 1 window inside the file. The modulo
  // bias is below 2^-30 for any file smaller than 2^34 tokens.
  const auto num_starts = static_cast<uint64_t>(file_->size() - seq_len_);
  return static_cast<int64_t>(RowHash(seed_, step, row) % num_starts);
}

Result<Batch> FileTokenSource::Rows(int64_t step, int64_t first_row, int64_t num_rows) {
  MW_RETURN_IF_ERROR(CheckRowRange(step, first_row, num_rows));
  MW_RETURN_IF_ERROR(file_->CheckNotTruncated());
  if (order_ == SampleOrder::kEpochs) {
    if (rows_per_step_ < 1) return Internal("data.order epochs: the position was never set (SetPosition)");
    if (first_row + num_rows > rows_per_step_ || step < base_step_) {
      return Internal("data.order epochs: rows [" + std::to_string(first_row) + ", " +
                      std::to_string(first_row + num_rows) + ") of step " + std::to_string(step) +
                      " lie outside the position set (" + std::to_string(rows_per_step_) + " rows a step from step " +
                      std::to_string(base_step_) + ")");
    }
  }
  const int64_t window = seq_len_ + 1;
  torch::Tensor windows = torch::empty({num_rows, window}, torch::kLong);
  int64_t* out = windows.data_ptr<int64_t>();
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t start = WindowStart(step, first_row + r);
    file_->CopyRange(start, window, out + r * window);
    MW_RETURN_IF_ERROR(CheckVocab(out + r * window, window, vocab_size_, *file_, start));
  }
  return SplitWindows(windows, seq_len_);
}

std::string FileTokenSource::Describe() const {
  if (order_ == SampleOrder::kEpochs) {
    return FileSummary(*file_) + ", epochs of " + std::to_string(NumEpochWindows()) +
           " non-overlapping windows of seq_len " + std::to_string(seq_len_) + " + 1 in a permutation per epoch, seed " +
           std::to_string(seed_);
  }
  return FileSummary(*file_) + ", random windows of seq_len " + std::to_string(seq_len_) +
         " + 1, seed " + std::to_string(seed_);
}

// --- SyntheticTokenSource -------------------------------------------------------------------

SyntheticTokenSource::SyntheticTokenSource(PrivateTag, int64_t vocab_size, int64_t seq_len,
                                           uint64_t seed)
    : vocab_size_(vocab_size), seq_len_(seq_len), seed_(seed) {}

Result<std::unique_ptr<SyntheticTokenSource>> SyntheticTokenSource::Create(int64_t vocab_size,
                                                                           int64_t seq_len,
                                                                           uint64_t seed) {
  MW_RETURN_IF_ERROR(CheckSeqLenAndVocab(seq_len, vocab_size));
  return std::make_unique<SyntheticTokenSource>(PrivateTag{}, vocab_size, seq_len, seed);
}

Result<Batch> SyntheticTokenSource::Rows(int64_t step, int64_t first_row, int64_t num_rows) {
  MW_RETURN_IF_ERROR(CheckRowRange(step, first_row, num_rows));
  const int64_t window = seq_len_ + 1;
  const auto vocab = static_cast<uint64_t>(vocab_size_);
  torch::Tensor windows = torch::empty({num_rows, window}, torch::kLong);
  int64_t* out = windows.data_ptr<int64_t>();
  for (int64_t r = 0; r < num_rows; ++r) {
    const uint64_t row_hash = RowHash(seed_, step, first_row + r);
    for (int64_t t = 0; t < window; ++t) {
      out[r * window + t] =
          static_cast<int64_t>(SplitMix64(row_hash + static_cast<uint64_t>(t) * kGolden) % vocab);
    }
  }
  return SplitWindows(windows, seq_len_);
}

std::string SyntheticTokenSource::Describe() const {
  return "synthetic tokens (uniform in [0, " + std::to_string(vocab_size_) + ")), seq_len " +
         std::to_string(seq_len_) + ", seed " + std::to_string(seed_);
}

// --- factory and evaluation -----------------------------------------------------------------

Result<std::unique_ptr<TokenSource>> MakeTokenSource(const std::string& path_or_synthetic,
                                                     TokenFormat format, int64_t seq_len,
                                                     int64_t vocab_size, uint64_t seed,
                                                     SampleOrder order) {
  if (path_or_synthetic == kSyntheticSourceName) {
    MW_ASSIGN_OR_RETURN(auto synthetic, SyntheticTokenSource::Create(vocab_size, seq_len, seed));
    return std::unique_ptr<TokenSource>(std::move(synthetic));
  }
  MW_ASSIGN_OR_RETURN(auto file, TokenFile::Open(path_or_synthetic, format));
  MW_ASSIGN_OR_RETURN(auto source,
                      FileTokenSource::Create(std::move(file), seq_len, vocab_size, seed, order));
  return std::unique_ptr<TokenSource>(std::move(source));
}

int64_t NumEvalWindows(const TokenFile& file, int64_t seq_len) {
  if (seq_len <= 0) return 0;
  return file.size() / (seq_len + 1);
}

Result<Batch> EvalWindows(const TokenFile& file, int64_t seq_len, int64_t first_window,
                          int64_t num_windows, int64_t vocab_size) {
  MW_RETURN_IF_ERROR(CheckSeqLenAndVocab(seq_len, vocab_size));
  MW_RETURN_IF_ERROR(CheckTokenizerFitsModel(file, vocab_size));
  if (first_window < 0 || num_windows < 0) {
    return Internal("EvalWindows: first_window and num_windows must be >= 0, got " +
                    std::to_string(first_window) + " and " + std::to_string(num_windows));
  }
  const int64_t window = seq_len + 1;
  const int64_t fit = NumEvalWindows(file, seq_len);
  if (first_window + num_windows > fit) {
    return InvalidInput("asked for eval windows [" + std::to_string(first_window) + ", " +
                        std::to_string(first_window + num_windows) + ") of " + FileSummary(file) +
                        ", but only " + std::to_string(fit) + " windows of seq_len + 1 = " +
                        std::to_string(window) + " tokens fit");
  }
  torch::Tensor windows = torch::empty({num_windows, window}, torch::kLong);
  int64_t* out = windows.data_ptr<int64_t>();
  const int64_t start = first_window * window;
  // The requested windows are adjacent in the file: one contiguous copy.
  MW_RETURN_IF_ERROR(file.CheckNotTruncated());
  file.CopyRange(start, num_windows * window, out);
  MW_RETURN_IF_ERROR(CheckVocab(out, num_windows * window, vocab_size, file, start));
  return SplitWindows(windows, seq_len);
}

}  // namespace meshwork::data
