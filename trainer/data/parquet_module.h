// The C ABI of libmeshwork_parquet.so, the module that reads Parquet files through Apache Arrow's
// C++ library (trainer/data/parquet_module.cpp). meshwork-train loads it with dlopen on first use
// rather than linking it: Arrow comes from PyPI's pyarrow wheel (Debian 12 does not package Arrow,
// scripts/setup.sh installs the wheel's libraries and headers), is 40 MB of shared libraries, and
// needs C++20 headers; a meshwork-train without the module (the images, the GPU prebuilt) still
// runs and refuses a Parquet input with a message that says what is missing. Deep binding keeps
// Arrow's bundled dependencies (thrift, compression codecs) from meeting libtorch's.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
struct MwParquet;
// Return codes: 0 ok; kMwParquetBadInput the file or its column is not usable (not Parquet, no
// such column, not a string column, a null row); kMwParquetIoError it could not be read.
// On failure *err holds a message to release with mwparquet_free_buffer.
enum { kMwParquetOk = 0, kMwParquetBadInput = 1, kMwParquetIoError = 2 };
// Opens `path` to read the top-level string column `column`, row group by row group.
using MwParquetOpenFn = int (*)(const char* path, const char* column, MwParquet** out, char** err);
using MwParquetFreeFn = void (*)(MwParquet* file);
using MwParquetNumRowsFn = int64_t (*)(const MwParquet* file);
// The next rows of the column, at most max_rows: texts[i] and lengths[i] point into the module's
// memory, valid until the next call or mwparquet_free. *n = 0 at the end; *first_row is the
// 0-based row number of texts[0]. A null value is kMwParquetBadInput naming its row.
using MwParquetNextFn = int (*)(MwParquet* file, size_t max_rows, const char** texts, size_t* lengths, size_t* n,
                                int64_t* first_row, char** err);
using MwParquetFreeBufferFn = void (*)(void* buffer);
}
