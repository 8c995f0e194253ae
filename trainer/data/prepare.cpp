// Text, JSON Lines and Parquet into train / val token files: a reader thread, encoding workers
// and the calling thread as the in-order writer (prepare.h).
#include "trainer/data/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "trainer/data/parquet_reader.h"

namespace meshwork::data {
namespace {

namespace fs = std::filesystem;

struct Document {
  std::string path;
  bool from_directory;  // binary files are skipped there, but an error when named directly
};

Status CollectDirectory(const std::string& dir, std::vector<Document>* docs) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) files.push_back(it->path().string());
  }
  if (ec) return IOError("cannot list input directory '" + dir + "': " + ec.message());
  // Directory order is filesystem-dependent; sorting makes the token stream reproducible.
  std::sort(files.begin(), files.end());
  for (auto& f : files) docs->push_back(Document{std::move(f), true});
  return Status::Ok();
}

Result<std::vector<Document>> CollectDocuments(const std::vector<std::string>& inputs) {
  std::vector<Document> docs;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (st.type() == fs::file_type::not_found) {
      return NotFound("input '" + input + "' does not exist");
    }
    if (ec) return IOError("cannot stat input '" + input + "': " + ec.message());
    if (fs::is_directory(st)) {
      MW_RETURN_IF_ERROR(CollectDirectory(input, &docs));
    } else if (fs::is_regular_file(st)) {
      docs.push_back(Document{input, false});
    } else {
      return InvalidInput("input '" + input + "' is neither a regular file nor a directory");
    }
  }
  return docs;
}

bool IsUtf8Continuation(uint32_t token) { return token >= 0x80 && token <= 0xBF; }

// Where a document's val part begins: the last floor(n * val_fraction) tokens; byte tokens are
// moved forward past UTF-8 continuation bytes so neither split starts mid-character.
size_t SplitPoint(const std::vector<uint32_t>& tokens, double val_fraction, bool byte_level) {
  const size_t n = tokens.size();
  const auto val = static_cast<size_t>(std::floor(static_cast<double>(n) * val_fraction));
  size_t split = n - val;
  while (byte_level && split < n && IsUtf8Continuation(tokens[split])) ++split;
  return split;
}

std::string Hex(char c) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(c);
  return {kDigits[b >> 4], kDigits[b & 15]};
}

std::string FormatDouble(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

Status ValidateOptions(const PrepareOptions& options) {
  if (options.inputs.empty()) return InvalidConfig("prepare-data: no INPUT files or directories");
  if (options.train_out.empty()) return InvalidConfig("prepare-data: no output path (--out)");
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    return InvalidConfig("val_fraction must be in [0, 1), got " +
                         FormatDouble(options.val_fraction));
  }
  for (const std::string* out : {&options.train_out, &options.val_out}) {
    std::error_code ec;
    if (!out->empty() && fs::is_directory(*out, ec)) {
      return InvalidConfig("prepare-data: the output '" + *out + "' is a directory; name a file");
    }
  }
  if (!options.val_out.empty()) {
    // By another name too: `./a.bin`, a link, or a path through `..` (neither need exist yet).
    std::error_code ec, ec_val, ec_train;
    const fs::path val = fs::weakly_canonical(options.val_out, ec_val);
    const fs::path train = fs::weakly_canonical(options.train_out, ec_train);
    if (options.val_out == options.train_out || fs::equivalent(options.val_out, options.train_out, ec) ||
        (!ec_val && !ec_train && val == train)) {
      return InvalidConfig("prepare-data: train and val outputs are the same file '" +
                           options.train_out + "'");
    }
    if (options.val_fraction == 0.0) {
      return InvalidConfig("val_fraction is 0, which would leave '" + options.val_out +
                           "' empty; set val_fraction > 0 or drop the val output");
    }
  }
  return Status::Ok();
}


enum class InputKind { kText, kJsonLines, kParquet };

// A unit of work: some documents of one input, in input order. The reader fills it; a worker
// parses and encodes it; the writer appends what it gives when its turn comes.
struct Chunk {
  int64_t seq = 0;
  InputKind kind = InputKind::kText;
  std::string path;
  std::string text;               // kText: the whole document; kJsonLines: whole lines
  int64_t first_line = 1;         // kJsonLines: text's first line number in the file
  std::vector<std::string> rows;  // kParquet: the column's values
  int64_t first_row = 0;          // kParquet: rows[0]'s row number
  Status status;                  // the reader's error, reported when this chunk's turn comes
  int64_t bytes = 0;              // input bytes the chunk covers
  int64_t skipped_binary_files = 0;
  int64_t skipped_empty_files = 0;
};

