// The API layer: routing, discovery, CRUD, status subresource, CRDs, list/watch, deletion, logs.
#include "controlplane/apiserver/api_server.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "controlplane/apiserver/protobuf_body.h"
#include "controlplane/apiserver/selectors.h"
#include "controlplane/schema/openapi.h"
#include "controlplane/schema/printer_columns.h"
#include "common/base64.h"

namespace meshwork::controlplane {

using nlohmann::json;
using Clock = std::chrono::system_clock;

struct ApiServer::Request {
  const HttpRequest* http = nullptr;
  ResourceInfo info;
  std::string ns;    // "" for cluster-scoped resources and all-namespace lists
  std::string name;  // "" for collections
  std::string sub;   // "", "status", "log", "scale"
  bool table = false;
  std::string include_object = "Metadata";
  std::string body;  // the request body as JSON text (protobuf bodies decoded)
};

namespace {

// ---- responses ----------------------------------------------------------------------------

HttpResponse JsonResponse(int code, const json& body,
                          const std::string& content_type = "application/json") {
  HttpResponse r;
  r.status = code;
  r.headers.push_back({"Content-Type", content_type});
  r.headers.push_back({"Cache-Control", "no-cache, private"});
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

json StatusObject(const ApiError& e) {
  json s = {{"kind", "Status"},   {"apiVersion", "v1"},  {"metadata", json::object()},
            {"status", "Failure"}, {"message", e.message}, {"reason", e.reason},
            {"code", e.code}};
  if (!e.details.is_null()) s["details"] = e.details;
  return s;
}

ApiError Err(int code, std::string reason, std::string message, json details = nullptr) {
  return ApiError{code, std::move(reason), std::move(message), std::move(details)};
}

ApiError BadRequest(const std::string& message) { return Err(400, "BadRequest", message); }

ApiError NotFoundErr(const ResourceInfo& info, const std::string& name) {
  return Err(404, "NotFound", info.QualifiedResource() + " \"" + name + "\" not found",
             {{"name", name}, {"group", info.group}, {"kind", info.resource}});
}

ApiError NamespaceNotFound(const std::string& ns) {
  return Err(404, "NotFound", "namespaces \"" + ns + "\" not found",
             {{"name", ns}, {"kind", "namespaces"}});
}

ApiError ConflictErr(const ResourceInfo& info, const std::string& name) {
  return Err(409, "Conflict",
             "Operation cannot be fulfilled on " + info.QualifiedResource() + " \"" + name +
                 "\": the object has been modified; please apply your changes to the latest "
                 "version and try again",
             {{"name", name}, {"group", info.group}, {"kind", info.resource}});
}

ApiError AlreadyExistsErr(const ResourceInfo& info, const std::string& name) {
  return Err(409, "AlreadyExists", info.QualifiedResource() + " \"" + name + "\" already exists",
             {{"name", name}, {"group", info.group}, {"kind", info.resource}});
}

ApiError InvalidErr(const ResourceInfo& info, const std::string& name,
                    const std::vector<schema::FieldCause>& causes) {
  return Err(422, "Invalid", schema::InvalidMessage(info.QualifiedKind(), name, causes),
             {{"name", name},
              {"group", info.group},
              {"kind", info.kind},
              {"causes", schema::CausesToJson(causes)}});
}

ApiError InternalErr(const std::string& message) {
  return Err(500, "InternalError", "Internal error occurred: " + message);
}

ApiError FromStore(const StoreError& e, const ResourceInfo& info, const std::string& name) {
  switch (e.code) {
    case StoreErrorCode::kNotFound: return NotFoundErr(info, name);
    case StoreErrorCode::kAlreadyExists: return AlreadyExistsErr(info, name);
    case StoreErrorCode::kConflict: return ConflictErr(info, name);
    case StoreErrorCode::kGone: return Err(410, "Expired", e.message);
    case StoreErrorCode::kInvalid: return BadRequest(e.message);
    case StoreErrorCode::kIO: return InternalErr(e.message);
  }
  return InternalErr(e.message);
}

template <class T>
ApiResult<T> Fail(ApiError e) {
  ApiResult<T> r;
  r.error = std::move(e);
  return r;
}
template <class T>
ApiResult<T> Ok(T v) {
  ApiResult<T> r;
  r.value = std::move(v);
  return r;
}

// ---- small helpers ------------------------------------------------------------------------

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> segs;
  std::string cur;
  for (char c : path) {
    if (c == '/') {
      if (!cur.empty()) segs.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) segs.push_back(cur);
  return segs;
}

json& Meta(json& obj) {
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) obj["metadata"] = json::object();
  return obj["metadata"];
}

std::string MetaString(const json& obj, const char* field) {
  auto md = obj.find("metadata");
  if (md == obj.end() || !md->is_object()) return "";
  auto it = md->find(field);
  if (it == md->end() || !it->is_string()) return "";
  return it->get<std::string>();
}

bool IsDeleting(const json& obj) { return !MetaString(obj, "deletionTimestamp").empty(); }

std::vector<std::string> Finalizers(const json& obj) {
  std::vector<std::string> out;
  auto md = obj.find("metadata");
  if (md == obj.end() || !md->is_object()) return out;
  auto it = md->find("finalizers");
  if (it == md->end() || !it->is_array()) return out;
  for (const json& f : *it) {
    if (f.is_string()) out.push_back(f.get<std::string>());
  }
  return out;
}

bool TruthyQuery(const HttpRequest& req, const std::string& name) {
  if (!req.HasQuery(name)) return false;
  std::string v = req.Query(name);
  return v == "1" || v == "true" || v == "True";
}

// The parts of an object that count as its spec for generation: everything but metadata (and
// status when the status subresource splits it off).
json SpecPart(const json& obj, bool status_split) {
  json s = obj;
  if (s.is_object()) {
    s.erase("metadata");
    s.erase("apiVersion");
    s.erase("kind");
    if (status_split) s.erase("status");
  }
  return s;
}

bool ParseUint(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  bool neg = s[0] == '-';
  uint64_t v;
  if (!ParseUint(neg ? s.substr(1) : s, &v)) return false;
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

// Strategic merge patch, approximated: maps merge as in a JSON merge patch, lists of objects
// that share a merge key (name, port, type, ...) merge element by element, `$patch: delete`
// removes an element, `$deleteFromPrimitiveList/<field>` removes values, other `$` directives
// are ignored.
json StripDirectives(const json& v) {
  if (v.is_object()) {
    json out = json::object();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it.key().empty() && it.key()[0] == '$') continue;
      out[it.key()] = StripDirectives(it.value());
    }
    return out;
  }
  if (v.is_array()) {
    json out = json::array();
    for (const json& e : v) out.push_back(StripDirectives(e));
    return out;
  }
  return v;
}

std::string MergeKeyOf(const json& list) {
  static const char* kKeys[] = {"name", "containerPort", "port", "type", "ip", "mountPath",
                                "devicePath", "topologyKey"};
  for (const char* k : kKeys) {
    bool all = !list.empty();
    for (const json& e : list) {
      if (!e.is_object() || !e.contains(k)) {
        all = false;
        break;
      }
    }
    if (all) return k;
  }
  return "";
}

json StrategicMerge(json target, const json& patch) {
  if (!patch.is_object()) return StripDirectives(patch);
  if (!target.is_object()) target = json::object();
  if (patch.value("$patch", "") == "replace") return StripDirectives(patch);
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    const std::string kDelete = "$deleteFromPrimitiveList/";
    if (k.rfind(kDelete, 0) == 0 && v.is_array()) {
      std::string field = k.substr(kDelete.size());
      if (target.contains(field) && target[field].is_array()) {
        json kept = json::array();
        for (const json& e : target[field]) {
          if (std::find(v.begin(), v.end(), e) == v.end()) kept.push_back(e);
        }
        target[field] = kept;
      }
      continue;
    }
    if (!k.empty() && k[0] == '$') continue;
    if (v.is_null()) {
      target.erase(k);
    } else if (v.is_object()) {
      if (v.value("$patch", "") == "delete") {
        target.erase(k);
      } else {
        target[k] = StrategicMerge(target.contains(k) ? target[k] : json::object(), v);
      }
    } else if (v.is_array() && target.contains(k) && target[k].is_array()) {
      std::string key = MergeKeyOf(v);
      if (key.empty()) {
        target[k] = StripDirectives(v);
        continue;
      }
      json merged = target[k];
      for (const json& e : v) {
        auto found = std::find_if(merged.begin(), merged.end(), [&](const json& m) {
          return m.is_object() && m.contains(key) && m[key] == e[key];
        });
        if (e.value("$patch", "") == "delete") {
          if (found != merged.end()) merged.erase(found);
        } else if (found != merged.end()) {
          *found = StrategicMerge(*found, e);
        } else {
          merged.push_back(StripDirectives(e));
        }
      }
      target[k] = merged;
    } else {
      target[k] = StripDirectives(v);
    }
  }
  return target;
}

// Deeper JSON than any Kubernetes object is refused before parsing: serializing and validating
// are recursive, and a 3 MiB body of brackets must not exhaust the stack.
constexpr int kMaxJsonDepth = 256;

json ParseBody(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        throw std::invalid_argument("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return json::parse(text);
}

// Bodies are JSON; protobuf (what typed clients prefer) is refused with 415 so they send JSON.
bool JsonBody(const HttpRequest& req) {
  std::string ct = req.Header("content-type");
  return ct.empty() || ct.rfind("application/json", 0) == 0 || ct.rfind("*/*", 0) == 0;
}

HttpResponse UnsupportedBody(const HttpRequest& req) {
  return JsonResponse(415, StatusObject(Err(415, "UnsupportedMediaType",
                                            "the body of the request was in an unknown format - "
                                            "accepted media types include: application/json (got " +
                                                req.Header("content-type") + ")")));
}

// Paths present in `original` but not in `pruned` (what pruning removed): "spec.foo".
void CollectPruned(const json& original, const json& pruned, const std::string& path,
                   std::vector<std::string>* out) {
  if (original.is_object() && pruned.is_object()) {
    for (auto it = original.begin(); it != original.end(); ++it) {
      if (path.empty() && (it.key() == "metadata" || it.key() == "apiVersion" || it.key() == "kind")) continue;
      std::string p = path.empty() ? it.key() : path + "." + it.key();
      auto found = pruned.find(it.key());
      if (found == pruned.end()) {
        out->push_back(p);
      } else {
        CollectPruned(it.value(), *found, p, out);
      }
    }
  } else if (original.is_array() && pruned.is_array() && original.size() == pruned.size()) {
    for (size_t i = 0; i < original.size(); ++i) {
      CollectPruned(original[i], pruned[i], path + "[" + std::to_string(i) + "]", out);
    }
  }
}

// fieldValidation=Strict: unknown fields of a custom resource are a 400, as kube-apiserver's
// strict decoding answers (kubectl apply and create send Strict by default).
std::optional<ApiError> StrictFieldCheck(const ResourceInfo& info, const HttpRequest* http, const json& obj) {
  if (!info.custom || info.schema.is_null() || http == nullptr) return std::nullopt;
  if (http->Query("fieldValidation") != "Strict") return std::nullopt;
  json pruned = obj;
  schema::Prune(info.schema, pruned);
  std::vector<std::string> unknown;
  CollectPruned(obj, pruned, "", &unknown);
  if (unknown.empty()) return std::nullopt;
  std::string msg = info.kind + " in version \"" + info.version + "\" cannot be handled as a " + info.kind +
                    ": strict decoding error: ";
  for (size_t i = 0; i < unknown.size(); ++i) msg += (i ? ", " : "") + std::string("unknown field \"") + unknown[i] + "\"";
  return BadRequest(msg);
}

bool WantsTable(const HttpRequest& req) {
  return req.Header("accept").find("as=Table") != std::string::npos;
}

}  // namespace

