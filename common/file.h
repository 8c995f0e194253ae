// Small POSIX file helpers shared by the checkpoint and token-file writers and readers: an all-or-nothing file
// writer (temporary file + rename) and whole-file / ranged reads that report errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace meshwork {

// Writes `path`.tmp.<pid> (same folder, so the rename is atomic; the pid keeps two processes
// writing the same path apart) and renames it over `path` on Commit(), so a reader, or a crash
// mid-write, never sees a half-written file. Dropping the writer without Commit() removes the
// temporary file.
class AtomicFileWriter {
 public:
  static Result<AtomicFileWriter> Create(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  Status Write(const void* data, size_t size);
  // Overwrites bytes already written (a header whose counts are known only at the end); the
  // file position, where Write appends, does not move.
  Status WriteAt(uint64_t offset, const void* data, size_t size);
  // Flushes to disk (fsync) without renaming: a caller that commits several files syncs them all
  // first, so a failure there leaves none of them replaced.
  Status Sync();
  // Flushes to disk (fsync), closes and renames into place.
  Status Commit();

 private:
  AtomicFileWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  static std::string TempPathFor(const std::string& path);
  std::string TempPath() const { return TempPathFor(path_); }
  void Abandon();

  std::string path_;
  int fd_ = -1;
};

// A read-only file descriptor that closes itself.
class ReadOnlyFile {
 public:
  // NotFound when `path` does not exist, IOError when it cannot be opened.
  static Result<ReadOnlyFile> Open(const std::string& path);

  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly `size` bytes at `offset`; a short file is InvalidInput (it was truncated).
  Status ReadAt(uint64_t offset, void* out, size_t size) const;

 private:
  ReadOnlyFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Writes all of `data` to `fd`, retrying short writes and EINTR. IOError "cannot write WHAT:
// <errno text>" on failure; the caller keeps ownership of `fd`.
Status WriteAll(int fd, const void* data, size_t size, const std::string& what);

// fsyncs directory `dir`, so that the renames and creations in it survive a power loss.
Status SyncDirectory(const std::string& dir);

// Creates directory `path` (and its parents) when missing and checks that a file can be created
// in it (a temporary one, removed at once), so that an output path the run cannot write is found
// before the run rather than after it. IOError with the OS's reason.
Status EnsureWritableDirectory(const std::string& path);

// The whole file as a string (for JSON side files such as config.json).
Result<std::string> ReadTextFile(const std::string& path);

// Deletes `path` and, if it is a directory, everything under it, without following symbolic
// links; a path that does not exist is Ok. IOError "cannot delete '<entry>': <errno text>" names
// the first entry that could not be deleted.
//
// Not std::filesystem::remove_all: PyPI's libtorch 2.x exports its own statically linked copy of
// it, which the dynamic linker binds ahead of the system libstdc++'s and which calls a libstdc++
// function older libstdc++s lack (recursive_directory_iterator::__erase, a null weak symbol):
// every process that links that libtorch crashed on its first call.
Status RemoveTree(const std::string& path);

}  // namespace meshwork
