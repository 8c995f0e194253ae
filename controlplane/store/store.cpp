// The durable, versioned object store (see store.h and docs/controlplane-storage.md).
//
// Locking: writer_mu_ serialises writers, watch registration and snapshots; the WAL append and
// its fsync happen under it alone, so readers (Get/List under a shared state_mu_) are not held
// up by the disk. A writer takes state_mu_ exclusively only to apply an acknowledged write. The
// object map is only mutated with both locks held, so a writer may read it under writer_mu_.
#include "controlplane/store/store.h"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <shared_mutex>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "controlplane/store/wal.h"

namespace meshwork::controlplane {

using nlohmann::json;

namespace {

using ObjectPtr = std::shared_ptr<const json>;

struct Entry {
  ObjectPtr object;
  uint64_t revision;
};

struct HistoryEvent {
  EventType type;
  std::string key;
  ObjectPtr object;
  uint64_t revision;
};

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::string Errno() { return std::strerror(errno); }

StoreError Err(StoreErrorCode code, std::string message) { return StoreError{code, std::move(message)}; }

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool MakeDirs(const std::string& dir, std::string* error) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      *error = "cannot create directory " + partial + ": " + Errno();
      return false;
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "store path " + dir + " is not a directory";
    return false;
  }
  return true;
}

}  // namespace

// ---- names --------------------------------------------------------------------------------

const char* StoreErrorCodeName(StoreErrorCode code) {
  switch (code) {
    case StoreErrorCode::kNotFound: return "NotFound";
    case StoreErrorCode::kAlreadyExists: return "AlreadyExists";
    case StoreErrorCode::kConflict: return "Conflict";
    case StoreErrorCode::kGone: return "Gone";
    case StoreErrorCode::kIO: return "IO";
    case StoreErrorCode::kInvalid: return "Invalid";
  }
  return "Unknown";
}

std::string StoreError::ToString() const { return std::string(StoreErrorCodeName(code)) + ": " + message; }

const char* EventTypeName(EventType type) {
  switch (type) {
    case EventType::kAdded: return "ADDED";
    case EventType::kModified: return "MODIFIED";
    case EventType::kDeleted: return "DELETED";
  }
  return "UNKNOWN";
}

bool SplitStoreKey(const std::string& key, std::string* resource, std::string* ns, std::string* name) {
  size_t a = key.find('/');
  if (a == std::string::npos) return false;
  size_t b = key.find('/', a + 1);
  if (b == std::string::npos || key.find('/', b + 1) != std::string::npos) return false;
  if (a == 0 || b + 1 == key.size() || key.find('\0') != std::string::npos) return false;
  if (resource) *resource = key.substr(0, a);
  if (ns) *ns = key.substr(a + 1, b - a - 1);
  if (name) *name = key.substr(b + 1);
  return true;
}

std::string StoreKey(const std::string& resource, const std::string& ns, const std::string& name) {
  return resource + "/" + ns + "/" + name;
}

