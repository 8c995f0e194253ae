// Tokenizers: the byte-level vocabulary, Hugging Face tokenizer.json through the Rust library's
// C ABI, and SentencePiece through the deep-bound module (spm_module.h).
#include "trainer/data/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

#include "trainer/data/plugin.h"
#include "trainer/data/spm_module.h"
#ifdef MESHWORK_HAVE_HF_TOKENIZERS
#include "trainer/data/hf_tokenizers/mwtok.h"
#endif

namespace meshwork::data {
namespace {

namespace fs = std::filesystem;

Status CheckUtf8(std::string_view text) {
  const size_t bad = FirstInvalidUtf8(text);
  if (bad == std::string_view::npos) return Status::Ok();
  return InvalidInput("invalid UTF-8 at byte offset " + std::to_string(bad));
}

// --- the byte-level vocabulary -------------------------------------------------------------------

class ByteTokenizer : public Tokenizer {
 public:
  ByteTokenizer() : Tokenizer(TokenizerKind::kBytes, "") {
    description_ = "the byte-level vocabulary (259 tokens)";
    bos_ = kBosToken;
    eos_ = kEosToken;
    specials_source_ = "the byte-level vocabulary";
  }
  Result<std::vector<uint32_t>> Encode(std::string_view text) const override {
    return EncodeBytes(text, false, false);
  }
  Result<std::string> Decode(const std::vector<uint32_t>& ids) const override { return DecodeBytes(ids); }
  int64_t VocabSize() const override { return kByteVocabSize; }
};

// --- special tokens ------------------------------------------------------------------------------

// tokenizer_config.json's bos_token / eos_token: a string, an AddedToken object ({"content": ...})
// or null. "" where absent or null.
struct ConfigSpecials {
  std::string bos, eos;
  bool found = false;
};

Result<ConfigSpecials> ReadTokenizerConfig(const fs::path& dir) {
  ConfigSpecials out;
  const fs::path file = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return out;
  std::ifstream in(file, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidInput("'" + file.string() + "' is not valid JSON: " + e.what());
  }
  auto name = [&](const char* key) -> Result<std::string> {
    if (!j.is_object() || !j.contains(key) || j[key].is_null()) return std::string();
    const auto& v = j[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return InvalidInput("'" + file.string() + "': " + key + " must be a string or an object with \"content\", got " +
                        v.dump());
  };
  MW_ASSIGN_OR_RETURN(out.bos, name("bos_token"));
  MW_ASSIGN_OR_RETURN(out.eos, name("eos_token"));
  out.found = true;
  return out;
}

constexpr const char* kUsualBos[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>", "<|bos|>"};
constexpr const char* kUsualEos[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>", "<|eos|>"};

// Sets bos and eos on a loaded tokenizer. `lookup` maps a token's text to its id, `model_bos` and
// `model_eos` are what the model file itself defines (SentencePiece), `config_dir` is where a
// tokenizer_config.json may be.
template <typename Lookup>
Status ResolveSpecials(const TokenizerOptions& options, const fs::path& config_dir, const std::string& what,
                       Lookup lookup, std::optional<uint32_t> model_bos, std::optional<uint32_t> model_eos,
                       std::optional<uint32_t>* bos, uint32_t* eos, std::string* source) {
  auto named = [&](const std::string& token, const std::string& from) -> Result<uint32_t> {
    std::optional<uint32_t> id = lookup(token);
    if (!id) return InvalidInput(from + " '" + token + "' is not a token of " + what);
    return *id;
  };
  std::vector<std::string> sources;
  std::optional<uint32_t> found_bos, found_eos;
  if (!options.bos_token.empty()) {
    MW_ASSIGN_OR_RETURN(found_bos, named(options.bos_token, "--bos-token"));
    sources.push_back("--bos-token");
  }
  if (!options.eos_token.empty()) {
    MW_ASSIGN_OR_RETURN(found_eos, named(options.eos_token, "--eos-token"));
    sources.push_back("--eos-token");
  }
  if (!found_bos || !found_eos) {
    MW_ASSIGN_OR_RETURN(ConfigSpecials config, ReadTokenizerConfig(config_dir));
    const std::string config_file = (config_dir / "tokenizer_config.json").string();
    if (!found_bos && !config.bos.empty()) {
      MW_ASSIGN_OR_RETURN(found_bos, named(config.bos, config_file + "'s bos_token"));
      sources.push_back("tokenizer_config.json");
    }
    if (!found_eos && !config.eos.empty()) {
      MW_ASSIGN_OR_RETURN(found_eos, named(config.eos, config_file + "'s eos_token"));
      sources.push_back("tokenizer_config.json");
    }
  }
  if (!found_bos && model_bos) {
    found_bos = model_bos;
    sources.push_back("the model file");
  }
  if (!found_eos && model_eos) {
    found_eos = model_eos;
    sources.push_back("the model file");
  }
  for (const char* usual : kUsualBos) {
    if (found_bos) break;
    if ((found_bos = lookup(usual))) sources.push_back(std::string("the usual name ") + usual);
  }
  for (const char* usual : kUsualEos) {
    if (found_eos) break;
    if ((found_eos = lookup(usual))) sources.push_back(std::string("the usual name ") + usual);
  }
  if (!found_eos) {
    return InvalidInput(what + " names no end-of-document token (no eos_token in a tokenizer_config.json beside "
                        "it, none of </s>, <|end_of_text|>, <|endoftext|>, <eos> in its vocabulary): pass "
                        "--eos-token TOKEN");
  }
  *bos = found_bos;
  *eos = *found_eos;
  source->clear();
  for (const auto& s : sources) {
    if (source->find(s) == std::string::npos) *source += (source->empty() ? "" : ", ") + s;
  }
  return Status::Ok();
}

// --- Hugging Face tokenizer.json ------------------------------------------------------------------

#ifdef MESHWORK_HAVE_HF_TOKENIZERS
std::string TakeError(char* err) {
  std::string message = err != nullptr ? err : "unknown error";
  mwtok_free_string(err);
  return message;
}

std::vector<uint32_t> TakeIds(MwIds ids) {
  std::vector<uint32_t> out(ids.data, ids.data + ids.len);
  mwtok_free_ids(ids);
  return out;
}

class HfTokenizer : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path, const TokenizerOptions& options) {
    MwTokenizer* raw = nullptr;
    char* err = nullptr;
    if (mwtok_load(path.c_str(), &raw, &err) != 0) {
      return InvalidInput("cannot read the Hugging Face tokenizer '" + path + "': " + TakeError(err));
    }
    std::unique_ptr<HfTokenizer> tok(new HfTokenizer(path, raw));
    tok->description_ = "Hugging Face tokenizer '" + path + "' (" + std::to_string(tok->VocabSize()) + " tokens)";
    auto lookup = [t = tok.get()](const std::string& token) -> std::optional<uint32_t> {
      uint32_t id = 0;
      if (mwtok_token_to_id(t->tok_, token.c_str(), &id) == 0) return std::nullopt;
      return id;
    };
    MW_RETURN_IF_ERROR(ResolveSpecials(options, fs::path(path).parent_path(), "the Hugging Face tokenizer '" + path + "'",
                                       lookup, std::nullopt, std::nullopt, &tok->bos_, &tok->eos_,
                                       &tok->specials_source_));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  ~HfTokenizer() override { mwtok_free(tok_); }

  Result<std::vector<uint32_t>> Encode(std::string_view text) const override {
    MwIds ids{};
    char* err = nullptr;
    if (mwtok_encode(tok_, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 0, &ids, &err) != 0) {
      return InvalidInput(TakeError(err));
    }
    return TakeIds(ids);
  }
  Result<std::vector<std::vector<uint32_t>>> EncodeBatch(const std::vector<std::string_view>& texts) const override {
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    for (auto t : texts) {
      ptrs.push_back(reinterpret_cast<const uint8_t*>(t.data()));
      lens.push_back(t.size());
    }
    std::vector<MwIds> out(texts.size());
    size_t bad = 0;
    char* err = nullptr;
    if (mwtok_encode_batch(tok_, ptrs.data(), lens.data(), texts.size(), 0, out.data(), &bad, &err) != 0) {
      if (bad == SIZE_MAX) return Internal("the Hugging Face tokenizer failed on a batch: " + TakeError(err));
      return InvalidInput("text " + std::to_string(bad) + " of the batch: " + TakeError(err));
    }
    std::vector<std::vector<uint32_t>> result;
    result.reserve(out.size());
    for (MwIds ids : out) result.push_back(TakeIds(ids));
    return result;
  }
  Result<std::string> Decode(const std::vector<uint32_t>& ids) const override {
    char* text = nullptr;
    char* err = nullptr;
    if (mwtok_decode(tok_, ids.data(), ids.size(), 0, &text, &err) != 0) return InvalidInput(TakeError(err));
    std::string out = text;
    mwtok_free_string(text);
    return out;
  }
  int64_t VocabSize() const override { return static_cast<int64_t>(mwtok_vocab_size(tok_)); }

 private:
  HfTokenizer(std::string path, MwTokenizer* tok) : Tokenizer(TokenizerKind::kHuggingFace, std::move(path)), tok_(tok) {}
  MwTokenizer* tok_;  // owned
};
#endif  // MESHWORK_HAVE_HF_TOKENIZERS

// --- SentencePiece, through the deep-bound module ---------------------------------------------------

struct SpmModule {
  void* handle = nullptr;
  MwSpmLoadFn load = nullptr;
  MwSpmFreeFn free = nullptr;
  MwSpmVocabSizeFn vocab_size = nullptr;
  MwSpmPieceToIdFn piece_to_id = nullptr;
  MwSpmSpecialIdFn special_id = nullptr;
  MwSpmEncodeFn encode = nullptr;
  MwSpmDecodeFn decode = nullptr;
  MwSpmFreeBufferFn free_buffer = nullptr;
  std::string error;  // why it could not be loaded
};

// The module is looked for at $MESHWORK_SPM_MODULE, beside the running executable, and where this
// build put it.
const SpmModule& Spm() {
  static SpmModule module;
  static std::once_flag once;
  std::call_once(once, [] {
#ifndef MESHWORK_SPM_MODULE_BUILD_PATH
    module.error = "this meshwork-train was built without SentencePiece (libsentencepiece-dev was not found when "
                   "it was configured; scripts/setup.sh installs it)";
#else
    const Plugin plugin = OpenPlugin("libmeshwork_spm.so", "MESHWORK_SPM_MODULE", MESHWORK_SPM_MODULE_BUILD_PATH,
                                     "the SentencePiece module");
    if (plugin.handle == nullptr) {
      module.error = plugin.error;
      return;
    }
    module.handle = plugin.handle;
    auto sym = [&](const char* name) { return dlsym(module.handle, name); };
    module.load = reinterpret_cast<MwSpmLoadFn>(sym("mwspm_load"));
    module.free = reinterpret_cast<MwSpmFreeFn>(sym("mwspm_free"));
    module.vocab_size = reinterpret_cast<MwSpmVocabSizeFn>(sym("mwspm_vocab_size"));
    module.piece_to_id = reinterpret_cast<MwSpmPieceToIdFn>(sym("mwspm_piece_to_id"));
    module.special_id = reinterpret_cast<MwSpmSpecialIdFn>(sym("mwspm_special_id"));
    module.encode = reinterpret_cast<MwSpmEncodeFn>(sym("mwspm_encode"));
    module.decode = reinterpret_cast<MwSpmDecodeFn>(sym("mwspm_decode"));
    module.free_buffer = reinterpret_cast<MwSpmFreeBufferFn>(sym("mwspm_free_buffer"));
    if (!module.load || !module.free || !module.vocab_size || !module.piece_to_id || !module.special_id ||
        !module.encode || !module.decode || !module.free_buffer) {
      module.error = "the SentencePiece module lacks a function (a module from another Meshwork version?)";
      module.load = nullptr;
    }
#endif
  });
  return module;
}

// The module's error message, its buffer released.
std::string TakeSpmError(const SpmModule& m, char* err) {
  std::string message = err != nullptr ? err : "unknown error";
  m.free_buffer(err);
  return message;
}

class SpmTokenizer : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path, const TokenizerOptions& options) {
    const SpmModule& m = Spm();
    if (m.load == nullptr) return Unavailable(m.error);
    MwSpm* raw = nullptr;
    char* err = nullptr;
    if (m.load(path.c_str(), &raw, &err) != 0) {
      return InvalidInput("cannot read the SentencePiece model '" + path + "': " + TakeSpmError(m, err));
    }
    std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer(path, raw));
    tok->description_ = "SentencePiece model '" + path + "' (" + std::to_string(tok->VocabSize()) + " tokens)";
    auto as_id = [](int id) -> std::optional<uint32_t> {
      if (id < 0) return std::nullopt;
      return static_cast<uint32_t>(id);
    };
    auto lookup = [&m, raw, &as_id](const std::string& piece) { return as_id(m.piece_to_id(raw, piece.c_str())); };
    MW_RETURN_IF_ERROR(ResolveSpecials(options, fs::path(path).parent_path(), "the SentencePiece model '" + path + "'",
                                       lookup, as_id(m.special_id(raw, kSpmBos)), as_id(m.special_id(raw, kSpmEos)),
                                       &tok->bos_, &tok->eos_, &tok->specials_source_));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  ~SpmTokenizer() override { Spm().free(spm_); }

  Result<std::vector<uint32_t>> Encode(std::string_view text) const override {
    // SentencePiece would replace invalid bytes silently; the Hugging Face path refuses them.
    MW_RETURN_IF_ERROR(CheckUtf8(text));
    const SpmModule& m = Spm();
    int32_t* ids = nullptr;
    size_t n = 0;
    char* err = nullptr;
    if (m.encode(spm_, text.data(), text.size(), &ids, &n, &err) != 0) {
      return InvalidInput("SentencePiece: " + TakeSpmError(m, err));
    }
    std::vector<uint32_t> out(ids, ids + n);
    m.free_buffer(ids);
    return out;
  }
  Result<std::string> Decode(const std::vector<uint32_t>& ids) const override {
    const SpmModule& m = Spm();
    std::vector<int32_t> in(ids.begin(), ids.end());
    char* text = nullptr;
    size_t len = 0;
    char* err = nullptr;
    if (m.decode(spm_, in.data(), in.size(), &text, &len, &err) != 0) {
      return InvalidInput("SentencePiece: " + TakeSpmError(m, err));
    }
    std::string out(text, len);
    m.free_buffer(text);
    return out;
  }
  int64_t VocabSize() const override { return Spm().vocab_size(spm_); }

 private:
  SpmTokenizer(std::string path, MwSpm* spm) : Tokenizer(TokenizerKind::kSentencePiece, std::move(path)), spm_(spm) {}
  MwSpm* spm_;  // owned
};

}  // namespace

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

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

Result<std::vector<std::vector<uint32_t>>> Tokenizer::EncodeBatch(const std::vector<std::string_view>& texts) const {
  std::vector<std::vector<uint32_t>> out;
  out.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = Encode(texts[i]);
    if (!ids.ok()) return InvalidInput("text " + std::to_string(i) + " of the batch: " + ids.status().message());
    out.push_back(std::move(*ids));
  }
  return out;
}

