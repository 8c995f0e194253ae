// Helpers shared by the k8s client tests: temp dirs, files, env guards.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace meshwork::k8s::testing {

// A fresh directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mw-k8s-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& content) const {
    std::string p = path_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream(p) << content;
    return p;
  }

 private:
  std::string path_;
};

// Sets (or unsets, with nullptr) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old, had_ = true;
    if (value != nullptr) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1); else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

inline std::string ReadTestdata(const std::string& name) {
  std::ifstream f(std::string(MESHWORK_SOURCE_DIR) + "/tests/operator/k8s/testdata/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace meshwork::k8s::testing