std::string Rfc3339(Clock::time_point t) {
  std::time_t tt = Clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// What a list, watch or delete-collection request selects: its label and field selectors and
// the store prefix of its resource (and namespace). A bad selector is the BadRequest to answer.
struct Selection {
  LabelSelector labels;
  FieldSelector fields;
  std::string prefix;
};

std::optional<ApiError> ParseSelection(const HttpRequest& http, const ResourceInfo& info, const std::string& ns,
                                       std::optional<Selection>* out) {
  auto labels = LabelSelector::Parse(http.Query("labelSelector"));
  if (!labels.ok()) return BadRequest(labels.status().message());
  auto fields = FieldSelector::Parse(http.Query("fieldSelector"));
  if (!fields.ok()) return BadRequest(fields.status().message());
  std::string prefix = info.StoreResource() + (!info.namespaced ? "//" : ns.empty() ? "/" : "/" + ns + "/");
  out->emplace(Selection{std::move(labels).value(), std::move(fields).value(), std::move(prefix)});
  return std::nullopt;
}

// A create or update body must be an object of this URL's apiVersion and kind (either may be
// left out) with an object as metadata; else the BadRequest kube-apiserver answers.
std::optional<ApiError> CheckBodyShape(const json& body, const ResourceInfo& info) {
  if (!body.is_object()) {
    return BadRequest("the body of the request must be a JSON object, got: " + std::string(body.type_name()));
  }
  if (body.contains("apiVersion") && body["apiVersion"] != info.GroupVersion()) {
    return BadRequest("the API version in the data (" + body["apiVersion"].dump() +
                      ") does not match the expected API version (" + info.GroupVersion() + ")");
  }
  if (body.contains("kind") && body["kind"] != info.kind) {
    return BadRequest("the kind in the data (" + body["kind"].dump() + ") does not match the expected kind (" +
                      info.kind + ")");
  }
  if (body.contains("metadata") && !body["metadata"].is_object()) {
    return BadRequest("metadata: must be an object, got " + body["metadata"].dump());
  }
  return std::nullopt;
}

namespace {

// Whether `info` is the built-in resource `group`/`resource` (not a CRD of the same name).
bool IsBuiltin(const ResourceInfo& info, const char* group, const char* resource) {
  return !info.custom && info.group == group && info.resource == resource;
}

// The ServiceAccount admission check on pod create: a named ServiceAccount must exist in the
// pod's namespace. "default" always passes: real clusters create it in every namespace.
// `name` is what the message calls the pod: its generateName when the name is generated, as
// admission runs before kube-apiserver generates the name.
std::optional<ApiError> CheckPodServiceAccount(Store& store, const json& pod, const std::string& name) {
  std::string sa = FieldValue(pod, "spec.serviceAccountName");
  if (sa.empty() || sa == "default") return std::nullopt;
  std::string ns = FieldValue(pod, "metadata.namespace");
  if (store.Get(StoreKey("serviceaccounts", ns, sa))) return std::nullopt;
  return Err(403, "Forbidden",
             "pods \"" + name + "\" is forbidden: error looking up service account " + ns + "/" + sa +
                 ": serviceaccount \"" + sa + "\" not found",
             {{"name", name}, {"kind", "pods"}});
}

// Go's %#v of a map[string]string, which kube-apiserver's messages quote: map[string]string{"a":"b", "c":"d"}.
std::string GoStringMap(const json& labels) {
  if (!labels.is_object() || labels.empty()) return "map[string]string(nil)";
  std::string out = "map[string]string{";
  bool first = true;
  for (auto it = labels.begin(); it != labels.end(); ++it) {
    out += (first ? "" : ", ") + json(it.key()).dump() + ":" + it.value().dump();
    first = false;
  }
  return out + "}";
}

// A Deployment's defaults and checks (kube-apiserver's apps/v1 defaulting and validation, in
// part). `old` is the stored object on an update: the selector is immutable.
std::vector<schema::FieldCause> PrepareDeployment(json& obj, const json* old) {
  std::vector<schema::FieldCause> causes;
  auto invalid = [&](const std::string& field, const std::string& value, const std::string& why) {
    causes.push_back({"FieldValueInvalid", field, "Invalid value: " + value + ": " + why});
  };
  if (!obj.contains("spec") || !obj["spec"].is_object()) {
    causes.push_back({"FieldValueRequired", "spec", "Required value"});
    return causes;
  }
  json& spec = obj["spec"];
  if (!spec.contains("replicas") || spec["replicas"].is_null()) spec["replicas"] = 1;
  if (!spec["replicas"].is_number_integer() || spec["replicas"].get<int64_t>() < 0) {
    invalid("spec.replicas", spec["replicas"].dump(), "must be greater than or equal to 0");
  }
  if (!spec.contains("revisionHistoryLimit")) spec["revisionHistoryLimit"] = 10;
  if (!spec.contains("progressDeadlineSeconds")) spec["progressDeadlineSeconds"] = 600;
  // Only Recreate is carried out (docs/controlplane.md); RollingUpdate is accepted and rolls
  // out the same way.
  if (!spec.contains("strategy") || !spec["strategy"].is_object()) spec["strategy"] = json::object();
  if (!spec["strategy"].contains("type")) spec["strategy"]["type"] = "Recreate";
  std::string strategy = spec["strategy"]["type"].is_string() ? spec["strategy"]["type"].get<std::string>() : "";
  if (strategy != "Recreate" && strategy != "RollingUpdate") {
    causes.push_back({"FieldValueNotSupported", "spec.strategy.type",
                      "Unsupported value: " + spec["strategy"]["type"].dump() +
                          ": supported values: \"Recreate\", \"RollingUpdate\""});
  }
  // Selector: required, non-empty, well formed, matching the template's labels.
  std::optional<LabelSelector> selector;
  if (!spec.contains("selector") || spec["selector"].is_null()) {
    causes.push_back({"FieldValueRequired", "spec.selector", "Required value"});
  } else {
    auto text = LabelSelectorText(spec["selector"]);
    if (!text.ok()) {
      invalid("spec.selector", spec["selector"].dump(), text.status().message());
    } else if (text->empty()) {
      invalid("spec.selector", spec["selector"].dump(), "empty selector is invalid for deployment");
    } else {
      selector = LabelSelector::Parse(*text).value();
    }
  }
  if (old != nullptr && old->contains("spec") && (*old)["spec"].is_object() &&
      (*old)["spec"].value("selector", json()) != spec.value("selector", json())) {
    invalid("spec.selector", spec.value("selector", json()).dump(), "field is immutable");
  }
  if (!spec.contains("template") || !spec["template"].is_object()) {
    causes.push_back({"FieldValueRequired", "spec.template", "Required value"});
    return causes;
  }
  json& tmpl = spec["template"];
  json labels = tmpl.contains("metadata") && tmpl["metadata"].is_object()
                    ? tmpl["metadata"].value("labels", json::object()) : json::object();
  if (!labels.is_object()) {
    causes.push_back({"FieldValueTypeInvalid", "spec.template.metadata.labels",
                      "Invalid value: " + labels.dump() + ": must be a map"});
  } else if (selector && !selector->Matches(json{{"metadata", {{"labels", labels}}}})) {
    invalid("spec.template.metadata.labels", GoStringMap(labels), "`selector` does not match template `labels`");
  }
  if (!tmpl.contains("spec") || !tmpl["spec"].is_object()) {
    causes.push_back({"FieldValueRequired", "spec.template.spec", "Required value"});
    return causes;
  }
  json& pod = tmpl["spec"];
  if (!pod.contains("containers") || !pod["containers"].is_array() || pod["containers"].empty()) {
    causes.push_back({"FieldValueRequired", "spec.template.spec.containers", "Required value"});
  } else {
    for (size_t i = 0; i < pod["containers"].size(); ++i) {
      const json& c = pod["containers"][i];
      std::string at = "spec.template.spec.containers[" + std::to_string(i) + "]";
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) {
        causes.push_back({"FieldValueRequired", at + ".name", "Required value"});
        continue;
      }
      if (std::string m = CheckDns1123Label(c["name"]); !m.empty()) {
        invalid(at + ".name", c["name"].dump(), m);
      }
      if (!c.contains("image")) causes.push_back({"FieldValueRequired", at + ".image", "Required value"});
    }
  }
  if (!pod.contains("restartPolicy")) pod["restartPolicy"] = "Always";
  if (pod["restartPolicy"] != "Always") {
    causes.push_back({"FieldValueNotSupported", "spec.template.spec.restartPolicy",
                      "Unsupported value: " + pod["restartPolicy"].dump() + ": supported values: \"Always\""});
  }
  return causes;
}

}  // namespace

HttpResponse ErrorResponse(const ApiError& error) {
  return JsonResponse(error.code, StatusObject(error));
}

// ---- construction -------------------------------------------------------------------------

ApiServer::ApiServer(Store* store, ApiServerOptions options)
    : store_(store), options_(std::move(options)) {
  std::random_device rd;
  random_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                  static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

ApiServer::~ApiServer() { Shutdown(); }

void ApiServer::Shutdown() { shutting_down_ = true; }

void ApiServer::SetPodLogSource(PodLogSource source) { pod_logs_ = std::move(source); }

void ApiServer::Log(const std::string& line) {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << line << std::endl;
  }
}

std::string ApiServer::NewUid() {
  std::lock_guard<std::mutex> lock(random_mu_);
  auto next = [&] {
    random_state_ ^= random_state_ << 13;
    random_state_ ^= random_state_ >> 7;
    random_state_ ^= random_state_ << 17;
    return random_state_;
  };
  uint64_t a = next(), b = next();
  a = (a & 0xFFFFFFFFFFFF0FFFULL) | 0x0000000000004000ULL;
  b = (b & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xFFFF), static_cast<unsigned>(a & 0xFFFF),
                static_cast<unsigned>(b >> 48),
                static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFULL));
  return buf;
}

std::string ApiServer::RandomSuffix(size_t n) {
  static const char* kAlphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::lock_guard<std::mutex> lock(random_mu_);
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    random_state_ ^= random_state_ << 13;
    random_state_ ^= random_state_ >> 7;
    random_state_ ^= random_state_ << 17;
    out += kAlphabet[random_state_ % 27];
  }
  return out;
}