std::string FindTokenizerFile(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

bool HaveHuggingFaceTokenizers() {
#ifdef MESHWORK_HAVE_HF_TOKENIZERS
  return true;
#else
  return false;
#endif
}

bool HaveSentencePiece(std::string* why_not) {
  const SpmModule& m = Spm();
  if (why_not != nullptr) *why_not = m.error;
  return m.load != nullptr;
}

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec, const TokenizerOptions& options) {
  if (spec == "bytes") {
    if (!options.bos_token.empty() || !options.eos_token.empty()) {
      return InvalidConfig("--bos-token and --eos-token apply to a tokenizer file; the byte-level vocabulary's are "
                           "fixed (<|bos|> 256, <|eos|> 257)");
    }
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  std::error_code ec;
  const fs::file_status st = fs::status(spec, ec);
  if (st.type() == fs::file_type::not_found) return NotFound("tokenizer '" + spec + "' does not exist");
  std::string file = spec;
  if (fs::is_directory(st)) {
    file = FindTokenizerFile(spec);
    if (file.empty()) {
      return NotFound("tokenizer directory '" + spec + "' has neither tokenizer.json nor tokenizer.model");
    }
  }
  const std::string ext = fs::path(file).extension().string();
  if (ext == ".json") {
#ifdef MESHWORK_HAVE_HF_TOKENIZERS
    return HfTokenizer::Load(file, options);
#else
    return Unavailable("cannot read '" + file + "': this meshwork-train was built without Hugging Face tokenizers "
                       "(no cargo when it was configured; scripts/setup.sh builds them)");
#endif
  }
  if (ext == ".model") return SpmTokenizer::Load(file, options);
  return InvalidInput("tokenizer '" + file + "': expected a Hugging Face tokenizer.json (.json) or a SentencePiece "
                      "model (.model), or 'bytes'");
}

Status TrainBpeTokenizer(const std::vector<std::string>& texts, int64_t vocab_size, const std::string& dir) {
  if (vocab_size < 258 || vocab_size > (int64_t{1} << 31)) {
    return InvalidConfig("--vocab-size: " + std::to_string(vocab_size) +
                         " must count the 256 byte tokens and the 2 special tokens (>= 258) and stay below 2^31");
  }
#ifdef MESHWORK_HAVE_HF_TOKENIZERS
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IOError("cannot create the tokenizer directory '" + dir + "': " + ec.message());
  std::vector<const uint8_t*> data;
  std::vector<size_t> lens;
  for (const auto& t : texts) {
    data.push_back(reinterpret_cast<const uint8_t*>(t.data()));
    lens.push_back(t.size());
  }
  const char* specials[] = {"<|begin_of_text|>", "<|end_of_text|>"};
  // Written beside, then renamed: a tokenizer.json that exists is a whole one.
  const std::string out = (fs::path(dir) / "tokenizer.json").string();
  const std::string tmp = out + ".tmp";
  char* err = nullptr;
  const int rc = mwtok_train_bpe(data.data(), lens.data(), data.size(), static_cast<size_t>(vocab_size), specials, 2,
                                 tmp.c_str(), &err);
  if (rc != 0) {
    fs::remove(tmp, ec);
    return rc == 1 ? InvalidInput("training the tokenizer: " + TakeError(err))
                   : Internal("training the tokenizer: " + TakeError(err));
  }
  fs::rename(tmp, out, ec);
  if (ec) return IOError("cannot rename '" + tmp + "' to '" + out + "': " + ec.message());
  nlohmann::ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["bos_token"] = specials[0];
  config["eos_token"] = specials[1];
  config["clean_up_tokenization_spaces"] = false;
  std::ofstream cfg((fs::path(dir) / "tokenizer_config.json").string(), std::ios::trunc);
  cfg << config.dump(2) << "\n";
  if (!cfg) return IOError("cannot write '" + (fs::path(dir) / "tokenizer_config.json").string() + "'");
  return Status::Ok();
#else
  (void)texts;
  (void)dir;
  return Unavailable("this meshwork-train was built without Hugging Face tokenizers (no cargo when it was "
                     "configured; scripts/setup.sh builds them)");
#endif
}

}  // namespace meshwork::data
