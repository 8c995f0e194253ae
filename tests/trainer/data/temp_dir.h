// Scratch folders and raw file helpers shared by the trainer/data tests.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace meshwork::data::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "meshwork_data_test_XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

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
