// Where training and evaluation batches come from: random windows of a token file, or synthetic
// tokens for throughput runs. Every row is a pure function of (seed, step, row), so any split of
// a global batch across ranks, and any resume, sees exactly the same data.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "trainer/data/token_file.h"

namespace meshwork::data {

// inputs and targets: int64 [rows, seq_len] on the CPU; targets[r][t] == inputs[r][t + 1] within
// the same window (the window holds seq_len + 1 tokens).
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

// The sampling hash, public so tools (and docs/data.md) can reproduce a run's data exactly.
// SplitMix64 is Steele et al.'s finaliser applied to x + 0x9E3779B97F4A7C15.
uint64_t SplitMix64(uint64_t x);
// SplitMix64(SplitMix64(SplitMix64(seed) ^ step) ^ row).
uint64_t RowHash(uint64_t seed, int64_t step, int64_t row);
// A bijection of [0, n) chosen by `key`: a 4-round Feistel network on the smallest even number of
// bits covering n, walked until it lands below n (docs/data.md, "Epochs").
uint64_t PermuteIndex(uint64_t i, uint64_t n, uint64_t key);

class TokenSource {
 public:
  virtual ~TokenSource();
  // Rows [first_row, first_row + num_rows) of the global batch of training step `step`. A step's
  // batch is an unbounded sequence of rows; a rank takes its slice of it. num_rows may be 0.
  virtual Result<Batch> Rows(int64_t step, int64_t first_row, int64_t num_rows) = 0;
  // One line for logs: where the tokens come from and the sampling parameters.
  virtual std::string Describe() const = 0;

  // Where the run stands in the data: step `step` begins at global sample `samples_before`, and
  // every step takes `rows_per_step` rows (batch_size x grad_accum x data-parallel ranks). An
  // epoch order numbers its samples from this, so a run resumed with another global batch
  // continues the same sequence; a fresh run is (0, 0, rows). InvalidConfig for rows_per_step < 1.
  Status SetPosition(int64_t step, int64_t samples_before, int64_t rows_per_step);
  // The global sample step `step` begins at, by the position set (what a checkpoint records).
  int64_t SamplesBefore(int64_t step) const { return base_samples_ + (step - base_step_) * rows_per_step_; }
  int64_t rows_per_step() const { return rows_per_step_; }

 protected:
  int64_t base_step_ = 0;
  int64_t base_samples_ = 0;
  int64_t rows_per_step_ = 0;  // 0: not set (the random order needs none)
};

// InvalidInput naming both sizes when the file's header records a tokenizer with more ids than
// the model's vocab_size (TokenFile::tokenizer_vocab_size); files that record none pass.
Status CheckTokenizerFitsModel(const TokenFile& file, int64_t vocab_size);

// Row r of step s is the window of seq_len + 1 tokens starting at
// RowHash(seed, s, r) mod (size - seq_len): sampling with replacement, the way llm.c and nanoGPT
// draw random windows, but without any RNG state to save in a checkpoint.
class FileTokenSource : public TokenSource {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  // InvalidConfig for seq_len or vocab_size <= 0; InvalidInput when the file holds fewer than
  // seq_len + 1 tokens. Tokens are checked against vocab_size as windows are read, not here:
  // scanning a multi-gigabyte file at start-up would cost minutes.
  static Result<std::unique_ptr<FileTokenSource>> Create(std::unique_ptr<TokenFile> file,
                                                         int64_t seq_len, int64_t vocab_size,
                                                         uint64_t seed,
                                                         SampleOrder order = SampleOrder::kRandom);

  // A token >= vocab_size gives InvalidInput naming the file, the token, its position, vocab_size.
  Result<Batch> Rows(int64_t step, int64_t first_row, int64_t num_rows) override;
  std::string Describe() const override;

  // The first token of row `row` at step `step`. kEpochs: precondition SetPosition was called and
  // row < rows_per_step (Rows checks both).
  int64_t WindowStart(int64_t step, int64_t row) const;
  // kEpochs: the non-overlapping windows an epoch permutes, floor((size - 1) / seq_len).
  int64_t NumEpochWindows() const { return (file_->size() - 1) / seq_len_; }
  const TokenFile& file() const { return *file_; }

  // Only Create can build one (PrivateTag): it validates the arguments first.
  FileTokenSource(PrivateTag, std::unique_ptr<TokenFile> file, int64_t seq_len,
                  int64_t vocab_size, uint64_t seed, SampleOrder order);

 private:
  std::unique_ptr<TokenFile> file_;
  int64_t seq_len_;
  int64_t vocab_size_;
  uint64_t seed_;
  SampleOrder order_;
};

// Uniform pseudo-random tokens in [0, vocab_size): token t of row r at step s is
// SplitMix64(RowHash(seed, s, r) + t * 0x9E3779B97F4A7C15) mod vocab_size, t in [0, seq_len].
// Nothing to learn; it measures throughput without a data file.
class SyntheticTokenSource : public TokenSource {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  static Result<std::unique_ptr<SyntheticTokenSource>> Create(int64_t vocab_size,
                                                              int64_t seq_len, uint64_t seed);

  Result<Batch> Rows(int64_t step, int64_t first_row, int64_t num_rows) override;
  std::string Describe() const override;

  // Only Create can build one (PrivateTag): it validates the arguments first.
  SyntheticTokenSource(PrivateTag, int64_t vocab_size, int64_t seq_len, uint64_t seed);

 private:
  int64_t vocab_size_;
  int64_t seq_len_;
  uint64_t seed_;
};

// The name that selects SyntheticTokenSource in MakeTokenSource (and in data.train_path).
inline constexpr const char* kSyntheticSourceName = "synthetic";

// "synthetic" -> SyntheticTokenSource; anything else is a token file path opened with `format`.
Result<std::unique_ptr<TokenSource>> MakeTokenSource(const std::string& path_or_synthetic,
                                                     TokenFormat format, int64_t seq_len,
                                                     int64_t vocab_size, uint64_t seed,
                                                     SampleOrder order = SampleOrder::kRandom);

// Evaluation reads the file in order: window i is tokens [i * (seq_len + 1), (i + 1) * (seq_len
// + 1)), inputs its first seq_len tokens and targets its last seq_len. Windows do not overlap,
// so each token is scored once per pass (the token after a window's end is not predicted).
int64_t NumEvalWindows(const TokenFile& file, int64_t seq_len);
// Windows [first_window, first_window + num_windows). Asking beyond NumEvalWindows gives
// InvalidInput saying how many fit; a token >= vocab_size gives InvalidInput naming it.
Result<Batch> EvalWindows(const TokenFile& file, int64_t seq_len, int64_t first_window,
                          int64_t num_windows, int64_t vocab_size);

}  // namespace meshwork::data
