// The REST client over cpprestsdk (see client.h). cpprest stays inside this file.
#include "operator/k8s/client.h"

#include <cpprest/http_client.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "operator/k8s/workqueue.h"  // TokenBucket

namespace meshwork::k8s {

namespace http = web::http;
using http::client::http_client;
using http::client::http_client_config;
using nlohmann::json;

namespace {

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// TLS material applied to every connection's context. With a CA given, only that CA is trusted
// (as kubectl does); without one, the system's roots.
void ApplyTls(const Config& c, boost::asio::ssl::context& ctx) {
  if (!c.ca_pem.empty()) {
    SSL_CTX_set_cert_store(ctx.native_handle(), X509_STORE_new());
    ctx.add_certificate_authority(boost::asio::buffer(c.ca_pem));
  }
  if (!c.client_cert_pem.empty()) {
    ctx.use_certificate_chain(boost::asio::buffer(c.client_cert_pem));
    ctx.use_private_key(boost::asio::buffer(c.client_key_pem), boost::asio::ssl::context::pem);
  }
}

// Loads the PEMs once up front so a bad certificate fails at start-up, naming what is wrong.
Error CheckTls(const Config& c) {
  auto try_load = [&](const char* what, const std::function<void(boost::asio::ssl::context&)>& f) -> Error {
    try {
      boost::asio::ssl::context ctx(boost::asio::ssl::context::sslv23);
      f(ctx);
    } catch (const std::exception& e) {
      return Error(ErrorKind::kInvalidConfig, c.source + ": " + what + " is not usable: " + e.what());
    }
    return Error::Ok();
  };
  if (!c.ca_pem.empty()) {
    MW_RETURN_IF_ERROR(try_load("certificate-authority (CA PEM)", [&](boost::asio::ssl::context& ctx) {
      ctx.add_certificate_authority(boost::asio::buffer(c.ca_pem));
    }));
  }
  if (!c.client_cert_pem.empty()) {
    MW_RETURN_IF_ERROR(try_load("client-certificate", [&](boost::asio::ssl::context& ctx) {
      ctx.use_certificate_chain(boost::asio::buffer(c.client_cert_pem));
    }));
    MW_RETURN_IF_ERROR(try_load("client-key (or it does not match client-certificate)",
                                 [&](boost::asio::ssl::context& ctx) {
                                   ctx.use_certificate_chain(boost::asio::buffer(c.client_cert_pem));
                                   ctx.use_private_key(boost::asio::buffer(c.client_key_pem),
                                                       boost::asio::ssl::context::pem);
                                   if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
                                     throw std::runtime_error("private key does not match the certificate");
                                   }
                                 }));
  }
  return Error::Ok();
}

struct RawResponse {
  int code = 0;
  std::string body;
  std::string retry_after;
};

}  // namespace

struct Client::Impl {
  Config config;
  ClientOptions options;
  std::unique_ptr<http_client> http;
  std::mutex bucket_mu;
  std::optional<TokenBucket> bucket;  // set when options.qps > 0

  // Blocks until the rate limit lets one more request go (no-op without a limit).
  void Throttle() {
    if (!bucket) return;
    std::chrono::milliseconds wait;
    {
      std::lock_guard<std::mutex> lock(bucket_mu);
      wait = bucket->Reserve();
    }
    if (wait.count() <= 0) return;
    std::this_thread::sleep_for(wait);
    if (options.on_throttled) options.on_throttled(std::chrono::duration<double>(wait).count());
  }

  http_client_config MakeHttpConfig(std::chrono::milliseconds timeout) const {
    http_client_config cfg;
    cfg.set_timeout(timeout);
    cfg.set_validate_certificates(!config.insecure_skip_tls_verify);
    Config tls = config;  // the callback outlives this call
    cfg.set_ssl_context_callback([tls](boost::asio::ssl::context& ctx) { ApplyTls(tls, ctx); });
    return cfg;
  }

