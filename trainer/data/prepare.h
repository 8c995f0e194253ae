// Text to token files, with a tokenizer (Hugging Face, SentencePiece) or the byte-level
// vocabulary that needs none: `meshwork-train prepare-data` (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

namespace meshwork::data {

struct PrepareOptions {
  // Files (one document each) or directories (every regular text file below them).
  std::vector<std::string> inputs;
  std::string train_out;
  std::string val_out;  // empty: no split, everything goes to train_out
  double val_fraction = 0.1;
  TokenFormat format = TokenFormat::kLlmc;
  // Non-empty: every input is JSON Lines, one document per line in this string field (a line
  // without it, or that is not a JSON object, is InvalidInput naming the file and line).
  std::string jsonl_field;
  // Not owned; null: the byte-level vocabulary.
  const Tokenizer* tokenizer = nullptr;
};

struct PrepareReport {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t skipped_binary_files = 0;  // files under an input directory that contain a NUL byte
  int64_t skipped_empty_files = 0;   // zero-byte files: no document to add
  int64_t skipped_empty_documents = 0;  // JSON Lines whose field is ""
};

// Each document becomes [BOS] + its tokens + EOS (the tokenizer's separators; the byte-level
// vocabulary's <|bos|> and <|eos|>), and the llm.c header records the tokenizer's vocabulary
// size. With val_out set, the last val_fraction of each document's tokens (byte tokens moved
// forward to a UTF-8 character boundary) go to val_out and the rest to train_out, so both splits sample every document. Directories are walked recursively in sorted
// path order, skipping files with a NUL byte (binary); a file named directly that holds a NUL is
// an error. The whole token stream is held in memory (4 bytes per input byte) before writing.
// NotFound: a missing input. InvalidConfig: val_fraction outside [0, 1), val_out set with
// val_fraction 0, no inputs or outputs, train_out == val_out. InvalidInput: no text at all,
// documents too short to give the val split any token, or a text input that is not UTF-8 for a
// tokenizer that needs it (naming the file, the line and the byte offset).
Result<PrepareReport> PrepareTokens(const PrepareOptions& options);

}  // namespace meshwork::data
