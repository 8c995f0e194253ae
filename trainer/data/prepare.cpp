// Byte-level tokenisation of text files into train / val token files.
#include "trainer/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

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

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IOError("cannot open input '" + path + "' for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return IOError("cannot read input '" + path + "'");
  return text;
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

}  // namespace

Result<PrepareReport> PrepareTokens(const PrepareOptions& options) {
  MW_RETURN_IF_ERROR(ValidateOptions(options));
  MW_ASSIGN_OR_RETURN(std::vector<Document> docs, CollectDocuments(options.inputs));

  const bool split = !options.val_out.empty();
  std::unique_ptr<Tokenizer> bytes;
  const Tokenizer* tokenizer = options.tokenizer;
  if (tokenizer == nullptr) {
    MW_ASSIGN_OR_RETURN(bytes, LoadTokenizer("bytes"));
    tokenizer = bytes.get();
  }
  const bool byte_level = tokenizer->kind() == TokenizerKind::kBytes;
  PrepareReport report;
  std::vector<uint32_t> train;
  std::vector<uint32_t> val;

  // Documents are encoded a batch at a time, so a Hugging Face tokenizer works on all cores.
  std::vector<std::string> texts;
  auto flush = [&]() -> Status {
    if (texts.empty()) return Status::Ok();
    std::vector<std::string_view> views(texts.begin(), texts.end());
    MW_ASSIGN_OR_RETURN(auto encoded, tokenizer->EncodeBatch(views));
    for (auto& ids : encoded) {
      std::vector<uint32_t> tokens;
      tokens.reserve(ids.size() + 2);
      if (tokenizer->bos()) tokens.push_back(*tokenizer->bos());
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      tokens.push_back(tokenizer->eos());
      const size_t at = split ? SplitPoint(tokens, options.val_fraction, byte_level) : tokens.size();
      train.insert(train.end(), tokens.begin(), tokens.begin() + at);
      val.insert(val.end(), tokens.begin() + at, tokens.end());
    }
    texts.clear();
    return Status::Ok();
  };
  constexpr size_t kBatchDocuments = 256;
  constexpr size_t kBatchBytes = size_t{64} << 20;
  size_t batch_bytes = 0;
  // One document's text: checked (a tokenizer needs UTF-8; the error names where the text came
  // from, not a position in a batch) and batched.
  auto add = [&](std::string text, const std::string& where) -> Status {
    if (!byte_level) {
      const size_t bad = FirstInvalidUtf8(text);
      if (bad != std::string::npos) {
        const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
        return InvalidInput(where + " is not UTF-8: invalid byte 0x" + Hex(text[bad]) + " at line " +
                            std::to_string(line) + ", byte offset " + std::to_string(bad) + " (" +
                            tokenizer->description() + " needs UTF-8 text)");
      }
    }
    batch_bytes += text.size();
    texts.push_back(std::move(text));
    ++report.documents;
    if (texts.size() >= kBatchDocuments || batch_bytes >= kBatchBytes) {
      MW_RETURN_IF_ERROR(flush());
      batch_bytes = 0;
    }
    return Status::Ok();
  };
  const bool jsonl = !options.jsonl_field.empty();
  for (const Document& doc : docs) {
    MW_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(doc.path));
    if (text.empty()) {
      ++report.skipped_empty_files;
      continue;
    }
    const size_t nul = text.find('\0');
    if (nul != std::string::npos) {
      if (doc.from_directory) {
        ++report.skipped_binary_files;
        continue;
      }
      return InvalidInput("input '" + doc.path + "' has a NUL byte at offset " +
                          std::to_string(nul) + "; it looks binary, not text");
    }
    // A text input that is also an output (`--out notes.txt notes.txt`, or a text file in an input
    // directory) would be overwritten with tokens. (An earlier run's token file in an input
    // directory is binary, skipped above, and may be written again.)
    for (const auto& [flag, out] : {std::pair<const char*, const std::string*>{"--out", &options.train_out},
                                    std::pair<const char*, const std::string*>{"--val-out", &options.val_out}}) {
      std::error_code ec;
      if (!out->empty() && fs::equivalent(*out, doc.path, ec)) {
        return InvalidConfig(std::string("prepare-data: ") + flag + " '" + *out + "' is the input '" + doc.path +
                             "'; writing it would overwrite that text");
      }
    }
    if (!jsonl) {
      MW_RETURN_IF_ERROR(add(std::move(text), "input '" + doc.path + "'"));
      continue;
    }
    // JSON Lines: every non-blank line an object whose field holds one document's text.
    int64_t line_number = 0;
    for (size_t at = 0; at < text.size();) {
      const size_t end = std::min(text.find('\n', at), text.size());
      const std::string_view line(text.data() + at, end - at);
      at = end + 1;
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = "input '" + doc.path + "' line " + std::to_string(line_number);
      nlohmann::json object;
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        return InvalidInput(where + " is not JSON: " + e.what());
      }
      if (!object.is_object()) return InvalidInput(where + " is not a JSON object");
      auto field = object.find(options.jsonl_field);
      if (field == object.end()) {
        return InvalidInput(where + " has no field '" + options.jsonl_field + "' (--jsonl-field)");
      }
      if (!field->is_string()) {
        return InvalidInput(where + ": field '" + options.jsonl_field + "' is " + field->type_name() + ", not a string");
      }
      std::string document = field->get<std::string>();
      if (document.empty()) {
        ++report.skipped_empty_documents;
        continue;
      }
      MW_RETURN_IF_ERROR(add(std::move(document), where));
    }
  }
  MW_RETURN_IF_ERROR(flush());

  if (report.documents == 0) {
    std::string names;
    for (const auto& in : options.inputs) names += (names.empty() ? "'" : ", '") + in + "'";
    return InvalidInput("no text found in " + names + " (" +
                        std::to_string(report.skipped_empty_files) + " empty and " +
                        std::to_string(report.skipped_binary_files) + " binary files skipped" +
                        (jsonl ? ", " + std::to_string(report.skipped_empty_documents) + " empty documents" : "") + ")");
  }
  if (split && val.empty()) {
    return InvalidInput("val split is empty: the " + std::to_string(report.documents) +
                        " documents are too short for val_fraction " +
                        FormatDouble(options.val_fraction) + " to take a token from any");
  }

  const int64_t vocab = tokenizer->VocabSize();
  MW_RETURN_IF_ERROR(WriteTokenFile(options.train_out, train, options.format, vocab));
  if (split) MW_RETURN_IF_ERROR(WriteTokenFile(options.val_out, val, options.format, vocab));
  report.train_tokens = static_cast<int64_t>(train.size());
  report.val_tokens = static_cast<int64_t>(val.size());
  return report;
}

}  // namespace meshwork::data
