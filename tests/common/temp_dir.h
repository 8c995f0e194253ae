// Scratch folders and raw file helpers shared by the test suites.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/file.h"

namespace meshwork::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "meshwork_test_XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  // RemoveTree, not std::filesystem::remove_all, which crashes in a process linked with PyPI's
  // libtorch 2.x (common/file.h).
  ~TempDir() {
    if (!path_.empty()) (void)RemoveTree(path_);
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

// Whether any entry of `dir` has `part` in its name (e.g. a leftover ".tmp").
inline bool AnyNameContains(const std::string& dir, const std::string& part) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find(part) != std::string::npos) return true;
  }
  return false;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace meshwork::testing
