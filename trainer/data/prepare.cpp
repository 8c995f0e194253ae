// Byte-level tokenisation of text files into train / val token files.
#include "trainer/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>
#include <utility>

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

// Where a document's val part begins: the last floor(n * val_fraction) tokens, moved forward
// past UTF-8 continuation bytes so neither split starts mid-character.
size_t SplitPoint(const std::vector<uint32_t>& tokens, double val_fraction) {
  const size_t n = tokens.size();
  const auto val = static_cast<size_t>(std::floor(static_cast<double>(n) * val_fraction));
  size_t split = n - val;
  while (split < n && IsUtf8Continuation(tokens[split])) ++split;
  return split;
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

std::vector<uint32_t> EncodeBytes(std::string_view text, bool add_bos, bool add_eos) {
  std::vector<uint32_t> tokens;
  tokens.reserve(text.size() + 2);
  if (add_bos) tokens.push_back(kBosToken);
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  if (add_eos) tokens.push_back(kEosToken);
  return tokens;
}

std::string DecodeBytes(const std::vector<uint32_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (uint32_t t : tokens) {
    if (t < 256) {
      text.push_back(static_cast<char>(t));
    } else if (t == kBosToken) {
      text += "<|bos|>";
    } else if (t == kEosToken) {
      text += "<|eos|>";
    } else if (t == kPadToken) {
      text += "<|pad|>";
    } else {
      text += "<|" + std::to_string(t) + "|>";
    }
  }
  return text;
}

Result<PrepareReport> PrepareTokens(const PrepareOptions& options) {
  MW_RETURN_IF_ERROR(ValidateOptions(options));
  MW_ASSIGN_OR_RETURN(std::vector<Document> docs, CollectDocuments(options.inputs));

  const bool split = !options.val_out.empty();
  PrepareReport report;
  std::vector<uint32_t> train;
  std::vector<uint32_t> val;
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
    const std::vector<uint32_t> tokens = EncodeBytes(text, /*add_bos=*/true, /*add_eos=*/true);
    const size_t at = split ? SplitPoint(tokens, options.val_fraction) : tokens.size();
    train.insert(train.end(), tokens.begin(), tokens.begin() + at);
    val.insert(val.end(), tokens.begin() + at, tokens.end());
    ++report.documents;
  }

  if (report.documents == 0) {
    std::string names;
    for (const auto& in : options.inputs) names += (names.empty() ? "'" : ", '") + in + "'";
    return InvalidInput("no text found in " + names + " (" +
                        std::to_string(report.skipped_empty_files) + " empty and " +
                        std::to_string(report.skipped_binary_files) + " binary files skipped)");
  }
  if (split && val.empty()) {
    return InvalidInput("val split is empty: the " + std::to_string(report.documents) +
                        " documents are too short for val_fraction " +
                        FormatDouble(options.val_fraction) + " to take a token from any");
  }

  MW_RETURN_IF_ERROR(WriteTokenFile(options.train_out, train, options.format));
  if (split) MW_RETURN_IF_ERROR(WriteTokenFile(options.val_out, val, options.format));
  report.train_tokens = static_cast<int64_t>(train.size());
  report.val_tokens = static_cast<int64_t>(val.size());
  return report;
}

}  // namespace meshwork::data