uint64_t ObjectRevision(const json& object) {
  if (!object.is_object()) return 0;
  auto m = object.find("metadata");
  if (m == object.end() || !m->is_object()) return 0;
  auto rv = m->find("resourceVersion");
  if (rv == m->end() || !rv->is_string()) return 0;
  const std::string& s = rv->get_ref<const std::string&>();
  if (s.empty() || s.size() > 19) return 0;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

// ---- watch --------------------------------------------------------------------------------

class WatchState {
 public:
  WatchState(std::string prefix, uint64_t from, size_t limit)
      : prefix_(std::move(prefix)), from_(from), limit_(limit) {}

  // Called by the store's writer (under its writer lock) for every committed event.
  // Returns false once this watch has ended, so the store can drop it.
  bool Offer(const HistoryEvent& e, bool live) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return false;
    if (e.revision > from_ && StartsWith(e.key, prefix_)) {
      if (live && queue_.size() >= limit_) {
        End("watcher fell behind: " + std::to_string(queue_.size()) +
            " events queued (watch_queue_events); re-watch from the last revision seen");
        return false;
      }
      queue_.push_back(e);
      cv_.notify_all();
    }
    if (e.revision > progress_) progress_ = e.revision;
    return true;
  }

  void SetProgress(uint64_t revision) {
    std::lock_guard<std::mutex> lock(mu_);
    if (revision > progress_) progress_ = revision;
  }

  void Close(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    End(reason);
  }

  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    cancelled_ = true;
    End("cancelled");
  }

  bool Next(StoreEvent* event, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || ended_; });
    if (queue_.empty() || cancelled_) return false;
    HistoryEvent e = std::move(queue_.front());
    queue_.pop_front();
    if (e.revision > delivered_) delivered_ = e.revision;
    lock.unlock();
    event->type = e.type;
    event->key = std::move(e.key);
    event->object = *e.object;
    event->revision = e.revision;
    return true;
  }

  bool Done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_ && queue_.empty();
  }

  std::string EndReason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }

  uint64_t ProgressRevision() const {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t r = queue_.empty() ? progress_ : queue_.front().revision - 1;
    if (r < delivered_) r = delivered_;
    if (r > reported_) reported_ = r;
    return reported_;
  }

 private:
  void End(const std::string& reason) {
    if (!ended_) {
      ended_ = true;
      reason_ = reason;
    }
    cv_.notify_all();
  }

  const std::string prefix_;
  const uint64_t from_;
  const size_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HistoryEvent> queue_;
  bool ended_ = false;
  bool cancelled_ = false;
  std::string reason_;
  uint64_t progress_ = 0;   // every event <= this has been offered
  uint64_t delivered_ = 0;  // the last revision Next() returned
  mutable uint64_t reported_ = 0;
};

WatchStream::WatchStream(std::shared_ptr<WatchState> state) : state_(std::move(state)) {}
WatchStream::~WatchStream() { Cancel(); }
bool WatchStream::Next(StoreEvent* event, std::chrono::milliseconds timeout) {
  return state_->Next(event, timeout);
}
void WatchStream::Cancel() { state_->Cancel(); }
bool WatchStream::Done() const { return state_->Done(); }
std::string WatchStream::EndReason() const { return state_->EndReason(); }
uint64_t WatchStream::ProgressRevision() const { return state_->ProgressRevision(); }

// ---- store --------------------------------------------------------------------------------

class Store::Impl {
 public:
  Impl(std::string dir, StoreOptions options) : dir_(std::move(dir)), options_(std::move(options)) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(writer_mu_);
      for (auto& w : watchers_) w->Close("store closed");
      watchers_.clear();
    }
    if (wal_fd_ >= 0) ::close(wal_fd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
  }

  void Log(const std::string& message) const {
    if (options_.log) {
      options_.log(message);
    } else {
      std::cerr << "[meshwork-store] " << message << std::endl;
    }
  }

  std::string WalPath() const { return dir_ + "/wal"; }
  std::string SnapshotPath() const { return dir_ + "/snapshot"; }

  std::optional<StoreError> OpenFiles();
  std::optional<StoreError> LoadSnapshot();
  std::optional<StoreError> ReplayWal();
  std::optional<StoreError> ApplyRecord(const std::string& payload, size_t index);

  StoreResult<json> Write(const std::string& op, const std::string& key, json object,
                          uint64_t expected_revision);
  std::optional<StoreError> AppendWal(const std::string& payload);
  void Commit(EventType type, const std::string& key, ObjectPtr stored, ObjectPtr event_object,
              uint64_t revision);
  void RecordHistory(HistoryEvent event, bool live);
  StoreResult<uint64_t> SnapshotLocked();

  const std::string dir_;
  const StoreOptions options_;
  int wal_fd_ = -1;
  int lock_fd_ = -1;
  size_t wal_records_ = 0;  // records in the WAL since the last snapshot
  off_t wal_bytes_ = 0;

  mutable std::mutex writer_mu_;
  mutable std::shared_mutex state_mu_;
  std::map<std::string, Entry> objects_;
  std::atomic<uint64_t> revision_{0};
  std::atomic<uint64_t> compacted_{0};
  std::deque<HistoryEvent> history_;                  // under writer_mu_
  std::vector<std::shared_ptr<WatchState>> watchers_;  // under writer_mu_
  std::string broken_;                                 // non-empty: writes refused (kIO)
};