std::string ApiServer::AllocateClusterIp() {
  // 10.96.0.0/12 minus network and the .1 kube uses for the kubernetes service; random, and
  // unique against the services that exist.
  std::set<std::string> used;
  for (const json& s : store_->List("services/").items) {
    used.insert(FieldValue(s, "spec.clusterIP"));
  }
  for (int attempt = 0; attempt < 1000; ++attempt) {
    uint32_t offset;
    {
      std::lock_guard<std::mutex> lock(random_mu_);
      random_state_ ^= random_state_ << 13;
      random_state_ ^= random_state_ >> 7;
      random_state_ ^= random_state_ << 17;
      offset = static_cast<uint32_t>(random_state_ % ((1u << 20) - 3)) + 2;
    }
    uint32_t ip = (10u << 24) | (96u << 16) | offset;
    std::string s = std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 255) + "." +
                    std::to_string((ip >> 8) & 255) + "." + std::to_string(ip & 255);
    if (!used.count(s)) return s;
  }
  return "10.96.0.2";
}

Status ApiServer::Bootstrap() {
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    std::string key = StoreKey("namespaces", "", ns);
    if (store_->Get(key)) continue;
    json obj = {{"apiVersion", "v1"},
                {"kind", "Namespace"},
                {"metadata",
                 {{"name", ns},
                  {"uid", NewUid()},
                  {"creationTimestamp", Rfc3339(Clock::now())},
                  {"labels", {{"kubernetes.io/metadata.name", ns}}}}},
                {"spec", {{"finalizers", {"kubernetes"}}}},
                {"status", {{"phase", "Active"}}}};
    auto r = store_->Create(key, obj);
    if (!r.ok() && r.code() != StoreErrorCode::kAlreadyExists) {
      return IOError("cannot create namespace " + std::string(ns) + ": " + r.error().ToString());
    }
  }
  for (const json& crd : store_->List("customresourcedefinitions.apiextensions.k8s.io/").items) {
    registry_.SetCustomResources(MetaString(crd, "name"), &crd);
  }
  return Status::Ok();
}

std::vector<ResourceInfo> ApiServer::AllStorageResources() const {
  // Every built-in, so that a kind added to the registry is never missed here (the garbage
  // collector would otherwise take its objects' dependents for orphans).
  std::vector<ResourceInfo> out = registry_.Builtins();
  for (const json& crd : store_->List("customresourcedefinitions.apiextensions.k8s.io/").items) {
    for (const ResourceInfo& info : registry_.CustomResources(MetaString(crd, "name"))) {
      if (info.version == info.storage_version) out.push_back(info);
    }
  }
  return out;
}

json ApiServer::ToVersion(const ResourceInfo& info, json obj) const {
  if (obj.is_object()) {
    obj["apiVersion"] = info.GroupVersion();
    obj["kind"] = info.kind;
  }
  return obj;
}

// ---- routing ------------------------------------------------------------------------------

HttpResponse ApiServer::Handle(const HttpRequest& http) {
  HttpResponse response;
  try {
    response = Route(http);
  } catch (const std::exception& e) {
    Log(std::string("meshwork-controlplane: internal error on ") + http.method + " " + http.path +
        ": " + e.what());
    response = ErrorResponse(InternalErr(e.what()));
  }
  if (options_.audit_log != nullptr) {
    // A lost audit line does not fail the request: the API is answered either way.
    if (Status st = options_.audit_log->Record(http, response.status); !st.ok()) {
      Log("meshwork-controlplane: " + st.message());
    }
  }
  return response;
}

