// safetensors reader and writer. The reader trusts nothing in the file: every length, shape and
// offset is checked before a byte is allocated or read, so a malformed file gives InvalidInput
// instead of a crash or a huge allocation.
#include "trainer/io/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "common/file.h"

// The format stores little-endian bytes and both sides copy them verbatim.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O copies raw bytes and assumes a little-endian host");

namespace meshwork::io {
namespace {

using nlohmann::json;

constexpr uint64_t kHeaderLengthBytes = 8;
// The reference implementation refuses headers over 100 MB; a real one is a few hundred KB, so
// anything larger is corruption and must not turn into a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeName {
  const char* name;
  torch::ScalarType dtype;
};

// The safetensors dtypes libtorch 1.13 can hold. U16/U32/U64 and the F8 types are left out:
// libtorch has no such dtype there, and they are rejected by name as unsupported.
constexpr DtypeName kDtypes[] = {
    {"F64", torch::kDouble}, {"F32", torch::kFloat},  {"F16", torch::kHalf},
    {"BF16", torch::kBFloat16}, {"I64", torch::kLong}, {"I32", torch::kInt},
    {"I16", torch::kShort},  {"I8", torch::kChar},    {"U8", torch::kByte},
    {"BOOL", torch::kBool},
};

bool DtypeFromName(const std::string& name, torch::ScalarType* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// A short rendering of a JSON value for error messages; long values are cut.
std::string Brief(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

Status BadTensor(const std::string& path, const std::string& name, const std::string& what) {
  return InvalidInput("safetensors file '" + path + "': tensor '" + name + "': " + what);
}

Status BadFile(const std::string& path, const std::string& what) {
  return InvalidInput("safetensors file '" + path + "': " + what);
}

Result<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name,
                                    const json& v, uint64_t buffer_size) {
  if (!v.is_object()) return BadTensor(path, name, "entry is not an object: " + Brief(v));
  SafetensorsEntry e;
  e.name = name;

  const auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    return BadTensor(path, name, "missing or non-string \"dtype\"");
  }
  const std::string dtype_name = dtype_it->get<std::string>();
  if (!DtypeFromName(dtype_name, &e.dtype)) {
    return BadTensor(path, name, "unknown or unsupported dtype \"" + dtype_name + "\"");
  }

  const auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    return BadTensor(path, name, "missing or non-array \"shape\"");
  }
  // Sizes are checked with zero dimensions counted as 1: libtorch rejects a shape whose
  // non-zero sizes overflow even when another size is 0, and so must we before calling it.
  uint64_t numel = 1;
  uint64_t bound = 1;
  bool overflow = false;
  for (const auto& d : *shape_it) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return BadTensor(path, name, "shape " + Brief(*shape_it) + " is not a list of sizes >= 0");
    }
    const uint64_t dim = d.get<uint64_t>();
    e.shape.push_back(static_cast<int64_t>(dim));
    overflow = overflow || __builtin_mul_overflow(bound, std::max<uint64_t>(dim, 1), &bound);
    numel *= dim;  // cannot overflow when `bound` does not
  }
  overflow = overflow || __builtin_mul_overflow(bound, c10::elementSize(e.dtype), &bound);
  if (overflow || bound > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return BadTensor(path, name, "shape " + ShapeString(e.shape) + " is too large");
  }
  const uint64_t nbytes = numel * c10::elementSize(e.dtype);

  const auto off_it = v.find("data_offsets");
  if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    return BadTensor(path, name, "\"data_offsets\" must be [begin, end], got " +
                                     (off_it == v.end() ? std::string("nothing") : Brief(*off_it)));
  }
  e.begin = (*off_it)[0].get<uint64_t>();
  e.end = (*off_it)[1].get<uint64_t>();
  if (e.begin > e.end || e.end > buffer_size) {
    return BadTensor(path, name,
                     "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         "] are out of range of the " + std::to_string(buffer_size) +
                         "-byte data buffer (truncated file?)");
  }
  if (e.end - e.begin != nbytes) {
    return BadTensor(path, name,
                     "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         "] hold " + std::to_string(e.end - e.begin) + " bytes but " +
                         dtype_name + " shape " + ShapeString(e.shape) + " needs " +
                         std::to_string(nbytes));
  }
  return e;
}

Result<SafetensorsHeader> ParseHeader(const std::string& path, const std::string& text,
                                      uint64_t file_size) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    return BadFile(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) return BadFile(path, "header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = kHeaderLengthBytes + text.size();
  const uint64_t buffer_size = file_size - h.data_start;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return BadFile(path, "\"__metadata__\" is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return BadFile(path, "\"__metadata__\" value for '" + mk + "' is not a string: " +
                                   Brief(mv));
        }
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    MW_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(path, key, value, buffer_size));
    h.tensors.push_back(std::move(entry));
  }

  // Overlapping ranges would alias two tensors onto the same bytes: a sign of a corrupt or
  // hand-crafted file. Gaps are tolerated; they cannot make us misread a tensor.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : h.tensors) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return BadTensor(path, by_offset[i]->name,
                       "data_offsets overlap those of tensor '" + by_offset[i - 1]->name + "'");
    }
  }
  return h;  // json objects iterate in key order, so tensors are already sorted by name
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsEntry& e, const std::string& n) {
                               return e.name < n;
                             });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

