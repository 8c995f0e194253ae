// Errors of the Kubernetes API client as values: the server's metav1 Status (or a transport
// failure) becomes a typed Error whose kind says what the caller should do about it.
#pragma once

#include <cassert>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace meshwork::k8s {

enum class ErrorKind {
  kOk = 0,
  kBadRequest,       // 400 (and any other 4xx without a kind of its own)
  kUnauthorized,     // 401: credentials missing or rejected
  kForbidden,        // 403: RBAC says no
  kNotFound,         // 404
  kAlreadyExists,    // 409, reason AlreadyExists (create of an existing name)
  kConflict,         // 409, reason Conflict (stale resourceVersion, failed precondition)
  kGone,             // 410: resourceVersion too old (watch/list); relist
  kInvalid,          // 422: the object failed validation; causes() names the fields
  kTooManyRequests,  // 429; retry_after() says when to come back
  kServerError,      // 5xx other than 503/504
  kUnavailable,      // connection refused/reset, timeout, 503, 504: retrying may help
  kInvalidConfig,    // kubeconfig / in-cluster config / client option is wrong
  kInvalidResponse,  // the server answered something that is not what the API promises
  kCancelled,        // the caller cancelled (watch)
};

const char* ErrorKindName(ErrorKind kind);

// One entry of Status.details.causes: which field is wrong and why.
struct StatusCause {
  std::string field;    // e.g. "spec.replicas"
  std::string reason;   // e.g. "FieldValueInvalid"
  std::string message;  // human text
};

class [[nodiscard]] Error {
 public:
  Error() = default;
  Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}

  static Error Ok() { return Error(); }

  bool ok() const { return kind_ == ErrorKind::kOk; }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  int http_code() const { return http_code_; }        // 0 when no HTTP answer was received
  const std::string& reason() const { return reason_; }  // Status.reason, e.g. "NotFound"
  const std::vector<StatusCause>& causes() const { return causes_; }
  std::optional<std::chrono::seconds> retry_after() const { return retry_after_; }

  Error& set_http_code(int c) { http_code_ = c; return *this; }
  Error& set_reason(std::string r) { reason_ = std::move(r); return *this; }
  Error& add_cause(StatusCause c) { causes_.push_back(std::move(c)); return *this; }
  Error& set_retry_after(std::chrono::seconds s) { retry_after_ = s; return *this; }

  // "Conflict (409): Operation cannot be fulfilled ...; causes: spec.x: ..."
  std::string ToString() const;
  // The project-wide Status code for this error (NotFound, Unavailable, InvalidConfig, ...).
  meshwork::Status ToStatus() const;

 private:
  ErrorKind kind_ = ErrorKind::kOk;
  std::string message_;
  int http_code_ = 0;
  std::string reason_;
  std::vector<StatusCause> causes_;
  std::optional<std::chrono::seconds> retry_after_;
};

inline bool IsNotFound(const Error& e) { return e.kind() == ErrorKind::kNotFound; }
inline bool IsAlreadyExists(const Error& e) { return e.kind() == ErrorKind::kAlreadyExists; }
inline bool IsConflict(const Error& e) { return e.kind() == ErrorKind::kConflict; }
inline bool IsInvalid(const Error& e) { return e.kind() == ErrorKind::kInvalid; }
inline bool IsGone(const Error& e) { return e.kind() == ErrorKind::kGone; }
inline bool IsForbidden(const Error& e) { return e.kind() == ErrorKind::kForbidden; }
inline bool IsUnauthorized(const Error& e) { return e.kind() == ErrorKind::kUnauthorized; }
inline bool IsTooManyRequests(const Error& e) { return e.kind() == ErrorKind::kTooManyRequests; }
inline bool IsBadRequest(const Error& e) { return e.kind() == ErrorKind::kBadRequest; }
inline bool IsServerError(const Error& e) { return e.kind() == ErrorKind::kServerError; }
inline bool IsUnavailable(const Error& e) { return e.kind() == ErrorKind::kUnavailable; }
inline bool IsCancelled(const Error& e) { return e.kind() == ErrorKind::kCancelled; }
// Worth retrying the same request later: 429, 5xx, connection trouble.
bool IsRetryable(const Error& e);

// Maps an HTTP answer to an Error. `body` is the response body (a metav1 Status when the server
// is a Kubernetes API server; anything else is tolerated); `retry_after_header` is the raw
// Retry-After header value or "". Returns Error::Ok() for 2xx.
Error ErrorFromResponse(int http_code, const std::string& body,
                        const std::string& retry_after_header = "");

// Maps a metav1 Status object embedded in a watch ERROR event (it has "code", no HTTP status).
Error ErrorFromStatusObject(const std::string& status_json);

// A value or the Error saying why there is none.
template <typename T>
using Result = meshwork::Result<T, Error>;

}  // namespace meshwork::k8s
