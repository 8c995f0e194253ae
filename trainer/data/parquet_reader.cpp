// ParquetTextReader over the module's C ABI (parquet_module.h).
#include "trainer/data/parquet_reader.h"

#include <fstream>
#include <mutex>

#include "trainer/data/parquet_module.h"
#include "trainer/data/plugin.h"

namespace meshwork::data {
namespace {

struct ParquetModule {
  MwParquetOpenFn open = nullptr;
  MwParquetFreeFn free = nullptr;
  MwParquetNumRowsFn num_rows = nullptr;
  MwParquetNextFn next = nullptr;
  MwParquetFreeBufferFn free_buffer = nullptr;
  std::string error;  // why it is not available
};

// Looked for at $MESHWORK_PARQUET_MODULE, beside the running executable, and where this build put it.
const ParquetModule& Module() {
  static ParquetModule module;
  static std::once_flag once;
  std::call_once(once, [] {
#ifndef MESHWORK_PARQUET_MODULE_BUILD_PATH
    module.error = "this meshwork-train was built without Parquet support (Apache Arrow's C++ library, from the "
                   "pyarrow wheel scripts/setup.sh installs, was not found when it was configured); convert the "
                   "data to JSON Lines, or rebuild with scripts/setup.sh";
#else
    const Plugin plugin = OpenPlugin("libmeshwork_parquet.so", "MESHWORK_PARQUET_MODULE",
                                     MESHWORK_PARQUET_MODULE_BUILD_PATH, "the Parquet module");
    if (plugin.handle == nullptr) {
      module.error = plugin.error;
      return;
    }
    module.open = PluginSymbol<MwParquetOpenFn>(plugin, "mwparquet_open");
    module.free = PluginSymbol<MwParquetFreeFn>(plugin, "mwparquet_free");
    module.num_rows = PluginSymbol<MwParquetNumRowsFn>(plugin, "mwparquet_num_rows");
    module.next = PluginSymbol<MwParquetNextFn>(plugin, "mwparquet_next");
    module.free_buffer = PluginSymbol<MwParquetFreeBufferFn>(plugin, "mwparquet_free_buffer");
    if (!module.open || !module.free || !module.num_rows || !module.next || !module.free_buffer) {
      module.error = "the Parquet module lacks a function (a module from another Meshwork version?)";
      module.open = nullptr;
    }
#endif
  });
  return module;
}

Status FromModule(const ParquetModule& m, int code, char* err, const std::string& where) {
  std::string message = err != nullptr ? err : "unknown error";
  m.free_buffer(err);
  if (code == kMwParquetIoError) return IOError(where + ": " + message);
  return InvalidInput(where + ": " + message);
}

}  // namespace

bool LooksLikeParquet(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && magic[0] == 'P' && magic[1] == 'A' && magic[2] == 'R' && magic[3] == '1';
}

Result<std::unique_ptr<ParquetTextReader>> ParquetTextReader::Open(const std::string& path,
                                                                   const std::string& column) {
  const ParquetModule& m = Module();
  if (m.open == nullptr) return Unavailable("cannot read Parquet input '" + path + "': " + m.error);
  MwParquet* file = nullptr;
  char* err = nullptr;
  const int code = m.open(path.c_str(), column.c_str(), &file, &err);
  if (code != kMwParquetOk) return FromModule(m, code, err, "Parquet input '" + path + "'");
  return std::unique_ptr<ParquetTextReader>(new ParquetTextReader(path, column, file));
}

ParquetTextReader::~ParquetTextReader() { Module().free(file_); }

int64_t ParquetTextReader::num_rows() const { return Module().num_rows(file_); }

Result<size_t> ParquetTextReader::Next(size_t max_rows, size_t max_bytes, std::vector<std::string>* out,
                                       int64_t* first_row) {
  if (!pending_.ok()) return pending_;
  const ParquetModule& m = Module();
  std::vector<const char*> texts(max_rows);
  std::vector<size_t> lengths(max_rows);
  size_t added = 0, bytes = 0;
  while (added < max_rows && bytes < max_bytes) {
    size_t n = 0;
    int64_t row = 0;
    char* err = nullptr;
    const int code = m.next(file_, max_rows - added, texts.data(), lengths.data(), &n, &row, &err);
    if (code != kMwParquetOk) {
      // Rows read before the bad one are returned first; the error comes with the next call.
      const Status status = FromModule(m, code, err, "Parquet input '" + path_ + "'");
      if (added == 0) return status;
      pending_ = status;
      break;
    }
    if (n == 0) break;
    if (added == 0) *first_row = row;
    for (size_t i = 0; i < n; ++i) {
      out->emplace_back(texts[i], lengths[i]);
      bytes += lengths[i];
    }
    added += n;
  }
  return added;
}

}  // namespace meshwork::data