HttpResponse ApiServer::Route(const HttpRequest& http) {
  const std::string& path = http.path;
  if (path == "/healthz" || path == "/livez" || path == "/readyz" ||
      path.rfind("/healthz/", 0) == 0 || path.rfind("/livez/", 0) == 0 ||
      path.rfind("/readyz/", 0) == 0) {
    HttpResponse r;
    r.headers.push_back({"Content-Type", "text/plain; charset=utf-8"});
    r.body = "ok";
    return r;
  }
  if (path == "/version" || path == "/version/") {
    return JsonResponse(200, {{"major", "1"},
                              {"minor", "32"},
                              {"gitVersion", "v1.32.0-meshwork"},
                              {"gitCommit", "meshwork"},
                              {"gitTreeState", "clean"},
                              {"buildDate", "2026-01-01T00:00:00Z"},
                              {"goVersion", "n/a"},
                              {"compiler", "c++"},
                              {"platform", "linux/amd64"}});
  }
  if (!options_.token.empty()) {
    std::string auth = http.Header("authorization");
    if (auth != "Bearer " + options_.token) {
      return ErrorResponse(Err(401, "Unauthorized", "Unauthorized"));
    }
  }
  std::vector<std::string> segs = SplitPath(path);
  if (segs.empty()) {
    json paths = {"/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v3", "/readyz", "/version"};
    return JsonResponse(200, {{"paths", paths}});
  }
  if (segs[0] == "openapi") {
    if (segs.size() == 2 && segs[1] == "v3") return JsonResponse(200, registry_.OpenApiV3Index());
    if (segs.size() >= 3 && segs[1] == "v3") {
      std::string rest = path.substr(std::string("/openapi/v3/").size());
      if (auto doc = registry_.OpenApiV3Document(rest)) return JsonResponse(200, *doc);
    }
    return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
  }
  size_t gv_len;
  std::string group, version;
  if (segs[0] == "api") {
    if (segs.size() == 1) {
      json v = registry_.CoreVersions();
      v["serverAddressByClientCIDRs"][0]["serverAddress"] = options_.server_address;
      return JsonResponse(200, v);
    }
    version = segs[1];
    gv_len = 2;
  } else if (segs[0] == "apis") {
    if (segs.size() == 1) return JsonResponse(200, registry_.Groups());
    group = segs[1];
    if (segs.size() == 2) {
      for (const json& g : registry_.Groups()["groups"]) {
        if (g["name"] == group) {
          json out = g;
          out["kind"] = "APIGroup";
          out["apiVersion"] = "v1";
          return JsonResponse(200, out);
        }
      }
      return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
    }
    version = segs[2];
    gv_len = 3;
  } else {
    return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
  }
  if (segs.size() == gv_len) {
    if (http.method != "GET") {
      return ErrorResponse(Err(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"));
    }
    auto list = registry_.ResourceList(group, version);
    if (!list) {
      return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
    }
    return JsonResponse(200, *list);
  }
  // Resource paths: [namespaces/<ns>/]<resource>[/<name>[/<subresource>]]
  std::vector<std::string> rest(segs.begin() + static_cast<long>(gv_len), segs.end());
  Request req;
  req.http = &http;
  std::string resource;
  bool namespaced_path = false;
  if (rest[0] == "namespaces" && rest.size() >= 3 &&
      !(rest.size() == 3 && (rest[2] == "status" || rest[2] == "finalize"))) {
    namespaced_path = true;
    req.ns = rest[1];
    resource = rest[2];
    if (rest.size() >= 4) req.name = rest[3];
    if (rest.size() >= 5) req.sub = rest[4];
    if (rest.size() > 5) {
      return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
    }
  } else {
    resource = rest[0];
    if (rest.size() >= 2) req.name = rest[1];
    if (rest.size() >= 3) req.sub = rest[2];
    if (rest.size() > 3) {
      return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
    }
  }
  auto info = registry_.Find(group, version, resource);
  if (!info) {
    return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
  }
  req.info = *info;
  if (namespaced_path && !info->namespaced) {
    return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
  }
  if (!req.sub.empty()) {
    bool ok = (req.sub == "status" && info->status_subresource) ||
              (req.sub == "log" && info->resource == "pods" && info->group.empty()) ||
              (req.sub == "scale" && info->scale_subresource) ||
              (req.sub == "finalize" && info->resource == "namespaces");
    if (!ok) {
      return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
    }
  }
  req.table = WantsTable(http);
  std::string inc = http.Query("includeObject");
  if (!inc.empty()) {
    if (inc != "Object" && inc != "Metadata" && inc != "None") {
      return ErrorResponse(BadRequest("includeObject: Unsupported value: \"" + inc +
                                      "\": supported values: \"Metadata\", \"None\", \"Object\""));
    }
    req.include_object = inc;
  }
  return HandleResource(http, req);
}

HttpResponse ApiServer::HandleResource(const HttpRequest& http, Request& req) {
  const std::string& m = http.method;
  req.body = http.body;
  if ((m == "POST" || m == "PUT") && http.Header("content-type").rfind(kProtobufContentType, 0) == 0) {
    auto decoded = DecodeProtobufObject(http.body);
    if (!decoded.ok()) {
      return JsonResponse(415, StatusObject(Err(415, "UnsupportedMediaType", decoded.status().message())));
    }
    req.body = decoded->dump();
  } else if ((m == "POST" || m == "PUT") && !JsonBody(http)) {
    return UnsupportedBody(http);
  }
  if (req.info.namespaced && req.ns.empty() && !req.name.empty()) {
    return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
  }
  if (req.name.empty()) {
    if (m == "GET") {
      if (TruthyQuery(http, "watch")) return Watch(req);
      return List(req);
    }
    if (m == "POST") {
      if (req.info.namespaced && req.ns.empty()) {
        return ErrorResponse(Err(404, "NotFound", "the server could not find the requested resource"));
      }
      return Create(req);
    }
    if (m == "DELETE") return DeleteCollection(req);
    return ErrorResponse(Err(405, "MethodNotAllowed",
                             "the server does not allow this method on the requested resource"));
  }
  if (req.sub == "log") {
    if (m != "GET") {
      return ErrorResponse(Err(405, "MethodNotAllowed",
                               "the server does not allow this method on the requested resource"));
    }
    return PodLog(req);
  }
  if (req.sub == "scale") return Scale(req);
  if (m == "GET") return Get(req);
  if (m == "PUT") {
    json body;
    try {
      body = ParseBody(req.body);
    } catch (const std::exception& e) {
      return ErrorResponse(BadRequest(std::string("the body of the request was in an unknown format: json parse error: ") + e.what()));
    }
    return Update(req, body);
  }
  if (m == "PATCH") return Patch(req);
  if (m == "DELETE") {
    if (!req.sub.empty()) {
      return ErrorResponse(Err(405, "MethodNotAllowed",
                               "the server does not allow this method on the requested resource"));
    }
    return Delete(req);
  }
  return ErrorResponse(Err(405, "MethodNotAllowed",
                           "the server does not allow this method on the requested resource"));
}

// ---- get and list -------------------------------------------------------------------------

namespace {

json TableFor(const ResourceInfo& info, const std::vector<json>& objects, const std::string& include) {
  if (info.custom) return schema::BuildTable(info.columns, objects, include, Clock::now());
  return schema::BuiltinTable(info.resource, objects, include, Clock::now());
}

}  // namespace

HttpResponse ApiServer::Get(Request& req) {
  std::string key = StoreKey(req.info.StoreResource(), req.ns, req.name);
  auto obj = store_->Get(key);
  if (!obj) return ErrorResponse(NotFoundErr(req.info, req.name));
  json out = ToVersion(req.info, *obj);
  if (req.table) {
    json t = TableFor(req.info, {out}, req.include_object);
    Meta(t)["resourceVersion"] = MetaString(out, "resourceVersion");
    return JsonResponse(200, t);
  }
  return JsonResponse(200, out);
}

HttpResponse ApiServer::List(Request& req) {
  std::optional<Selection> sel;
  if (auto err = ParseSelection(*req.http, req.info, req.ns, &sel)) return ErrorResponse(*err);
  const LabelSelector& labels = sel->labels;
  const FieldSelector& fields = sel->fields;
  const std::string& prefix = sel->prefix;
  uint64_t limit = 0;
  if (req.http->HasQuery("limit") && !req.http->Query("limit").empty() &&
      !ParseUint(req.http->Query("limit"), &limit)) {
    return ErrorResponse(BadRequest("limit: Invalid value: \"" + req.http->Query("limit") + "\": must be a non-negative integer"));
  }
  std::string start_after;
  uint64_t list_rev = 0;
  std::string token = req.http->Query("continue");
  if (!token.empty()) {
    auto decoded = Base64Decode(token);
    json t;
    try {
      if (decoded) t = ParseBody(*decoded);
    } catch (const std::exception&) {
    }
    if (!t.is_object() || !t.contains("start") || !t["start"].is_string() ||
        t["start"].get<std::string>().rfind(prefix, 0) != 0) {
      return ErrorResponse(BadRequest("continue key is not valid: \"" + token + "\""));
    }
    start_after = t["start"].get<std::string>();
    list_rev = t.value("rv", uint64_t{0});
    if (list_rev != 0 && list_rev < store_->CompactedRevision()) {
      return ErrorResponse(Err(410, "Expired",
                               "The provided continue parameter is too old to display a "
                               "consistent list result. You can start a new list without the "
                               "continue parameter."));
    }
  }
  std::vector<json> items;
  std::string last_key;
  bool more = false;
  uint64_t revision = 0;
  while (true) {
    size_t page = limit == 0 ? 0 : std::max<size_t>(static_cast<size_t>(limit - items.size()), 1);
    Store::ListResult r = store_->ListPage(prefix, start_after, page);
    if (revision == 0) revision = r.revision;
    for (size_t i = 0; i < r.items.size(); ++i) {
      last_key = r.keys[i];
      if (labels.Matches(r.items[i]) && fields.Matches(r.items[i])) {
        items.push_back(ToVersion(req.info, r.items[i]));
      }
      if (limit != 0 && items.size() >= limit) {
        more = i + 1 < r.items.size() || r.more;
        break;
      }
    }
    if (limit == 0 || items.size() >= limit || !r.more) break;
    start_after = last_key;
  }
  json meta = {{"resourceVersion", std::to_string(list_rev != 0 ? list_rev : revision)}};
  if (more) {
    meta["continue"] = Base64Encode(json{{"rv", list_rev != 0 ? list_rev : revision}, {"start", last_key}}.dump());
  }
  if (req.table) {
    json t = TableFor(req.info, items, req.include_object);
    t["metadata"] = meta;
    return JsonResponse(200, t);
  }
  return JsonResponse(200, {{"kind", req.info.list_kind},
                            {"apiVersion", req.info.GroupVersion()},
                            {"metadata", meta},
                            {"items", items}});
}

// ---- watch --------------------------------------------------------------------------------

HttpResponse ApiServer::Watch(Request& req) {
  std::optional<Selection> sel;
  if (auto err = ParseSelection(*req.http, req.info, req.ns, &sel)) return ErrorResponse(*err);
  const LabelSelector& labels = sel->labels;
  const FieldSelector& fields = sel->fields;
  const std::string& prefix = sel->prefix;
  int64_t timeout_seconds = 0;
  if (req.http->HasQuery("timeoutSeconds") &&
      (!ParseInt(req.http->Query("timeoutSeconds"), &timeout_seconds) || timeout_seconds < 0)) {
    return ErrorResponse(BadRequest("timeoutSeconds: Invalid value: \"" +
                                    req.http->Query("timeoutSeconds") + "\": must be a non-negative integer"));
  }
  bool bookmarks = TruthyQuery(*req.http, "allowWatchBookmarks");
  std::string rv_text = req.http->Query("resourceVersion");
  uint64_t from = 0;
  auto initial = std::make_shared<std::vector<std::pair<std::string, json>>>();
  auto in_selection = std::make_shared<std::set<std::string>>();
  bool selective = !labels.Empty() || !fields.Empty();
  if (rv_text.empty() || rv_text == "0") {
    Store::ListResult r = store_->List(prefix);
    from = r.revision;
    for (size_t i = 0; i < r.items.size(); ++i) {
      if (labels.Matches(r.items[i]) && fields.Matches(r.items[i])) {
        initial->push_back({r.keys[i], r.items[i]});
        in_selection->insert(r.keys[i]);
      }
    }
  } else {
    if (!ParseUint(rv_text, &from)) {
      return ErrorResponse(BadRequest("resourceVersion: Invalid value: \"" + rv_text + "\": must be an integer"));
    }
    if (selective) {
      // Which objects the client already holds is not known; the current selection is the best
      // guess (exact when the watch starts at the list's own revision, the usual case).
      Store::ListResult r = store_->List(prefix);
      for (size_t i = 0; i < r.items.size(); ++i) {
        if (labels.Matches(r.items[i]) && fields.Matches(r.items[i])) in_selection->insert(r.keys[i]);
      }
    }
  }
  HttpResponse resp;
  resp.status = 200;
  resp.headers.push_back({"Content-Type", "application/json"});
  resp.headers.push_back({"Cache-Control", "no-cache, private"});
  auto watch = store_->Watch(prefix, from);
  if (!watch.ok()) {
    ApiError e = watch.code() == StoreErrorCode::kGone
                     ? Err(410, "Expired", "too old resource version: " + rv_text + " (" +
                                               std::to_string(store_->CompactedRevision() + 1) + ")")
                     : FromStore(watch.error(), req.info, "");
    json line = {{"type", "ERROR"}, {"object", StatusObject(e)}};
    resp.stream = [line](ResponseStream& out) { out.Write(line.dump() + "\n"); };
    return resp;
  }
  std::shared_ptr<WatchStream> stream(std::move(watch).value().release());
  ResourceInfo info = req.info;
  bool table = req.table;
  std::string include = req.include_object;
  LabelSelector label_sel = labels;
  FieldSelector field_sel = fields;
  auto interval = options_.bookmark_interval;
  resp.stream = [this, stream, info, table, include, label_sel, field_sel, selective, initial,
                 in_selection, bookmarks, interval, timeout_seconds](ResponseStream& out) {
    auto encode = [&](const char* type, const json& obj) {
      json o = ToVersion(info, obj);
      if (table) {
        json t = TableFor(info, {o}, include);
        Meta(t)["resourceVersion"] = MetaString(o, "resourceVersion");
        o = t;
      }
      json ev = {{"type", type}, {"object", o}};
      return ev.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    };
    for (const auto& [key, obj] : *initial) {
      if (!out.Write(encode("ADDED", obj))) return;
    }
    auto start = std::chrono::steady_clock::now();
    auto deadline = timeout_seconds > 0 ? start + std::chrono::seconds(timeout_seconds)
                                        : std::chrono::steady_clock::time_point::max();
    auto next_bookmark = start + interval;
    while (!shutting_down_ && out.Open()) {
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return;
      if (bookmarks && now >= next_bookmark) {
        json bm = {{"type", "BOOKMARK"},
                   {"object",
                    {{"kind", info.kind},
                     {"apiVersion", info.GroupVersion()},
                     {"metadata", {{"resourceVersion", std::to_string(stream->ProgressRevision())}}}}}};
        if (!out.Write(bm.dump() + "\n")) return;
        next_bookmark = now + interval;
      }
      StoreEvent ev;
      if (!stream->Next(&ev, std::chrono::milliseconds(200))) {
        if (stream->Done()) return;
        continue;
      }
      const char* type = EventTypeName(ev.type);
      if (selective) {
        bool was = in_selection->count(ev.key) > 0;
        bool now_in = ev.type != EventType::kDeleted && label_sel.Matches(ev.object) &&
                      field_sel.Matches(ev.object);
        if (ev.type == EventType::kDeleted) {
          if (!was) continue;
          in_selection->erase(ev.key);
        } else if (now_in && was) {
          type = "MODIFIED";
        } else if (now_in) {
          type = "ADDED";
          in_selection->insert(ev.key);
        } else if (was) {
          type = "DELETED";
          in_selection->erase(ev.key);
        } else {
          continue;
        }
      }
      if (!out.Write(encode(type, ev.object))) return;
    }
  };
  return resp;
}

// ---- create -------------------------------------------------------------------------------

std::optional<ApiError> ApiServer::ValidateCustom(const ResourceInfo& info, json& obj, const json* old) {
  if (!info.custom || info.schema.is_null()) return std::nullopt;
  auto causes = schema::DefaultPruneAndValidate(info.schema, obj, old);
  if (causes.empty()) return std::nullopt;
  return InvalidErr(info, MetaString(obj, "name"), causes);
}

std::optional<ApiError> ApiServer::PrepareCreate(const ResourceInfo& info, json& obj) {
  json& md = Meta(obj);
  std::string name = MetaString(obj, "name");
  // Objects' status under a status subresource is the controllers' to write.
  bool deployment = IsBuiltin(info, "apps", "deployments");
  if ((info.custom && info.status_subresource) || deployment) obj.erase("status");
  md.erase("deletionTimestamp");
  md.erase("deletionGracePeriodSeconds");
  md.erase("resourceVersion");
  md.erase("managedFields");
  md.erase("selfLink");
  md["uid"] = NewUid();
  md["creationTimestamp"] = Rfc3339(Clock::now());
  // kube-apiserver keeps generation for custom resources, CRDs and (of what is served here)
  // Deployments.
  if (info.custom || info.resource == "customresourcedefinitions" || deployment) md["generation"] = 1;
  std::vector<schema::FieldCause> causes;
  if (md.contains("labels") && !md["labels"].is_object()) {
    causes.push_back({"FieldValueTypeInvalid", "metadata.labels", "Invalid value: " + md["labels"].dump() + ": must be a map"});
  }
  if (md.contains("finalizers") && !md["finalizers"].is_array()) {
    causes.push_back({"FieldValueTypeInvalid", "metadata.finalizers", "Invalid value: " + md["finalizers"].dump() + ": must be a list"});
  }
  if (md.contains("ownerReferences")) {
    if (!md["ownerReferences"].is_array()) {
      causes.push_back({"FieldValueTypeInvalid", "metadata.ownerReferences", "Invalid value: " + md["ownerReferences"].dump() + ": must be a list"});
    } else {
      for (size_t i = 0; i < md["ownerReferences"].size(); ++i) {
        const json& o = md["ownerReferences"][i];
        std::string at = "metadata.ownerReferences[" + std::to_string(i) + "]";
        if (!o.is_object() || !o.contains("uid") || !o["uid"].is_string() || o["uid"].get<std::string>().empty()) {
          causes.push_back({"FieldValueInvalid", at + ".uid", "Invalid value: \"\": uid must not be empty"});
        }
      }
    }
  }
  const std::string& r = info.resource;
  if (!info.custom && info.group.empty()) {
    if (r == "pods") {
      json& spec = obj["spec"];
      if (!spec.is_object()) {
        causes.push_back({"FieldValueRequired", "spec", "Required value"});
      } else {
        if (!spec.contains("containers") || !spec["containers"].is_array() || spec["containers"].empty()) {
          causes.push_back({"FieldValueRequired", "spec.containers", "Required value"});
        } else {
          for (size_t i = 0; i < spec["containers"].size(); ++i) {
            json& c = spec["containers"][i];
            std::string at = "spec.containers[" + std::to_string(i) + "]";
            if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) {
              causes.push_back({"FieldValueRequired", at + ".name", "Required value"});
              continue;
            }
            if (std::string m = CheckDns1123Label(c["name"]); !m.empty()) {
              causes.push_back({"FieldValueInvalid", at + ".name", "Invalid value: " + c["name"].dump() + ": " + m});
            }
            if (!c.contains("image")) causes.push_back({"FieldValueRequired", at + ".image", "Required value"});
            if (!c.contains("imagePullPolicy")) c["imagePullPolicy"] = "IfNotPresent";
            if (!c.contains("terminationMessagePath")) c["terminationMessagePath"] = "/dev/termination-log";
            if (!c.contains("terminationMessagePolicy")) c["terminationMessagePolicy"] = "File";
            if (!c.contains("resources")) c["resources"] = json::object();
          }
        }
        if (!spec.contains("restartPolicy")) spec["restartPolicy"] = "Always";
        std::string rp = spec.value("restartPolicy", "");
        if (rp != "Always" && rp != "OnFailure" && rp != "Never") {
          causes.push_back({"FieldValueNotSupported", "spec.restartPolicy",
                            "Unsupported value: " + json(rp).dump() + ": supported values: \"Always\", \"OnFailure\", \"Never\""});
        }
        if (!spec.contains("terminationGracePeriodSeconds")) spec["terminationGracePeriodSeconds"] = 30;
        if (!spec.contains("dnsPolicy")) spec["dnsPolicy"] = "ClusterFirst";
        if (!spec.contains("schedulerName")) spec["schedulerName"] = "default-scheduler";
        if (!spec.contains("securityContext")) spec["securityContext"] = json::object();
        // The ServiceAccount admission plugin's default; the deprecated serviceAccount mirrors it.
        if (!spec.contains("serviceAccountName") || !spec["serviceAccountName"].is_string() ||
            spec["serviceAccountName"].get<std::string>().empty()) {
          spec["serviceAccountName"] =
              spec.contains("serviceAccount") && spec["serviceAccount"].is_string() &&
                      !spec["serviceAccount"].get<std::string>().empty()
                  ? spec["serviceAccount"] : json("default");
        }
        spec["serviceAccount"] = spec["serviceAccountName"];
        if (spec.contains("hostname") && spec["hostname"].is_string()) {
          if (std::string m = CheckDns1123Label(spec["hostname"]); !m.empty()) {
            causes.push_back({"FieldValueInvalid", "spec.hostname", "Invalid value: " + spec["hostname"].dump() + ": " + m});
          }
        }
      }
      obj["status"] = {{"phase", "Pending"}, {"qosClass", "BestEffort"}};
    } else if (r == "services") {
      json& spec = obj["spec"];
      if (!spec.is_object()) spec = json::object();
      if (!spec.contains("type")) spec["type"] = "ClusterIP";
      if (!spec.contains("sessionAffinity")) spec["sessionAffinity"] = "None";
      std::string ip = spec.value("clusterIP", "");
      if (ip.empty()) {
        spec["clusterIP"] = AllocateClusterIp();
      }
      spec["clusterIPs"] = json::array({spec["clusterIP"]});
      if (spec.contains("ports") && spec["ports"].is_array()) {
        for (size_t i = 0; i < spec["ports"].size(); ++i) {
          json& p = spec["ports"][i];
          if (!p.is_object() || !p.contains("port") || !p["port"].is_number_integer()) {
            causes.push_back({"FieldValueRequired", "spec.ports[" + std::to_string(i) + "].port", "Required value"});
            continue;
          }
          if (!p.contains("protocol")) p["protocol"] = "TCP";
          if (!p.contains("targetPort")) p["targetPort"] = p["port"];
        }
      }
      obj["status"] = {{"loadBalancer", json::object()}};
    } else if (r == "namespaces") {
      obj["status"] = {{"phase", "Active"}};
      if (!md.contains("labels") || !md["labels"].is_object()) md["labels"] = json::object();
      md["labels"]["kubernetes.io/metadata.name"] = name;
    }
  }
  if (deployment) {
    auto deployment_causes = PrepareDeployment(obj, nullptr);
    causes.insert(causes.end(), deployment_causes.begin(), deployment_causes.end());
  }
  if (r == "customresourcedefinitions" && info.group == "apiextensions.k8s.io") {
    auto crd_causes = ValidateCrd(obj);
    causes.insert(causes.end(), crd_causes.begin(), crd_causes.end());
  }
  if (!causes.empty()) return InvalidErr(info, name, causes);
  return ValidateCustom(info, obj);
}

namespace {

// A CRD's status as kube-apiserver's controllers set it: names accepted, established.
void SetCrdStatus(json& crd, const json* previous) {
  std::string now = Rfc3339(Clock::now());
  json names = crd["spec"]["names"];
  json stored = json::array();
  if (previous && previous->contains("status") && (*previous)["status"].contains("storedVersions")) {
    stored = (*previous)["status"]["storedVersions"];
  }
  for (const json& v : crd["spec"]["versions"]) {
    if (v.value("storage", false) && std::find(stored.begin(), stored.end(), v["name"]) == stored.end()) {
      stored.push_back(v["name"]);
    }
  }
  auto condition = [&](const char* type, const char* reason, const char* message) {
    std::string since = now;
    if (previous && previous->contains("status") && (*previous)["status"].contains("conditions")) {
      for (const json& c : (*previous)["status"]["conditions"]) {
        if (c.value("type", "") == type && c.value("status", "") == "True") {
          since = c.value("lastTransitionTime", now);
        }
      }
    }
    return json{{"type", type}, {"status", "True"}, {"lastTransitionTime", since},
                {"reason", reason}, {"message", message}};
  };
  crd["status"] = {
      {"conditions",
       json::array({condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                    condition("Established", "InitialNamesAccepted", "the initial names have been accepted")})},
      {"acceptedNames", names},
      {"storedVersions", stored}};
}

}  // namespace

HttpResponse ApiServer::Create(Request& req) {
  json obj;
  try {
    obj = ParseBody(req.body);
  } catch (const std::exception& e) {
    return ErrorResponse(BadRequest(std::string("the body of the request was in an unknown format: json parse error: ") + e.what()));
  }
  const ResourceInfo& info = req.info;
  if (auto bad = CheckBodyShape(obj, info)) return ErrorResponse(*bad);
  obj["apiVersion"] = info.GroupVersion();
  obj["kind"] = info.kind;
  json& md = Meta(obj);
  if (md.contains("name") && !md["name"].is_string()) {
    return ErrorResponse(BadRequest("metadata.name: must be a string, got " + md["name"].dump()));
  }
  if (md.contains("namespace") && !md["namespace"].is_string()) {
    return ErrorResponse(BadRequest("metadata.namespace: must be a string, got " + md["namespace"].dump()));
  }
  // Namespace: from the URL; the body may repeat it but not contradict it.
  if (info.namespaced) {
    std::string body_ns = MetaString(obj, "namespace");
    if (!body_ns.empty() && body_ns != req.ns) {
      return ErrorResponse(BadRequest("the namespace of the provided object does not match the namespace sent on the request"));
    }
    md["namespace"] = req.ns;
    auto ns_obj = store_->Get(StoreKey("namespaces", "", req.ns));
    if (!ns_obj) return ErrorResponse(NamespaceNotFound(req.ns));
    if (IsDeleting(*ns_obj)) {
      return ErrorResponse(Err(403, "Forbidden",
                               info.QualifiedResource() + " \"" + MetaString(obj, "name") +
                                   "\" is forbidden: unable to create new content in namespace " +
                                   req.ns + " because it is being terminated",
                               {{"name", MetaString(obj, "name")}, {"group", info.group}, {"kind", info.resource}}));
    }
  } else {
    md.erase("namespace");
  }
  std::string generate = MetaString(obj, "generateName");
  bool generated = false;
  if (MetaString(obj, "name").empty()) {
    if (generate.empty()) {
      return ErrorResponse(InvalidErr(info, "", {{"FieldValueRequired", "metadata.name",
                                                   "Required value: name or generateName is required"}}));
    }
    generated = true;
  }
  bool dry_run = req.http->Query("dryRun") == "All";
  for (int attempt = 0; attempt < 8; ++attempt) {
    json candidate = obj;
    if (generated) {
      std::string base = generate.size() > 58 ? generate.substr(0, 58) : generate;
      Meta(candidate)["name"] = base + RandomSuffix(5);
    }
    std::string name = MetaString(candidate, "name");
    bool label_name = info.resource == "namespaces" || info.resource == "services";
    std::string bad = label_name ? CheckDns1123Label(name) : CheckDns1123Subdomain(name);
    if (!bad.empty()) {
      std::string field = generated ? "metadata.generateName" : "metadata.name";
      return ErrorResponse(InvalidErr(info, name, {{"FieldValueInvalid", field,
                                                     "Invalid value: " + json(name).dump() + ": " + bad}}));
    }
    if (auto err = StrictFieldCheck(info, req.http, candidate)) return ErrorResponse(*err);
    if (auto err = PrepareCreate(info, candidate)) return ErrorResponse(*err);
    if (IsBuiltin(info, "", "pods")) {
      if (auto err = CheckPodServiceAccount(*store_, candidate, generated ? generate : name)) return ErrorResponse(*err);
    }
    if (info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io") {
      SetCrdStatus(candidate, nullptr);
    }
    std::string key = StoreKey(info.StoreResource(), info.namespaced ? req.ns : "", name);
    if (dry_run) {
      if (store_->Get(key)) return ErrorResponse(AlreadyExistsErr(info, name));
      return JsonResponse(201, candidate);
    }
    auto r = store_->Create(key, candidate);
    if (!r.ok()) {
      if (r.code() == StoreErrorCode::kAlreadyExists && generated) continue;
      return ErrorResponse(FromStore(r.error(), info, name));
    }
    AfterWrite(info, r.value(), false);
    return JsonResponse(201, ToVersion(info, r.value()));
  }
  return ErrorResponse(Err(500, "AlreadyExists", "could not generate a unique name from generateName " + generate));
}

ApiResult<json> ApiServer::CreateObject(const ResourceInfo& info, const std::string& ns, const json& obj) {
  // Through the HTTP path's Create, so that a controller's object gets what a client's would.
  HttpRequest http;
  http.method = "POST";
  http.path = info.namespaced ? "/namespaces/" + ns + "/" + info.resource : "/" + info.resource;
  http.headers["content-type"] = "application/json";
  http.body = obj.dump();
  Request req;
  req.http = &http;
  req.info = info;
  req.ns = info.namespaced ? ns : "";
  req.body = http.body;
  HttpResponse r = Create(req);
  json body = json::parse(r.body, nullptr, false);
  if (r.status == 201 && !body.is_discarded()) return Ok(body);
  if (body.is_discarded() || !body.is_object()) return Fail<json>(InternalErr("create answered " + std::to_string(r.status)));
  return Fail<json>(Err(r.status, body.value("reason", ""), body.value("message", ""), body.value("details", json())));
}

// ---- update and patch ---------------------------------------------------------------------

HttpResponse ApiServer::Update(Request& req, const json& body) {
  const ResourceInfo& info = req.info;
  if (auto bad = CheckBodyShape(body, info)) return ErrorResponse(*bad);
  std::string body_name = MetaString(body, "name");
  if (!body_name.empty() && body_name != req.name) {
    return ErrorResponse(BadRequest("the name of the object (" + body_name +
                                    ") does not match the name on the URL (" + req.name + ")"));
  }
  std::string body_ns = MetaString(body, "namespace");
  if (info.namespaced && !body_ns.empty() && body_ns != req.ns) {
    return ErrorResponse(BadRequest("the namespace of the provided object does not match the namespace sent on the request"));
  }
  auto r = UpdateObject(req, body);
  if (!r.ok()) return ErrorResponse(r.error);
  return JsonResponse(200, ToVersion(info, *r.value));
}

ApiResult<json> ApiServer::UpdateObject(Request& req, json incoming) {
  const ResourceInfo& info = req.info;
  std::string key = StoreKey(info.StoreResource(), req.ns, req.name);
  bool status_only = req.sub == "status";
  bool dry_run = req.http != nullptr && req.http->Query("dryRun") == "All";
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto cur_opt = store_->Get(key);
    if (!cur_opt) return Fail<json>(NotFoundErr(info, req.name));
    const json& cur = *cur_opt;
    std::string want_rv;
    if (incoming.contains("metadata") && incoming["metadata"].is_object() &&
        incoming["metadata"].contains("resourceVersion")) {
      const json& rv = incoming["metadata"]["resourceVersion"];
      if (!rv.is_string()) {
        return Fail<json>(BadRequest("metadata.resourceVersion: must be a string, got " + rv.dump()));
      }
      want_rv = rv.get<std::string>();
    }
    if (!want_rv.empty() && want_rv != MetaString(cur, "resourceVersion")) {
      return Fail<json>(ConflictErr(info, req.name));
    }
    json next;
    if (status_only) {
      next = cur;
      if (incoming.contains("status")) {
        next["status"] = incoming["status"];
      } else {
        next.erase("status");
      }
    } else {
      next = incoming;
      next["apiVersion"] = info.GroupVersion();
      next["kind"] = info.kind;
      if (info.status_subresource) {
        if (cur.contains("status")) {
          next["status"] = cur["status"];
        } else {
          next.erase("status");
        }
      }
      json& md = Meta(next);
      const json& old_md = cur["metadata"];
      for (const char* f : {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                            "deletionGracePeriodSeconds", "generation", "generateName"}) {
        if (old_md.contains(f)) {
          md[f] = old_md[f];
        } else {
          md.erase(f);
        }
      }
      md.erase("managedFields");
      md.erase("selfLink");
      if (IsDeleting(cur)) {
        // Finalizers may only be removed from an object being deleted, not added.
        std::vector<std::string> before = Finalizers(cur);
        for (const std::string& f : Finalizers(next)) {
          if (std::find(before.begin(), before.end(), f) == before.end()) {
            return Fail<json>(InvalidErr(info, req.name, {{"FieldValueForbidden", "metadata.finalizers",
                                                             "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"" + f + "\"}"}}));
          }
        }
      }
      // Kind-specific immutables.
      if (info.resource == "services" && !info.custom) {
        std::string old_ip = FieldValue(cur, "spec.clusterIP");
        std::string new_ip = FieldValue(next, "spec.clusterIP");
        if (new_ip.empty() && next.contains("spec") && next["spec"].is_object()) {
          next["spec"]["clusterIP"] = old_ip;
          next["spec"]["clusterIPs"] = json::array({old_ip});
        } else if (new_ip != old_ip) {
          return Fail<json>(InvalidErr(info, req.name, {{"FieldValueInvalid", "spec.clusterIP",
                                                           "Invalid value: " + json(new_ip).dump() + ": field is immutable"}}));
        }
      }
      if (info.resource == "pods" && !info.custom) {
        std::string old_node = FieldValue(cur, "spec.nodeName");
        std::string new_node = FieldValue(next, "spec.nodeName");
        if (!old_node.empty() && new_node != old_node) {
          return Fail<json>(InvalidErr(info, req.name, {{"FieldValueForbidden", "spec",
                                                           "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.activeDeadlineSeconds` or `spec.tolerations`"}}));
        }
        // Scheduling gates can only be removed after creation (kube-apiserver's rule).
        const json old_gates = cur.value("spec", json::object()).value("schedulingGates", json::array());
        const json new_gates = next.value("spec", json::object()).value("schedulingGates", json::array());
        if (new_gates.is_array() && old_gates.is_array()) {
          for (const json& gate : new_gates) {
            if (std::find(old_gates.begin(), old_gates.end(), gate) == old_gates.end()) {
              return Fail<json>(InvalidErr(info, req.name, {{"FieldValueForbidden", "spec.schedulingGates",
                                                               "Forbidden: only deletion is allowed, but found new scheduling gate '" +
                                                                   gate.value("name", "") + "'"}}));
            }
          }
        }
      }
      if (IsBuiltin(info, "apps", "deployments")) {
        auto causes = PrepareDeployment(next, &cur);
        if (!causes.empty()) return Fail<json>(InvalidErr(info, req.name, causes));
      }
      if (info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io") {
        auto causes = ValidateCrd(next);
        if (!causes.empty()) return Fail<json>(InvalidErr(info, req.name, causes));
        if (FieldValue(next, "spec.group") != FieldValue(cur, "spec.group") ||
            FieldValue(next, "spec.names.plural") != FieldValue(cur, "spec.names.plural")) {
          return Fail<json>(InvalidErr(info, req.name, {{"FieldValueInvalid", "spec.group",
                                                           "Invalid value: " + json(FieldValue(next, "spec.group")).dump() + ": field is immutable"}}));
        }
        SetCrdStatus(next, &cur);
      }
    }
    if (auto err = StrictFieldCheck(info, req.http, next)) return Fail<json>(*err);
    if (auto err = ValidateCustom(info, next, &cur)) return Fail<json>(*err);
    // generation: bumps when the spec (all but metadata, and status when split off) changes.
    if (cur["metadata"].contains("generation")) {
      bool split = info.status_subresource;
      if (SpecPart(next, split) != SpecPart(cur, split)) {
        Meta(next)["generation"] = cur["metadata"].value("generation", int64_t{1}) + 1;
      }
    }
    Meta(next)["resourceVersion"] = MetaString(cur, "resourceVersion");
    uint64_t expected = ObjectRevision(cur);
    if (next == cur) return Ok(ToVersion(info, cur));  // a no-op writes nothing
    if (dry_run) return Ok(ToVersion(info, next));
    if (IsDeleting(next) && Finalizers(next).empty() &&
        !(info.resource == "pods" && !info.custom && pods_have_agent_ &&
          !FieldValue(next, "spec.nodeName").empty() && FieldValue(next, "metadata.deletionGracePeriodSeconds") != "0")) {
      auto removed = RemoveFromStore(info, key, expected);
      if (!removed.ok() && removed.error.code == 409) continue;
      return removed;
    }
    auto r = store_->Update(key, next, expected);
    if (!r.ok()) {
      if (r.code() == StoreErrorCode::kConflict) continue;
      return Fail<json>(FromStore(r.error(), info, req.name));
    }
    AfterWrite(info, r.value(), false);
    return Ok(r.value());
  }
  return Fail<json>(ConflictErr(info, req.name));
}

