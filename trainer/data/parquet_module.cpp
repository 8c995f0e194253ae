// libmeshwork_parquet.so: Apache Arrow's Parquet reader behind the C ABI of parquet_module.h
// (see there for why it is a module). Memory stays bounded by a batch of rows and the pages being
// decoded: the column is read through a RecordBatchReader with a small batch size, with
// pre-buffering (which reads whole column chunks ahead) off.
#include "trainer/data/parquet_module.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

struct MwParquet {
  std::string path;
  std::string column;
  int64_t num_rows = 0;
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::unique_ptr<arrow::RecordBatchReader> batches;
  std::shared_ptr<arrow::Array> current;  // the batch the caller's pointers point into
  int64_t current_offset = 0;             // rows of `current` already handed out
  int64_t next_row = 0;                   // file row number of current's row current_offset
};

namespace {

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

int Fail(char** err, int code, const std::string& message) {
  *err = CopyString(message);
  return code;
}

// Arrow reports a missing file as IOError and a non-Parquet one as Invalid or IOError with
// "Parquet magic bytes not found"; either way the message says which.
int FromStatus(char** err, const arrow::Status& status, const std::string& what) {
  const bool io = status.IsIOError() && status.message().find("magic") == std::string::npos &&
                  status.message().find("Parquet") == std::string::npos;
  return Fail(err, io ? kMwParquetIoError : kMwParquetBadInput, what + ": " + status.ToString());
}

bool IsStringType(const arrow::DataType& type) {
  if (type.id() == arrow::Type::DICTIONARY) {
    return IsStringType(*static_cast<const arrow::DictionaryType&>(type).value_type());
  }
  return type.id() == arrow::Type::STRING || type.id() == arrow::Type::LARGE_STRING ||
         type.id() == arrow::Type::STRING_VIEW;
}

// Row `at` of a string array (IsStringType; dictionary-encoded ones through their dictionary).
std::string_view ValueAt(const arrow::Array& array, int64_t at) {
  switch (array.type_id()) {
    case arrow::Type::STRING: return static_cast<const arrow::StringArray&>(array).GetView(at);
    case arrow::Type::LARGE_STRING: return static_cast<const arrow::LargeStringArray&>(array).GetView(at);
    case arrow::Type::DICTIONARY: {
      const auto& dict = static_cast<const arrow::DictionaryArray&>(array);
      return ValueAt(*dict.dictionary(), dict.GetValueIndex(at));
    }
    default: return static_cast<const arrow::StringViewArray&>(array).GetView(at);
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int mwparquet_open(const char* path, const char* column, MwParquet** out,
                                                          char** err) {
  try {
    auto file = std::make_unique<MwParquet>();
    file->path = path;
    file->column = column;
    parquet::ArrowReaderProperties properties;
    properties.set_batch_size(256);
    properties.set_pre_buffer(false);
    parquet::arrow::FileReaderBuilder builder;
    if (auto s = builder.OpenFile(path); !s.ok()) return FromStatus(err, s, "cannot open it as Parquet");
    auto reader = builder.properties(properties)->Build();
    if (!reader.ok()) return FromStatus(err, reader.status(), "cannot open it as Parquet");
    file->reader = std::move(*reader);

    std::shared_ptr<arrow::Schema> schema;
    if (auto s = file->reader->GetSchema(&schema); !s.ok()) return FromStatus(err, s, "cannot read its schema");
    const std::vector<int> matches = schema->GetAllFieldIndices(column);
    if (matches.size() > 1) {
      return Fail(err, kMwParquetBadInput, "has " + std::to_string(matches.size()) + " columns named '" +
                                               std::string(column) + "'");
    }
    if (matches.empty()) {
      std::string names;
      for (const auto& f : schema->fields()) names += (names.empty() ? "" : ", ") + f->name();
      return Fail(err, kMwParquetBadInput, "has no column '" + std::string(column) + "' (its columns: " + names + ")");
    }
    const int field = matches[0];
    const auto& type = *schema->field(field)->type();
    if (!IsStringType(type)) {
      return Fail(err, kMwParquetBadInput,
                  "column '" + std::string(column) + "' is " + type.ToString() + ", not a string column");
    }
    // The Parquet leaf column that holds this top-level field (a string field is one leaf).
    const auto& manifest = file->reader->manifest();
    const int leaf = manifest.schema_fields[static_cast<size_t>(field)].column_index;
    std::vector<int> row_groups(static_cast<size_t>(file->reader->num_row_groups()));
    for (size_t i = 0; i < row_groups.size(); ++i) row_groups[i] = static_cast<int>(i);
    auto batches = file->reader->GetRecordBatchReader(row_groups, {leaf});
    if (!batches.ok()) return FromStatus(err, batches.status(), "cannot read column '" + std::string(column) + "'");
    file->batches = std::move(*batches);
    file->num_rows = file->reader->parquet_reader()->metadata()->num_rows();
    *out = file.release();
    return kMwParquetOk;
  } catch (const parquet::ParquetException& e) {
    return Fail(err, kMwParquetBadInput, std::string("not a readable Parquet file: ") + e.what());
  } catch (const std::bad_alloc&) {
    return Fail(err, kMwParquetIoError, "out of memory opening it");
  } catch (const std::exception& e) {
    return Fail(err, kMwParquetBadInput, e.what());
  }
}

__attribute__((visibility("default"))) void mwparquet_free(MwParquet* file) { delete file; }

__attribute__((visibility("default"))) int64_t mwparquet_num_rows(const MwParquet* file) { return file->num_rows; }

__attribute__((visibility("default"))) int mwparquet_next(MwParquet* file, size_t max_rows, const char** texts,
                                                          size_t* lengths, size_t* n, int64_t* first_row,
                                                          char** err) {
  try {
    *n = 0;
    *first_row = file->next_row;
    while (file->current == nullptr || file->current_offset >= file->current->length()) {
      std::shared_ptr<arrow::RecordBatch> batch;
      if (auto s = file->batches->ReadNext(&batch); !s.ok()) {
        return FromStatus(err, s, "cannot read rows from " + std::to_string(file->next_row));
      }
      if (batch == nullptr) {
        file->current.reset();
        return kMwParquetOk;  // the end
      }
      file->current = batch->column(0);
      file->current_offset = 0;
    }
    const arrow::Array& array = *file->current;
    int64_t count = std::min<int64_t>(static_cast<int64_t>(max_rows), array.length() - file->current_offset);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = file->current_offset + i;
      if (array.IsNull(at)) {
        // The rows before it first; the next call starts at the null and reports it.
        if (i > 0) {
          count = i;
          break;
        }
        return Fail(err, kMwParquetBadInput,
                    "row " + std::to_string(file->next_row) + " of column '" + file->column + "' is null");
      }
      const std::string_view text = ValueAt(array, at);
      texts[i] = text.data();
      lengths[i] = text.size();
    }
    file->current_offset += count;
    file->next_row += count;
    *n = static_cast<size_t>(count);
    return kMwParquetOk;
  } catch (const parquet::ParquetException& e) {
    return Fail(err, kMwParquetBadInput, "cannot read rows from " + std::to_string(file->next_row) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return Fail(err, kMwParquetIoError, "out of memory reading rows from " + std::to_string(file->next_row));
  } catch (const std::exception& e) {
    return Fail(err, kMwParquetBadInput, e.what());
  }
}

__attribute__((visibility("default"))) void mwparquet_free_buffer(void* buffer) { std::free(buffer); }

}  // extern "C"
