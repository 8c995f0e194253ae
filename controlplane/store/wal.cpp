// Record framing and file helpers for the store's WAL and snapshots (see wal.h).
#include "controlplane/store/wal.h"

#include <array>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace meshwork::controlplane::wal {
namespace {

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

bool AllZero(const std::string& data, size_t from) {
  for (size_t i = from; i < data.size(); ++i)
    if (data[i] != 0) return false;
  return true;
}

}  // namespace

uint32_t Crc32(std::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) c = table[(c ^ static_cast<uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void AppendRecord(std::string_view payload, std::string* out) {
  PutU32(static_cast<uint32_t>(payload.size()), out);
  PutU32(Crc32(payload), out);
  out->append(payload.data(), payload.size());
}

// True when a whole, CRC-valid record starts anywhere at or after `from`. A write cut short by
// a crash cannot be followed by one, so finding one means the bad record is damage in the
// middle (say a corrupted length field), not a torn tail. Payloads are JSON objects, so only
// offsets whose payload starts with '{' are checked.
static bool ContainsRecordAfter(const std::string& data, size_t from) {
  for (size_t p = from; p + kHeaderBytes < data.size(); ++p) {
    if (data[p + kHeaderBytes] != '{') continue;
    uint32_t len = GetU32(data.data() + p);
    if (len == 0 || len > kMaxRecordBytes || len > data.size() - p - kHeaderBytes) continue;
    if (Crc32(std::string_view(data.data() + p + kHeaderBytes, len)) == GetU32(data.data() + p + 4)) {
      return true;
    }
  }
  return false;
}

ReadResult ParseRecords(const std::string& data, const std::string& file_name) {
  ReadResult r;
  size_t off = 0;
  size_t index = 0;
  while (off < data.size()) {
    std::string why;
    size_t next = 0;
    if (data.size() - off < kHeaderBytes) {
      why = "an incomplete record header (" + std::to_string(data.size() - off) + " bytes)";
    } else {
      uint32_t len = GetU32(data.data() + off);
      uint32_t crc = GetU32(data.data() + off + 4);
      if (len == 0 || len > kMaxRecordBytes) {
        why = "an impossible record length " + std::to_string(len);
      } else if (data.size() - off - kHeaderBytes < len) {
        why = "a record of " + std::to_string(len) + " bytes cut short at " +
              std::to_string(data.size() - off - kHeaderBytes);
      } else if (Crc32(std::string_view(data.data() + off + kHeaderBytes, len)) != crc) {
        why = "a record whose CRC32 does not match";
        next = off + kHeaderBytes + len;
      } else {
        r.payloads.emplace_back(data, off + kHeaderBytes, len);
        off += kHeaderBytes + len;
        r.good_bytes = off;
        ++index;
        continue;
      }
    }
    // A bad record. Torn tail if nothing meaningful follows it, else corruption in the middle.
    // A length that runs past the end, or a short header, is a write cut short; an impossible
    // length is torn only when all that follows is zeros (a file extended but never written).
    bool nothing_after;
    if (next != 0) {
      nothing_after = next >= data.size() || AllZero(data, next);
    } else if (why.rfind("an impossible", 0) == 0) {
      nothing_after = AllZero(data, off + kHeaderBytes);
    } else {
      nothing_after = true;
    }
    if (nothing_after && ContainsRecordAfter(data, off + 1)) {
      nothing_after = false;
      if (next == 0) next = off;  // for the message below
    }
    if (nothing_after) {
      r.torn_tail = true;
      r.tail_reason = why + " at offset " + std::to_string(off) + " (record #" +
                      std::to_string(index) + "), " + std::to_string(data.size() - off) +
                      " bytes discarded";
    } else {
      r.corrupt_middle = true;
      r.error = file_name + ": " + why + " at offset " + std::to_string(off) + " (record #" +
                std::to_string(index) + ") is followed by " + std::to_string(data.size() - (next ? next : off)) +
                " more bytes of records: the file is corrupt in the middle, not torn at the end; "
                "refusing to open (restore the directory from a backup, or move the file away to "
                "discard what it holds)";
    }
    return r;
  }
  return r;
}

bool ReadWholeFile(const std::string& path, std::string* out, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  out->clear();
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = "cannot read " + path + ": " + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

bool WriteAll(int fd, std::string_view data, std::string* error) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = std::strerror(errno);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool FsyncDir(const std::string& dir, std::string* error) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot open directory " + dir + ": " + std::strerror(errno);
    return false;
  }
  bool ok = ::fsync(fd) == 0;
  if (!ok) *error = "cannot fsync directory " + dir + ": " + std::strerror(errno);
  ::close(fd);
  return ok;
}

}  // namespace meshwork::controlplane::wal
