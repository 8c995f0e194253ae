// Text to token files, with a tokenizer (Hugging Face, SentencePiece) or the byte-level
// vocabulary that needs none: `meshwork-train prepare-data` (docs/data.md).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

namespace meshwork::data {

struct PrepareOptions {
  // Files or directories (every regular file below them, in sorted path order).
  std::vector<std::string> inputs;
  std::string train_out;
  std::string val_out;  // empty: no split, everything goes to train_out
  double val_fraction = 0.1;
  TokenFormat format = TokenFormat::kLlmc;
  // Empty: every input file is one document of plain text. Set: the field holding each document's
  // text: a Parquet input (a file that begins with "PAR1") gives one document per row of this
  // top-level string column, any other input is JSON Lines with one document per line in this
  // string field. A line that is not a JSON object or lacks the field, or a row whose value is
  // null, is InvalidInput naming the file and the line or row.
  std::string field;
  // Not owned; null: the byte-level vocabulary.
  const Tokenizer* tokenizer = nullptr;
  // Threads that parse and encode (the reader and the writer are two more, mostly waiting on the
  // disk); 0: one per core. A Hugging Face tokenizer also spreads each batch over its own pool.
  int threads = 0;
  // Where a progress line goes every progress_seconds (documents, tokens, input MB and MB/s);
  // null or progress_seconds <= 0: none.
  std::ostream* progress = nullptr;
  double progress_seconds = 5.0;
};

struct PrepareReport {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t input_bytes = 0;  // text read: plain files, JSON Lines (syntax included), Parquet values
  double seconds = 0.0;     // wall time from the first read to the committed outputs
  int64_t skipped_binary_files = 0;  // files under an input directory that contain a NUL byte
  int64_t skipped_empty_files = 0;   // zero-byte files, and Parquet files without rows
  int64_t skipped_empty_documents = 0;  // JSON Lines whose field is "", Parquet rows whose value is ""
};

// Each document becomes [BOS] + its tokens + EOS (the tokenizer's separators; the byte-level
// vocabulary's <|bos|> and <|eos|>), and the llm.c header records the tokenizer's vocabulary size.
// With val_out set, the last val_fraction of each document's tokens (byte tokens moved forward to
// a UTF-8 character boundary) go to val_out and the rest to train_out, so both splits sample
// every document.
//
// Streaming: inputs are read in chunks (a plain-text file whole, JSON Lines about 4 MB of lines at
// a time, Parquet a few hundred rows), encoded by `threads` workers in parallel, and appended to
// the outputs in input order, so the files are the same whatever the thread count. At most
// 2 * threads + 2 chunks are in memory at once: memory is bounded by the chunk size (and the
// largest single document), not by the corpus. Outputs are written to temporaries and renamed
// only when everything succeeded; on any error nothing is left behind.
//
// Files under a directory that contain a NUL byte (in the first chunk read) are skipped as
// binary; a file named directly that holds one is an error. NotFound: a missing input.
// InvalidConfig: val_fraction outside [0, 1), val_out set with val_fraction 0, no inputs or
// outputs, train_out == val_out, an output that is also an input. InvalidInput: no text at all,
// documents too short to give the val split any token, malformed JSON Lines or Parquet, or text
// that is not UTF-8 for a tokenizer that needs it (naming the file, the line or row, and the byte
// offset). Unavailable: a Parquet input to a meshwork-train built without the Parquet module.
Result<PrepareReport> PrepareTokens(const PrepareOptions& options);

// The text of every input as PrepareTokens reads it without a field (a file one document;
// directories walked in sorted path order, zero-byte and binary files under them skipped; a
// binary file named directly refused), held in memory: for training a tokenizer. A text that is
// not UTF-8 is InvalidInput naming the file and the byte offset.
Result<std::vector<std::string>> ReadTextDocuments(const std::vector<std::string>& inputs);

}  // namespace meshwork::data