  // The bearer token; a token file is re-read each time (service-account tokens rotate).
  std::string Token() const {
    if (!config.token_file.empty()) {
      std::ifstream f(config.token_file);
      if (f) {
        std::stringstream ss;
        ss << f.rdbuf();
        std::string t = Trim(ss.str());
        if (!t.empty()) return t;
      }
    }
    return config.token;
  }

  http::http_request MakeRequest(const http::method& method, const std::string& path_query, const json* body,
                                 const std::string& content_type, const char* accept) const {
    http::http_request req(method);
    req.set_request_uri(utility::conversions::to_string_t(path_query));
    req.headers().add(U("Accept"), utility::conversions::to_string_t(accept));
    req.headers().add(U("User-Agent"), utility::conversions::to_string_t(options.user_agent));
    std::string token = Token();
    if (!token.empty()) req.headers().add(U("Authorization"), utility::conversions::to_string_t("Bearer " + token));
    if (body != nullptr) req.set_body(body->dump(), content_type);
    return req;
  }

  std::string Describe(const http::method& method, const std::string& path) const {
    return utility::conversions::to_utf8string(method) + " " + config.server + path;
  }

  // One request with the bounded retry: connection errors (when `retry_connection_errors`) and
  // 429, whose Retry-After is honoured up to options.max_retry_after.
  Result<RawResponse> Send(const http::method& method, const std::string& path_query, const json* body,
                           const std::string& content_type, const char* accept, bool retry_connection_errors) {
    std::chrono::milliseconds backoff = options.retry_backoff;
    Error last;
    for (int attempt = 0;; ++attempt) {
      bool can_retry = attempt < options.max_retries;
      Throttle();
      try {
        http::http_response resp =
            http->request(MakeRequest(method, path_query, body, content_type, accept)).get();
        RawResponse r;
        r.code = resp.status_code();
        r.body = resp.extract_utf8string(true).get();
        auto it = resp.headers().find(U("Retry-After"));
        if (it != resp.headers().end()) r.retry_after = utility::conversions::to_utf8string(it->second);
        if (r.code == 429 && can_retry) {
          Error e = ErrorFromResponse(r.code, r.body, r.retry_after);
          auto wait = std::min<std::chrono::milliseconds>(e.retry_after().value_or(std::chrono::seconds(1)),
                                                          options.max_retry_after);
          std::this_thread::sleep_for(wait);
          continue;
        }
        return r;
      } catch (const std::exception& e) {
        last = Error(ErrorKind::kUnavailable, Describe(method, path_query) + ": " + e.what());
      }
      if (!retry_connection_errors || !can_retry) return last;
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
  }

  Result<json> DoJson(const http::method& method, const std::string& path_query, const json* body = nullptr,
                      const std::string& content_type = "application/json") {
    // A POST that lost its connection may have been applied: only idempotent calls are resent.
    bool idempotent = method != http::methods::POST;
    MW_ASSIGN_OR_RETURN(RawResponse r,
                         Send(method, path_query, body, content_type, "application/json", idempotent));
    Error err = ErrorFromResponse(r.code, r.body, r.retry_after);
    if (!err.ok()) return err;
    json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return Error(ErrorKind::kInvalidResponse,
                   Describe(method, path_query) + ": response is not JSON: " + r.body.substr(0, 200));
    }
    return j;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::FromConfig(Config config, ClientOptions options) {
  if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0) {
    return Error(ErrorKind::kInvalidConfig,
                 config.source + ": server \"" + config.server + "\" must start with https:// or http://");
  }
  if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
    return Error(ErrorKind::kInvalidConfig, config.source + ": a client certificate needs its key, and a key its certificate");
  }
  if (options.request_timeout.count() <= 0) {
    return Error(ErrorKind::kInvalidConfig, "ClientOptions.request_timeout must be positive, got " +
                                                std::to_string(options.request_timeout.count()) + "ms");
  }
  if (options.max_retries < 0) {
    return Error(ErrorKind::kInvalidConfig,
                 "ClientOptions.max_retries must be >= 0, got " + std::to_string(options.max_retries));
  }
  if (!std::isfinite(options.qps)) {
    return Error(ErrorKind::kInvalidConfig, "ClientOptions.qps must be a finite number, got " + std::to_string(options.qps));
  }
  if (config.source.empty()) config.source = "client config for " + config.server;
  MW_RETURN_IF_ERROR(CheckTls(config));
  auto impl = std::make_unique<Impl>();
  impl->config = std::move(config);
  impl->options = options;
  if (options.qps > 0) {
    const int burst =
        options.burst > 0 ? options.burst : std::max(1, static_cast<int>(std::ceil(1.5 * options.qps)));
    impl->bucket.emplace(options.qps, burst);
  }
  try {
    impl->http = std::make_unique<http_client>(utility::conversions::to_string_t(impl->config.server),
                                               impl->MakeHttpConfig(options.request_timeout));
  } catch (const std::exception& e) {
    return Error(ErrorKind::kInvalidConfig, impl->config.source + ": server \"" + impl->config.server +
                                                "\" is not a usable URL: " + e.what());
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const Config& Client::config() const { return impl_->config; }

Result<json> Client::Get(const ResourceRef& ref, const std::string& ns, const std::string& name) {
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, ns, name));
  return impl_->DoJson(http::methods::GET, path);
}

