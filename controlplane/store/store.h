// The local control plane's durable, versioned object store (docs/controlplane-storage.md): a
// write-ahead log of CRC-checked JSON records plus periodic atomic snapshots, one global revision
// counter (Kubernetes' resourceVersion), and watches that replay kept history then follow live.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshwork::controlplane {

enum class StoreErrorCode {
  kNotFound,       // no object at the key
  kAlreadyExists,  // Create of a key that exists
  kConflict,       // expected_revision differs from the object's current revision
  kGone,           // watch from a revision older than the kept history: re-list
  kIO,             // the disk refused, or the files on disk are corrupt
  kInvalid,        // a malformed key or object (the message names it)
};
const char* StoreErrorCodeName(StoreErrorCode code);

struct StoreError {
  StoreErrorCode code;
  std::string message;
  std::string ToString() const;  // "Conflict: ..."
};

// A value or the StoreError saying why there is none.
template <class T>
class [[nodiscard]] StoreResult {
 public:
  StoreResult(T value) : v_(std::in_place_index<0>, std::move(value)) {}        // NOLINT: implicit
  StoreResult(StoreError error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit
  bool ok() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const StoreError& error() const { return std::get<1>(v_); }
  StoreErrorCode code() const { return error().code; }  // only when !ok()

 private:
  std::variant<T, StoreError> v_;
};

// Keys are "<resource>/<namespace>/<name>", e.g. "pods/default/web-0", cluster-scoped
// "namespaces//default", custom resources "trainingjobs.meshwork.dev/default/j1": exactly two
// '/', non-empty resource and name, no NUL. Prefix lists use "pods/default/" or "pods/".
enum class EventType { kAdded, kModified, kDeleted };
const char* EventTypeName(EventType type);  // "ADDED", "MODIFIED", "DELETED" (the watch wire names)

struct StoreEvent {
  EventType type;
  std::string key;
  nlohmann::json object;  // after the write; for kDeleted the last state, with
                          // metadata.resourceVersion set to the deletion revision
  uint64_t revision;
};

struct StoreOptions {
  size_t history_events = 10000;   // events kept in memory for watch resume
  size_t snapshot_every = 5000;    // WAL records between snapshots (0: never snapshot)
  bool fsync = true;               // fsync the WAL before a write returns (off: tests, benchmarks)
  size_t watch_queue_events = 10000;  // a watcher this far behind is ended (Done()); it re-watches
                                      // from its last revision, or re-lists on kGone
  // Where the store logs (a discarded torn tail, snapshots). Empty: stderr.
  std::function<void(const std::string&)> log;
};

class WatchState;  // shared between a WatchStream and the Store's fan-out

class WatchStream {
 public:
  explicit WatchStream(std::shared_ptr<WatchState> state);
  ~WatchStream();  // cancels
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  // Waits up to timeout for the next event; false on timeout or after Cancel/store close/overflow.
  bool Next(StoreEvent* event, std::chrono::milliseconds timeout);
  // Ends the watch; a blocked Next returns false. Safe from any thread.
  void Cancel();
  // True once no event will ever come again (cancelled, the store closed, or this watcher fell
  // watch_queue_events behind) and every queued event has been taken. Tells a Next() timeout
  // (send a bookmark, keep going) from the end (close the response).
  bool Done() const;
  // Why it ended: "" while open, else "cancelled", "store closed" or "watcher fell behind ...".
  std::string EndReason() const;
  // A revision R such that every event under the prefix with revision <= R has been returned by
  // Next(): what a BOOKMARK may carry. Never goes backwards.
  uint64_t ProgressRevision() const;

 private:
  std::shared_ptr<WatchState> state_;
};

class Store {
 public:
  // Opens (creating if needed) the store in `dir`: loads the snapshot, replays the WAL, discards
  // a torn tail record (logged), refuses a corrupt record in the middle (kIO naming the file and
  // offset). kIO as well when another process holds the directory.
  static StoreResult<std::unique_ptr<Store>> Open(const std::string& dir, StoreOptions options = {});
  ~Store();  // ends every watch (Done() becomes true)
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Each write is durable (WAL appended and, with fsync, fsync'ed) before it returns, and sets
  // the object's metadata.resourceVersion to the new global revision (as a decimal string); the
  // returned object is what is stored. `object` must be a JSON object (kInvalid otherwise).
  StoreResult<nlohmann::json> Create(const std::string& key, nlohmann::json object);  // kAlreadyExists
  // expected_revision 0 = unconditional; kConflict when it differs, kNotFound when absent.
  StoreResult<nlohmann::json> Update(const std::string& key, nlohmann::json object,
                                     uint64_t expected_revision);
  // Returns the deleted object (resourceVersion = the deletion revision, as its event carries).
  // expected_revision 0 = unconditional; kConflict, kNotFound.
  StoreResult<nlohmann::json> Delete(const std::string& key, uint64_t expected_revision);

  std::optional<nlohmann::json> Get(const std::string& key) const;

  struct ListResult {
    std::vector<nlohmann::json> items;  // sorted by key
    std::vector<std::string> keys;      // items[i] is at keys[i]
    uint64_t revision;                  // the store revision the list is consistent with
    bool more = false;                  // ListPage: items remain after the last returned key
  };
  ListResult List(const std::string& prefix) const;  // sorted by key
  // At most `limit` items (0: all) under prefix with key > start_after ("" : from the start);
  // for limit/continue pagination.
  ListResult ListPage(const std::string& prefix, const std::string& start_after, size_t limit) const;

  uint64_t Revision() const;
  // The oldest revision a Watch may start from: events with revision > this are kept.
  uint64_t CompactedRevision() const;
  size_t Size() const;  // number of objects

  // Events under prefix with revision > from_revision (0 = only future events), replayed from the
  // kept history then followed live. kGone if from_revision is older than the kept history (the
  // API answers 410 "too old resource version"). A from_revision above Revision() waits for it.
  StoreResult<std::unique_ptr<WatchStream>> Watch(const std::string& prefix, uint64_t from_revision);

  // Writes a snapshot now and truncates the WAL (normally done every snapshot_every records).
  StoreResult<uint64_t> Snapshot();

  const std::string& dir() const;

  class Impl;

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Splits a key into its three parts; false when it is not a valid key.
bool SplitStoreKey(const std::string& key, std::string* resource, std::string* ns, std::string* name);
// "<resource>/<namespace>/<name>"
std::string StoreKey(const std::string& resource, const std::string& ns, const std::string& name);
// The decimal metadata.resourceVersion of an object, 0 when absent or malformed.
uint64_t ObjectRevision(const nlohmann::json& object);

}  // namespace meshwork::controlplane
