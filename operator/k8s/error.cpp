// Kubernetes Status -> k8s::Error mapping (see error.h).
#include "operator/k8s/error.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdlib>

namespace meshwork::k8s {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk: return "OK";
    case ErrorKind::kBadRequest: return "BadRequest";
    case ErrorKind::kUnauthorized: return "Unauthorized";
    case ErrorKind::kForbidden: return "Forbidden";
    case ErrorKind::kNotFound: return "NotFound";
    case ErrorKind::kAlreadyExists: return "AlreadyExists";
    case ErrorKind::kConflict: return "Conflict";
    case ErrorKind::kGone: return "Gone";
    case ErrorKind::kInvalid: return "Invalid";
    case ErrorKind::kTooManyRequests: return "TooManyRequests";
    case ErrorKind::kServerError: return "ServerError";
    case ErrorKind::kUnavailable: return "Unavailable";
    case ErrorKind::kInvalidConfig: return "InvalidConfig";
    case ErrorKind::kInvalidResponse: return "InvalidResponse";
    case ErrorKind::kCancelled: return "Cancelled";
  }
  return "Unknown";
}

std::string Error::ToString() const {
  if (ok()) return "OK";
  std::string s = ErrorKindName(kind_);
  if (http_code_ != 0) s += " (" + std::to_string(http_code_) + ")";
  s += ": " + message_;
  if (!causes_.empty()) {
    s += "; causes:";
    for (size_t i = 0; i < causes_.size(); ++i) {
      const StatusCause& c = causes_[i];
      s += (i == 0 ? " " : ", ");
      if (!c.field.empty()) s += c.field + ": ";
      s += c.message.empty() ? c.reason : c.message;
    }
  }
  if (retry_after_) s += "; retry after " + std::to_string(retry_after_->count()) + "s";
  return s;
}

meshwork::Status Error::ToStatus() const {
  switch (kind_) {
    case ErrorKind::kOk: return meshwork::Status::Ok();
    case ErrorKind::kNotFound: return meshwork::NotFound(ToString());
    case ErrorKind::kInvalidConfig: return meshwork::InvalidConfig(ToString());
    case ErrorKind::kInvalid:
    case ErrorKind::kBadRequest: return meshwork::InvalidInput(ToString());
    case ErrorKind::kTooManyRequests:
    case ErrorKind::kServerError:
    case ErrorKind::kUnavailable:
    case ErrorKind::kGone:
    case ErrorKind::kConflict:
    case ErrorKind::kAlreadyExists:
    case ErrorKind::kUnauthorized:
    case ErrorKind::kForbidden: return meshwork::Unavailable(ToString());
    case ErrorKind::kInvalidResponse:
    case ErrorKind::kCancelled: return meshwork::Internal(ToString());
  }
  return meshwork::Internal(ToString());
}

bool IsRetryable(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kTooManyRequests:
    case ErrorKind::kServerError:
    case ErrorKind::kUnavailable: return true;
    default: return false;
  }
}

