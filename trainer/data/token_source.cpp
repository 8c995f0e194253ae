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

TokenSource::~TokenSource() = default;

// --- FileTokenSource ------------------------------------------------------------------------

FileTokenSource::FileTokenSource(PrivateTag, std::unique_ptr<TokenFile> file, int64_t seq_len,
                                 int64_t vocab_size, uint64_t seed)
    : file_(std::move(file)), seq_len_(seq_len), vocab_size_(vocab_size), seed_(seed) {}

Result<std::unique_ptr<FileTokenSource>> FileTokenSource::Create(std::unique_ptr<TokenFile> file,
                                                                 int64_t seq_len,
                                                                 int64_t vocab_size,
                                                                 uint64_t seed) {
  if (file == nullptr) return Internal("FileTokenSource::Create: no token file");
  MW_RETURN_IF_ERROR(CheckSeqLenAndVocab(seq_len, vocab_size));
  if (file->size() < seq_len + 1) {
    return InvalidInput("token file '" + file->path() + "' holds " + std::to_string(file->size()) +
                        " tokens, fewer than one training window of seq_len + 1 = " +
                        std::to_string(seq_len + 1));
  }
  return std::make_unique<FileTokenSource>(PrivateTag{}, std::move(file), seq_len, vocab_size,
                                           seed);
}

int64_t FileTokenSource::WindowStart(int64_t step, int64_t row) const {
  // Starts in [0, size - seq_len) keep the whole seq_len + 1 window inside the file. The modulo
  // bias is below 2^-30 for any file smaller than 2^34 tokens.
  const auto num_starts = static_cast<uint64_t>(file_->size() - seq_len_);
  return static_cast<int64_t>(RowHash(seed_, step, row) % num_starts);
}

Result<Batch> FileTokenSource::Rows(int64_t step, int64_t first_row, int64_t num_rows) {
  MW_RETURN_IF_ERROR(CheckRowRange(step, first_row, num_rows));
  MW_RETURN_IF_ERROR(file_->CheckNotTruncated());
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
                                                     int64_t vocab_size, uint64_t seed) {
  if (path_or_synthetic == kSyntheticSourceName) {
    MW_ASSIGN_OR_RETURN(auto synthetic, SyntheticTokenSource::Create(vocab_size, seq_len, seed));
    return std::unique_ptr<TokenSource>(std::move(synthetic));
  }
  MW_ASSIGN_OR_RETURN(auto file, TokenFile::Open(path_or_synthetic, format));
  MW_ASSIGN_OR_RETURN(auto source,
                      FileTokenSource::Create(std::move(file), seq_len, vocab_size, seed));
  return std::unique_ptr<TokenSource>(std::move(source));
}

int64_t NumEvalWindows(const TokenFile& file, int64_t seq_len) {
  if (seq_len <= 0) return 0;
  return file.size() / (seq_len + 1);
}

Result<Batch> EvalWindows(const TokenFile& file, int64_t seq_len, int64_t first_window,
                          int64_t num_windows, int64_t vocab_size) {
  MW_RETURN_IF_ERROR(CheckSeqLenAndVocab(seq_len, vocab_size));
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
