// llm.c header bytes built by hand for the trainer/data tests, plus the shared scratch helpers.
#pragma once

#include <cstdint>
#include <string>

#include "tests/common/temp_dir.h"

namespace meshwork::data::testing {

using meshwork::testing::ReadBytes;
using meshwork::testing::TempDir;
using meshwork::testing::WriteBytes;

inline void AppendLe(std::string& out, uint32_t v, int width) {
  for (int b = 0; b < width; ++b) out.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}

// An llm.c header built by hand, independent of WriteTokenFile.
inline std::string LlmcHeader(int32_t magic, int32_t version, int32_t count) {
  std::string h;
  AppendLe(h, static_cast<uint32_t>(magic), 4);
  AppendLe(h, static_cast<uint32_t>(version), 4);
  AppendLe(h, static_cast<uint32_t>(count), 4);
  h.resize(1024, '\0');
  return h;
}

}  // namespace meshwork::data::testing
