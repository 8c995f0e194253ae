// Text to token files with a byte-level vocabulary, so real text can be trained on without a
// tokenizer download: `meshwork-train prepare-data` (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "trainer/data/token_file.h"

namespace meshwork::data {

// Tokens 0-255 are the bytes of the UTF-8 text; three specials follow. A model trained on these
// needs vocab_size >= kByteVocabSize (the `tiny` preset's 320 leaves room to spare).
inline constexpr int64_t kBosToken = 256;  // start of a document
inline constexpr int64_t kEosToken = 257;  // end of a document
inline constexpr int64_t kPadToken = 258;  // padding; never written by PrepareTokens
inline constexpr int64_t kByteVocabSize = 259;

std::vector<uint32_t> EncodeBytes(std::string_view text, bool add_bos, bool add_eos);
// Bytes back to text; specials render as <|bos|>, <|eos|>, <|pad|>, and any other token a model
// may sample above 258 as <|N|>. Invalid UTF-8 in the bytes is passed through unchanged.
std::string DecodeBytes(const std::vector<uint32_t>& tokens);

struct PrepareOptions {
  // Files (one document each) or directories (every regular text file below them).
  std::vector<std::string> inputs;
  std::string train_out;
  std::string val_out;  // empty: no split, everything goes to train_out
  double val_fraction = 0.1;
  TokenFormat format = TokenFormat::kLlmc;
};

struct PrepareReport {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t skipped_binary_files = 0;  // files under an input directory that contain a NUL byte
  int64_t skipped_empty_files = 0;   // zero-byte files: no document to add
};

// Each document becomes BOS + its bytes + EOS. With val_out set, the last val_fraction of each
// document's tokens (moved forward to a UTF-8 character boundary) go to val_out and the rest to
// train_out, so both splits sample every document. Directories are walked recursively in sorted
// path order, skipping files with a NUL byte (binary); a file named directly that holds a NUL is
// an error. The whole token stream is held in memory (4 bytes per input byte) before writing.
// NotFound: a missing input. InvalidConfig: val_fraction outside [0, 1), val_out set with
// val_fraction 0, no inputs or outputs, train_out == val_out. InvalidInput: no text at all, or
// documents too short to give the val split any token.
Result<PrepareReport> PrepareTokens(const PrepareOptions& options);

}  // namespace meshwork::data
