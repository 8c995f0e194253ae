// Shared libraries that meshwork-train opens on first use instead of linking (SentencePiece,
// Parquet): where it looks for them and how, in one place. Each module's header says why it is
// a module.
#pragma once

#include <string>

namespace meshwork::data {

struct Plugin {
  void* handle = nullptr;  // from dlopen; never closed (the process keeps it to its end)
  std::string error;       // why it could not be opened, when handle is null
};

// Opens `file_name` (e.g. libmeshwork_spm.so) from $env_var when that is set and not empty (there
// only), else from beside the running executable, else from build_path (where the build tree put
// it, for tests run from there). Deep binding (RTLD_DEEPBIND) makes the module resolve symbols
// against its own dependencies first. `what` names the module in the error ("the SentencePiece
// module"), which lists every path tried and why each failed.
Plugin OpenPlugin(const std::string& file_name, const char* env_var, const std::string& build_path,
                  const std::string& what);

// A symbol of an opened plugin, cast to the function type the caller expects.
template <typename Fn>
Fn PluginSymbol(const Plugin& plugin, const char* name);

}  // namespace meshwork::data

#include <dlfcn.h>

namespace meshwork::data {
template <typename Fn>
Fn PluginSymbol(const Plugin& plugin, const char* name) {
  return reinterpret_cast<Fn>(dlsym(plugin.handle, name));
}
}  // namespace meshwork::data
