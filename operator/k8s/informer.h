// Informer: lists, then watches from the list's resourceVersion, keeping a thread-safe cache
// keyed "namespace/name" and calling handlers for adds, updates and deletes. A broken or ended
// watch resumes from the last resourceVersion seen (bookmarks advance it), with backoff; 410 Gone
// relists and turns the difference into synthetic events (DiffOnRelist).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/k8s/client.h"

namespace meshwork::k8s {

// The informer's cache. Readers get copies; thread-safe.
class Store {
 public:
  std::optional<nlohmann::json> Get(const std::string& key) const;
  std::vector<nlohmann::json> List() const;
  std::vector<std::string> Keys() const;
  size_t Size() const;
  std::map<std::string, nlohmann::json> Snapshot() const;
  // Visits every object in key order without copying it, the store locked meanwhile (`visit`
  // must not call back into the store).
  void ForEach(const std::function<void(const std::string& key, const nlohmann::json& obj)>& visit) const;

  // Writers (the informer).
  void Upsert(const std::string& key, nlohmann::json obj);
  void Remove(const std::string& key);
  void Replace(std::map<std::string, nlohmann::json> objects);

 private:
  mutable std::mutex mu_;
  std::map<std::string, nlohmann::json> objects_;
};

// One change found by comparing the cache with a fresh list.
struct Delta {
  enum class Type { kAdded, kUpdated, kDeleted };
  Type type;
  std::string key;
  nlohmann::json old_object;  // kUpdated, kDeleted
  nlohmann::json new_object;  // kAdded, kUpdated
};

// What handlers must hear after a relist: keys only in `listed` are added, keys only in
// `cached` deleted, keys in both with a different resourceVersion updated. Sorted by key.
std::vector<Delta> DiffOnRelist(const std::map<std::string, nlohmann::json>& cached,
                                const std::vector<nlohmann::json>& listed);

struct EventHandlers {
  std::function<void(const nlohmann::json& obj)> on_add;
  std::function<void(const nlohmann::json& old_obj, const nlohmann::json& new_obj)> on_update;
  std::function<void(const nlohmann::json& obj)> on_delete;  // the last state known
};

struct InformerOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t page_size = 500;                        // list pagination
  int watch_timeout_seconds = 300;                // each watch; then re-watch
  std::chrono::milliseconds resync_period{0};     // 0 = off; else on_update(obj, obj) for all
  std::chrono::milliseconds initial_backoff{200};  // after a failed list/watch; doubles ...
  std::chrono::milliseconds max_backoff{30000};    // ... up to this
  // Drop metadata.managedFields (server-side apply's bookkeeping, often half of a small object's
  // bytes) before caching and before handlers see the object. An Update of a cached object that
  // has none leaves the server's as they are.
  bool strip_managed_fields = true;
};

class Informer {
 public:
  // `client` must outlive the informer. `ns` "" watches all namespaces.
  Informer(Client* client, ResourceRef ref, std::string ns, InformerOptions options = {});
  ~Informer();  // Stop()
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Handlers are called from the informer's thread, after the cache has the change, one at a
  // time. Add them before Start().
  void AddEventHandlers(EventHandlers handlers);
  void Start();
  // Ends the watch promptly and joins the threads. Idempotent.
  void Stop();

  // The first list has been applied to the cache.
  bool HasSynced() const { return synced_.load(); }
  // Waits until HasSynced() or `timeout`; returns HasSynced().
  bool WaitForSync(std::chrono::milliseconds timeout) const;

  const Store& store() const { return store_; }
  std::string LastResourceVersion() const;
  int64_t NumLists() const { return lists_.load(); }     // lists done (1 + relists)
  int64_t NumWatches() const { return watches_.load(); } // watch requests started
  // The error of the last failed list or watch ("OK" if none yet); for logs and /readyz.
  std::string LastError() const;

 private:
  void Run();
  void ResyncLoop();
  // Drops what options_ says the cache does not keep (managedFields).
  void Trim(nlohmann::json* obj) const;
  Error ListAndReplace();
  void Apply(const WatchEvent& ev);
  bool SleepUnlessStopped(std::chrono::milliseconds d);
  void Emit(const Delta& d);

  Client* client_;
  ResourceRef ref_;
  std::string ns_;
  InformerOptions options_;
  std::vector<EventHandlers> handlers_;
  std::mutex handler_mu_;  // handlers run one at a time (watch thread and resync thread)
  Store store_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopped_ = false;
  bool started_ = false;
  std::string last_rv_;
  std::string last_error_ = "OK";
  CancelToken current_watch_;
  std::atomic<bool> synced_{false};
  std::atomic<int64_t> lists_{0};
  std::atomic<int64_t> watches_{0};
  std::thread thread_;
  std::thread resync_thread_;
};

}  // namespace meshwork::k8s