struct Encoded {
  Status status;
  std::vector<uint32_t> train;
  std::vector<uint32_t> val;
  int64_t documents = 0;
  int64_t skipped_empty_documents = 0;
  int64_t bytes = 0;
  int64_t skipped_binary_files = 0;
  int64_t skipped_empty_files = 0;
};

constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr size_t kParquetRows = 1024;

std::string Where(const Chunk& c, int64_t index) {
  switch (c.kind) {
    case InputKind::kText: return "input '" + c.path + "'";
    case InputKind::kJsonLines: return "input '" + c.path + "' line " + std::to_string(index);
    case InputKind::kParquet: return "input '" + c.path + "' row " + std::to_string(index);
  }
  return c.path;
}

std::string MegabytesPerSecond(int64_t bytes, double seconds) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / 1e6 << " MB in " << seconds << " s ("
    << (seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0) << " MB/s)";
  return s.str();
}

class Pipeline {
 public:
  Pipeline(const PrepareOptions& options, const Tokenizer& tokenizer, std::vector<Document> docs)
      : options_(options),
        tokenizer_(tokenizer),
        docs_(std::move(docs)),
        byte_level_(tokenizer.kind() == TokenizerKind::kBytes),
        split_(!options.val_out.empty()),
        threads_(options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency())),
        max_in_flight_(2 * threads_ + 2) {}

  Result<PrepareReport> Run() {
    const auto start = std::chrono::steady_clock::now();
    const int64_t vocab = tokenizer_.VocabSize();
    const auto max_token = static_cast<uint32_t>(std::max<int64_t>(vocab - 1, 0));
    MW_ASSIGN_OR_RETURN(TokenFileWriter train, TokenFileWriter::Create(options_.train_out, options_.format, max_token, vocab,
                                                                                  tokenizer_.eos()));
    std::optional<TokenFileWriter> val;
    if (split_) {
      MW_ASSIGN_OR_RETURN(TokenFileWriter v, TokenFileWriter::Create(options_.val_out, options_.format, max_token, vocab,
                                                                                tokenizer_.eos()));
      val.emplace(std::move(v));
    }
    Status status;
    {
      // Every thread started is stopped and joined on every way out, an exception included (a
      // joinable std::thread destroyed would end the process, leaving the temporaries).
      ThreadsJoiner threads(this);
      try {
        threads.started.emplace_back([this] { ReadAll(); });
        for (int i = 0; i < threads_; ++i) threads.started.emplace_back([this] { Work(); });
      } catch (const std::system_error& e) {
        return Unavailable("prepare-data: cannot start " + std::to_string(threads_ + 1) + " threads (--threads " +
                           std::to_string(threads_) + "): " + e.what());
      }
      status = WriteInOrder(&train, val ? &*val : nullptr, start);
    }
    MW_RETURN_IF_ERROR(status);

    if (report_.documents == 0) {
      std::string names;
      for (const auto& in : options_.inputs) names += (names.empty() ? "'" : ", '") + in + "'";
      return InvalidInput("no text found in " + names + " (" + std::to_string(report_.skipped_empty_files) +
                          " empty and " + std::to_string(report_.skipped_binary_files) + " binary files skipped" +
                          (options_.field.empty() ? "" : ", " + std::to_string(report_.skipped_empty_documents) +
                                                             " empty documents") + ")");
    }
    if (split_ && val->size() == 0) {
      return InvalidInput("val split is empty: the " + std::to_string(report_.documents) +
                          " documents are too short for val_fraction " + FormatDouble(options_.val_fraction) +
                          " to take a token from any");
    }
    report_.train_tokens = train.size();
    report_.val_tokens = val ? val->size() : 0;
    // Both flushed before either is renamed: a failure here leaves both outputs as they were.
    MW_RETURN_IF_ERROR(train.Finish());
    if (val) MW_RETURN_IF_ERROR(val->Finish());
    MW_RETURN_IF_ERROR(train.Commit());
    if (val) MW_RETURN_IF_ERROR(val->Commit());
    report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report_;
  }

 private:
  struct ThreadsJoiner {
    explicit ThreadsJoiner(Pipeline* p) : pipeline(p) {}
    ~ThreadsJoiner() {
      {
        std::lock_guard<std::mutex> lock(pipeline->mu_);
        pipeline->stop_ = true;
      }
      pipeline->cv_.notify_all();
      for (auto& t : started) t.join();
    }
    Pipeline* pipeline;
    std::vector<std::thread> started;
  };

  // An exception in the reader or a worker (out of memory, a library's): the run stops with it.
  void Fatal(const std::string& who, const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fatal_.ok()) {
      fatal_ = dynamic_cast<const std::bad_alloc*>(&e) != nullptr
                   ? Unavailable("prepare-data: out of memory in the " + who + " (a single document or line too "
                                 "large for this machine?)")
                   : Internal("prepare-data: the " + who + " failed: " + e.what());
    }
    stop_ = true;
    cv_.notify_all();
  }

  bool Stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  // --- the reader: inputs into chunks, in order -------------------------------------------------

  // Hands a chunk to the workers once fewer than max_in_flight_ chunks are unwritten; false when
  // the writer stopped (an error, or the end).
  bool Emit(Chunk chunk) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || issued_ - written_ < max_in_flight_; });
    if (stop_) return false;
    chunk.seq = issued_++;
    todo_.push_back(std::move(chunk));
    cv_.notify_all();
    return true;
  }

  bool EmitError(const std::string& path, Status status) {
    Chunk c;
    c.path = path;
    c.status = std::move(status);
    Emit(std::move(c));
    return false;  // nothing after an error is read
  }

  void ReadAll() {
    try {
      for (const Document& doc : docs_) {
        if (!ReadInput(doc)) break;
      }
    } catch (const std::exception& e) {
      Fatal("reader", e);
    }
    std::lock_guard<std::mutex> lock(mu_);
    reader_done_ = true;
    cv_.notify_all();
  }

  // A text input that is also an output (`--out notes.txt notes.txt`, or a text file in an input
  // directory) would be overwritten with tokens. (An earlier run's token file in an input
  // directory is binary, skipped, and may be written again.)
  Status CheckNotAnOutput(const std::string& path) const {
    for (const auto& [flag, out] : {std::pair<const char*, const std::string*>{"--out", &options_.train_out},
                                    std::pair<const char*, const std::string*>{"--val-out", &options_.val_out}}) {
      std::error_code ec;
      if (!out->empty() && fs::equivalent(*out, path, ec)) {
        return InvalidConfig(std::string("prepare-data: ") + flag + " '" + *out + "' is the input '" + path +
                             "'; writing it would overwrite that text");
      }
    }
    return Status::Ok();
  }

  // A NUL byte at `nul` of a file: skipped (counted) under a directory, an error when named.
  bool SkipOrRefuseBinary(const Document& doc, size_t nul, bool parquet) {
    if (doc.from_directory) {
      Chunk c;
      c.path = doc.path;
      c.skipped_binary_files = 1;
      return Emit(std::move(c));
    }
    if (parquet) {
      return EmitError(doc.path, InvalidConfig("input '" + doc.path +
                                               "' is a Parquet file: name the column that holds the text with "
                                               "--field"));
    }
    return EmitError(doc.path, InvalidInput("input '" + doc.path + "' has a NUL byte at offset " +
                                            std::to_string(nul) + "; it looks binary, not text"));
  }

  bool ReadInput(const Document& doc) {
    // A file named directly is checked against the outputs at once; one under a directory once it
    // is known to be read (an earlier run's token file there is binary, skipped, and may be
    // written again).
    auto check_output = [&]() -> bool {
      Status s = CheckNotAnOutput(doc.path);
      return s.ok() || EmitError(doc.path, std::move(s));
    };
    if (!doc.from_directory && !check_output()) return false;
    const bool parquet = LooksLikeParquet(doc.path);
    if (!options_.field.empty() && parquet) return (!doc.from_directory || check_output()) && ReadParquet(doc);
    std::ifstream in(doc.path, std::ios::binary);
    if (!in) return EmitError(doc.path, IOError("cannot open input '" + doc.path + "' for reading"));
    if (options_.field.empty()) {
      Chunk c;
      c.kind = InputKind::kText;
      c.path = doc.path;
      c.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (in.bad()) return EmitError(doc.path, IOError("cannot read input '" + doc.path + "'"));
      if (c.text.empty()) {
        c.skipped_empty_files = 1;
        return Emit(std::move(c));
      }
      const size_t nul = c.text.find('\0');
      if (nul != std::string::npos) return SkipOrRefuseBinary(doc, nul, parquet);
      if (doc.from_directory && !check_output()) return false;
      c.bytes = static_cast<int64_t>(c.text.size());
      return Emit(std::move(c));
    }
    // JSON Lines, about kChunkBytes of whole lines per chunk (a longer line is one chunk). A NUL
    // byte in the first chunk marks the file binary; later, it is an error at its line.
    std::string carry;
    int64_t line = 1;
    bool first = true;
    std::vector<char> buffer(kChunkBytes);
    while (!Stopped()) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const auto got = static_cast<size_t>(in.gcount());
      if (in.bad()) return EmitError(doc.path, IOError("cannot read input '" + doc.path + "'"));
      const bool end = got < buffer.size();
      const size_t old_size = carry.size();
      carry.append(buffer.data(), got);
      // Only the bytes just read can hold the chunk's last newline: the carry before them has none.
      size_t cut = carry.size();
      if (!end) {
        const size_t last = std::string_view(carry).substr(old_size).rfind('\n');
        if (last == std::string_view::npos) continue;  // one line longer than a chunk: read on
        cut = old_size + last + 1;                      // the newline belongs to its line
      }
      if (first && end && carry.empty()) {
        Chunk c;
        c.path = doc.path;
        c.skipped_empty_files = 1;
        return Emit(std::move(c));
      }
      Chunk c;
      c.kind = InputKind::kJsonLines;
      c.path = doc.path;
      c.text = carry.substr(0, cut);
      carry.erase(0, cut);
      c.first_line = line;
      const size_t nul = c.text.find('\0');
      if (nul != std::string::npos) {
        if (first) return SkipOrRefuseBinary(doc, nul, parquet);
        // The lines before the NUL's go first, so an error among them is the one reported.
        const size_t line_start = c.text.rfind('\n', nul) == std::string::npos ? 0 : c.text.rfind('\n', nul) + 1;
        const auto at_line = line + std::count(c.text.begin(), c.text.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
        c.text.resize(line_start);
        c.bytes = static_cast<int64_t>(c.text.size());
        if (!c.text.empty() && !Emit(std::move(c))) return false;
        return EmitError(doc.path, InvalidInput("input '" + doc.path + "' line " + std::to_string(at_line) +
                                                " has a NUL byte; it is not JSON Lines text"));
      }
      if (first && doc.from_directory && !check_output()) return false;
      first = false;
      line += std::count(c.text.begin(), c.text.end(), '\n');
      c.bytes = static_cast<int64_t>(c.text.size());
      if (!c.text.empty() && !Emit(std::move(c))) return false;
      if (end) return true;
    }
    return false;
  }

  bool ReadParquet(const Document& doc) {
    auto file = ParquetTextReader::Open(doc.path, options_.field);
    if (!file.ok()) return EmitError(doc.path, file.status());
    if ((*file)->num_rows() == 0) {
      Chunk c;
      c.path = doc.path;
      c.skipped_empty_files = 1;
      return Emit(std::move(c));
    }
    while (true) {
      Chunk c;
      c.kind = InputKind::kParquet;
      c.path = doc.path;
      auto n = (*file)->Next(kParquetRows, kChunkBytes, &c.rows, &c.first_row);
      if (!n.ok()) return EmitError(doc.path, n.status());
      if (*n == 0) return true;
      for (const auto& r : c.rows) c.bytes += static_cast<int64_t>(r.size());
      if (!Emit(std::move(c))) return false;
    }
  }

  // --- the workers: chunks into tokens ----------------------------------------------------------

  void Work() {
    while (true) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !todo_.empty() || reader_done_; });
        if (stop_ || todo_.empty()) return;
        chunk = std::move(todo_.front());
        todo_.pop_front();
      }
      const int64_t seq = chunk.seq;
      Encoded out;
      try {
        out = Encode(std::move(chunk));
      } catch (const std::exception& e) {
        Fatal("encoder", e);
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      done_.emplace(seq, std::move(out));
      cv_.notify_all();
    }
  }

  // The chunk's documents (text, and where each came from for errors), JSON parsed.
  Status Documents(Chunk& c, std::vector<std::string>* texts, std::vector<int64_t>* index, Encoded* out) const {
    if (c.kind == InputKind::kText) {
      if (!c.text.empty()) {
        texts->push_back(std::move(c.text));
        index->push_back(0);
      }
      return Status::Ok();
    }
    if (c.kind == InputKind::kParquet) {
      for (size_t i = 0; i < c.rows.size(); ++i) {
        if (c.rows[i].empty()) {
          ++out->skipped_empty_documents;
          continue;
        }
        texts->push_back(std::move(c.rows[i]));
        index->push_back(c.first_row + static_cast<int64_t>(i));
      }
      return Status::Ok();
    }
    int64_t line_number = c.first_line - 1;
    for (size_t at = 0; at < c.text.size();) {
      const size_t end = std::min(c.text.find('\n', at), c.text.size());
      const std::string_view line(c.text.data() + at, end - at);
      at = end + 1;
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = Where(c, line_number);
      nlohmann::json object;
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        return InvalidInput(where + " is not JSON: " + e.what());
      }
      if (!object.is_object()) return InvalidInput(where + " is not a JSON object");
      auto field = object.find(options_.field);
      if (field == object.end()) return InvalidInput(where + " has no field '" + options_.field + "' (--field)");
      if (!field->is_string()) {
        return InvalidInput(where + ": field '" + options_.field + "' is " + field->type_name() + ", not a string");
      }
      std::string document = field->get<std::string>();
      if (document.empty()) {
        ++out->skipped_empty_documents;
        continue;
      }
      texts->push_back(std::move(document));
      index->push_back(line_number);
    }
    return Status::Ok();
  }

  Encoded Encode(Chunk c) const {
    Encoded out;
    out.status = c.status;
    out.bytes = c.bytes;
    out.skipped_binary_files = c.skipped_binary_files;
    out.skipped_empty_files = c.skipped_empty_files;
    if (!out.status.ok()) return out;
    std::vector<std::string> texts;
    std::vector<int64_t> index;
    out.status = Documents(c, &texts, &index, &out);
    if (!out.status.ok()) return out;
    if (!byte_level_) {
      // A tokenizer needs UTF-8; the error names where the text came from, not a batch position.
      for (size_t i = 0; i < texts.size(); ++i) {
        const std::string& text = texts[i];
        const size_t bad = FirstInvalidUtf8(text);
        if (bad == std::string::npos) continue;
        std::string where = Where(c, index[i]);
        if (c.kind == InputKind::kText) {
          const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
          where += " is not UTF-8: invalid byte 0x" + Hex(text[bad]) + " at line " + std::to_string(line) + ", byte offset " + std::to_string(bad);
        } else {
          where += " is not UTF-8: invalid byte 0x" + Hex(text[bad]) + " at byte offset " + std::to_string(bad) + " of the text";
        }
        out.status = InvalidInput(where + " (" + tokenizer_.description() + " needs UTF-8 text)");
        return out;
      }
    }
    if (texts.empty()) return out;
    std::vector<std::string_view> views(texts.begin(), texts.end());
    auto encoded = tokenizer_.EncodeBatch(views);
    if (!encoded.ok()) {
      // Rare: find the document that failed, to name where it came from.
      out.status = encoded.status();
      for (size_t i = 0; i < views.size(); ++i) {
        if (auto one = tokenizer_.Encode(views[i]); !one.ok()) {
          out.status = Status(one.status().code(), Where(c, index[i]) + ": " + one.status().message());
          break;
        }
      }
      return out;
    }
    std::vector<uint32_t> tokens;
    for (auto& ids : *encoded) {
      tokens.clear();
      if (tokenizer_.bos()) tokens.push_back(*tokenizer_.bos());
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      tokens.push_back(tokenizer_.eos());
      const size_t at = split_ ? SplitPoint(tokens, options_.val_fraction, byte_level_) : tokens.size();
      out.train.insert(out.train.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(at));
      out.val.insert(out.val.end(), tokens.begin() + static_cast<std::ptrdiff_t>(at), tokens.end());
    }
    out.documents = static_cast<int64_t>(encoded->size());
    return out;
  }

  // --- the writer: the calling thread, chunk after chunk in input order -------------------------

  Status WriteInOrder(TokenFileWriter* train, TokenFileWriter* val, std::chrono::steady_clock::time_point start) {
    auto last_progress = start;
    const bool progress = options_.progress != nullptr && options_.progress_seconds > 0;
    while (true) {
      Encoded e;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return !fatal_.ok() || done_.count(written_) > 0 || (reader_done_ && written_ == issued_);
        });
        if (!fatal_.ok()) return fatal_;
        auto it = done_.find(written_);
        if (it == done_.end()) return Status::Ok();  // the reader is done and everything is written
        e = std::move(it->second);
        done_.erase(it);
      }
      MW_RETURN_IF_ERROR(e.status);
      MW_RETURN_IF_ERROR(train->Append(e.train.data(), e.train.size()));
      if (val != nullptr) MW_RETURN_IF_ERROR(val->Append(e.val.data(), e.val.size()));
      report_.documents += e.documents;
      report_.input_bytes += e.bytes;
      report_.skipped_binary_files += e.skipped_binary_files;
      report_.skipped_empty_files += e.skipped_empty_files;
      report_.skipped_empty_documents += e.skipped_empty_documents;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++written_;
      }
      cv_.notify_all();
      const auto now = std::chrono::steady_clock::now();
      if (progress && std::chrono::duration<double>(now - last_progress).count() >= options_.progress_seconds) {
        last_progress = now;
        *options_.progress << "prepare-data: " << report_.documents << " documents, "
                           << train->size() + (val ? val->size() : 0) << " tokens, "
                           << MegabytesPerSecond(report_.input_bytes, std::chrono::duration<double>(now - start).count())
                           << std::endl;
      }
    }
  }

  const PrepareOptions& options_;
  const Tokenizer& tokenizer_;
  const std::vector<Document> docs_;
  const bool byte_level_;
  const bool split_;
  const int threads_;
  const int64_t max_in_flight_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> todo_;           // issued, not yet taken by a worker
  std::map<int64_t, Encoded> done_;  // encoded, waiting for their turn
  int64_t issued_ = 0;               // chunks the reader emitted
  int64_t written_ = 0;              // chunks the writer appended: the next one to write
  bool reader_done_ = false;
  bool stop_ = false;  // the writer finished or failed: the reader and the workers stop
  Status fatal_;       // an exception in the reader or a worker

  PrepareReport report_;  // the writer's
};

}  // namespace