HttpResponse ApiServer::Patch(Request& req) {
  std::string ct = req.http->Header("content-type");
  auto semi = ct.find(';');
  if (semi != std::string::npos) ct = ct.substr(0, semi);
  while (!ct.empty() && ct.back() == ' ') ct.pop_back();
  enum { kMerge, kStrategic, kJsonPatch } kind;
  if (ct == "application/merge-patch+json") {
    kind = kMerge;
  } else if (ct == "application/strategic-merge-patch+json") {
    kind = kStrategic;
  } else if (ct == "application/json-patch+json") {
    kind = kJsonPatch;
  } else {
    return ErrorResponse(Err(415, "UnsupportedMediaType",
                             "the body of the request was in an unknown format - accepted media types include: "
                             "application/json-patch+json, application/merge-patch+json, "
                             "application/strategic-merge-patch+json (server-side apply, "
                             "application/apply-patch+yaml, is not supported)"));
  }
  json patch;
  try {
    patch = ParseBody(req.http->body);
  } catch (const std::exception& e) {
    return ErrorResponse(BadRequest(std::string("error decoding patch: ") + e.what()));
  }
  if (kind == kJsonPatch ? !patch.is_array() : !patch.is_object()) {
    return ErrorResponse(BadRequest(kind == kJsonPatch ? "json patch must be a JSON array of operations"
                                                       : "the patch must be a JSON object"));
  }
  const ResourceInfo& info = req.info;
  std::string key = StoreKey(info.StoreResource(), req.ns, req.name);
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto cur = store_->Get(key);
    if (!cur) return ErrorResponse(NotFoundErr(info, req.name));
    json base = ToVersion(info, *cur);
    json patched;
    try {
      if (kind == kMerge) {
        patched = base;
        patched.merge_patch(patch);
      } else if (kind == kStrategic) {
        patched = StrategicMerge(base, patch);
      } else {
        patched = base.patch(patch);
      }
    } catch (const json::exception& e) {
      return ErrorResponse(Err(422, "Invalid", std::string("the patch could not be applied: ") + e.what()));
    }
    if (!patched.is_object()) return ErrorResponse(BadRequest("the patched object is not a JSON object"));
    if (MetaString(patched, "name") != req.name) {
      return ErrorResponse(BadRequest("the name of the object (" + MetaString(patched, "name") +
                                      ") does not match the name on the URL (" + req.name + ")"));
    }
    if (patched.value("kind", "") != info.kind || patched.value("apiVersion", "") != info.GroupVersion()) {
      return ErrorResponse(BadRequest("a patch may not change apiVersion or kind"));
    }
    // The patch's own resourceVersion, if any, is a precondition; otherwise retry on races.
    bool patch_has_rv = patched["metadata"].value("resourceVersion", "") != MetaString(*cur, "resourceVersion");
    auto r = UpdateObject(req, patched);
    if (!r.ok()) {
      if (r.error.code == 409 && r.error.reason == "Conflict" && !patch_has_rv) continue;
      return ErrorResponse(r.error);
    }
    return JsonResponse(200, ToVersion(info, *r.value));
  }
  return ErrorResponse(ConflictErr(info, req.name));
}

