// Errors as values at module boundaries: a small Status / Result<T> whose codes say what the
// caller should do (fix the config, fix an input file, retry, report a bug), and the process
// exit code each one maps to.
#pragma once

#include <cassert>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshwork {

enum class StatusCode {
  kOk = 0,
  kInvalidConfig,  // a config key, CLI flag or value is wrong: fix the config
  kInvalidInput,   // an input file (tokens, weights) is malformed or does not match: fix the file
  kNotFound,       // a named file or object does not exist
  kIOError,        // the OS refused a read or write (permissions, disk full)
  kUnavailable,    // a dependency is not reachable now: retrying may help
  kInternal,       // a bug or an unexpected library error
};

// Distinct, documented process exit codes (docs/config.md, "Exit codes").
namespace exit_code {
inline constexpr int kOk = 0;
inline constexpr int kRuntime = 1;       // training failed at run time (internal error, NaN, ...)
inline constexpr int kConfig = 2;        // bad config key / value / command line
inline constexpr int kInput = 3;         // bad or missing input file (tokens, weights)
inline constexpr int kIO = 4;            // the OS refused a read or write
inline constexpr int kUnavailable = 5;   // a dependency (device, port) was not available
}  // namespace exit_code

inline const char* StatusCodeName(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidConfig: return "InvalidConfig";
    case StatusCode::kInvalidInput: return "InvalidInput";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

inline int ExitCodeFor(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return exit_code::kOk;
    case StatusCode::kInvalidConfig: return exit_code::kConfig;
    case StatusCode::kInvalidInput:
    case StatusCode::kNotFound: return exit_code::kInput;
    case StatusCode::kIOError: return exit_code::kIO;
    case StatusCode::kUnavailable: return exit_code::kUnavailable;
    case StatusCode::kInternal: return exit_code::kRuntime;
  }
  return exit_code::kRuntime;
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const {
    return ok() ? "OK" : std::string(StatusCodeName(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidConfig(std::string m) { return {StatusCode::kInvalidConfig, std::move(m)}; }
inline Status InvalidInput(std::string m) { return {StatusCode::kInvalidInput, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Carries a Status through code that can only fail by throwing (autograd hooks and functions);
// the boundary that catches it (train's Guard, FSDP's FinishBackward) returns status() as is,
// so a lost peer inside backward still exits "unavailable", not "internal".
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status) : std::runtime_error(status.message()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void ThrowIfError(Status s) {
  if (!s.ok()) throw StatusError(std::move(s));
}

// A value or the error saying why there is none. The error type is Status everywhere but the
// Kubernetes client, whose k8s::Error carries the API server's reason and causes
// (`k8s::Result<T>` = `Result<T, k8s::Error>`). error() and status() are the same value.
template <typename T, typename E = Status>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(E error) : error_(std::move(error)) {  // NOLINT: implicit by design
    assert(!error_.ok() && "a Result built from an error must carry one");
  }

  bool ok() const { return value_.has_value(); }
  const E& error() const { return error_; }
  const E& status() const { return error_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  std::optional<T> value_;
  E error_;
};

}  // namespace meshwork

#define MESHWORK_CONCAT_INNER(a, b) a##b
#define MESHWORK_CONCAT(a, b) MESHWORK_CONCAT_INNER(a, b)

// Returns the error (a Status, or a k8s::Error) from the enclosing function when `expr` fails.
#define MW_RETURN_IF_ERROR(expr)     \
  do {                               \
    auto mw_error_ = (expr);         \
    if (!mw_error_.ok()) return mw_error_; \
  } while (0)

// `MW_ASSIGN_OR_RETURN(auto x, F())`: x = F().value(), or return its error.
#define MW_ASSIGN_OR_RETURN(lhs, expr) \
  MW_ASSIGN_OR_RETURN_IMPL(MESHWORK_CONCAT(mw_result_, __LINE__), lhs, expr)
#define MW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.error();             \
  lhs = std::move(tmp).value()
