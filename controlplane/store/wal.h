// Record framing shared by the store's write-ahead log and snapshot files: each record is
// [u32 little-endian payload length][u32 little-endian CRC32 of the payload][payload bytes].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshwork::controlplane::wal {

inline constexpr size_t kHeaderBytes = 8;
inline constexpr uint32_t kMaxRecordBytes = 256u * 1024 * 1024;

uint32_t Crc32(std::string_view data);

// Appends one framed record for `payload` to `out`.
void AppendRecord(std::string_view payload, std::string* out);

struct ReadResult {
  std::vector<std::string> payloads;  // the good records, in order
  size_t good_bytes = 0;              // offset just past the last good record
  bool torn_tail = false;             // bytes after good_bytes were an incomplete/corrupt last record
  std::string tail_reason;            // why the tail was judged torn
  bool corrupt_middle = false;        // a bad record followed by more data: refuse to open
  std::string error;                  // the message for corrupt_middle
};

// Parses `data` (a whole file's contents) into records. A bad record that reaches the end of the
// data, or is followed only by zero bytes, and has no whole valid record anywhere after it, is a
// torn tail (a write cut short by a crash); any other bad record is corruption in the middle.
ReadResult ParseRecords(const std::string& data, const std::string& file_name);

// Whole-file read; false with errno text in *error.
bool ReadWholeFile(const std::string& path, std::string* out, std::string* error);
// write(2) all of `data`; false with errno text.
bool WriteAll(int fd, std::string_view data, std::string* error);
// fsync of a directory, so a rename or new file in it is durable.
bool FsyncDir(const std::string& dir, std::string* error);

}  // namespace meshwork::controlplane::wal
