// libmeshwork_spm.so: Debian's libsentencepiece behind the C ABI of spm_module.h, loaded by
// meshwork-train with deep binding (see spm_module.h for why it is not linked directly).
#include "trainer/data/spm_module.h"

#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct MwSpm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int mwspm_load(const char* path, MwSpm** out, char** err) {
  try {
    auto spm = std::make_unique<MwSpm>();
    const auto status = spm->processor.Load(path);
    if (!status.ok()) {
      *err = CopyString(status.ToString());
      return 1;
    }
    *out = spm.release();
    return 0;
  } catch (const std::exception& e) {
    *err = CopyString(e.what());
    return 2;
  }
}

__attribute__((visibility("default"))) void mwspm_free(MwSpm* spm) { delete spm; }

__attribute__((visibility("default"))) int mwspm_vocab_size(const MwSpm* spm) {
  return spm->processor.GetPieceSize();
}

__attribute__((visibility("default"))) int mwspm_piece_to_id(const MwSpm* spm, const char* piece) {
  // PieceToId answers unk's id for an unknown piece; only unk's own piece may map to it.
  const int id = spm->processor.PieceToId(piece);
  if (id == spm->processor.unk_id() && spm->processor.IdToPiece(id) != piece) return -1;
  return id;
}

__attribute__((visibility("default"))) int mwspm_special_id(const MwSpm* spm, int which) {
  switch (which) {
    case meshwork::data::kSpmBos: return spm->processor.bos_id();
    case meshwork::data::kSpmEos: return spm->processor.eos_id();
    case meshwork::data::kSpmUnk: return spm->processor.unk_id();
    case meshwork::data::kSpmPad: return spm->processor.pad_id();
  }
  return -1;
}

__attribute__((visibility("default"))) int mwspm_encode(const MwSpm* spm, const char* text, size_t len,
                                                        int32_t** ids, size_t* n, char** err) {
  try {
    std::vector<int> out;
    const auto status = spm->processor.Encode(std::string_view(text, len), &out);
    if (!status.ok()) {
      *err = CopyString(status.ToString());
      return 1;
    }
    *n = out.size();
    *ids = static_cast<int32_t*>(std::malloc(std::max<size_t>(out.size(), 1) * sizeof(int32_t)));
    if (*ids == nullptr) {
      *err = CopyString("out of memory for " + std::to_string(out.size()) + " ids");
      return 2;
    }
    for (size_t i = 0; i < out.size(); ++i) (*ids)[i] = out[i];
    return 0;
  } catch (const std::exception& e) {
    *err = CopyString(e.what());
    return 2;
  }
}

__attribute__((visibility("default"))) int mwspm_decode(const MwSpm* spm, const int32_t* ids, size_t n,
                                                        char** text, size_t* len, char** err) {
  try {
    std::vector<int> in(ids, ids + n);
    std::string out;
    const auto status = spm->processor.Decode(in, &out);
    if (!status.ok()) {
      *err = CopyString(status.ToString());
      return 1;
    }
    *len = out.size();
    *text = CopyString(out);
    return 0;
  } catch (const std::exception& e) {
    *err = CopyString(e.what());
    return 2;
  }
}

__attribute__((visibility("default"))) void mwspm_free_buffer(void* buffer) { std::free(buffer); }

}  // extern "C"
