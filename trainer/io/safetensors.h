// Reader and writer for the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON describing each tensor's dtype,
// shape and byte range, then the raw little-endian tensor bytes.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshwork::io {

using TensorMap = std::map<std::string, torch::Tensor>;

// One tensor as the header describes it; offsets are relative to the start of the byte buffer
// that follows the header.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A validated header: every entry's byte range is consistent with its dtype and shape, lies
// inside the file and overlaps no other entry.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" object
  uint64_t data_start = 0;  // file offset of the byte buffer (8 + N)

  const SafetensorsEntry* Find(const std::string& name) const;
};

// Reads only the header, so callers can list names and check shapes before reading gigabytes.
// Missing file: NotFound. Malformed header: InvalidInput naming the file and, where there is
// one, the tensor.
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// Reads every tensor into freshly allocated, contiguous CPU tensors of the stored dtype.
// Errors as ReadSafetensorsHeader.
Result<TensorMap> ReadSafetensors(const std::string& path);

// Writes `tensors` (copied to contiguous CPU, dtype kept) and `metadata` to `path` through a
// temporary file and a rename, so `path` is either the old file or the complete new one.
// An unsupported dtype or the reserved name "__metadata__" is InvalidInput; an OS failure is
// IOError naming the path.
Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype string ("F32", "BF16", ...) for a torch dtype; empty when the format
// has none that libtorch can also represent.
std::string SafetensorsDtypeName(torch::ScalarType dtype);

}  // namespace meshwork::io