std::optional<StoreError> Store::Impl::OpenFiles() {
  std::string error;
  if (!MakeDirs(dir_, &error)) return Err(StoreErrorCode::kIO, error);
  std::string lock_path = dir_ + "/LOCK";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return Err(StoreErrorCode::kIO, "cannot open " + lock_path + ": " + Errno());
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Err(StoreErrorCode::kIO, "store directory " + dir_ +
                                        " is in use by another open store (" + lock_path +
                                        " is locked): " + Errno());
  }
  return std::nullopt;
}

std::optional<StoreError> Store::Impl::LoadSnapshot() {
  std::string data, error;
  std::string path = SnapshotPath();
  ::unlink((path + ".tmp").c_str());  // a snapshot a crash interrupted before its rename
  if (::access(path.c_str(), F_OK) != 0) return std::nullopt;
  if (!wal::ReadWholeFile(path, &data, &error)) return Err(StoreErrorCode::kIO, error);
  wal::ReadResult r = wal::ParseRecords(data, path);
  // A snapshot is renamed into place whole, so any bad record in it is corruption.
  if (r.corrupt_middle || r.torn_tail) {
    return Err(StoreErrorCode::kIO, "snapshot " + path + " is corrupt: " +
                                        (r.corrupt_middle ? r.error : r.tail_reason) +
                                        "; refusing to open");
  }
  if (r.payloads.empty()) return Err(StoreErrorCode::kIO, "snapshot " + path + " is empty; refusing to open");
  try {
    json header = json::parse(r.payloads[0]);
    if (header.value("format", "") != "meshwork-store-snapshot" || header.value("version", 0) != 1) {
      return Err(StoreErrorCode::kIO, "snapshot " + path + " has an unknown header " + Dump(header));
    }
    uint64_t revision = header.at("revision").get<uint64_t>();
    size_t count = header.at("objects").get<size_t>();
    if (count != r.payloads.size() - 1) {
      return Err(StoreErrorCode::kIO, "snapshot " + path + " says it holds " + std::to_string(count) +
                                          " objects but has " + std::to_string(r.payloads.size() - 1));
    }
    for (size_t i = 1; i < r.payloads.size(); ++i) {
      json rec = json::parse(r.payloads[i]);
      std::string key = rec.at("key").get<std::string>();
      json obj = std::move(rec.at("obj"));
      uint64_t rev = ObjectRevision(obj);
      objects_[key] = Entry{std::make_shared<const json>(std::move(obj)), rev};
    }
    revision_ = revision;
    compacted_ = revision;
  } catch (const std::exception& e) {
    return Err(StoreErrorCode::kIO, "snapshot " + path + " holds a malformed record: " + e.what());
  }
  return std::nullopt;
}

std::optional<StoreError> Store::Impl::ApplyRecord(const std::string& payload, size_t index) {
  json rec;
  try {
    rec = json::parse(payload);
    std::string op = rec.at("op").get<std::string>();
    std::string key = rec.at("key").get<std::string>();
    uint64_t rev = rec.at("rev").get<uint64_t>();
    if (rev <= revision_) return std::nullopt;  // already in the snapshot (crash before truncation)
    if (op == "put") {
      auto obj = std::make_shared<const json>(std::move(rec.at("obj")));
      bool existed = objects_.count(key) != 0;
      objects_[key] = Entry{obj, rev};
      RecordHistory(HistoryEvent{existed ? EventType::kModified : EventType::kAdded, key, obj, rev}, false);
    } else if (op == "del") {
      auto it = objects_.find(key);
      if (it == objects_.end()) {
        return Err(StoreErrorCode::kIO, WalPath() + ": record #" + std::to_string(index) +
                                            " deletes " + key + ", which does not exist");
      }
      json gone = *it->second.object;
      gone["metadata"]["resourceVersion"] = std::to_string(rev);
      objects_.erase(it);
      RecordHistory(HistoryEvent{EventType::kDeleted, key, std::make_shared<const json>(std::move(gone)), rev},
                    false);
    } else {
      return Err(StoreErrorCode::kIO, WalPath() + ": record #" + std::to_string(index) +
                                          " has an unknown op \"" + op + "\"");
    }
    revision_ = rev;
  } catch (const std::exception& e) {
    return Err(StoreErrorCode::kIO, WalPath() + ": record #" + std::to_string(index) +
                                        " passes its CRC but is not a valid record: " + e.what());
  }
  return std::nullopt;
}