// ---- delete -------------------------------------------------------------------------------

ApiResult<json> ApiServer::RemoveFromStore(const ResourceInfo& info, const std::string& key,
                                           uint64_t expected_revision) {
  std::string res, ns, name;
  SplitStoreKey(key, &res, &ns, &name);
  auto r = store_->Delete(key, expected_revision);
  if (!r.ok()) return Fail<json>(FromStore(r.error(), info, name));
  AfterWrite(info, r.value(), true);
  return Ok(ToVersion(info, r.value()));
}

void ApiServer::AfterWrite(const ResourceInfo& info, const json& stored, bool removed) {
  if (info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io") {
    std::string name = MetaString(stored, "name");
    if (!removed) {
      registry_.SetCustomResources(name, &stored);
      return;
    }
    // The CRD is gone: so are its objects.
    std::vector<ResourceInfo> served = registry_.CustomResources(name);
    registry_.SetCustomResources(name, nullptr);
    if (served.empty()) return;
    Store::ListResult all = store_->List(served[0].StoreResource() + "/");
    for (const std::string& k : all.keys) {
      auto r = store_->Delete(k, 0);
      (void)r;
    }
  }
}

ApiResult<json> ApiServer::Mutate(const std::string& key, const std::function<bool(json&)>& mutate) {
  std::string res, ns, name;
  if (!SplitStoreKey(key, &res, &ns, &name)) return Fail<json>(BadRequest("bad key " + key));
  ResourceInfo info;
  auto dot = res.find('.');
  ResourceInfo builtin = registry_.Builtin(res.substr(0, dot));
  if (!builtin.resource.empty() && builtin.StoreResource() == res) {
    info = builtin;
  } else {
    for (const ResourceInfo& r : AllStorageResources()) {
      if (r.StoreResource() == res) info = r;
    }
  }
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto cur = store_->Get(key);
    if (!cur) return Fail<json>(NotFoundErr(info, name));
    json next = *cur;
    if (!mutate(next)) return Ok(*cur);
    uint64_t expected = ObjectRevision(*cur);
    bool pod_waits = info.resource == "pods" && !info.custom && pods_have_agent_ &&
                     !FieldValue(next, "spec.nodeName").empty() &&
                     FieldValue(next, "metadata.deletionGracePeriodSeconds") != "0";
    if (IsDeleting(next) && Finalizers(next).empty() && !pod_waits) {
      auto r = RemoveFromStore(info, key, expected);
      if (!r.ok() && r.error.code == 409) continue;
      return r;
    }
    auto r = store_->Update(key, next, expected);
    if (!r.ok()) {
      if (r.code() == StoreErrorCode::kConflict) continue;
      return Fail<json>(FromStore(r.error(), info, name));
    }
    AfterWrite(info, r.value(), false);
    return Ok(r.value());
  }
  return Fail<json>(ConflictErr(info, name));
}

