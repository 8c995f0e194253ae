// Text <-> token ids: Meshwork's byte-level vocabulary, Hugging Face `tokenizer.json` files
// (through the `tokenizers` crate, trainer/data/hf_tokenizers/) and SentencePiece `.model` files
// (through Debian's libsentencepiece, trainer/data/spm_module.cpp). docs/data.md, "Tokenizers".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshwork::data {

// The byte-level vocabulary (`prepare-data` without --tokenizer): tokens 0-255 are the bytes of
// the UTF-8 text; three specials follow. A model trained on these needs vocab_size >=
// kByteVocabSize (the `tiny` preset's 320 leaves room to spare).
inline constexpr int64_t kBosToken = 256;  // start of a document
inline constexpr int64_t kEosToken = 257;  // end of a document
inline constexpr int64_t kPadToken = 258;  // padding; never written by prepare-data
inline constexpr int64_t kByteVocabSize = 259;

std::vector<uint32_t> EncodeBytes(std::string_view text, bool add_bos, bool add_eos);
// Bytes back to text; specials render as <|bos|>, <|eos|>, <|pad|>, and any other token a model
// may sample above 258 as <|N|>. Invalid UTF-8 in the bytes is passed through unchanged.
std::string DecodeBytes(const std::vector<uint32_t>& tokens);

enum class TokenizerKind { kBytes, kHuggingFace, kSentencePiece };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`, no special token added. InvalidInput naming the byte offset where the text
  // is not UTF-8 (the byte-level vocabulary takes any bytes).
  virtual Result<std::vector<uint32_t>> Encode(std::string_view text) const = 0;
  // Result i is Encode(texts[i]); a Hugging Face tokenizer encodes them in parallel
  // (RAYON_NUM_THREADS threads, else one per core). An error names the index of the bad text.
  virtual Result<std::vector<std::vector<uint32_t>>> EncodeBatch(
      const std::vector<std::string_view>& texts) const;
  // Special tokens render as their text (`<|eos|>`, `</s>`).
  virtual Result<std::string> Decode(const std::vector<uint32_t>& ids) const = 0;
  // Every id Encode, bos() and eos() can give is below this.
  virtual int64_t VocabSize() const = 0;

  TokenizerKind kind() const { return kind_; }
  // What was loaded, for messages: "Hugging Face tokenizer 'dir/tokenizer.json' (128256 tokens)".
  const std::string& description() const { return description_; }
  // The file read ("" for the byte vocabulary).
  const std::string& path() const { return path_; }
  // A document is [bos] + Encode(text) + [eos]; no bos where the tokenizer has none (GPT-2's
  // vocabulary has only <|endoftext|>, which then ends documents).
  std::optional<uint32_t> bos() const { return bos_; }
  uint32_t eos() const { return eos_; }
  // Which names bos and eos came from: "tokenizer_config.json", "--bos-token", "the model file".
  const std::string& specials_source() const { return specials_source_; }

 protected:
  Tokenizer(TokenizerKind kind, std::string path) : kind_(kind), path_(std::move(path)) {}

  TokenizerKind kind_;
  std::string path_;
  std::string description_;
  std::optional<uint32_t> bos_;
  uint32_t eos_ = 0;
  std::string specials_source_;
};

struct TokenizerOptions {
  // Names of the document separators, overriding what the tokenizer's files say.
  std::string bos_token;
  std::string eos_token;
};

// Offset of the first byte of `text` that is not valid UTF-8 (overlong forms, surrogates and code
// points past U+10FFFF included, as Rust's str and Python's decoder have them), or npos.
size_t FirstInvalidUtf8(std::string_view text);

// Where a directory (a Hugging Face model directory, model.init_from) keeps its tokenizer:
// tokenizer.json, else tokenizer.model; "" if neither is there.
std::string FindTokenizerFile(const std::string& dir);

// `spec` is "bytes" (the byte-level vocabulary), a tokenizer.json or .model file, or a directory
// holding one (FindTokenizerFile). Bos and eos come from TokenizerOptions, else the directory's
// tokenizer_config.json (bos_token, eos_token), else the model file (SentencePiece's ids), else
// the usual names (<|begin_of_text|>/<|end_of_text|>, <s>/</s>, <|endoftext|>).
// NotFound: no such file, or a directory without a tokenizer. InvalidInput: a file the library
// cannot read, a named special token that is not in the vocabulary, no end-of-document token.
// Unavailable: this build has no Hugging Face (or SentencePiece) support; the message says why.
Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec,
                                                 const TokenizerOptions& options = {});

// Trains a byte-level BPE tokenizer the way Llama 3's is built (its pre-tokenizer regex, then the
// byte mapping: no text is ever unknown) on `texts` with the tokenizers crate's BpeTrainer, and
// writes `dir`/tokenizer.json and `dir`/tokenizer_config.json (bos <|begin_of_text|>, eos
// <|end_of_text|>, ids 0 and 1). vocab_size counts the 256 byte tokens and the two specials.
// InvalidConfig: vocab_size below 258 or above 2^31; InvalidInput: a text that is not UTF-8 (its
// index); Unavailable: no Hugging Face support in this build.
Status TrainBpeTokenizer(const std::vector<std::string>& texts, int64_t vocab_size, const std::string& dir);

// Whether this build can read tokenizer.json files / SentencePiece models, and if not, why.
bool HaveHuggingFaceTokenizers();
bool HaveSentencePiece(std::string* why_not = nullptr);

}  // namespace meshwork::data
