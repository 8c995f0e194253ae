// Opening meshwork-train's optional modules (plugin.h).
#include "trainer/data/plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace meshwork::data {
namespace {

namespace fs = std::filesystem;

std::string SelfDirectory() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return fs::path(buf).parent_path().string();
}

}  // namespace

Plugin OpenPlugin(const std::string& file_name, const char* env_var, const std::string& build_path,
                  const std::string& what) {
  Plugin plugin;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    const std::string self = SelfDirectory();
    if (!self.empty()) candidates.push_back(self + "/" + file_name);
    if (!build_path.empty()) candidates.push_back(build_path);
  }
  std::string tried;
  for (const auto& path : candidates) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      tried += (tried.empty() ? "" : ", ") + path + " (absent)";
      continue;
    }
    plugin.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (plugin.handle != nullptr) return plugin;
    tried += (tried.empty() ? "" : ", ") + path + " (" + dlerror() + ")";
  }
  plugin.error = "cannot load " + what + " " + file_name + ": tried " + tried + " (set " + env_var + " to its path)";
  return plugin;
}

}  // namespace meshwork::data