std::optional<StoreError> Store::Impl::ReplayWal() {
  std::string path = WalPath();
  std::string data, error;
  bool exists = ::access(path.c_str(), F_OK) == 0;
  if (exists) {
    if (!wal::ReadWholeFile(path, &data, &error)) return Err(StoreErrorCode::kIO, error);
    wal::ReadResult r = wal::ParseRecords(data, path);
    if (r.corrupt_middle) return Err(StoreErrorCode::kIO, r.error);
    for (size_t i = 0; i < r.payloads.size(); ++i) {
      if (auto e = ApplyRecord(r.payloads[i], i)) return e;
    }
    wal_records_ = r.payloads.size();
    wal_bytes_ = static_cast<off_t>(r.good_bytes);
    if (r.torn_tail) {
      Log("discarding a torn tail record in " + path + ": " + r.tail_reason +
          " (a write cut short by a crash; it was never acknowledged)");
      if (::truncate(path.c_str(), wal_bytes_) != 0) {
        return Err(StoreErrorCode::kIO, "cannot truncate the torn tail of " + path + ": " + Errno());
      }
    }
  }
  wal_fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (wal_fd_ < 0) return Err(StoreErrorCode::kIO, "cannot open " + path + ": " + Errno());
  if (::fsync(wal_fd_) != 0) return Err(StoreErrorCode::kIO, "cannot fsync " + path + ": " + Errno());
  if (!exists && !wal::FsyncDir(dir_, &error)) return Err(StoreErrorCode::kIO, error);
  return std::nullopt;
}

void Store::Impl::RecordHistory(HistoryEvent event, bool live) {
  if (options_.history_events == 0) {
    compacted_ = event.revision;
  } else {
    history_.push_back(event);
    while (history_.size() > options_.history_events) {
      compacted_ = history_.front().revision;
      history_.pop_front();
    }
  }
  if (!live) return;
  size_t kept = 0;
  for (size_t i = 0; i < watchers_.size(); ++i) {
    if (watchers_[i]->Offer(event, true)) watchers_[kept++] = std::move(watchers_[i]);
  }
  watchers_.resize(kept);
}

std::optional<StoreError> Store::Impl::AppendWal(const std::string& payload) {
  std::string framed;
  framed.reserve(payload.size() + wal::kHeaderBytes);
  wal::AppendRecord(payload, &framed);
  std::string error;
  bool ok = wal::WriteAll(wal_fd_, framed, &error);
  if (ok && options_.fsync && ::fdatasync(wal_fd_) != 0) {
    ok = false;
    error = "fdatasync: " + Errno();
  }
  if (!ok) {
    // Cut the partial record off so later records do not follow garbage; if even that fails,
    // refuse further writes rather than risk a corrupt middle.
    if (::ftruncate(wal_fd_, wal_bytes_) != 0) {
      broken_ = "the WAL " + WalPath() + " could not be repaired after a failed write (" + error +
                "; ftruncate: " + Errno() + "); reopen the store";
    }
    return Err(StoreErrorCode::kIO, "cannot append to " + WalPath() + ": " + error);
  }
  wal_bytes_ += static_cast<off_t>(framed.size());
  ++wal_records_;
  return std::nullopt;
}

void Store::Impl::Commit(EventType type, const std::string& key, ObjectPtr stored, ObjectPtr event_object,
                         uint64_t revision) {
  {
    std::unique_lock<std::shared_mutex> lock(state_mu_);
    if (stored) {
      objects_[key] = Entry{stored, revision};
    } else {
      objects_.erase(key);
    }
    revision_ = revision;
  }
  RecordHistory(HistoryEvent{type, key, std::move(event_object), revision}, true);
  if (options_.snapshot_every > 0 && wal_records_ >= options_.snapshot_every) {
    auto r = SnapshotLocked();
    if (!r.ok()) {
      // The write itself is durable in the WAL; try again after another snapshot_every records.
      Log("snapshot failed (the WAL keeps growing; will retry): " + r.error().message);
      wal_records_ = 0;
    }
  }
}

