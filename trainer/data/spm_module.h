// The C ABI of libmeshwork_spm.so, the module that holds Debian's libsentencepiece
// (trainer/data/spm_module.cpp). meshwork-train loads it with dlopen(RTLD_DEEPBIND) on first use
// rather than linking it: libsentencepiece carries and exports its own copy of protobuf-lite,
// and meshwork-train already has the system's libprotobuf (through libtorch); linked together,
// one copy's symbols would serve code compiled against the other's layouts. Deep binding makes
// the module's libsentencepiece resolve protobuf against its own copy.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
struct MwSpm;
// 0 on success; on failure *err holds a message to release with mwspm_free_buffer.
using MwSpmLoadFn = int (*)(const char* path, MwSpm** out, char** err);
using MwSpmFreeFn = void (*)(MwSpm* spm);
using MwSpmVocabSizeFn = int (*)(const MwSpm* spm);
// The id of `piece`, or -1 when the vocabulary has no such piece.
using MwSpmPieceToIdFn = int (*)(const MwSpm* spm, const char* piece);
// bos, eos, unk and pad ids as the model defines them; -1 where it has none.
using MwSpmSpecialIdFn = int (*)(const MwSpm* spm, int which);
using MwSpmEncodeFn = int (*)(const MwSpm* spm, const char* text, size_t len, int32_t** ids,
                              size_t* n, char** err);
using MwSpmDecodeFn = int (*)(const MwSpm* spm, const int32_t* ids, size_t n, char** text,
                              size_t* len, char** err);
using MwSpmFreeBufferFn = void (*)(void* buffer);
}

namespace meshwork::data {
enum MwSpmSpecial { kSpmBos = 0, kSpmEos = 1, kSpmUnk = 2, kSpmPad = 3 };
}  // namespace meshwork::data