namespace {

ErrorKind KindFor(int code, const std::string& reason) {
  if (code >= 200 && code < 300) return ErrorKind::kOk;
  switch (code) {
    case 401: return ErrorKind::kUnauthorized;
    case 403: return ErrorKind::kForbidden;
    case 404: return ErrorKind::kNotFound;
    case 409: return reason == "AlreadyExists" ? ErrorKind::kAlreadyExists : ErrorKind::kConflict;
    case 410: return ErrorKind::kGone;
    case 422: return ErrorKind::kInvalid;
    case 429: return ErrorKind::kTooManyRequests;
    case 503:
    case 504: return ErrorKind::kUnavailable;
    default: break;
  }
  if (code >= 400 && code < 500) return ErrorKind::kBadRequest;
  if (code >= 500 && code < 600) return ErrorKind::kServerError;
  // No code (a watch ERROR event from a loose server): fall back on the reason.
  if (reason == "NotFound") return ErrorKind::kNotFound;
  if (reason == "AlreadyExists") return ErrorKind::kAlreadyExists;
  if (reason == "Conflict") return ErrorKind::kConflict;
  if (reason == "Expired" || reason == "Gone") return ErrorKind::kGone;
  if (reason == "Invalid") return ErrorKind::kInvalid;
  if (reason == "TooManyRequests") return ErrorKind::kTooManyRequests;
  return ErrorKind::kInvalidResponse;
}

std::optional<long> ParseSeconds(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  if (b == e) return std::nullopt;
  long v = 0;
  for (size_t i = b; i < e; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;  // HTTP-date form
    v = v * 10 + (s[i] - '0');
    if (v > 1000000) return v;
  }
  return v;
}

// Fills `err` from a parsed Status object; returns the Status's "code" (0 if absent).
int FillFromStatus(const nlohmann::json& st, Error* err, std::string* reason) {
  int code = 0;
  if (st.contains("code") && st["code"].is_number_integer()) code = st["code"].get<int>();
  if (st.contains("reason") && st["reason"].is_string()) *reason = st["reason"].get<std::string>();
  if (st.contains("details") && st["details"].is_object()) {
    const auto& d = st["details"];
    if (d.contains("causes") && d["causes"].is_array()) {
      for (const auto& c : d["causes"]) {
        if (!c.is_object()) continue;
        StatusCause cause;
        cause.field = c.value("field", std::string());
        cause.reason = c.value("reason", std::string());
        cause.message = c.value("message", std::string());
        err->add_cause(std::move(cause));
      }
    }
    if (d.contains("retryAfterSeconds") && d["retryAfterSeconds"].is_number_integer()) {
      err->set_retry_after(std::chrono::seconds(d["retryAfterSeconds"].get<long>()));
    }
  }
  return code;
}

Error Build(int code, const std::string& body, const std::string& retry_after_header,
            bool have_http_code) {
  Error scratch(ErrorKind::kInvalidResponse, "");
  std::string reason;
  std::string message;
  int status_code = 0;
  nlohmann::json st = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  bool is_status = st.is_object() && st.value("kind", std::string()) == "Status";
  if (is_status) {
    status_code = FillFromStatus(st, &scratch, &reason);
    message = st.value("message", std::string());
  }
  if (!have_http_code) code = status_code;
  ErrorKind kind = KindFor(code, reason);
  if (kind == ErrorKind::kOk) return Error::Ok();
  if (message.empty()) {
    // Not a Status (a proxy's HTML page, an empty body): keep a short excerpt for the reader.
    std::string excerpt = body.substr(0, 200);
    message = excerpt.empty() ? std::string("the server answered HTTP ") + std::to_string(code)
                              : "the server answered HTTP " + std::to_string(code) + ": " + excerpt;
  }
  Error err(kind, message);
  err.set_http_code(code);
  err.set_reason(reason.empty() ? ErrorKindName(kind) : reason);
  for (const auto& c : scratch.causes()) err.add_cause(c);
  if (auto s = ParseSeconds(retry_after_header)) {
    err.set_retry_after(std::chrono::seconds(*s));
  } else if (scratch.retry_after()) {
    err.set_retry_after(*scratch.retry_after());
  } else if (kind == ErrorKind::kTooManyRequests) {
    err.set_retry_after(std::chrono::seconds(1));  // 429 without a hint: come back soon, not now
  }
  return err;
}

}  // namespace

Error ErrorFromResponse(int http_code, const std::string& body,
                        const std::string& retry_after_header) {
  return Build(http_code, body, retry_after_header, /*have_http_code=*/true);
}

Error ErrorFromStatusObject(const std::string& status_json) {
  Error e = Build(0, status_json, "", /*have_http_code=*/false);
  if (e.ok()) return Error(ErrorKind::kInvalidResponse, "watch ERROR event with a success Status");
  return e;
}

}  // namespace meshwork::k8s