StoreResult<json> Store::Impl::Write(const std::string& op, const std::string& key, json object,
                                     uint64_t expected_revision) {
  if (!SplitStoreKey(key, nullptr, nullptr, nullptr)) {
    return Err(StoreErrorCode::kInvalid, "invalid store key \"" + key +
                                             "\": want <resource>/<namespace>/<name> with a "
                                             "non-empty resource and name");
  }
  if (op != "delete") {
    if (!object.is_object()) {
      return Err(StoreErrorCode::kInvalid, key + ": the object must be a JSON object, got " +
                                               std::string(object.type_name()));
    }
    auto m = object.find("metadata");
    if (m != object.end() && !m->is_object()) {
      return Err(StoreErrorCode::kInvalid, key + ": metadata must be a JSON object, got " +
                                               std::string(m->type_name()));
    }
  }
  std::lock_guard<std::mutex> lock(writer_mu_);
  if (!broken_.empty()) return Err(StoreErrorCode::kIO, broken_);
  auto it = objects_.find(key);
  bool exists = it != objects_.end();
  if (op == "create" && exists) return Err(StoreErrorCode::kAlreadyExists, key + " already exists");
  if (op != "create") {
    if (!exists) return Err(StoreErrorCode::kNotFound, key + " not found");
    if (expected_revision != 0 && expected_revision != it->second.revision) {
      return Err(StoreErrorCode::kConflict, key + ": expected revision " + std::to_string(expected_revision) +
                                                ", but the object is at revision " +
                                                std::to_string(it->second.revision));
    }
  }
  uint64_t rev = revision_ + 1;
  json record = {{"op", op == "delete" ? "del" : "put"}, {"key", key}, {"rev", rev}};
  ObjectPtr stored, event_object;
  if (op == "delete") {
    json gone = *it->second.object;
    gone["metadata"]["resourceVersion"] = std::to_string(rev);
    event_object = std::make_shared<const json>(std::move(gone));
  } else {
    object["metadata"]["resourceVersion"] = std::to_string(rev);
    stored = std::make_shared<const json>(std::move(object));
    event_object = stored;
    record["obj"] = *stored;
  }
  if (auto e = AppendWal(Dump(record))) return *e;
  EventType type = op == "create" ? EventType::kAdded : op == "delete" ? EventType::kDeleted : EventType::kModified;
  Commit(type, key, stored, event_object, rev);
  return json(*event_object);
}

