// POSIX implementation of the file helpers (see file.h).
#include "common/file.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

namespace meshwork {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

// --- AtomicFileWriter --------------------------------------------------------------------------

std::string AtomicFileWriter::TempPathFor(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

Result<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  const std::string tmp = TempPathFor(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return IOError("cannot create '" + tmp + "' (writing '" + path + "'): " + ErrnoText(err));
  }
  return AtomicFileWriter(path, fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(TempPath().c_str());
  }
}

Status WriteAll(int fd, const void* data, size_t size, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      return IOError("cannot write " + what + ": " + ErrnoText(err));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AtomicFileWriter::Write(const void* data, size_t size) {
  if (fd_ < 0) return Internal("write to '" + path_ + "' after it was committed");
  return WriteAll(fd_, data, size, "'" + TempPath() + "'");
}

Status AtomicFileWriter::WriteAt(uint64_t offset, const void* data, size_t size) {
  if (fd_ < 0) return Internal("write to '" + path_ + "' after it was committed");
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IOError("cannot write '" + TempPath() + "': " + ErrnoText(n < 0 ? errno : EIO));
    bytes += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AtomicFileWriter::Sync() {
  if (fd_ < 0) return Internal("'" + path_ + "' synced after it was committed");
  if (::fsync(fd_) != 0) {
    const int err = errno;
    Abandon();
    return IOError("cannot flush '" + TempPath() + "': " + ErrnoText(err));
  }
  return Status::Ok();
}

Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return Internal("'" + path_ + "' committed twice");
  // fsync before rename: otherwise a power loss can leave the new name pointing at an empty file.
  MW_RETURN_IF_ERROR(Sync());
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(TempPath().c_str());
    return IOError("cannot close '" + TempPath() + "': " + ErrnoText(err));
  }
  if (std::rename(TempPath().c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(TempPath().c_str());
    return IOError("cannot rename '" + TempPath() + "' to '" + path_ + "': " + ErrnoText(err));
  }
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return IOError("cannot open directory '" + dir + "': " + ErrnoText(err));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (and FUSE mounts) cannot fsync a directory; the rename itself happened.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) {
    return IOError("cannot flush directory '" + dir + "': " + ErrnoText(err));
  }
  return Status::Ok();
}

// --- ReadOnlyFile ------------------------------------------------------------------------------

Result<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound("'" + path + "' does not exist");
    return IOError("cannot open '" + path + "': " + ErrnoText(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IOError("cannot stat '" + path + "': " + ErrnoText(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidInput("'" + path + "' is a directory, not a file");
  }
  return ReadOnlyFile(path, fd, static_cast<uint64_t>(st.st_size));
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status ReadOnlyFile::ReadAt(uint64_t offset, void* out, size_t size) const {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      return IOError("cannot read '" + path_ + "': " + ErrnoText(err));
    }
    // The size was checked against fstat, so running out early means the file shrank under us.
    if (n == 0) return InvalidInput("'" + path_ + "' ended early (truncated while reading?)");
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status EnsureWritableDirectory(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec || !std::filesystem::is_directory(path)) {
    return IOError("cannot create directory '" + path + "': " + (ec ? ec.message() : "it is not a directory"));
  }
  // Dropped without Commit: the temporary file is removed.
  MW_ASSIGN_OR_RETURN(AtomicFileWriter probe, AtomicFileWriter::Create(path + "/.meshwork-write-check"));
  return Status::Ok();
}

Result<std::string> ReadTextFile(const std::string& path) {
  MW_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(path));
  std::string text(file.size(), '\0');
  MW_RETURN_IF_ERROR(file.ReadAt(0, text.data(), text.size()));
  return text;
}

namespace {

// nftw's callback takes no context: the first failure of the walk in progress on this thread.
thread_local int remove_tree_errno = 0;
thread_local std::string* remove_tree_failed = nullptr;

int RemoveEntry(const char* path, const struct stat* /*st*/, int type, struct FTW* /*ftw*/) {
  // FTW_DP: a directory whose entries were all visited (FTW_DEPTH); FTW_DNR: one not readable.
  const int rc = type == FTW_DP || type == FTW_DNR ? ::rmdir(path) : ::unlink(path);
  if (rc == 0 || errno == ENOENT) return 0;
  remove_tree_errno = errno;
  *remove_tree_failed = path;
  return 1;  // stops the walk
}

}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return IOError("cannot delete '" + path + "': " + std::strerror(errno));
  }
  std::string failed;
  remove_tree_errno = 0;
  remove_tree_failed = &failed;
  // FTW_DEPTH: entries before their directory; FTW_PHYS: links are removed, not followed.
  const int rc = ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  remove_tree_failed = nullptr;
  if (rc == 0) return Status::Ok();
  if (remove_tree_errno != 0) {
    return IOError("cannot delete '" + failed + "': " + std::strerror(remove_tree_errno));
  }
  return IOError("cannot delete '" + path + "': " + std::strerror(errno));
}

}  // namespace meshwork
