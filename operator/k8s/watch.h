// Watch decoding: the API server streams one JSON event per line on a chunked body; chunks split
// lines anywhere. WatchLineParser turns bytes into events as they arrive. CancelToken lets
// another thread end a running watch.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/k8s/error.h"

namespace meshwork::k8s {

struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark, kError };
  Type type = Type::kAdded;
  nlohmann::json object;         // the object (for kError: the metav1 Status)
  std::string resource_version;  // object.metadata.resourceVersion ("" for kError)
  Error error;                   // kError only: the Status as an Error (410 -> kGone)
};

const char* WatchEventTypeName(WatchEvent::Type t);

class WatchLineParser {
 public:
  static constexpr size_t kDefaultMaxLineBytes = 64u << 20;
  explicit WatchLineParser(size_t max_line_bytes = kDefaultMaxLineBytes) : max_line_(max_line_bytes) {}

  // Appends bytes and decodes every complete line into `out`. Blank lines are skipped. A line
  // that is not a watch event, or one longer than the limit, is an kInvalidResponse error.
  Error Feed(std::string_view bytes, std::vector<WatchEvent>* out);
  // End of stream: decodes a final line that had no newline.
  Error Finish(std::vector<WatchEvent>* out);
  size_t buffered() const { return pending_.size(); }

  // Decodes one line (no newline).
  static Result<WatchEvent> ParseLine(std::string_view line);

 private:
  std::string pending_;
  size_t max_line_;
};

// Shared cancellation flag; copies refer to the same flag. Cancel() runs the registered
// callbacks (the client uses one to close the watch's connection at once).
class CancelToken {
 public:
  CancelToken();
  void Cancel() const;
  bool cancelled() const;
  // Runs `f` on Cancel(), or now if already cancelled. Returns an id for Unregister.
  int OnCancel(std::function<void()> f) const;
  void Unregister(int id) const;

 private:
  struct State {
    std::mutex mu;
    std::atomic<bool> cancelled{false};
    int next_id = 0;
    std::map<int, std::function<void()>> callbacks;
  };
  std::shared_ptr<State> state_;
};

}  // namespace meshwork::k8s