StoreResult<uint64_t> Store::Impl::SnapshotLocked() {
  std::string tmp = SnapshotPath() + ".tmp";
  std::string data;
  uint64_t revision = revision_;
  wal::AppendRecord(Dump(json{{"format", "meshwork-store-snapshot"},
                              {"version", 1},
                              {"revision", revision},
                              {"objects", objects_.size()}}),
                    &data);
  for (const auto& [key, entry] : objects_) {
    wal::AppendRecord(Dump(json{{"key", key}, {"obj", *entry.object}}), &data);
  }
  std::string error;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Err(StoreErrorCode::kIO, "cannot create " + tmp + ": " + Errno());
  bool ok = wal::WriteAll(fd, data, &error);
  // Without fsync the rename still makes the snapshot all-or-nothing for a process crash; only
  // a power loss could lose it, which is what turning fsync off accepts.
  if (ok && options_.fsync && ::fsync(fd) != 0) {
    ok = false;
    error = "fsync: " + Errno();
  }
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Err(StoreErrorCode::kIO, "cannot write " + tmp + ": " + error);
  }
  if (::rename(tmp.c_str(), SnapshotPath().c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Err(StoreErrorCode::kIO, "cannot rename " + tmp + " to " + SnapshotPath() + ": " + Errno());
  }
  if (options_.fsync && !wal::FsyncDir(dir_, &error)) return Err(StoreErrorCode::kIO, error);
  // The snapshot is durable; the WAL's records are all <= revision and would be skipped on
  // replay, so a crash before or during this truncation loses nothing.
  if (::ftruncate(wal_fd_, 0) != 0 || (options_.fsync && ::fsync(wal_fd_) != 0)) {
    return Err(StoreErrorCode::kIO, "cannot truncate " + WalPath() + " after a snapshot: " + Errno());
  }
  wal_bytes_ = 0;
  wal_records_ = 0;
  return revision;
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

StoreResult<std::unique_ptr<Store>> Store::Open(const std::string& dir, StoreOptions options) {
  if (dir.empty()) return Err(StoreErrorCode::kInvalid, "store directory is empty");
  auto impl = std::make_unique<Impl>(dir, std::move(options));
  if (auto e = impl->OpenFiles()) return *e;
  if (auto e = impl->LoadSnapshot()) return *e;
  if (auto e = impl->ReplayWal()) return *e;
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

StoreResult<json> Store::Create(const std::string& key, json object) {
  return impl_->Write("create", key, std::move(object), 0);
}

StoreResult<json> Store::Update(const std::string& key, json object, uint64_t expected_revision) {
  return impl_->Write("update", key, std::move(object), expected_revision);
}

StoreResult<json> Store::Delete(const std::string& key, uint64_t expected_revision) {
  return impl_->Write("delete", key, json(), expected_revision);
}

std::optional<json> Store::Get(const std::string& key) const {
  std::shared_lock<std::shared_mutex> lock(impl_->state_mu_);
  auto it = impl_->objects_.find(key);
  if (it == impl_->objects_.end()) return std::nullopt;
  return *it->second.object;
}

Store::ListResult Store::List(const std::string& prefix) const { return ListPage(prefix, "", 0); }

Store::ListResult Store::ListPage(const std::string& prefix, const std::string& start_after,
                                  size_t limit) const {
  ListResult out;
  std::shared_lock<std::shared_mutex> lock(impl_->state_mu_);
  out.revision = impl_->revision_;
  const auto& objects = impl_->objects_;
  auto it = start_after.empty() || start_after < prefix ? objects.lower_bound(prefix)
                                                         : objects.upper_bound(start_after);
  for (; it != objects.end() && StartsWith(it->first, prefix); ++it) {
    if (limit != 0 && out.items.size() == limit) {
      out.more = true;
      break;
    }
    out.keys.push_back(it->first);
    out.items.push_back(*it->second.object);
  }
  return out;
}

uint64_t Store::Revision() const { return impl_->revision_; }
uint64_t Store::CompactedRevision() const { return impl_->compacted_; }

size_t Store::Size() const {
  std::shared_lock<std::shared_mutex> lock(impl_->state_mu_);
  return impl_->objects_.size();
}

StoreResult<std::unique_ptr<WatchStream>> Store::Watch(const std::string& prefix, uint64_t from_revision) {
  std::lock_guard<std::mutex> lock(impl_->writer_mu_);
  uint64_t current = impl_->revision_;
  uint64_t compacted = impl_->compacted_;
  if (from_revision != 0 && from_revision < compacted) {
    return Err(StoreErrorCode::kGone, "too old resource version: " + std::to_string(from_revision) +
                                          " (the oldest kept is " + std::to_string(compacted) + ")");
  }
  uint64_t from = from_revision == 0 ? current : from_revision;
  auto state = std::make_shared<WatchState>(prefix, from, impl_->options_.watch_queue_events);
  if (from < current) {
    for (const HistoryEvent& e : impl_->history_) {
      if (e.revision > from) state->Offer(e, false);
    }
  }
  state->SetProgress(current);
  impl_->watchers_.push_back(state);
  return std::make_unique<WatchStream>(std::move(state));
}

StoreResult<uint64_t> Store::Snapshot() {
  std::lock_guard<std::mutex> lock(impl_->writer_mu_);
  return impl_->SnapshotLocked();
}

const std::string& Store::dir() const { return impl_->dir_; }

}  // namespace meshwork::controlplane