std::string SafetensorsDtypeName(torch::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "";
}

namespace {

Result<SafetensorsHeader> ReadHeader(const ReadOnlyFile& file) {
  const std::string& path = file.path();
  if (file.size() < kHeaderLengthBytes) {
    return BadFile(path, "truncated: " + std::to_string(file.size()) +
                             " bytes, shorter than the 8-byte header length");
  }
  unsigned char len_bytes[kHeaderLengthBytes];
  MW_RETURN_IF_ERROR(file.ReadAt(0, len_bytes, sizeof(len_bytes)));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file.size() - kHeaderLengthBytes) {
    return BadFile(path, "header length " + std::to_string(header_len) +
                             " is larger than the rest of the " + std::to_string(file.size()) +
                             "-byte file (truncated or not a safetensors file)");
  }
  if (header_len > kMaxHeaderBytes) {
    return BadFile(path, "header length " + std::to_string(header_len) + " exceeds the " +
                             std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  std::string text(header_len, '\0');
  MW_RETURN_IF_ERROR(file.ReadAt(kHeaderLengthBytes, text.data(), text.size()));
  return ParseHeader(path, text, file.size());
}

}  // namespace

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  MW_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(path));
  return ReadHeader(file);
}

Result<TensorMap> ReadSafetensors(const std::string& path) {
  MW_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(path));
  MW_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeader(file));
  TensorMap out;
  for (const auto& e : header.tensors) {
    // Read straight into the tensor's own storage (no intermediate whole-file buffer), so peak
    // memory stays at one copy of the weights. BOOL lands as bytes first: a stored byte other
    // than 0/1 is not a valid torch bool, and ne(0) normalises it.
    const bool is_bool = e.dtype == torch::kBool;
    torch::Tensor t;
    try {
      t = torch::empty(e.shape, torch::TensorOptions().dtype(is_bool ? torch::kByte : e.dtype));
    } catch (const c10::Error& err) {  // out of memory, typically
      return Internal("reading '" + path + "': cannot allocate tensor '" + e.name +
                      "': " + err.what_without_backtrace());
    }
    if (e.end > e.begin) {
      const Status s = file.ReadAt(header.data_start + e.begin, t.data_ptr(), e.end - e.begin);
      if (!s.ok()) return Status(s.code(), s.message() + " (tensor '" + e.name + "')");
    }
    out.emplace(e.name, is_bool ? t.ne(0) : t);
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                        const std::map<std::string, std::string>& metadata) {
  // Lay tensors out by element size, largest first, then by name: with the 8-byte aligned
  // header, every tensor then starts at a multiple of its element size, which lets readers
  // that mmap the file view tensors in place (as the reference writer arranges too).
  std::vector<std::pair<const std::string*, const torch::Tensor*>> order;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) {
      return InvalidInput("writing '" + path + "': tensor name '__metadata__' is reserved");
    }
    if (!t.defined()) {
      return InvalidInput("writing '" + path + "': tensor '" + name + "' is undefined");
    }
    if (SafetensorsDtypeName(t.scalar_type()).empty()) {
      return InvalidInput("writing '" + path + "': tensor '" + name + "' has dtype " +
                          std::string(c10::toString(t.scalar_type())) +
                          ", which safetensors I/O does not support");
    }
    order.emplace_back(&name, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->element_size() > b.second->element_size();
  });

  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    const uint64_t nbytes = static_cast<uint64_t>(t->numel()) * t->element_size();
    header[*name] = {{"dtype", SafetensorsDtypeName(t->scalar_type())},
                     {"shape", t->sizes().vec()},
                     {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // a name or metadata string that is not UTF-8
    return InvalidInput("writing '" + path + "': header cannot be encoded: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // spaces are legal JSON whitespace

  unsigned char len_bytes[kHeaderLengthBytes];
  uint64_t len = text.size();
  for (auto& b : len_bytes) {
    b = static_cast<unsigned char>(len & 0xff);
    len >>= 8;
  }

  MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  MW_RETURN_IF_ERROR(out.Write(len_bytes, sizeof(len_bytes)));
  MW_RETURN_IF_ERROR(out.Write(text.data(), text.size()));
  for (const auto& [name, t] : order) {
    // One tensor at a time, so a GPU model is never copied to host all at once.
    torch::Tensor cpu;
    try {
      cpu = t->detach().to(torch::kCPU).contiguous();
    } catch (const c10::Error& err) {
      return Internal("writing '" + path + "': cannot copy tensor '" + *name +
                      "' to host memory: " + err.what_without_backtrace());
    }
    const size_t nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
    if (nbytes > 0) MW_RETURN_IF_ERROR(out.Write(cpu.data_ptr(), nbytes));
  }
  return out.Commit();
}

}  // namespace meshwork::io
