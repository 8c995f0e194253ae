// data.token_format as a type, in a header of its own (no libtorch) so the config can hold it.
#pragma once

#include "common/enum_names.h"

namespace meshwork::data {

enum class TokenFormat {
  kAuto,    // llm.c if the file starts with its magic, else raw_u16 (what nanoGPT writes)
  kLlmc,    // llm.c: 1024-byte header of 256 little-endian int32, then uint16 or uint32 tokens
  kRawU16,  // header-less little-endian uint16 tokens (nanoGPT's train.bin)
  kRawU32,  // header-less little-endian uint32 tokens, for vocabularies above 65535
};

inline constexpr EnumName<TokenFormat> kTokenFormatNames[] = {{TokenFormat::kAuto, "auto"},
                                                             {TokenFormat::kLlmc, "llmc"},
                                                             {TokenFormat::kRawU16, "raw_u16"},
                                                             {TokenFormat::kRawU32, "raw_u32"}};
inline const char* TokenFormatName(TokenFormat format) { return NameOf(kTokenFormatNames, format); }

// data.order: how training rows are drawn from a token file (docs/data.md).
enum class SampleOrder {
  kRandom,  // random windows, with replacement: row r of step s from (seed, s, r) alone
  kEpochs,  // every non-overlapping window once per epoch, in a seeded permutation per epoch
};
inline constexpr EnumName<SampleOrder> kSampleOrderNames[] = {{SampleOrder::kRandom, "random"},
                                                             {SampleOrder::kEpochs, "epochs"}};

}  // namespace meshwork::data