Result<PrepareReport> PrepareTokens(const PrepareOptions& options) {
  MW_RETURN_IF_ERROR(ValidateOptions(options));
  MW_ASSIGN_OR_RETURN(std::vector<Document> docs, CollectDocuments(options.inputs));
  std::unique_ptr<Tokenizer> bytes;
  const Tokenizer* tokenizer = options.tokenizer;
  if (tokenizer == nullptr) {
    MW_ASSIGN_OR_RETURN(bytes, LoadTokenizer("bytes"));
    tokenizer = bytes.get();
  }
  Pipeline pipeline(options, *tokenizer, std::move(docs));
  return pipeline.Run();
}

Result<std::vector<std::string>> ReadTextDocuments(const std::vector<std::string>& inputs) {
  MW_ASSIGN_OR_RETURN(std::vector<Document> docs, CollectDocuments(inputs));
  std::vector<std::string> texts;
  for (const Document& doc : docs) {
    std::ifstream in(doc.path, std::ios::binary);
    if (!in) return IOError("cannot open input '" + doc.path + "' for reading");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return IOError("cannot read input '" + doc.path + "'");
    if (text.empty()) continue;
    const size_t nul = text.find('\0');
    if (nul != std::string::npos) {
      if (doc.from_directory) continue;
      return InvalidInput("input '" + doc.path + "' has a NUL byte at offset " + std::to_string(nul) +
                          "; it looks binary, not text");
    }
    const size_t bad = FirstInvalidUtf8(text);
    if (bad != std::string::npos) {
      return InvalidInput("input '" + doc.path + "' is not UTF-8: invalid byte 0x" + Hex(text[bad]) + " at byte offset " +
                          std::to_string(bad));
    }
    texts.push_back(std::move(text));
  }
  if (texts.empty()) return InvalidInput("no text found in the inputs");
  return texts;
}

}  // namespace meshwork::data