Result<json> Client::ListPage(const ResourceRef& ref, const std::string& ns, const ListOptions& opts) {
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, ns));
  return impl_->DoJson(http::methods::GET, path + ListQuery(opts));
}

Result<json> Client::List(const ResourceRef& ref, const std::string& ns, const ListOptions& opts) {
  ListOptions page_opts = opts;
  json all;
  json items = json::array();
  for (int page = 0;; ++page) {
    auto r = ListPage(ref, ns, page_opts);
    if (!r.ok()) {
      if (IsGone(r.error()) && page > 0) {
        // The continue token expired mid-way: start over with one unpaginated list.
        ListOptions whole = opts;
        whole.limit = 0;
        whole.continue_token.clear();
        return List(ref, ns, whole);
      }
      return r.error();
    }
    json& body = r.value();
    if (!body.is_object() || !body.contains("items") || !(body["items"].is_array() || body["items"].is_null())) {
      return Error(ErrorKind::kInvalidResponse, "list of " + ref.resource + ": the answer has no items array");
    }
    if (page == 0) all = body;
    if (body["items"].is_array()) {
      for (auto& item : body["items"]) items.push_back(std::move(item));
    }
    std::string cont;
    if (body.contains("metadata") && body["metadata"].is_object()) {
      cont = body["metadata"].value("continue", std::string());
      all["metadata"]["resourceVersion"] = body["metadata"].value("resourceVersion", std::string());
    }
    if (cont.empty() || opts.limit <= 0) break;
    page_opts.continue_token = cont;
  }
  // List items come without apiVersion/kind; fill them in so an item stands on its own.
  std::string list_kind = all.value("kind", std::string());
  std::string kind = list_kind.size() > 4 && list_kind.compare(list_kind.size() - 4, 4, "List") == 0
                         ? list_kind.substr(0, list_kind.size() - 4)
                         : std::string();
  for (auto& item : items) {
    if (!item.is_object()) continue;
    if (!item.contains("apiVersion")) item["apiVersion"] = ref.ApiVersion();
    if (!item.contains("kind") && !kind.empty()) item["kind"] = kind;
  }
  all["items"] = std::move(items);
  if (all.contains("metadata") && all["metadata"].is_object()) all["metadata"].erase("continue");
  return all;
}

