// Reading (mmap) and writing (tmp + rename) of llm.c and raw token files.
#include "trainer/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "common/file.h"

namespace meshwork::data {
namespace {

// Closes a file descriptor on every return path.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string Quote(const std::string& path) { return "'" + path + "'"; }

std::string ErrnoText(int err) { return std::strerror(err); }

// Byte-wise decoding keeps the files little-endian whatever the host is; compilers turn these
// into plain loads on x86 and ARM.
int32_t ReadLeI32(const unsigned char* p) {
  uint32_t u = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
               static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  int32_t v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

uint32_t ReadLeU16(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
}

uint32_t ReadLeU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void AppendLe(std::vector<unsigned char>& out, uint32_t v, int width) {
  for (int b = 0; b < width; ++b) out.push_back(static_cast<unsigned char>(v >> (8 * b)));
}

}  // namespace

Result<TokenFormat> ParseTokenFormat(const std::string& name) {
  if (auto f = ParseName(kTokenFormatNames, name)) return *f;
  return InvalidConfig("data.token_format: unknown token format '" + name + "'; expected one of " +
                       NameList(kTokenFormatNames));
}

TokenFile::TokenFile(PrivateTag, std::string path) : path_(std::move(path)) {}

TokenFile::~TokenFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

Status TokenFile::CheckNotTruncated() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return IOError("cannot stat token file " + Quote(path_) + ": " + ErrnoText(errno));
  if (static_cast<uint64_t>(st.st_size) >= mapping_bytes_) return Status::Ok();
  return InvalidInput("token file " + Quote(path_) + " was truncated while in use: it had " +
                      std::to_string(mapping_bytes_) + " bytes when opened and has " + std::to_string(st.st_size) +
                      " now (write a new token file under another name and rename it into place, as prepare-data "
                      "does)");
}

Result<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path, TokenFormat format) {
  FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return NotFound("token file " + Quote(path) + " does not exist");
    }
    return IOError("cannot open token file " + Quote(path) + ": " + ErrnoText(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return IOError("cannot stat token file " + Quote(path) + ": " + ErrnoText(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidInput("token file " + Quote(path) + " is not a regular file");
  }
  // mmap refuses a zero length, and an empty file is never a usable token file anyway.
  if (st.st_size == 0) return InvalidInput("token file " + Quote(path) + " is empty (0 bytes)");

  auto file = std::make_unique<TokenFile>(PrivateTag{}, path);
  MW_RETURN_IF_ERROR(file->Map(fd.get(), static_cast<size_t>(st.st_size)));
  file->fd_ = fd.release();  // kept open to see the file truncated (CheckNotTruncated)
  MW_RETURN_IF_ERROR(file->ResolveLayout(format));
  return Result<std::unique_ptr<TokenFile>>(std::move(file));
}

Status TokenFile::Map(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    return IOError("cannot mmap token file " + Quote(path_) + " (" + std::to_string(bytes) +
                   " bytes): " + ErrnoText(errno));
  }
  mapping_ = p;
  mapping_bytes_ = bytes;
  return Status::Ok();
}

Status TokenFile::ResolveLayout(TokenFormat requested) {
  const auto* bytes = static_cast<const unsigned char*>(mapping_);
  const int64_t file_bytes = static_cast<int64_t>(mapping_bytes_);
  const std::string where = "token file " + Quote(path_);

  if (requested == TokenFormat::kAuto) {
    const bool has_magic = file_bytes >= 4 && ReadLeI32(bytes) == kLlmcMagic;
    requested = has_magic ? TokenFormat::kLlmc : TokenFormat::kRawU16;
  }
  format_ = requested;

  if (format_ == TokenFormat::kRawU16 || format_ == TokenFormat::kRawU32) {
    bytes_per_token_ = format_ == TokenFormat::kRawU16 ? 2 : 4;
    if (file_bytes % bytes_per_token_ != 0) {
      return InvalidInput(where + " (" + TokenFormatName(format_) + ") is " +
                          std::to_string(file_bytes) + " bytes, not a multiple of the " +
                          std::to_string(bytes_per_token_) +
                          "-byte token size; is it another format?");
    }
    tokens_ = bytes;
    num_tokens_ = file_bytes / bytes_per_token_;
    return Status::Ok();
  }

  // llm.c
  if (file_bytes < kLlmcHeaderBytes) {
    return InvalidInput(where + " is " + std::to_string(file_bytes) + " bytes, shorter than the " +
                        std::to_string(kLlmcHeaderBytes) + "-byte llm.c header");
  }
  const int32_t magic = ReadLeI32(bytes);
  const int32_t version = ReadLeI32(bytes + 4);
  const int32_t count = ReadLeI32(bytes + 8);
  if (magic != kLlmcMagic) {
    return InvalidInput(where + " has magic " + std::to_string(magic) + ", not llm.c's " +
                        std::to_string(kLlmcMagic) + "; is it a raw_u16 or raw_u32 file?");
  }
  if (version != kLlmcVersionU16 && version != kLlmcVersionU32) {
    return InvalidInput(where + " has llm.c version " + std::to_string(version) +
                        "; expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  }
  bytes_per_token_ = version == kLlmcVersionU16 ? 2 : 4;
  if (count <= 0) {
    return InvalidInput(where + " holds no tokens: its llm.c header says " +
                        std::to_string(count) + " tokens");
  }
  const int64_t expected = kLlmcHeaderBytes + int64_t{count} * bytes_per_token_;
  if (file_bytes != expected) {
    const std::string header_says = "its llm.c header says " + std::to_string(count) +
                                    " tokens of " + std::to_string(bytes_per_token_) +
                                    " bytes, i.e. " + std::to_string(expected) +
                                    " bytes with the header";
    if (file_bytes < expected) {
      return InvalidInput(where + " is truncated: " + header_says + ", but the file has " +
                          std::to_string(file_bytes) + " bytes");
    }
    return InvalidInput(where + " is " + std::to_string(file_bytes) + " bytes but " +
                        header_says + " (trailing data or a wrong header count)");
  }
  tokens_ = bytes + kLlmcHeaderBytes;
  num_tokens_ = count;
  const int32_t vocab = ReadLeI32(bytes + 4 * kLlmcTokenizerVocabIndex);
  if (vocab < 0) {
    return InvalidInput(where + " records a tokenizer vocabulary of " + std::to_string(vocab) +
                        " tokens in its llm.c header (slot 3); expected 0 (unrecorded) or a size");
  }
  tokenizer_vocab_size_ = vocab;
  const int32_t separator = ReadLeI32(bytes + 4 * kLlmcDocumentSeparatorIndex);
  if (separator < 0 || (vocab > 0 && separator > vocab)) {
    return InvalidInput(where + " records document separator " + std::to_string(separator - 1) +
                        " in its llm.c header (slot 4, stored plus one), outside its tokenizer's " +
                        std::to_string(vocab) + " ids");
  }
  if (separator > 0) document_separator_ = static_cast<uint32_t>(separator - 1);
  return Status::Ok();
}

uint32_t TokenFile::at(int64_t i) const {
  assert(i >= 0 && i < num_tokens_);
  const unsigned char* p = tokens_ + i * bytes_per_token_;
  return bytes_per_token_ == 2 ? ReadLeU16(p) : ReadLeU32(p);
}

void TokenFile::CopyRange(int64_t begin, int64_t count, int64_t* out) const {
  assert(begin >= 0 && count >= 0 && begin + count <= num_tokens_);
  const unsigned char* p = tokens_ + begin * bytes_per_token_;
  if (bytes_per_token_ == 2) {
    for (int64_t k = 0; k < count; ++k) out[k] = ReadLeU16(p + 2 * k);
  } else {
    for (int64_t k = 0; k < count; ++k) out[k] = ReadLeU32(p + 4 * k);
  }
}

Result<TokenFileWriter> TokenFileWriter::Create(const std::string& path, TokenFormat format, uint32_t max_token,
                                                int64_t tokenizer_vocab_size,
                                                std::optional<uint32_t> document_separator) {
  if (format == TokenFormat::kAuto) format = TokenFormat::kLlmc;  // the format that self-describes
  if (tokenizer_vocab_size < 0 || tokenizer_vocab_size > std::numeric_limits<int32_t>::max()) {
    return InvalidInput("cannot write " + Quote(path) + ": tokenizer vocabulary size " +
                        std::to_string(tokenizer_vocab_size) + " does not fit the llm.c header");
  }
  if (tokenizer_vocab_size > 0 && max_token >= tokenizer_vocab_size) {
    max_token = static_cast<uint32_t>(tokenizer_vocab_size - 1);  // ids past the vocabulary are refused anyway
  }
  const bool fits_u16 = max_token < 65536u;
  int width = 4;
  if (format == TokenFormat::kLlmc) width = fits_u16 ? 2 : 4;
  if (format == TokenFormat::kRawU16) {
    if (!fits_u16) {
      return InvalidInput("cannot write " + Quote(path) + " as raw_u16: ids up to " + std::to_string(max_token) +
                          " do not fit in 16 bits; use raw_u32 or llmc");
    }
    width = 2;
  }
  MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  if (document_separator && (*document_separator > max_token || *document_separator >= std::numeric_limits<int32_t>::max())) {
    return InvalidInput("cannot write " + Quote(path) + ": document separator " + std::to_string(*document_separator) +
                        " is past the largest id " + std::to_string(max_token));
  }
  TokenFileWriter writer(path, std::move(out), format, width, max_token, tokenizer_vocab_size);
  writer.document_separator_ = document_separator;
  if (format == TokenFormat::kLlmc) {
    // Zeros now; Commit writes the header once the count is known.
    const std::vector<unsigned char> header(kLlmcHeaderBytes, 0);
    MW_RETURN_IF_ERROR(writer.out_.Write(header.data(), header.size()));
  }
  return writer;
}

TokenFileWriter::TokenFileWriter(std::string path, AtomicFileWriter out, TokenFormat format, int width,
                                 uint32_t max_token, int64_t vocab)
    : path_(std::move(path)),
      out_(std::move(out)),
      format_(format),
      width_(width),
      max_token_(max_token),
      tokenizer_vocab_size_(vocab) {}

Status TokenFileWriter::Append(const uint32_t* tokens, size_t n) {
  // Chunks bound the staging memory whatever n is.
  constexpr size_t kChunkTokens = size_t{1} << 20;
  for (size_t begin = 0; begin < n; begin += kChunkTokens) {
    const size_t end = std::min(n, begin + kChunkTokens);
    staging_.clear();
    staging_.reserve((end - begin) * static_cast<size_t>(width_));
    for (size_t i = begin; i < end; ++i) {
      if (tokens[i] > max_token_) {
        const int64_t position = count_ + static_cast<int64_t>(i);
        if (tokenizer_vocab_size_ > 0 && tokens[i] >= tokenizer_vocab_size_) {
          return InvalidInput("cannot write " + Quote(path_) + ": token " + std::to_string(tokens[i]) +
                              " at position " + std::to_string(position) + " is outside the tokenizer's " +
                              std::to_string(tokenizer_vocab_size_) + " ids");
        }
        return InvalidInput("cannot write " + Quote(path_) + " as " + TokenFormatName(format_) + ": token " +
                            std::to_string(tokens[i]) + " at position " + std::to_string(position) +
                            " does not fit in " + std::to_string(8 * width_) + " bits");
      }
      AppendLe(staging_, tokens[i], width_);
    }
    MW_RETURN_IF_ERROR(out_.Write(staging_.data(), staging_.size()));
  }
  count_ += static_cast<int64_t>(n);
  return Status::Ok();
}

Status TokenFileWriter::Commit() {
  if (!finished_) MW_RETURN_IF_ERROR(Finish());
  return out_.Commit();
}

Status TokenFileWriter::Finish() {
  if (count_ == 0) {
    return InvalidInput("refusing to write token file " + Quote(path_) +
                        ": no tokens (an empty token file cannot be read back)");
  }
  if (format_ == TokenFormat::kLlmc) {
    if (count_ > std::numeric_limits<int32_t>::max()) {
      return InvalidInput("cannot write " + Quote(path_) + " as llmc: " + std::to_string(count_) +
                          " tokens exceed the int32 count in its header; use raw_u16/raw_u32");
    }
    std::vector<unsigned char> header;
    header.reserve(kLlmcHeaderBytes);
    AppendLe(header, static_cast<uint32_t>(kLlmcMagic), 4);
    AppendLe(header, static_cast<uint32_t>(width_ == 2 ? kLlmcVersionU16 : kLlmcVersionU32), 4);
    AppendLe(header, static_cast<uint32_t>(count_), 4);
    AppendLe(header, static_cast<uint32_t>(tokenizer_vocab_size_), 4);                            // slot 3
    AppendLe(header, document_separator_ ? *document_separator_ + 1 : 0, 4);  // slot 4
    header.resize(kLlmcHeaderBytes, 0);
    MW_RETURN_IF_ERROR(out_.WriteAt(0, header.data(), header.size()));
  }
  MW_RETURN_IF_ERROR(out_.Sync());
  finished_ = true;
  return Status::Ok();
}

Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                      TokenFormat format, int64_t tokenizer_vocab_size) {
  const uint32_t max_token = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  // Named at its position by Append, not by Create's "ids up to".
  const uint32_t width_bound = format == TokenFormat::kRawU16 ? std::min<uint32_t>(max_token, 65535u) : max_token;
  MW_ASSIGN_OR_RETURN(TokenFileWriter writer, TokenFileWriter::Create(path, format, width_bound, tokenizer_vocab_size));
  MW_RETURN_IF_ERROR(writer.Append(tokens.data(), tokens.size()));
  return writer.Commit();
}

}  // namespace meshwork::data
