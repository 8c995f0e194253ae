// Token files on disk: llm.c's headered format and nanoGPT's raw uint16 / uint32 arrays, read
// through a memory mapping so a multi-gigabyte corpus costs page cache, not process memory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/status.h"
#include "trainer/data/token_format.h"

namespace meshwork::data {


// llm.c's header (llm.c/dev/data/data_common.py): int32 [0] magic, [1] version, [2] count.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersionU16 = 1;
inline constexpr int32_t kLlmcVersionU32 = 2;
inline constexpr int64_t kLlmcHeaderInts = 256;
inline constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
// Meshwork's one addition, in a slot llm.c leaves zero: [3] the vocabulary size of the tokenizer
// that wrote the file (0: not recorded), so training refuses a model whose vocab_size is smaller.
inline constexpr int64_t kLlmcTokenizerVocabIndex = 3;
// And [4]: the id that ends each document (the tokenizer's eos), plus one (0: not recorded), for
// data.document_masking.
inline constexpr int64_t kLlmcDocumentSeparatorIndex = 4;

// One of kTokenFormatNames; an error names the key 'data.token_format'.
Result<TokenFormat> ParseTokenFormat(const std::string& name);

// A read-only, memory-mapped token file. Opening validates the whole layout (header, size,
// token width) so that reads afterwards cannot run off the mapping.
class TokenFile {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  static Result<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                 TokenFormat format = TokenFormat::kAuto);

  // Only Open can build one (PrivateTag); public so std::make_unique can reach it.
  TokenFile(PrivateTag, std::string path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return num_tokens_; }
  // Precondition: 0 <= i < size() (asserted in debug builds only: this is the hot path).
  uint32_t at(int64_t i) const;
  int bytes_per_token() const { return bytes_per_token_; }
  // The format actually read: never kAuto.
  TokenFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  // The vocabulary size of the tokenizer that wrote the file (llm.c header slot 3), 0 when the file
  // does not record it (raw files, llm.c's own, Meshwork's before it wrote the slot).
  int64_t tokenizer_vocab_size() const { return tokenizer_vocab_size_; }
  // The id that ends each document (llm.c header slot 4), when the file records it.
  std::optional<uint32_t> document_separator() const { return document_separator_; }

  // out[k] = at(begin + k) for k in [0, count). Precondition: the range lies inside the file.
  void CopyRange(int64_t begin, int64_t count, int64_t* out) const;
  // InvalidInput naming the file when it is shorter now than when it was opened: a read of the
  // mapping past its new end would kill the process (SIGBUS). Called before each batch's reads;
  // a file rewritten by rename (prepare-data's way) keeps the old one mapped and is fine.
  Status CheckNotTruncated() const;

 private:
  Status Map(int fd, size_t bytes);
  Status ResolveLayout(TokenFormat requested);

  std::string path_;
  TokenFormat format_ = TokenFormat::kAuto;
  int fd_ = -1;              // owned: closed in the destructor
  void* mapping_ = nullptr;  // owned: munmap'd in the destructor
  size_t mapping_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // first token byte, inside mapping_
  int64_t num_tokens_ = 0;
  int bytes_per_token_ = 2;
  int64_t tokenizer_vocab_size_ = 0;
  std::optional<uint32_t> document_separator_;
};

// Writes a token file as its tokens arrive, in bounded memory, atomically: nothing appears at
// `path` until Commit renames a temporary file beside it, and a writer dropped before Commit
// removes its temporary. The token width is fixed at Create from the largest id that may come:
// llm.c (and kAuto, which writes llm.c) take uint16 when max_token < 65536, else uint32; kRawU16
// refuses a max_token that does not fit 16 bits. kLlmc records tokenizer_vocab_size in header slot
// 3 (0: unknown) and document_separator in slot 4, and the header's count is written at Commit.
class TokenFileWriter {
 public:
  static Result<TokenFileWriter> Create(const std::string& path, TokenFormat format, uint32_t max_token,
                                        int64_t tokenizer_vocab_size = 0,
                                        std::optional<uint32_t> document_separator = std::nullopt);

  // InvalidInput naming the token and its position in the file when it is past max_token.
  Status Append(const uint32_t* tokens, size_t n);
  // Writes the header and flushes the file to disk, not yet renamed. InvalidInput when nothing was
  // appended (TokenFile::Open would refuse the file) or when an llm.c count would not fit its
  // int32 header slot.
  Status Finish();
  // Finish (once) and rename into place.
  Status Commit();
  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  TokenFileWriter(std::string path, AtomicFileWriter out, TokenFormat format, int width, uint32_t max_token,
                  int64_t vocab);

  std::string path_;
  AtomicFileWriter out_;
  TokenFormat format_;
  int width_;
  uint32_t max_token_;
  int64_t tokenizer_vocab_size_;
  std::optional<uint32_t> document_separator_;
  int64_t count_ = 0;
  bool finished_ = false;
  std::vector<unsigned char> staging_;
};

// Writes `tokens` to `path` atomically through TokenFileWriter, with the narrowest width that holds
// the largest token. Errors as TokenFileWriter's, naming the first offending token's position: a
// token at or past tokenizer_vocab_size, one past 16 bits for kRawU16, an empty list.
Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                      TokenFormat format, int64_t tokenizer_vocab_size = 0);

}  // namespace meshwork::data