namespace {
// The namespace a write goes to: the argument, else the object's; they must agree.
Result<std::string> WriteNamespace(const ResourceRef& ref, const std::string& ns, const json& obj) {
  std::string obj_ns;
  if (obj.is_object() && obj.contains("metadata") && obj["metadata"].is_object()) {
    obj_ns = obj["metadata"].value("namespace", std::string());
  }
  if (!ref.namespaced) return std::string();
  if (ns.empty()) return obj_ns;
  if (!obj_ns.empty() && obj_ns != ns) {
    return Error(ErrorKind::kBadRequest, "object's metadata.namespace \"" + obj_ns +
                                             "\" differs from the namespace \"" + ns + "\" it is written to");
  }
  return ns;
}

Result<std::string> NameOf(const json& obj, const char* op) {
  std::string name;
  if (obj.is_object() && obj.contains("metadata") && obj["metadata"].is_object()) {
    name = obj["metadata"].value("name", std::string());
  }
  if (name.empty()) return Error(ErrorKind::kBadRequest, std::string(op) + ": the object has no metadata.name");
  return name;
}
}  // namespace

Result<json> Client::Create(const ResourceRef& ref, const std::string& ns, const json& obj) {
  if (!obj.is_object()) return Error(ErrorKind::kBadRequest, "Create: the object is not a JSON object");
  MW_ASSIGN_OR_RETURN(std::string target_ns, WriteNamespace(ref, ns, obj));
  if (ref.namespaced && target_ns.empty()) {
    return Error(ErrorKind::kBadRequest, "Create: no namespace given for " + ref.resource);
  }
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, target_ns));
  return impl_->DoJson(http::methods::POST, path, &obj);
}

Result<json> Client::CreateSubresource(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                       const std::string& subresource, const json& body) {
  if (!body.is_object()) return Error(ErrorKind::kBadRequest, "CreateSubresource: the body is not a JSON object");
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, ns, name, subresource));
  return impl_->DoJson(http::methods::POST, path, &body);
}

Result<json> Client::Update(const ResourceRef& ref, const std::string& ns, const json& obj) {
  MW_ASSIGN_OR_RETURN(std::string name, NameOf(obj, "Update"));
  MW_ASSIGN_OR_RETURN(std::string target_ns, WriteNamespace(ref, ns, obj));
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, target_ns, name));
  return impl_->DoJson(http::methods::PUT, path, &obj);
}

Result<json> Client::UpdateStatus(const ResourceRef& ref, const std::string& ns, const json& obj) {
  MW_ASSIGN_OR_RETURN(std::string name, NameOf(obj, "UpdateStatus"));
  MW_ASSIGN_OR_RETURN(std::string target_ns, WriteNamespace(ref, ns, obj));
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, target_ns, name, "status"));
  return impl_->DoJson(http::methods::PUT, path, &obj);
}

Result<json> Client::MergePatch(const ResourceRef& ref, const std::string& ns, const std::string& name,
                                const json& patch, const std::string& subresource) {
  if (!patch.is_object()) return Error(ErrorKind::kBadRequest, "MergePatch: the patch is not a JSON object");
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, ns, name, subresource));
  return impl_->DoJson(http::methods::PATCH, path, &patch, "application/merge-patch+json");
}

Result<json> Client::Delete(const ResourceRef& ref, const std::string& ns, const std::string& name,
                            const DeleteOptions& opts) {
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, ns, name));
  json body = DeleteBody(opts);
  return impl_->DoJson(http::methods::DEL, path, &body);
}

Result<std::string> Client::GetLog(const std::string& ns, const std::string& pod, const LogOptions& opts) {
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(resources::Pods(), ns, pod, "log"));
  path += LogQuery(opts);
  MW_ASSIGN_OR_RETURN(RawResponse r, impl_->Send(http::methods::GET, path, nullptr, "", "*/*", true));
  Error err = ErrorFromResponse(r.code, r.body, r.retry_after);
  if (!err.ok()) return err;
  return r.body;
}