ApiResult<json> ApiServer::DeleteObject(const ResourceInfo& info, const std::string& ns,
                                        const std::string& name, const DeleteOptions& opts) {
  std::string key = StoreKey(info.StoreResource(), info.namespaced ? ns : "", name);
  if (info.resource == "namespaces" && info.group.empty() &&
      (name == "default" || name == "kube-system" || name == "kube-public")) {
    return Fail<json>(Err(403, "Forbidden", "namespaces \"" + name + "\" is forbidden: this namespace may not be deleted",
                          {{"name", name}, {"kind", "namespaces"}}));
  }
  std::string policy = opts.propagation_policy;
  if (!policy.empty() && policy != "Orphan" && policy != "Background" && policy != "Foreground") {
    return Fail<json>(InvalidErr(info, name, {{"FieldValueNotSupported", "propagationPolicy",
                                               "Unsupported value: \"" + policy + "\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""}}));
  }
  bool orphaned = false;
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto cur_opt = store_->Get(key);
    if (!cur_opt) return Fail<json>(NotFoundErr(info, name));
    json cur = *cur_opt;
    if (!opts.precondition_uid.empty() && opts.precondition_uid != MetaString(cur, "uid")) {
      return Fail<json>(Err(409, "Conflict",
                            "Operation cannot be fulfilled on " + info.QualifiedResource() + " \"" + name +
                                "\": Precondition failed: UID in precondition: " + opts.precondition_uid +
                                ", UID in object meta: " + MetaString(cur, "uid"),
                            {{"name", name}, {"group", info.group}, {"kind", info.resource}}));
    }
    if (!opts.precondition_resource_version.empty() &&
        opts.precondition_resource_version != MetaString(cur, "resourceVersion")) {
      return Fail<json>(Err(409, "Conflict",
                            "Operation cannot be fulfilled on " + info.QualifiedResource() + " \"" + name +
                                "\": Precondition failed: ResourceVersion in precondition: " +
                                opts.precondition_resource_version + ", ResourceVersion in object meta: " +
                                MetaString(cur, "resourceVersion"),
                            {{"name", name}, {"group", info.group}, {"kind", info.resource}}));
    }
    if (opts.dry_run) return Ok(ToVersion(info, cur));
    std::string uid = MetaString(cur, "uid");
    if (policy == "Orphan" && !orphaned) {
      // Dependents lose their reference to this owner before it goes.
      for (const ResourceInfo& r : AllStorageResources()) {
        Store::ListResult all = store_->List(r.StoreResource() + "/");
        for (size_t i = 0; i < all.items.size(); ++i) {
          const json& refs = all.items[i]["metadata"].value("ownerReferences", json::array());
          bool refers = std::any_of(refs.begin(), refs.end(), [&](const json& o) { return o.value("uid", "") == uid; });
          if (!refers) continue;
          Mutate(all.keys[i], [&](json& o) {
            json kept = json::array();
            for (const json& ref : o["metadata"].value("ownerReferences", json::array())) {
              if (ref.value("uid", "") != uid) kept.push_back(ref);
            }
            if (kept.empty()) {
              o["metadata"].erase("ownerReferences");
            } else {
              o["metadata"]["ownerReferences"] = kept;
            }
            return true;
          });
        }
      }
      orphaned = true;
    }
    json next = cur;
    json& md = Meta(next);
    std::string now = Rfc3339(Clock::now());
    bool changed = false;
    if (policy == "Foreground") {
      std::vector<std::string> f = Finalizers(next);
      if (std::find(f.begin(), f.end(), "foregroundDeletion") == f.end()) {
        if (!md.contains("finalizers") || !md["finalizers"].is_array()) md["finalizers"] = json::array();
        md["finalizers"].push_back("foregroundDeletion");
        changed = true;
      }
    }
    // Pods on a node stop gracefully: the agent removes the object once its processes exit.
    bool graceful_pod = info.resource == "pods" && !info.custom && pods_have_agent_ &&
                        !FieldValue(cur, "spec.nodeName").empty();
    int grace = 0;
    if (graceful_pod) {
      grace = opts.grace_period_seconds.value_or(
          cur.contains("spec") ? cur["spec"].value("terminationGracePeriodSeconds", 30) : 30);
      std::string phase = FieldValue(cur, "status.phase");
      if (phase == "Succeeded" || phase == "Failed") grace = 0;
      if (grace < 0) grace = 0;
    }
    bool namespace_delete = info.resource == "namespaces" && info.group.empty();
    bool stays = !Finalizers(next).empty() || namespace_delete || (graceful_pod && grace > 0);
    if (!stays) {
      auto r = RemoveFromStore(info, key, ObjectRevision(cur));
      if (!r.ok() && r.error.code == 409) continue;
      return r;
    }
    if (!IsDeleting(cur)) {
      md["deletionTimestamp"] = graceful_pod ? Rfc3339(Clock::now() + std::chrono::seconds(grace)) : now;
      md["deletionGracePeriodSeconds"] = graceful_pod ? grace : 0;
      if (namespace_delete) next["status"]["phase"] = "Terminating";
      if (md.contains("generation")) md["generation"] = md["generation"].get<int64_t>() + 1;
      changed = true;
    } else if (graceful_pod && grace < md.value("deletionGracePeriodSeconds", 30)) {
      md["deletionGracePeriodSeconds"] = grace;
      md["deletionTimestamp"] = Rfc3339(Clock::now() + std::chrono::seconds(grace));
      changed = true;
    }
    if (!changed) return Ok(ToVersion(info, cur));
    auto r = store_->Update(key, next, ObjectRevision(cur));
    if (!r.ok()) {
      if (r.code() == StoreErrorCode::kConflict) continue;
      return Fail<json>(FromStore(r.error(), info, name));
    }
    return Ok(ToVersion(info, r.value()));
  }
  return Fail<json>(ConflictErr(info, name));
}

namespace {

std::optional<ApiError> ParseDeleteOptions(const HttpRequest& http, DeleteOptions* opts) {
  if (!http.body.empty()) {
    json body;
    try {
      body = ParseBody(http.body);
    } catch (const std::exception& e) {
      return BadRequest(std::string("the body of the request was in an unknown format: json parse error: ") + e.what());
    }
    if (!body.is_object()) return BadRequest("DeleteOptions must be a JSON object");
    if (body.contains("gracePeriodSeconds") && body["gracePeriodSeconds"].is_number_integer()) {
      opts->grace_period_seconds = body["gracePeriodSeconds"].get<int>();
    }
    if (body.contains("propagationPolicy") && body["propagationPolicy"].is_string()) {
      opts->propagation_policy = body["propagationPolicy"];
    }
    if (body.contains("orphanDependents") && body["orphanDependents"].is_boolean() &&
        opts->propagation_policy.empty()) {
      opts->propagation_policy = body["orphanDependents"].get<bool>() ? "Orphan" : "Background";
    }
    if (body.contains("preconditions") && body["preconditions"].is_object()) {
      opts->precondition_uid = body["preconditions"].value("uid", "");
      opts->precondition_resource_version = body["preconditions"].value("resourceVersion", "");
    }
    if (body.contains("dryRun") && body["dryRun"].is_array() && !body["dryRun"].empty()) {
      opts->dry_run = true;
    }
  }
  if (http.HasQuery("gracePeriodSeconds")) {
    int64_t g;
    if (!ParseInt(http.Query("gracePeriodSeconds"), &g)) {
      return BadRequest("gracePeriodSeconds: Invalid value: \"" + http.Query("gracePeriodSeconds") + "\": must be an integer");
    }
    opts->grace_period_seconds = static_cast<int>(g);
  }
  if (http.HasQuery("propagationPolicy")) opts->propagation_policy = http.Query("propagationPolicy");
  if (http.Query("dryRun") == "All") opts->dry_run = true;
  return std::nullopt;
}

}  // namespace

HttpResponse ApiServer::Delete(Request& req) {
  DeleteOptions opts;
  if (auto err = ParseDeleteOptions(*req.http, &opts)) return ErrorResponse(*err);
  auto r = DeleteObject(req.info, req.ns, req.name, opts);
  if (!r.ok()) return ErrorResponse(r.error);
  return JsonResponse(200, *r.value);
}

HttpResponse ApiServer::DeleteCollection(Request& req) {
  DeleteOptions opts;
  if (auto err = ParseDeleteOptions(*req.http, &opts)) return ErrorResponse(*err);
  std::optional<Selection> sel;
  if (auto err = ParseSelection(*req.http, req.info, req.ns, &sel)) return ErrorResponse(*err);
  const LabelSelector& labels = sel->labels;
  const FieldSelector& fields = sel->fields;
  const std::string& prefix = sel->prefix;
  json items = json::array();
  Store::ListResult all = store_->List(prefix);
  for (const json& obj : all.items) {
    if (!labels.Matches(obj) || !fields.Matches(obj)) continue;
    auto r = DeleteObject(req.info, MetaString(obj, "namespace"), MetaString(obj, "name"), opts);
    if (r.ok()) items.push_back(*r.value);
  }
  return JsonResponse(200, {{"kind", req.info.list_kind},
                            {"apiVersion", req.info.GroupVersion()},
                            {"metadata", {{"resourceVersion", std::to_string(store_->Revision())}}},
                            {"items", items}});
}

// ---- pods/log -----------------------------------------------------------------------------

HttpResponse ApiServer::PodLog(Request& req) {
  std::string key = StoreKey("pods", req.ns, req.name);
  auto pod = store_->Get(key);
  if (!pod) return ErrorResponse(NotFoundErr(req.info, req.name));
  std::vector<std::string> names;
  if (pod->contains("spec") && (*pod)["spec"].contains("containers")) {
    for (const json& c : (*pod)["spec"]["containers"]) names.push_back(c.value("name", ""));
  }
  std::string container = req.http->Query("container");
  if (container.empty()) {
    if (names.size() != 1) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : " ") + n;
      return ErrorResponse(BadRequest("a container name must be specified for pod " + req.name +
                                      ", choose one of: [" + list + "]"));
    }
    container = names[0];
  }
  if (std::find(names.begin(), names.end(), container) == names.end()) {
    return ErrorResponse(BadRequest("container " + container + " is not valid for pod " + req.name));
  }
  bool previous = TruthyQuery(*req.http, "previous");
  bool follow = TruthyQuery(*req.http, "follow");
  int64_t tail = -1;
  if (req.http->HasQuery("tailLines") && (!ParseInt(req.http->Query("tailLines"), &tail) || tail < 0)) {
    return ErrorResponse(BadRequest("tailLines: Invalid value: \"" + req.http->Query("tailLines") + "\": must be a non-negative integer"));
  }
  std::string uid = MetaString(*pod, "uid");
  std::string path = pod_logs_.path ? pod_logs_.path(uid, container, previous) : "";
  if (path.empty()) {
    if (previous) {
      return ErrorResponse(BadRequest("previous terminated container \"" + container + "\" in pod \"" +
                                      req.name + "\" not found"));
    }
    return ErrorResponse(BadRequest("container \"" + container + "\" in pod \"" + req.name +
                                    "\" is waiting to start: ContainerCreating"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t offset = content.size();
  if (tail >= 0) {
    size_t pos = content.size();
    if (pos > 0 && content[pos - 1] == '\n') --pos;
    int64_t lines = 0;
    while (pos > 0 && lines < tail) {
      --pos;
      if (content[pos] == '\n') {
        ++lines;
        if (lines == tail) {
          ++pos;
          break;
        }
      }
    }
    if (tail == 0) pos = content.size();
    content = content.substr(pos);
  }
  HttpResponse resp;
  resp.headers.push_back({"Content-Type", "text/plain"});
  if (!follow) {
    resp.body = content;
    return resp;
  }
  resp.stream = [this, content, offset, path, key, uid, container](ResponseStream& out) {
    if (!content.empty() && !out.Write(content)) return;
    size_t pos = offset;
    int quiet_after_end = 0;
    while (!shutting_down_ && out.Open()) {
      std::ifstream f(path, std::ios::binary);
      f.seekg(0, std::ios::end);
      std::streamoff size = f.tellg();
      if (size > static_cast<std::streamoff>(pos)) {
        f.seekg(static_cast<std::streamoff>(pos));
        std::string chunk(static_cast<size_t>(size) - pos, '\0');
        f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        pos += static_cast<size_t>(f.gcount());
        if (!out.Write(chunk.substr(0, static_cast<size_t>(f.gcount())))) return;
        continue;
      }
      // Ends once the container has stopped (or the pod is gone) and the file stopped growing.
      auto pod = store_->Get(key);
      bool running = false;
      if (pod && MetaString(*pod, "uid") == uid) {
        running = true;
        std::string phase = FieldValue(*pod, "status.phase");
        if (phase == "Succeeded" || phase == "Failed") running = false;
        if (pod->contains("status") && (*pod)["status"].contains("containerStatuses")) {
          for (const json& cs : (*pod)["status"]["containerStatuses"]) {
            if (cs.value("name", "") == container && cs.contains("state") &&
                cs["state"].contains("terminated") && (*pod)["spec"].value("restartPolicy", "Always") == "Never") {
              running = false;
            }
          }
        }
      }
      if (!running && ++quiet_after_end >= 3) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  };
  return resp;
}

// ---- scale subresource (custom resources) --------------------------------------------------

namespace {

// ".spec.replicas" -> the JSON pointer "/spec/replicas".
json::json_pointer PointerOf(const std::string& dotted) {
  std::string p;
  for (char c : dotted) p += c == '.' ? '/' : c;
  return json::json_pointer(p);
}

}  // namespace

HttpResponse ApiServer::Scale(Request& req) {
  const ResourceInfo& info = req.info;
  const std::string& m = req.http->method;
  if (m != "GET" && m != "PUT" && m != "PATCH") {
    return ErrorResponse(Err(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"));
  }
  std::string key = StoreKey(info.StoreResource(), req.ns, req.name);
  auto to_scale = [&](const json& obj) {
    json scale = {{"apiVersion", "autoscaling/v1"},
                  {"kind", "Scale"},
                  {"metadata",
                   {{"name", MetaString(obj, "name")},
                    {"uid", MetaString(obj, "uid")},
                    {"resourceVersion", MetaString(obj, "resourceVersion")},
                    {"creationTimestamp", MetaString(obj, "creationTimestamp")}}},
                  {"spec", json::object()},
                  {"status", {{"replicas", 0}}}};
    if (info.namespaced) scale["metadata"]["namespace"] = MetaString(obj, "namespace");
    json::json_pointer spec = PointerOf(info.scale_spec_path);
    if (obj.contains(spec) && obj[spec].is_number_integer()) scale["spec"]["replicas"] = obj[spec];
    if (!info.scale_status_path.empty()) {
      json::json_pointer st = PointerOf(info.scale_status_path);
      if (obj.contains(st) && obj[st].is_number_integer()) scale["status"]["replicas"] = obj[st];
    }
    if (!info.scale_selector_path.empty()) {
      json::json_pointer sel = PointerOf(info.scale_selector_path);
      if (obj.contains(sel) && obj[sel].is_string()) scale["status"]["selector"] = obj[sel];
    }
    if (IsBuiltin(info, "apps", "deployments") && obj.contains("spec") && obj["spec"].contains("selector")) {
      auto text = LabelSelectorText(obj["spec"]["selector"]);
      if (text.ok()) scale["status"]["selector"] = *text;
    }
    return scale;
  };
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto cur = store_->Get(key);
    if (!cur) return ErrorResponse(NotFoundErr(info, req.name));
    json scale = to_scale(*cur);
    if (m == "GET") return JsonResponse(200, scale);
    json wanted;
    try {
      json body = ParseBody(m == "PUT" ? req.body : req.http->body);
      if (m == "PUT") {
        wanted = body;
      } else {
        std::string ct = req.http->Header("content-type");
        wanted = scale;
        if (ct.rfind("application/json-patch+json", 0) == 0) {
          wanted = scale.patch(body);
        } else if (ct.rfind("application/merge-patch+json", 0) == 0 ||
                   ct.rfind("application/strategic-merge-patch+json", 0) == 0) {
          wanted.merge_patch(body);
        } else {
          return ErrorResponse(Err(415, "UnsupportedMediaType", "unsupported patch type: " + ct));
        }
      }
    } catch (const std::exception& e) {
      return ErrorResponse(BadRequest(std::string("the body of the request was in an unknown format: ") + e.what()));
    }
    if (!wanted.is_object() || !wanted.contains("spec") || !wanted["spec"].is_object() ||
        !wanted["spec"].contains("replicas") || !wanted["spec"]["replicas"].is_number_integer() ||
        wanted["spec"]["replicas"].get<int64_t>() < 0) {
      return ErrorResponse(Err(422, "Invalid",
                               "Scale.autoscaling \"" + req.name + "\" is invalid: spec.replicas: Invalid value: " +
                                   (wanted.is_object() && wanted.contains("spec") && wanted["spec"].is_object()
                                        ? wanted["spec"].value("replicas", json(nullptr)).dump() : std::string("null")) +
                                   ": must be greater than or equal to 0",
                               {{"name", req.name}, {"group", "autoscaling"}, {"kind", "Scale"},
                                {"causes", json::array({{{"reason", "FieldValueInvalid"}, {"field", "spec.replicas"},
                                                         {"message", "Invalid value: must be greater than or equal to 0"}}})}}));
    }
    json incoming = ToVersion(info, *cur);
    incoming[PointerOf(info.scale_spec_path)] = wanted["spec"]["replicas"];
    std::string want_rv = wanted.contains("metadata") && wanted["metadata"].is_object()
                              ? wanted["metadata"].value("resourceVersion", "") : "";
    Meta(incoming)["resourceVersion"] = want_rv.empty() ? MetaString(*cur, "resourceVersion") : want_rv;
    Request main = req;
    main.sub = "";
    auto r = UpdateObject(main, incoming);
    if (!r.ok()) {
      if (r.error.code == 409 && r.error.reason == "Conflict" && want_rv.empty()) continue;
      return ErrorResponse(r.error);
    }
    return JsonResponse(200, to_scale(*r.value));
  }
  return ErrorResponse(ConflictErr(info, req.name));
}

}  // namespace meshwork::controlplane
