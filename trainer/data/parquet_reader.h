// The text column of a Parquet file, read a batch of rows at a time through libmeshwork_parquet.so
// (Apache Arrow's C++ reader; parquet_module.h says why it is a module).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

struct MwParquet;

namespace meshwork::data {

// True when `path` begins with Parquet's magic bytes "PAR1" (false when it cannot be read).
bool LooksLikeParquet(const std::string& path);

class ParquetTextReader {
 public:
  // Unavailable when this meshwork-train has no Parquet module (the message says what is missing);
  // InvalidInput naming the file when it is not Parquet, has no such top-level column (listing
  // those it has) or the column is not of string type; IOError when it cannot be read.
  static Result<std::unique_ptr<ParquetTextReader>> Open(const std::string& path, const std::string& column);
  ~ParquetTextReader();
  ParquetTextReader(const ParquetTextReader&) = delete;
  ParquetTextReader& operator=(const ParquetTextReader&) = delete;

  int64_t num_rows() const;
  // Appends the next rows' values to `out` until at least `max_bytes` of text or `max_rows` rows
  // were added; returns how many (0: the end). *first_row: the 0-based row number of the first
  // one. A null value is InvalidInput naming the file, the column and the row.
  Result<size_t> Next(size_t max_rows, size_t max_bytes, std::vector<std::string>* out, int64_t* first_row);

 private:
  ParquetTextReader(std::string path, std::string column, MwParquet* file)
      : path_(std::move(path)), column_(std::move(column)), file_(file) {}
  std::string path_;
  std::string column_;
  MwParquet* file_;  // owned
  Status pending_;   // an error found after the rows a call returned, for the next call
};

}  // namespace meshwork::data