Error Client::Watch(const ResourceRef& ref, const std::string& ns, const std::string& resource_version,
                    const WatchOptions& opts, const WatchHandler& handler, const CancelToken& cancel) {
  MW_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref, ns));
  path += WatchQuery(opts, resource_version);
  const std::string what = "watch " + impl_->config.server + path;
  if (cancel.cancelled()) return Error(ErrorKind::kCancelled, what + ": cancelled");
  impl_->Throttle();

  // cpprest's timeout is an idle timer (reset by each chunk): give the server's own
  // timeoutSeconds room to end the stream first.
  std::chrono::milliseconds idle = opts.timeout_seconds > 0
                                       ? std::chrono::seconds(opts.timeout_seconds + 30)
                                       : std::chrono::milliseconds(std::chrono::minutes(10));
  auto cts = std::make_shared<pplx::cancellation_token_source>();
  int reg = cancel.OnCancel([cts] { cts->cancel(); });
  struct Unregister {
    const CancelToken& token;
    int id;
    ~Unregister() { token.Unregister(id); }
  } unregister{cancel, reg};

  auto cancelled = [&] { return Error(ErrorKind::kCancelled, what + ": cancelled"); };
  try {
    http_client client(utility::conversions::to_string_t(impl_->config.server), impl_->MakeHttpConfig(idle));
    http::http_response resp =
        client.request(impl_->MakeRequest(http::methods::GET, path, nullptr, "", "application/json"),
                       cts->get_token())
            .get();
    if (resp.status_code() != 200) {
      std::string body = resp.extract_utf8string(true).get();
      auto it = resp.headers().find(U("Retry-After"));
      Error e = ErrorFromResponse(resp.status_code(), body,
                                  it == resp.headers().end() ? "" : utility::conversions::to_utf8string(it->second));
      if (e.ok()) e = Error(ErrorKind::kInvalidResponse, what + ": unexpected HTTP " + std::to_string(resp.status_code()));
      return e;
    }
    auto buf = resp.body().streambuf();
    WatchLineParser parser;
    std::vector<WatchEvent> events;
    std::vector<char> chunk(64 * 1024);
    auto deliver = [&]() -> std::optional<Error> {
      for (const WatchEvent& ev : events) {
        if (cancel.cancelled()) return cancelled();
        bool go_on = handler(ev);
        if (ev.type == WatchEvent::Type::kError) {
          cts->cancel();
          return ev.error;
        }
        if (!go_on) {
          cts->cancel();  // close the connection; nothing more is read
          return Error::Ok();
        }
      }
      events.clear();
      return std::nullopt;
    };
    for (;;) {
      // Wait for at least one byte, then take whatever else has arrived: events are handled as
      // their lines complete, never at the end of the body.
      size_t n = buf.getn(reinterpret_cast<uint8_t*>(chunk.data()), 1).get();
      if (n == 0) break;  // the server ended the stream
      size_t avail = std::min(buf.in_avail(), chunk.size() - 1);
      if (avail > 0) n += buf.getn(reinterpret_cast<uint8_t*>(chunk.data()) + 1, avail).get();
      Error perr = parser.Feed(std::string_view(chunk.data(), n), &events);
      if (auto done = deliver()) return *done;
      if (!perr.ok()) {
        cts->cancel();
        return Error(perr.kind(), what + ": " + perr.message());
      }
    }
    Error ferr = parser.Finish(&events);
    if (auto done = deliver()) return *done;
    if (!ferr.ok()) return Error(ferr.kind(), what + ": " + ferr.message());
    return cancel.cancelled() ? cancelled() : Error::Ok();
  } catch (const pplx::task_canceled&) {
    return cancelled();
  } catch (const std::exception& e) {
    if (cancel.cancelled()) return cancelled();
    return Error(ErrorKind::kUnavailable, what + ": " + e.what());
  }
}

}  // namespace meshwork::k8s
