// Informer, its cache and the relist diff (see informer.h).
#include "operator/k8s/informer.h"

#include <algorithm>

#include "operator/k8s/resource.h"

namespace meshwork::k8s {

using nlohmann::json;

std::optional<json> Store::Get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::vector<json> Store::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  out.reserve(objects_.size());
  for (const auto& [k, v] : objects_) out.push_back(v);
  return out;
}

void Store::ForEach(const std::function<void(const std::string& key, const json& obj)>& visit) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, v] : objects_) visit(k, v);
}

std::vector<std::string> Store::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [k, v] : objects_) out.push_back(k);
  return out;
}

size_t Store::Size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_.size();
}

std::map<std::string, json> Store::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_;
}

void Store::Upsert(const std::string& key, json obj) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_[key] = std::move(obj);
}

void Store::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_.erase(key);
}

void Store::Replace(std::map<std::string, json> objects) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_ = std::move(objects);
}

std::vector<Delta> DiffOnRelist(const std::map<std::string, json>& cached, const std::vector<json>& listed) {
  std::map<std::string, const json*> fresh;
  for (const json& obj : listed) fresh[ObjectKey(obj)] = &obj;
  std::vector<Delta> out;
  auto c = cached.begin();
  auto f = fresh.begin();
  // Both maps are sorted by key: walk them together.
  while (c != cached.end() || f != fresh.end()) {
    if (f == fresh.end() || (c != cached.end() && c->first < f->first)) {
      out.push_back({Delta::Type::kDeleted, c->first, c->second, json()});
      ++c;
    } else if (c == cached.end() || f->first < c->first) {
      out.push_back({Delta::Type::kAdded, f->first, json(), *f->second});
      ++f;
    } else {
      if (ResourceVersionOf(c->second) != ResourceVersionOf(*f->second) || ResourceVersionOf(c->second).empty()) {
        out.push_back({Delta::Type::kUpdated, c->first, c->second, *f->second});
      }
      ++c;
      ++f;
    }
  }
  return out;
}

Informer::Informer(Client* client, ResourceRef ref, std::string ns, InformerOptions options)
    : client_(client), ref_(std::move(ref)), ns_(std::move(ns)), options_(options) {}

Informer::~Informer() { Stop(); }

void Informer::AddEventHandlers(EventHandlers handlers) {
  std::lock_guard<std::mutex> lock(handler_mu_);
  handlers_.push_back(std::move(handlers));
}

void Informer::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopped_) return;
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  if (options_.resync_period.count() > 0) resync_thread_ = std::thread([this] { ResyncLoop(); });
}

void Informer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ && !thread_.joinable()) return;
    stopped_ = true;
    current_watch_.Cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (resync_thread_.joinable()) resync_thread_.join();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return synced_.load() || stopped_; });
  return synced_.load();
}

std::string Informer::LastResourceVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_rv_;
}

std::string Informer::LastError() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

bool Informer::SleepUnlessStopped(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopped_; });
  return !stopped_;
}

void Informer::Emit(const Delta& d) {
  std::lock_guard<std::mutex> lock(handler_mu_);
  for (const auto& h : handlers_) {
    switch (d.type) {
      case Delta::Type::kAdded:
        if (h.on_add) h.on_add(d.new_object);
        break;
      case Delta::Type::kUpdated:
        if (h.on_update) h.on_update(d.old_object, d.new_object);
        break;
      case Delta::Type::kDeleted:
        if (h.on_delete) h.on_delete(d.old_object);
        break;
    }
  }
}

void Informer::Trim(json* obj) const {
  if (!options_.strip_managed_fields) return;
  auto meta = obj->find("metadata");
  if (meta != obj->end() && meta->is_object()) meta->erase("managedFields");
}

Error Informer::ListAndReplace() {
  ListOptions lo;
  lo.label_selector = options_.label_selector;
  lo.field_selector = options_.field_selector;
  lo.limit = options_.page_size;
  auto list = client_->List(ref_, ns_, lo);
  if (!list.ok()) return list.error();
  std::vector<json> items = std::move(list.value()["items"].get_ref<json::array_t&>());
  for (json& obj : items) Trim(&obj);
  std::string rv = list.value()["metadata"].value("resourceVersion", std::string());
  std::vector<Delta> deltas = DiffOnRelist(store_.Snapshot(), items);
  std::map<std::string, json> fresh;
  for (json& obj : items) {
    std::string key = ObjectKey(obj);
    fresh[key] = std::move(obj);
  }
  store_.Replace(std::move(fresh));
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_rv_ = rv;
  }
  lists_.fetch_add(1);
  for (const Delta& d : deltas) Emit(d);
  if (!synced_.exchange(true)) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  return Error::Ok();
}

void Informer::Apply(const WatchEvent& ev) {
  if (ev.type == WatchEvent::Type::kError) return;
  if (!ev.resource_version.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    last_rv_ = ev.resource_version;
  }
  if (ev.type == WatchEvent::Type::kBookmark) return;
  json obj = ev.object;
  Trim(&obj);
  std::string key = ObjectKey(obj);
  std::optional<json> old = store_.Get(key);
  if (ev.type == WatchEvent::Type::kDeleted) {
    store_.Remove(key);
    Emit({Delta::Type::kDeleted, key, obj, json()});
    return;
  }
  store_.Upsert(key, obj);
  if (old) {
    Emit({Delta::Type::kUpdated, key, *old, obj});
  } else {
    Emit({Delta::Type::kAdded, key, json(), obj});
  }
}

void Informer::Run() {
  bool need_list = true;
  std::chrono::milliseconds backoff = options_.initial_backoff;
  auto failed = [&](const Error& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_error_ = e.ToString();
    }
    bool go_on = SleepUnlessStopped(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
    return go_on;
  };
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
    }
    if (need_list) {
      Error e = ListAndReplace();
      if (!e.ok()) {
        if (!failed(e)) return;
        continue;
      }
      need_list = false;
    }
    CancelToken token;
    std::string rv;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      current_watch_ = token;
      rv = last_rv_;
    }
    WatchOptions wo;
    wo.label_selector = options_.label_selector;
    wo.field_selector = options_.field_selector;
    wo.timeout_seconds = options_.watch_timeout_seconds;
    watches_.fetch_add(1);
    bool got_event = false;
    Error e = client_->Watch(ref_, ns_, rv, wo,
                             [&](const WatchEvent& ev) {
                               got_event = true;
                               Apply(ev);
                               return true;
                             },
                             token);
    if (IsCancelled(e)) return;
    if (e.ok()) {
      // The server ended a healthy stream: watch again (after a pause if it was empty, so a
      // server that closes at once is not hammered).
      backoff = options_.initial_backoff;
      if (!got_event && !SleepUnlessStopped(options_.initial_backoff)) return;
      continue;
    }
    if (got_event) backoff = options_.initial_backoff;
    if (IsGone(e)) {
      // Our resourceVersion is older than the server's history: relist and diff.
      std::lock_guard<std::mutex> lock(mu_);
      last_error_ = e.ToString();
      need_list = true;
      continue;
    }
    if (!failed(e)) return;
  }
}

void Informer::ResyncLoop() {
  while (SleepUnlessStopped(options_.resync_period)) {
    if (!synced_.load()) continue;
    for (const json& obj : store_.List()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_) return;
      }
      Emit({Delta::Type::kUpdated, ObjectKey(obj), obj, obj});
    }
  }
}

}  // namespace meshwork::k8s
