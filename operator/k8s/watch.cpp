// Watch stream decoding and cancellation (see watch.h).
#include "operator/k8s/watch.h"

#include "operator/k8s/resource.h"

namespace meshwork::k8s {

const char* WatchEventTypeName(WatchEvent::Type t) {
  switch (t) {
    case WatchEvent::Type::kAdded: return "ADDED";
    case WatchEvent::Type::kModified: return "MODIFIED";
    case WatchEvent::Type::kDeleted: return "DELETED";
    case WatchEvent::Type::kBookmark: return "BOOKMARK";
    case WatchEvent::Type::kError: return "ERROR";
  }
  return "?";
}

Result<WatchEvent> WatchLineParser::ParseLine(std::string_view line) {
  auto bad = [&](const std::string& why) {
    std::string excerpt(line.substr(0, 120));
    return Error(ErrorKind::kInvalidResponse, "watch stream: " + why + ": " + excerpt);
  };
  nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("line is not JSON");
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return bad("event has no \"type\"");
  if (!j.contains("object") || !j["object"].is_object()) return bad("event has no \"object\"");
  WatchEvent ev;
  std::string type = j["type"].get<std::string>();
  if (type == "ADDED") ev.type = WatchEvent::Type::kAdded;
  else if (type == "MODIFIED") ev.type = WatchEvent::Type::kModified;
  else if (type == "DELETED") ev.type = WatchEvent::Type::kDeleted;
  else if (type == "BOOKMARK") ev.type = WatchEvent::Type::kBookmark;
  else if (type == "ERROR") ev.type = WatchEvent::Type::kError;
  else return bad("unknown event type \"" + type + "\"");
  ev.object = std::move(j["object"]);
  if (ev.type == WatchEvent::Type::kError) {
    ev.error = ErrorFromStatusObject(ev.object.dump());
  } else {
    ev.resource_version = ResourceVersionOf(ev.object);
  }
  return ev;
}

Error WatchLineParser::Feed(std::string_view bytes, std::vector<WatchEvent>* out) {
  size_t start = 0;
  while (start < bytes.size()) {
    size_t nl = bytes.find('\n', start);
    if (nl == std::string_view::npos) {
      pending_.append(bytes.substr(start));
      if (pending_.size() > max_line_) {
        pending_.clear();
        return Error(ErrorKind::kInvalidResponse,
                     "watch stream: an event is longer than " + std::to_string(max_line_) + " bytes");
      }
      return Error::Ok();
    }
    std::string_view piece = bytes.substr(start, nl - start);
    start = nl + 1;
    // A line whole in these bytes is parsed where it lies; one begun in earlier bytes from
    // pending_, which keeps its capacity for the next (no copy of every event's bytes).
    std::string_view line = piece;
    if (!pending_.empty()) {
      pending_.append(piece);
      line = pending_;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    Error parsed = Error::Ok();
    if (line.find_first_not_of(" \t") != std::string_view::npos) {
      auto ev = ParseLine(line);
      if (ev.ok()) {
        out->push_back(std::move(ev).value());
      } else {
        parsed = ev.error();
      }
    }
    pending_.clear();
    if (!parsed.ok()) return parsed;
  }
  return Error::Ok();
}

Error WatchLineParser::Finish(std::vector<WatchEvent>* out) {
  std::string line;
  line.swap(pending_);
  if (line.find_first_not_of(" \t\r") == std::string::npos) return Error::Ok();
  auto ev = ParseLine(line);
  if (!ev.ok()) return ev.error();
  out->push_back(std::move(ev).value());
  return Error::Ok();
}

CancelToken::CancelToken() : state_(std::make_shared<State>()) {}

void CancelToken::Cancel() const {
  std::map<int, std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->cancelled.exchange(true)) return;
    callbacks.swap(state_->callbacks);
  }
  for (auto& [id, f] : callbacks) f();
}

bool CancelToken::cancelled() const { return state_->cancelled.load(); }

int CancelToken::OnCancel(std::function<void()> f) const {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->cancelled.load()) {
      int id = state_->next_id++;
      state_->callbacks.emplace(id, std::move(f));
      return id;
    }
  }
  f();
  return -1;
}

void CancelToken::Unregister(int id) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->callbacks.erase(id);
}

}  // namespace meshwork::k8s
