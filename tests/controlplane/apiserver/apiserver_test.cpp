// The API layer through its handler, without sockets: routing, discovery, metadata semantics,
// optimistic concurrency, the status subresource, CRDs and validation, list/watch, deletion and
// garbage collection, and bad input answered with a Kubernetes Status (never a crash); then
// ServiceAccounts, RBAC objects, Deployments and the Deployment controller, one pass at a time.
#include "controlplane/apiserver/api_server.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "controlplane/apiserver/controllers.h"

namespace meshwork::controlplane {
namespace {

using nlohmann::json;

const char* kCrd = R"({
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "trainingjobs.meshwork.dev"},
  "spec": {"group": "meshwork.dev", "scope": "Namespaced",
    "names": {"plural": "trainingjobs", "singular": "trainingjob", "kind": "TrainingJob", "shortNames": ["tj"]},
    "versions": [{"name": "v1alpha1", "served": true, "storage": true,
      "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
      "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}],
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["replicas"], "properties": {
          "replicas": {"type": "integer", "minimum": 1},
          "image": {"type": "string"},
          "policy": {"type": "string", "enum": ["Never", "Gang"], "default": "Gang"}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}, "replicas": {"type": "integer"}}}}}}}]}})";

const char* kJobs = "/apis/meshwork.dev/v1alpha1/namespaces/default/trainingjobs";

// A ResponseStream that records what a watch writes; Close() makes the stream return.
class RecordingStream : public ResponseStream {
 public:
  bool Write(std::string_view chunk) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    data_ += chunk;
    cv_.notify_all();
    return true;
  }
  bool Open() const override { return !closed_; }
  void Close() { closed_ = true; }
  // The JSON lines written so far.
  std::vector<json> Lines() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<json> out;
    size_t start = 0;
    while (true) {
      size_t nl = data_.find('\n', start);
      if (nl == std::string::npos) break;
      out.push_back(json::parse(data_.substr(start, nl - start)));
      start = nl + 1;
    }
    return out;
  }
  // Waits (bounded) until at least n lines were written.
  bool WaitLines(size_t n) {
    for (int i = 0; i < 500; ++i) {
      if (Lines().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string data_;
  std::atomic<bool> closed_{false};
};

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(StoreOptions{}); }
  void TearDown() override {
    api_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open(StoreOptions options, std::string token = "") {
    api_.reset();
    store_.reset();
    if (dir_.empty()) {
      char tmpl[] = "/tmp/apiserver_test.XXXXXX";
      dir_ = mkdtemp(tmpl);
    }
    options.fsync = false;
    auto s = Store::Open(dir_ + "/store", options);
    ASSERT_TRUE(s.ok()) << s.error().ToString();
    store_ = std::move(s).value();
    ApiServerOptions o;
    o.token = std::move(token);
    o.bookmark_interval = std::chrono::milliseconds(100);
    o.log = [](const std::string&) {};
    o.audit_log = audit_log_.get();
    api_ = std::make_unique<ApiServer>(store_.get(), o);
    ASSERT_TRUE(api_->Bootstrap().ok());
  }

  HttpResponse Call(const std::string& method, const std::string& target, const std::string& body = "",
                    const std::string& content_type = "application/json", const std::string& accept = "") {
    HttpRequest r;
    r.method = method;
    r.raw_target = target;
    auto q = target.find('?');
    r.path = target.substr(0, q);
    if (q != std::string::npos) {
      std::string query = target.substr(q + 1);
      size_t start = 0;
      while (start <= query.size()) {
        size_t amp = query.find('&', start);
        std::string kv = query.substr(start, amp == std::string::npos ? std::string::npos : amp - start);
        auto eq = kv.find('=');
        std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
        std::string dk, dv;
        PercentDecode(k, &dk, true);
        PercentDecode(v, &dv, true);
        r.query.push_back({dk, dv});
        if (amp == std::string::npos) break;
        start = amp + 1;
      }
    }
    if (!body.empty()) r.headers["content-type"] = content_type;
    if (!accept.empty()) r.headers["accept"] = accept;
    if (!user_agent_.empty()) r.headers["user-agent"] = user_agent_;
    r.body = body;
    r.version = "HTTP/1.1";
    return api_->Handle(r);
  }

  json CallJson(const std::string& method, const std::string& target, const json& body, int want,
                const std::string& content_type = "application/json") {
    HttpResponse r = Call(method, target, body.is_null() ? "" : body.dump(), content_type);
    EXPECT_EQ(r.status, want) << method << " " << target << ": " << r.body;
    return json::parse(r.body);
  }

  void CreateCrd() { CallJson("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json::parse(kCrd), 201); }

  json Job(const std::string& name, int replicas) {
    return {{"apiVersion", "meshwork.dev/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", name}}},
            {"spec", {{"replicas", replicas}, {"image", "img"}}}};
  }

  std::string dir_;
  std::unique_ptr<AuditLog> audit_log_;  // set before Open() to record requests
  std::string user_agent_;               // sent by Call() when set
  std::unique_ptr<Store> store_;
  std::unique_ptr<ApiServer> api_;
};

TEST_F(ApiServerTest, BadInputGetsAStatusWithTheRightCode) {
  CreateCrd();
  std::string deep(5000, '[');
  deep += std::string(5000, ']');
  // 1M levels inside an object: refused before anything recursive sees it.
  std::string deep_object = R"({"metadata":{"name":"d"},"data":{"x":)" + std::string(1000000, '[') +
                            std::string(1000000, ']') + "}}";
  std::string huge = R"({"metadata":{"name":"huge"},"data":{"x":")" + std::string(2 << 20, 'a') + "\"}}";
  struct Case {
    std::string name, method, target, body, content_type;
    int code;
    std::string reason;
  };
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  const std::vector<Case> cases = {
      {"unknown root path", "GET", "/nope", "", "", 404, "NotFound"},
      {"unknown resource", "GET", "/api/v1/widgets", "", "", 404, "NotFound"},
      {"unknown group", "GET", "/apis/nope.dev/v1/things", "", "", 404, "NotFound"},
      {"too many segments", "GET", cms + "/a/b/c", "", "", 404, "NotFound"},
      {"unknown subresource", "GET", cms + "/a/status", "", "", 404, "NotFound"},
      {"malformed JSON", "POST", cms, "{\"metadata\": ", "application/json", 400, "BadRequest"},
      {"not an object", "POST", cms, "[1,2]", "application/json", 400, "BadRequest"},
      {"deeply nested", "POST", cms, deep, "application/json", 400, "BadRequest"},
      {"deeply nested object", "POST", cms, deep_object, "application/json", 400, "BadRequest"},
      {"deeply nested patch", "PATCH", cms + "/a", deep_object, "application/merge-patch+json", 400, "BadRequest"},
      {"wrong kind", "POST", cms, R"({"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"}})", "application/json", 400, "BadRequest"},
      {"wrong apiVersion", "POST", cms, R"({"kind":"ConfigMap","apiVersion":"v2","metadata":{"name":"a"}})", "application/json", 400, "BadRequest"},
      {"metadata not an object", "POST", cms, R"({"metadata":"x"})", "application/json", 400, "BadRequest"},
      {"name not a string", "POST", cms, R"({"metadata":{"name":7}})", "application/json", 400, "BadRequest"},
      {"bad name", "POST", cms, R"({"metadata":{"name":"Bad_Name"}})", "application/json", 422, "Invalid"},
      {"no name", "POST", cms, R"({"metadata":{}})", "application/json", 422, "Invalid"},
      {"namespace mismatch", "POST", cms, R"({"metadata":{"name":"a","namespace":"other"}})", "application/json", 400, "BadRequest"},
      {"missing namespace", "POST", "/api/v1/namespaces/missing/configmaps", R"({"metadata":{"name":"a"}})", "application/json", 404, "NotFound"},
      {"protobuf body", "POST", cms, "k8s\x00", "application/vnd.kubernetes.protobuf", 415, "UnsupportedMediaType"},
      {"yaml body", "POST", cms, "metadata: {}", "application/yaml", 415, "UnsupportedMediaType"},
      {"create without namespace", "POST", "/api/v1/configmaps", R"({"metadata":{"name":"a"}})", "application/json", 404, "NotFound"},
      {"get missing", "GET", cms + "/missing", "", "", 404, "NotFound"},
      {"delete missing", "DELETE", cms + "/missing", "", "", 404, "NotFound"},
      {"put missing", "PUT", cms + "/missing", R"({"metadata":{"name":"missing"}})", "application/json", 404, "NotFound"},
      {"put name mismatch", "PUT", cms + "/a", R"({"metadata":{"name":"b"}})", "application/json", 400, "BadRequest"},
      {"put malformed", "PUT", cms + "/a", "{", "application/json", 400, "BadRequest"},
      {"patch unknown type", "PATCH", cms + "/a", "{}", "text/plain", 415, "UnsupportedMediaType"},
      {"server-side apply", "PATCH", cms + "/a", "{}", "application/apply-patch+yaml", 415, "UnsupportedMediaType"},
      {"patch malformed", "PATCH", cms + "/a", "{", "application/merge-patch+json", 400, "BadRequest"},
      {"json patch not a list", "PATCH", cms + "/a", "{}", "application/json-patch+json", 400, "BadRequest"},
      {"bad label selector", "GET", cms + "?labelSelector=a+in+(b", "", "", 400, "BadRequest"},
      {"bad field selector", "GET", cms + "?fieldSelector=metadata.name", "", "", 400, "BadRequest"},
      {"bad limit", "GET", cms + "?limit=x", "", "", 400, "BadRequest"},
      {"bad continue", "GET", cms + "?limit=1&continue=%21%21", "", "", 400, "BadRequest"},
      {"bad watch rv", "GET", cms + "?watch=1&resourceVersion=abc", "", "", 400, "BadRequest"},
      {"bad timeoutSeconds", "GET", cms + "?watch=1&timeoutSeconds=-1", "", "", 400, "BadRequest"},
      {"bad delete options", "DELETE", cms + "/a", "{", "application/json", 400, "BadRequest"},
      {"bad grace period", "DELETE", cms + "/a?gracePeriodSeconds=soon", "", "", 400, "BadRequest"},
      {"bad includeObject", "GET", cms + "?includeObject=All", "", "", 400, "BadRequest"},
      {"method on discovery", "POST", "/api/v1", "{}", "application/json", 405, "MethodNotAllowed"},
      {"invalid custom resource", "POST", kJobs, R"({"metadata":{"name":"j"},"spec":{"replicas":"many"}})", "application/json", 422, "Invalid"},
      {"cluster-scoped under a namespace", "GET", "/api/v1/namespaces/default/namespaces/x", "", "", 404, "NotFound"},
      {"protected namespace", "DELETE", "/api/v1/namespaces/default", "", "", 403, "Forbidden"},
  };
  CallJson("POST", cms, json{{"metadata", {{"name", "a"}}}}, 201);
  // A large but well-formed body is fine here (the HTTP layer caps bodies at 3 MiB with a 413).
  EXPECT_EQ(Call("POST", cms, huge).status, 201);
  for (const Case& c : cases) {
    HttpResponse r = Call(c.method, c.target, c.body, c.content_type);
    EXPECT_EQ(r.status, c.code) << c.name << ": " << r.body.substr(0, 300);
    json body;
    ASSERT_NO_THROW(body = json::parse(r.body)) << c.name;
    EXPECT_EQ(body.value("kind", ""), "Status") << c.name;
    EXPECT_EQ(body.value("code", 0), c.code) << c.name;
    EXPECT_EQ(body.value("reason", ""), c.reason) << c.name << ": " << body.value("message", "");
    EXPECT_FALSE(body.value("message", "").empty()) << c.name;
  }
}

TEST_F(ApiServerTest, AuthenticationNeedsTheBearerTokenExceptForHealth) {
  Open(StoreOptions{}, "s3cret");
  EXPECT_EQ(Call("GET", "/api").status, 401);
  EXPECT_EQ(Call("GET", "/healthz").status, 200);
  EXPECT_EQ(Call("GET", "/version").status, 200);
  HttpRequest r;
  r.method = "GET";
  r.path = "/api";
  r.headers["authorization"] = "Bearer s3cret";
  EXPECT_EQ(api_->Handle(r).status, 200);
  r.headers["authorization"] = "Bearer wrong";
  EXPECT_EQ(api_->Handle(r).status, 401);
}

TEST_F(ApiServerTest, DiscoveryServesBuiltinsAndCustomResourcesAtOnce) {
  json api = json::parse(Call("GET", "/api").body);
  EXPECT_EQ(api["versions"], json({"v1"}));
  json core = json::parse(Call("GET", "/api/v1").body);
  std::set<std::string> names;
  for (const json& r : core["resources"]) names.insert(r["name"].get<std::string>());
  for (const char* n : {"pods", "pods/log", "pods/status", "services", "configmaps", "events", "namespaces"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_EQ(Call("GET", "/apis/meshwork.dev/v1alpha1").status, 404);
  CreateCrd();
  json groups = json::parse(Call("GET", "/apis").body);
  bool found = false;
  for (const json& g : groups["groups"]) found = found || g["name"] == "meshwork.dev";
  EXPECT_TRUE(found);
  json list = json::parse(Call("GET", "/apis/meshwork.dev/v1alpha1").body);
  ASSERT_EQ(list["resources"].size(), 3u);
  EXPECT_EQ(list["resources"][0]["name"], "trainingjobs");
  EXPECT_EQ(list["resources"][0]["kind"], "TrainingJob");
  EXPECT_EQ(list["resources"][0]["shortNames"], json({"tj"}));
  EXPECT_EQ(list["resources"][1]["name"], "trainingjobs/status");
  EXPECT_EQ(list["resources"][2]["name"], "trainingjobs/scale");
  EXPECT_EQ(list["resources"][2]["group"], "autoscaling");
  // kubectl learns from /openapi/v3 that the server validates fields itself.
  json index = json::parse(Call("GET", "/openapi/v3").body);
  ASSERT_TRUE(index["paths"].contains("apis/meshwork.dev/v1alpha1"));
  json doc = json::parse(Call("GET", "/openapi/v3/apis/meshwork.dev/v1alpha1").body);
  const json& path = doc["paths"]["/apis/meshwork.dev/v1alpha1/namespaces/{namespace}/trainingjobs/{name}"];
  EXPECT_EQ(path["patch"]["x-kubernetes-group-version-kind"]["kind"], "TrainingJob");
  EXPECT_EQ(path["patch"]["parameters"][0]["name"], "fieldValidation");
  // The CRD reports itself established.
  json crd = json::parse(Call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.meshwork.dev").body);
  std::set<std::string> conditions;
  for (const json& c : crd["status"]["conditions"]) {
    if (c["status"] == "True") conditions.insert(c["type"].get<std::string>());
  }
  EXPECT_TRUE(conditions.count("Established"));
  EXPECT_TRUE(conditions.count("NamesAccepted"));
  EXPECT_EQ(crd["status"]["acceptedNames"]["kind"], "TrainingJob");
}

TEST_F(ApiServerTest, CreateSetsMetadataAndDefaults) {
  CreateCrd();
  json j = CallJson("POST", kJobs, Job("a", 2), 201);
  EXPECT_EQ(j["metadata"]["generation"], 1);
  EXPECT_EQ(j["metadata"]["namespace"], "default");
  EXPECT_EQ(j["metadata"]["uid"].get<std::string>().size(), 36u);
  EXPECT_EQ(j["metadata"]["creationTimestamp"].get<std::string>().back(), 'Z');
  EXPECT_FALSE(j["metadata"]["resourceVersion"].get<std::string>().empty());
  EXPECT_EQ(j["spec"]["policy"], "Gang");  // schema default
  CallJson("POST", kJobs, Job("a", 2), 409);  // AlreadyExists
  // generateName
  json g = CallJson("POST", "/api/v1/namespaces/default/configmaps",
                    json{{"metadata", {{"generateName", "cfg-"}}}}, 201);
  std::string name = g["metadata"]["name"];
  EXPECT_EQ(name.rfind("cfg-", 0), 0u);
  EXPECT_EQ(name.size(), 9u);
  // Unknown fields are pruned; a CR's status is dropped on create (status subresource).
  json withstatus = Job("b", 1);
  withstatus["spec"]["unknown"] = 1;
  withstatus["status"] = {{"phase", "Done"}};
  json b = CallJson("POST", kJobs, withstatus, 201);
  EXPECT_FALSE(b["spec"].contains("unknown"));
  EXPECT_FALSE(b.contains("status"));
}

TEST_F(ApiServerTest, InvalidCustomResourceNamesEachField) {
  CreateCrd();
  json bad = Job("bad", 0);
  bad["spec"]["policy"] = "Sometimes";
  json s = CallJson("POST", kJobs, bad, 422);
  EXPECT_EQ(s["reason"], "Invalid");
  EXPECT_EQ(s["details"]["name"], "bad");
  EXPECT_EQ(s["details"]["group"], "meshwork.dev");
  EXPECT_EQ(s["details"]["kind"], "TrainingJob");
  std::set<std::string> fields;
  for (const json& c : s["details"]["causes"]) fields.insert(c["field"].get<std::string>());
  EXPECT_TRUE(fields.count("spec.replicas"));
  EXPECT_TRUE(fields.count("spec.policy"));
  EXPECT_NE(s["message"].get<std::string>().find("TrainingJob.meshwork.dev \"bad\" is invalid"), std::string::npos);
  EXPECT_EQ(Call("GET", std::string(kJobs) + "/bad").status, 404);
  // fieldValidation=Strict (kubectl's default) refuses unknown fields instead of pruning them.
  json typo = Job("typo", 1);
  typo["spec"]["replicaz"] = 3;
  json strict = CallJson("POST", std::string(kJobs) + "?fieldValidation=Strict", typo, 400);
  EXPECT_NE(strict["message"].get<std::string>().find("unknown field \"spec.replicaz\""), std::string::npos)
      << strict["message"];
  CallJson("POST", std::string(kJobs) + "?fieldValidation=Ignore", typo, 201);
}

TEST_F(ApiServerTest, InvalidCrdIsRefused) {
  json crd = json::parse(kCrd);
  crd["spec"]["versions"][0]["storage"] = false;
  crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"]["type"] = "integr";
  json s = CallJson("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, 422);
  std::string msg = s["message"];
  EXPECT_NE(msg.find("spec.versions"), std::string::npos) << msg;
  EXPECT_NE(msg.find("openAPIV3Schema"), std::string::npos) << msg;
  crd = json::parse(kCrd);
  crd["metadata"]["name"] = "wrong.meshwork.dev";
  CallJson("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, 422);
}

// x-kubernetes-validations (CEL) rules: a CR breaking one is refused as on a real cluster, a
// transition rule sees the stored object, and a rule that does not compile refuses the CRD.
TEST_F(ApiServerTest, ValidationRulesAreEvaluated) {
  json crd = json::parse(kCrd);
  json& spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
  spec["properties"]["processesPerReplica"] = {{"type", "integer"}, {"default", 1}};
  spec["properties"]["mesh"] = json::parse(R"({"type": "object", "properties": {
      "dpReplicate": {"type": "integer"}, "dpShard": {"type": "integer"}, "tp": {"type": "integer"}}})");
  spec["x-kubernetes-validations"] = json::parse(R"([{
      "rule": "!has(self.mesh) || self.mesh.dpReplicate * self.mesh.dpShard * self.mesh.tp == self.replicas * self.processesPerReplica",
      "message": "mesh: dpReplicate x dpShard x tp must equal replicas x processesPerReplica"}])");
  spec["properties"]["image"]["x-kubernetes-validations"] = json::parse(R"([{"rule": "self == oldSelf", "message": "is immutable"}])");

  json bad_crd = crd;
  bad_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"][0]["rule"] =
      "self.mesh.pp == 1";
  json refused = CallJson("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", bad_crd, 422);
  EXPECT_NE(refused["message"].get<std::string>().find(
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: "
                "apiextensions.ValidationRule{Rule:\"self.mesh.pp == 1\""),
            std::string::npos)
      << refused["message"];
  EXPECT_NE(refused["message"].get<std::string>().find("compilation failed: ERROR: <input>:1:10: undefined field 'pp'"),
            std::string::npos)
      << refused["message"];

  CallJson("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, 201);
  json job = Job("mesh", 4);
  job["spec"]["mesh"] = {{"dpReplicate", 2}, {"dpShard", 2}, {"tp", 2}};
  json s = CallJson("POST", kJobs, job, 422);
  EXPECT_EQ(s["message"], "TrainingJob.meshwork.dev \"mesh\" is invalid: spec: Invalid value: \"object\": mesh: "
                          "dpReplicate x dpShard x tp must equal replicas x processesPerReplica");
  EXPECT_EQ(s["details"]["causes"],
            json::parse(R"([{"reason": "FieldValueInvalid", "field": "spec",
              "message": "Invalid value: \"object\": mesh: dpReplicate x dpShard x tp must equal replicas x processesPerReplica"}])"));
  job["spec"]["mesh"]["dpShard"] = 1;
  json created = CallJson("POST", kJobs, job, 201);
  EXPECT_EQ(created["spec"]["processesPerReplica"], 1);  // the rule saw the defaulted object

  // Transition rule: image may not change on update.
  created["spec"]["image"] = "other";
  json immutable = CallJson("PUT", std::string(kJobs) + "/mesh", created, 422);
  EXPECT_EQ(immutable["message"], "TrainingJob.meshwork.dev \"mesh\" is invalid: spec.image: Invalid value: \"string\": is immutable");
  CallJson("PATCH", std::string(kJobs) + "/mesh", json{{"spec", {{"image", "other"}}}}, 422, "application/merge-patch+json");
  json scaled = CallJson("PATCH", std::string(kJobs) + "/mesh", json{{"spec", {{"replicas", 2}, {"processesPerReplica", 2}}}},
                         200, "application/merge-patch+json");
  EXPECT_EQ(scaled["spec"]["replicas"], 2);
}

TEST_F(ApiServerTest, UpdateChecksResourceVersionAndBumpsGenerationOnSpecOnly) {
  CreateCrd();
  json j = CallJson("POST", kJobs, Job("a", 2), 201);
  std::string rv1 = j["metadata"]["resourceVersion"];
  j["spec"]["replicas"] = 3;
  json j2 = CallJson("PUT", std::string(kJobs) + "/a", j, 200);
  EXPECT_EQ(j2["metadata"]["generation"], 2);
  EXPECT_NE(j2["metadata"]["resourceVersion"], rv1);
  // Stale resourceVersion: 409 Conflict.
  j["spec"]["replicas"] = 4;
  json s = CallJson("PUT", std::string(kJobs) + "/a", j, 409);
  EXPECT_EQ(s["reason"], "Conflict");
  // Metadata-only change: no generation bump. Empty resourceVersion: unconditional.
  j2["metadata"]["labels"] = {{"x", "y"}};
  j2["metadata"].erase("resourceVersion");
  json j3 = CallJson("PUT", std::string(kJobs) + "/a", j2, 200);
  EXPECT_EQ(j3["metadata"]["generation"], 2);
  EXPECT_EQ(j3["metadata"]["labels"]["x"], "y");
  // A no-op update writes nothing.
  json j4 = CallJson("PUT", std::string(kJobs) + "/a", j3, 200);
  EXPECT_EQ(j4["metadata"]["resourceVersion"], j3["metadata"]["resourceVersion"]);
  // uid and creationTimestamp cannot be changed.
  json j5 = j4;
  j5["metadata"]["uid"] = "other";
  json j6 = CallJson("PUT", std::string(kJobs) + "/a", j5, 200);
  EXPECT_EQ(j6["metadata"]["uid"], j["metadata"]["uid"]);
}

TEST_F(ApiServerTest, StatusSubresourceSplitsSpecAndStatus) {
  CreateCrd();
  json j = CallJson("POST", kJobs, Job("a", 2), 201);
  // Main resource: status changes are ignored.
  j["status"] = {{"phase", "Hacked"}};
  j["spec"]["replicas"] = 5;
  json j2 = CallJson("PUT", std::string(kJobs) + "/a", j, 200);
  EXPECT_FALSE(j2.contains("status"));
  EXPECT_EQ(j2["spec"]["replicas"], 5);
  EXPECT_EQ(j2["metadata"]["generation"], 2);
  // Status: only status changes; generation stays.
  j2["status"] = {{"phase", "Running"}};
  j2["spec"]["replicas"] = 9;
  json j3 = CallJson("PUT", std::string(kJobs) + "/a/status", j2, 200);
  EXPECT_EQ(j3["status"]["phase"], "Running");
  EXPECT_EQ(j3["spec"]["replicas"], 5);
  EXPECT_EQ(j3["metadata"]["generation"], 2);
  // Merge patch on /status.
  json j4 = CallJson("PATCH", std::string(kJobs) + "/a/status", json{{"status", {{"phase", "Done"}}}}, 200,
                     "application/merge-patch+json");
  EXPECT_EQ(j4["status"]["phase"], "Done");
  // Status is validated against the schema too.
  CallJson("PATCH", std::string(kJobs) + "/a/status", json{{"status", {{"phase", 7}}}}, 422,
           "application/merge-patch+json");
}

TEST_F(ApiServerTest, ScaleSubresourceReadsAndWritesTheReplicasPaths) {
  CreateCrd();
  json j = CallJson("POST", kJobs, Job("a", 2), 201);
  CallJson("PATCH", std::string(kJobs) + "/a/status", json{{"status", {{"replicas", 1}}}}, 200,
           "application/merge-patch+json");
  json scale = CallJson("GET", std::string(kJobs) + "/a/scale", nullptr, 200);
  EXPECT_EQ(scale["kind"], "Scale");
  EXPECT_EQ(scale["spec"]["replicas"], 2);
  EXPECT_EQ(scale["status"]["replicas"], 1);
  json scaled = CallJson("PATCH", std::string(kJobs) + "/a/scale", json{{"spec", {{"replicas", 5}}}}, 200,
                         "application/merge-patch+json");
  EXPECT_EQ(scaled["spec"]["replicas"], 5);
  json after = CallJson("GET", std::string(kJobs) + "/a", nullptr, 200);
  EXPECT_EQ(after["spec"]["replicas"], 5);
  EXPECT_EQ(after["metadata"]["generation"], 2);
  // The CR's schema still applies (minimum 1), and a stale resourceVersion conflicts.
  CallJson("PATCH", std::string(kJobs) + "/a/scale", json{{"spec", {{"replicas", 0}}}}, 422, "application/merge-patch+json");
  json stale = scale;
  stale["spec"]["replicas"] = 3;
  CallJson("PUT", std::string(kJobs) + "/a/scale", stale, 409);
  CallJson("PUT", std::string(kJobs) + "/a/scale", json{{"spec", {{"replicas", "x"}}}}, 422);
}

TEST_F(ApiServerTest, PatchTypes) {
  const std::string cm = "/api/v1/namespaces/default/configmaps/c";
  CallJson("POST", "/api/v1/namespaces/default/configmaps",
           json{{"metadata", {{"name", "c"}}}, {"data", {{"a", "1"}, {"b", "2"}}}}, 201);
  json m = CallJson("PATCH", cm, json{{"data", {{"a", nullptr}, {"c", "3"}}}}, 200, "application/merge-patch+json");
  EXPECT_EQ(m["data"], json({{"b", "2"}, {"c", "3"}}));
  json s = CallJson("PATCH", cm, json{{"data", {{"d", "4"}}}, {"$setElementOrder/x", json::array()}}, 200,
                    "application/strategic-merge-patch+json");
  EXPECT_EQ(s["data"]["d"], "4");
  json p = CallJson("PATCH", cm, json::parse(R"([{"op":"replace","path":"/data/b","value":"20"}])"), 200,
                    "application/json-patch+json");
  EXPECT_EQ(p["data"]["b"], "20");
  json failed = CallJson("PATCH", cm, json::parse(R"([{"op":"test","path":"/data/b","value":"nope"}])"), 422,
                         "application/json-patch+json");
  EXPECT_EQ(failed["kind"], "Status");
  // A resourceVersion in the patch is a precondition.
  CallJson("PATCH", cm, json{{"metadata", {{"resourceVersion", "1"}}}, {"data", {{"e", "5"}}}}, 409,
           "application/merge-patch+json");
  // Strategic merge on a keyed list merges by name.
  CallJson("POST", "/api/v1/namespaces/default/pods",
           json::parse(R"({"metadata":{"name":"p"},"spec":{"containers":[
             {"name":"a","image":"x","command":["true"]},{"name":"b","image":"y","command":["true"]}]}})"), 201);
  json pod = CallJson("PATCH", "/api/v1/namespaces/default/pods/p",
                      json::parse(R"({"spec":{"containers":[{"name":"b","image":"z"}]}})"), 200,
                      "application/strategic-merge-patch+json");
  ASSERT_EQ(pod["spec"]["containers"].size(), 2u);
  EXPECT_EQ(pod["spec"]["containers"][0]["image"], "x");
  EXPECT_EQ(pod["spec"]["containers"][1]["image"], "z");
}

TEST_F(ApiServerTest, ListSelectorsPaginationAndTable) {
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  for (int i = 0; i < 5; ++i) {
    CallJson("POST", cms,
             json{{"metadata", {{"name", "c" + std::to_string(i)}, {"labels", {{"parity", i % 2 ? "odd" : "even"}}}}}}, 201);
  }
  json odd = json::parse(Call("GET", cms + "?labelSelector=parity%3Dodd").body);
  EXPECT_EQ(odd["items"].size(), 2u);
  json notodd = json::parse(Call("GET", cms + "?labelSelector=parity+notin+(odd)").body);
  EXPECT_EQ(notodd["items"].size(), 3u);
  json named = json::parse(Call("GET", cms + "?fieldSelector=metadata.name%3Dc3").body);
  ASSERT_EQ(named["items"].size(), 1u);
  EXPECT_EQ(named["items"][0]["metadata"]["name"], "c3");
  EXPECT_EQ(named["kind"], "ConfigMapList");
  // limit + continue visits every object once.
  std::vector<std::string> seen;
  std::string token;
  for (int page = 0; page < 10; ++page) {
    std::string target = cms + "?limit=2" + (token.empty() ? "" : "&continue=" + token);
    json l = json::parse(Call("GET", target).body);
    for (const json& it : l["items"]) seen.push_back(it["metadata"]["name"]);
    token = l["metadata"].value("continue", "");
    if (token.empty()) break;
    EXPECT_EQ(l["items"].size(), 2u);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"c0", "c1", "c2", "c3", "c4"}));
  // All namespaces.
  json all = json::parse(Call("GET", "/api/v1/configmaps").body);
  EXPECT_EQ(all["items"].size(), 5u);
  // as=Table
  HttpResponse t = Call("GET", cms, "", "", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json");
  json table = json::parse(t.body);
  EXPECT_EQ(table["kind"], "Table");
  EXPECT_EQ(table["rows"].size(), 5u);
  EXPECT_FALSE(table["metadata"]["resourceVersion"].get<std::string>().empty());
}

TEST_F(ApiServerTest, WatchSendsCurrentObjectsThenChangesAndHonoursSelectors) {
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  CallJson("POST", cms, json{{"metadata", {{"name", "a"}, {"labels", {{"app", "x"}}}}}}, 201);
  HttpResponse w = Call("GET", cms + "?watch=true&labelSelector=app%3Dx&allowWatchBookmarks=true");
  ASSERT_TRUE(w.stream);
  RecordingStream out;
  std::thread t([&] { w.stream(out); });
  ASSERT_TRUE(out.WaitLines(1));
  CallJson("POST", cms, json{{"metadata", {{"name", "b"}, {"labels", {{"app", "x"}}}}}}, 201);
  CallJson("POST", cms, json{{"metadata", {{"name", "other"}}}}, 201);  // not selected
  // b leaves the selection: its watcher sees DELETED.
  CallJson("PATCH", cms + "/b", json{{"metadata", {{"labels", {{"app", "y"}}}}}}, 200, "application/merge-patch+json");
  ASSERT_TRUE(out.WaitLines(3));
  std::vector<std::pair<std::string, std::string>> events;
  bool saw_bookmark = false;
  for (int i = 0; i < 300 && !saw_bookmark; ++i) {
    events.clear();
    for (const json& l : out.Lines()) {
      if (l["type"] == "BOOKMARK") {
        saw_bookmark = true;
        EXPECT_FALSE(l["object"]["metadata"]["resourceVersion"].get<std::string>().empty());
        continue;
      }
      events.push_back({l["type"], l["object"]["metadata"]["name"]});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out.Close();
  t.join();
  std::vector<std::pair<std::string, std::string>> want = {{"ADDED", "a"}, {"ADDED", "b"}, {"DELETED", "b"}};
  EXPECT_EQ(events, want);
  EXPECT_TRUE(saw_bookmark);
}

TEST_F(ApiServerTest, WatchFromAResourceVersionAndTooOldIsGone) {
  StoreOptions small;
  small.history_events = 3;
  Open(small);
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  json first = CallJson("POST", cms, json{{"metadata", {{"name", "c0"}}}}, 201);
  std::string rv = first["metadata"]["resourceVersion"];
  for (int i = 1; i < 8; ++i) CallJson("POST", cms, json{{"metadata", {{"name", "c" + std::to_string(i)}}}}, 201);
  HttpResponse gone = Call("GET", cms + "?watch=1&resourceVersion=" + rv);
  ASSERT_TRUE(gone.stream);
  RecordingStream out;
  gone.stream(out);  // writes the ERROR event and returns
  auto lines = out.Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["type"], "ERROR");
  EXPECT_EQ(lines[0]["object"]["code"], 410);
  EXPECT_EQ(lines[0]["object"]["reason"], "Expired");
  // From a recent revision: only what came after it.
  json last = json::parse(Call("GET", cms).body);
  std::string now = last["metadata"]["resourceVersion"];
  HttpResponse w = Call("GET", cms + "?watch=1&resourceVersion=" + now + "&fieldSelector=metadata.name%3Dc2");
  RecordingStream out2;
  std::thread t([&] { w.stream(out2); });
  CallJson("PATCH", cms + "/c1", json{{"data", {{"k", "v"}}}}, 200, "application/merge-patch+json");
  CallJson("PATCH", cms + "/c2", json{{"data", {{"k", "v"}}}}, 200, "application/merge-patch+json");
  ASSERT_TRUE(out2.WaitLines(1));
  out2.Close();
  t.join();
  auto l2 = out2.Lines();
  ASSERT_EQ(l2.size(), 1u);
  EXPECT_EQ(l2[0]["type"], "MODIFIED");
  EXPECT_EQ(l2[0]["object"]["metadata"]["name"], "c2");
}

TEST_F(ApiServerTest, FinalizersHoldDeletionUntilRemoved) {
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  json c = CallJson("POST", cms, json{{"metadata", {{"name", "f"}, {"finalizers", {"example.com/hold"}}}}}, 201);
  json d = CallJson("DELETE", cms + "/f", nullptr, 200);
  EXPECT_TRUE(d["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(d["metadata"]["deletionGracePeriodSeconds"], 0);
  json still = CallJson("GET", cms + "/f", nullptr, 200);
  EXPECT_TRUE(still["metadata"].contains("deletionTimestamp"));
  // Adding a finalizer while deleting is refused.
  CallJson("PATCH", cms + "/f", json{{"metadata", {{"finalizers", {"example.com/hold", "more"}}}}}, 422,
           "application/merge-patch+json");
  CallJson("PATCH", cms + "/f", json{{"metadata", {{"finalizers", nullptr}}}}, 200, "application/merge-patch+json");
  EXPECT_EQ(Call("GET", cms + "/f").status, 404);
}

TEST_F(ApiServerTest, DeletePreconditions) {
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  json c = CallJson("POST", cms, json{{"metadata", {{"name", "p"}}}}, 201);
  CallJson("DELETE", cms + "/p", json{{"preconditions", {{"uid", "not-it"}}}}, 409);
  CallJson("DELETE", cms + "/p", json{{"preconditions", {{"resourceVersion", "1"}}}}, 409);
  CallJson("DELETE", cms + "/p", json{{"preconditions", {{"uid", c["metadata"]["uid"]}}}}, 200);
  EXPECT_EQ(Call("GET", cms + "/p").status, 404);
}

TEST_F(ApiServerTest, GarbageCollectorFollowsOwnerReferences) {
  CreateCrd();
  json owner = CallJson("POST", kJobs, Job("owner", 1), 201);
  json ref = {{"apiVersion", "meshwork.dev/v1alpha1"}, {"kind", "TrainingJob"}, {"name", "owner"},
              {"uid", owner["metadata"]["uid"]}, {"blockOwnerDeletion", true}};
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  CallJson("POST", cms, json{{"metadata", {{"name", "dep"}, {"ownerReferences", {ref}}}}}, 201);
  CallJson("POST", cms, json{{"metadata", {{"name", "free"}}}}, 201);
  GarbageCollector gc(api_.get());
  gc.Sweep();
  EXPECT_EQ(Call("GET", cms + "/dep").status, 200);
  // Foreground: the owner waits for its blocking dependent.
  json d = CallJson("DELETE", std::string(kJobs) + "/owner", json{{"propagationPolicy", "Foreground"}}, 200);
  EXPECT_NE(d["metadata"]["finalizers"].dump().find("foregroundDeletion"), std::string::npos);
  EXPECT_EQ(Call("GET", std::string(kJobs) + "/owner").status, 200);
  gc.Sweep();  // puts the dependent into foreground deletion too (it has no dependents)
  gc.Sweep();  // removes the dependent
  gc.Sweep();  // then releases the owner
  EXPECT_EQ(Call("GET", cms + "/dep").status, 404);
  EXPECT_EQ(Call("GET", std::string(kJobs) + "/owner").status, 404);
  EXPECT_EQ(Call("GET", cms + "/free").status, 200);
  // Orphan: the dependent stays without its reference.
  json owner2 = CallJson("POST", kJobs, Job("owner2", 1), 201);
  ref["uid"] = owner2["metadata"]["uid"];
  CallJson("POST", cms, json{{"metadata", {{"name", "dep2"}, {"ownerReferences", {ref}}}}}, 201);
  CallJson("DELETE", std::string(kJobs) + "/owner2", json{{"propagationPolicy", "Orphan"}}, 200);
  gc.Sweep();
  json dep2 = CallJson("GET", cms + "/dep2", nullptr, 200);
  EXPECT_FALSE(dep2["metadata"].contains("ownerReferences"));
}

TEST_F(ApiServerTest, DeletingACrdDeletesItsObjectsAndRoutes) {
  CreateCrd();
  CallJson("POST", kJobs, Job("a", 1), 201);
  CallJson("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.meshwork.dev", nullptr, 200);
  EXPECT_EQ(Call("GET", kJobs).status, 404);
  CreateCrd();
  json list = json::parse(Call("GET", kJobs).body);
  EXPECT_TRUE(list["items"].empty());
}

TEST_F(ApiServerTest, NamespacesScopeObjects) {
  CallJson("POST", "/api/v1/namespaces", json{{"metadata", {{"name", "team"}}}}, 201);
  CallJson("POST", "/api/v1/namespaces/team/configmaps", json{{"metadata", {{"name", "c"}}}}, 201);
  json d = CallJson("DELETE", "/api/v1/namespaces/team", nullptr, 200);
  EXPECT_EQ(d["status"]["phase"], "Terminating");
  json s = CallJson("POST", "/api/v1/namespaces/team/configmaps", json{{"metadata", {{"name", "c2"}}}}, 403);
  EXPECT_EQ(s["reason"], "Forbidden");
  GarbageCollector gc(api_.get());
  gc.Sweep();
  gc.Sweep();
  EXPECT_EQ(Call("GET", "/api/v1/namespaces/team/configmaps/c").status, 404);
  EXPECT_EQ(Call("GET", "/api/v1/namespaces/team").status, 404);
}

// Protobuf length-delimited field (what kubectl's typed clients send for create).
std::string PbField(int field, const std::string& bytes) {
  std::string out(1, static_cast<char>((field << 3) | 2));
  size_t n = bytes.size();
  while (n >= 0x80) {
    out += static_cast<char>((n & 0x7F) | 0x80);
    n >>= 7;
  }
  out += static_cast<char>(n);
  return out + bytes;
}

TEST_F(ApiServerTest, ProtobufConfigMapFromKubectlCreateIsDecoded) {
  std::string meta = PbField(1, "pb") + PbField(2, "") + PbField(11, PbField(1, "app") + PbField(2, "x"));
  std::string raw = PbField(1, meta) + PbField(2, PbField(1, "k") + PbField(2, "v"));
  std::string body = std::string("k8s\0", 4) + PbField(1, PbField(1, "v1") + PbField(2, "ConfigMap")) + PbField(2, raw);
  HttpResponse r = Call("POST", "/api/v1/namespaces/default/configmaps", body, "application/vnd.kubernetes.protobuf");
  ASSERT_EQ(r.status, 201) << r.body;
  json cm = json::parse(r.body);
  EXPECT_EQ(cm["metadata"]["name"], "pb");
  EXPECT_FALSE(cm["metadata"].contains("generateName"));
  EXPECT_EQ(cm["metadata"]["labels"]["app"], "x");
  EXPECT_EQ(cm["data"]["k"], "v");
  // Other kinds, and truncated bodies, are refused with a Status.
  std::string pod = std::string("k8s\0", 4) + PbField(1, PbField(1, "v1") + PbField(2, "Pod")) + PbField(2, "");
  EXPECT_EQ(Call("POST", "/api/v1/namespaces/default/pods", pod, "application/vnd.kubernetes.protobuf").status, 415);
  EXPECT_EQ(Call("POST", "/api/v1/namespaces/default/configmaps", body.substr(0, body.size() - 3),
                 "application/vnd.kubernetes.protobuf").status, 415);
}

TEST_F(ApiServerTest, ServicesGetAClusterIp) {
  json s = CallJson("POST", "/api/v1/namespaces/default/services",
                    json{{"metadata", {{"name", "web"}}}, {"spec", {{"ports", {{{"port", 80}}}}}}}, 201);
  std::string ip = s["spec"]["clusterIP"];
  EXPECT_EQ(ip.rfind("10.", 0), 0u);
  EXPECT_EQ(s["spec"]["ports"][0]["targetPort"], 80);
  json h = CallJson("POST", "/api/v1/namespaces/default/services",
                    json{{"metadata", {{"name", "hl"}}}, {"spec", {{"clusterIP", "None"}}}}, 201);
  EXPECT_EQ(h["spec"]["clusterIP"], "None");
}

// ---- service accounts, RBAC objects, Deployments ------------------------------------------

const char* kDeployments = "/apis/apps/v1/namespaces/default/deployments";
const char* kPods = "/api/v1/namespaces/default/pods";

json Deployment(const std::string& name, int replicas, const std::string& command = "sleep") {
  return {{"apiVersion", "apps/v1"},
          {"kind", "Deployment"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"replicas", replicas},
            {"selector", {{"matchLabels", {{"app", name}}}}},
            {"template",
             {{"metadata", {{"labels", {{"app", name}, {"tier", "x"}}}}},
              {"spec", {{"containers", {{{"name", "main"}, {"image", "none"}, {"command", {command, "300"}}}}}}}}}}}};
}

TEST_F(ApiServerTest, DiscoveryServesServiceAccountsRbacAndDeployments) {
  auto names = [&](const std::string& path) {
    std::map<std::string, json> out;
    json list = json::parse(Call("GET", path).body);
    for (const json& r : list["resources"]) out[r["name"].get<std::string>()] = r;
    return out;
  };
  auto core = names("/api/v1");
  ASSERT_TRUE(core.count("serviceaccounts"));
  EXPECT_EQ(core["serviceaccounts"]["shortNames"], json({"sa"}));
  EXPECT_EQ(core["serviceaccounts"]["kind"], "ServiceAccount");
  auto rbac = names("/apis/rbac.authorization.k8s.io/v1");
  for (const char* r : {"roles", "rolebindings", "clusterroles", "clusterrolebindings"}) EXPECT_TRUE(rbac.count(r)) << r;
  EXPECT_TRUE(rbac["roles"]["namespaced"]);
  EXPECT_FALSE(rbac["clusterroles"]["namespaced"]);
  EXPECT_FALSE(rbac["clusterrolebindings"]["namespaced"]);
  auto apps = names("/apis/apps/v1");
  ASSERT_TRUE(apps.count("deployments"));
  EXPECT_EQ(apps["deployments"]["shortNames"], json({"deploy"}));
  EXPECT_EQ(apps["deployments"]["categories"], json({"all"}));
  EXPECT_TRUE(apps.count("deployments/status"));
  EXPECT_EQ(apps["deployments/scale"]["group"], "autoscaling");
  json groups = json::parse(Call("GET", "/apis").body);
  std::set<std::string> group_names;
  for (const json& g : groups["groups"]) group_names.insert(g["name"].get<std::string>());
  EXPECT_TRUE(group_names.count("apps"));
  EXPECT_TRUE(group_names.count("rbac.authorization.k8s.io"));
}

TEST_F(ApiServerTest, RbacObjectsAreStoredAndServed) {
  json role = {{"metadata", {{"name", "reader"}}},
               {"rules", {{{"apiGroups", {""}}, {"resources", {"pods"}}, {"verbs", {"get", "list"}}}}}};
  CallJson("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role, 201);
  CallJson("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", role, 201);
  json binding = {{"metadata", {{"name", "read"}}},
                  {"roleRef", {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", "reader"}}},
                  {"subjects", {{{"kind", "ServiceAccount"}, {"name", "op"}, {"namespace", "default"}}}}};
  CallJson("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding, 201);
  CallJson("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", binding, 201);
  CallJson("POST", "/api/v1/namespaces/default/serviceaccounts", json{{"metadata", {{"name", "op"}}}}, 201);
  json got = CallJson("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/reader", nullptr, 200);
  EXPECT_EQ(got["rules"][0]["verbs"], json({"get", "list"}));
  EXPECT_EQ(got["kind"], "ClusterRole");
  // Cluster-scoped: no namespace path.
  EXPECT_EQ(Call("GET", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/clusterroles/reader").status, 404);
  HttpResponse t = Call("GET", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "", "application/json",
                        "application/json;as=Table;v=v1;g=meta.k8s.io");
  json table = json::parse(t.body);
  EXPECT_EQ(table["columnDefinitions"][1]["name"], "Role");
  EXPECT_EQ(table["rows"][0]["cells"][1], "ClusterRole/reader");
  EXPECT_EQ(table["rows"][0]["cells"][5], "default/op");
  EXPECT_EQ(Call("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterroles/reader").status, 200);
}

// An audit log read back: one JSON object per line.
std::vector<json> ReadAuditLog(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(json::parse(line));
  return lines;
}

TEST_F(ApiServerTest, AuditLogRecordsEachResourceRequestWithItsAuthorizationVerb) {
  auto opened = AuditLog::Open(dir_ + "/audit.jsonl");
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  audit_log_ = std::move(opened).value();
  Open(StoreOptions{});
  user_agent_ = "meshwork-operator/0.1";
  // Health, version, openapi and discovery are not requests on a resource: not recorded.
  for (const char* path : {"/healthz", "/livez", "/readyz", "/version", "/", "/api", "/api/v1", "/apis",
                           "/apis/apps", "/apis/apps/v1", "/openapi/v3", "/openapi/v3/api/v1", "/nope"}) {
    Call("GET", path);
  }
  EXPECT_TRUE(ReadAuditLog(dir_ + "/audit.jsonl").empty());

  struct Case {
    std::string method, target, body, content_type;
    std::string verb, group, version, resource, sub, ns, name;
  };
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  const std::string pods = kPods;
  const std::string cm = R"({"metadata":{"name":"a"},"data":{"k":"v"}})";
  const std::string pod = R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}})";
  const std::string pod_status = R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]},"status":{"phase":"Running"}})";
  const std::string merge = "application/merge-patch+json";
  const std::string js = "application/json";
  const std::vector<Case> cases = {
      {"POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", kCrd, js,
       "create", "apiextensions.k8s.io", "v1", "customresourcedefinitions", "", "", ""},
      {"POST", cms, cm, js, "create", "", "v1", "configmaps", "", "default", ""},
      {"GET", cms + "/a", "", "", "get", "", "v1", "configmaps", "", "default", "a"},
      {"GET", cms + "/missing", "", "", "get", "", "v1", "configmaps", "", "default", "missing"},
      {"GET", cms + "?labelSelector=x%3Dy", "", "", "list", "", "v1", "configmaps", "", "default", ""},
      {"GET", "/api/v1/configmaps", "", "", "list", "", "v1", "configmaps", "", "", ""},
      {"GET", cms + "?watch=true&timeoutSeconds=1", "", "", "watch", "", "v1", "configmaps", "", "default", ""},
      {"GET", "/api/v1/configmaps?watch=1", "", "", "watch", "", "v1", "configmaps", "", "", ""},
      // The deprecated /watch/ prefix: a watch, answered 404 here.
      {"GET", "/api/v1/watch/namespaces/default/configmaps", "", "", "watch", "", "v1", "configmaps", "", "default", ""},
      {"PUT", cms + "/a", cm, js, "update", "", "v1", "configmaps", "", "default", "a"},
      {"PATCH", cms + "/a", R"({"data":{"k":"w"}})", merge, "patch", "", "v1", "configmaps", "", "default", "a"},
      {"DELETE", cms + "/a", "", "", "delete", "", "v1", "configmaps", "", "default", "a"},
      {"DELETE", cms, "", "", "deletecollection", "", "v1", "configmaps", "", "default", ""},
      {"POST", pods, pod, js, "create", "", "v1", "pods", "", "default", ""},
      {"GET", pods + "/p/status", "", "", "get", "", "v1", "pods", "status", "default", "p"},
      {"PUT", pods + "/p/status", pod_status, js, "update", "", "v1", "pods", "status", "default", "p"},
      {"PATCH", pods + "/p/status", R"({"status":{"phase":"Failed"}})", merge, "patch", "", "v1", "pods", "status", "default", "p"},
      {"GET", pods + "/p/log?tailLines=5", "", "", "get", "", "v1", "pods", "log", "default", "p"},
      {"DELETE", pods + "/p?gracePeriodSeconds=0", "", "", "delete", "", "v1", "pods", "", "default", "p"},
      {"POST", kJobs, Job("j", 1).dump(), js, "create", "meshwork.dev", "v1alpha1", "trainingjobs", "", "default", ""},
      {"GET", std::string(kJobs) + "/j/scale", "", "", "get", "meshwork.dev", "v1alpha1", "trainingjobs", "scale", "default", "j"},
      {"PATCH", std::string(kJobs) + "/j/status", R"({"status":{"phase":"Running"}})", merge,
       "patch", "meshwork.dev", "v1alpha1", "trainingjobs", "status", "default", "j"},
      {"GET", "/apis/meshwork.dev/v1alpha1/trainingjobs", "", "", "list", "meshwork.dev", "v1alpha1", "trainingjobs", "", "", ""},
      // Cluster-scoped: no namespace, also for a namespace itself.
      {"GET", "/api/v1/nodes", "", "", "list", "", "v1", "nodes", "", "", ""},
      {"GET", "/api/v1/namespaces/default", "", "", "get", "", "v1", "namespaces", "", "", "default"},
      {"GET", "/api/v1/namespaces", "", "", "list", "", "v1", "namespaces", "", "", ""},
      {"PUT", "/apis/rbac.authorization.k8s.io/v1/clusterroles/r", R"({"metadata":{"name":"r"},"rules":[]})", js,
       "update", "rbac.authorization.k8s.io", "v1", "clusterroles", "", "", "r"},
      {"GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l", "", "", "get", "coordination.k8s.io", "v1", "leases", "", "kube-system", "l"},
  };
  std::vector<int> codes;
  for (const Case& c : cases) codes.push_back(Call(c.method, c.target, c.body, c.content_type).status);
  // Spot checks that the requests did what they say (the log records any answer).
  EXPECT_EQ(codes[1], 201);
  EXPECT_EQ(codes[3], 404);
  EXPECT_EQ(codes[8], 404);
  EXPECT_EQ(codes[15], 200);

  std::vector<json> lines = ReadAuditLog(dir_ + "/audit.jsonl");
  ASSERT_EQ(lines.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const json& l = lines[i];
    std::string what = c.method + " " + c.target + ": " + l.dump();
    EXPECT_EQ(l["verb"], c.verb) << what;
    EXPECT_EQ(l["apiGroup"], c.group) << what;
    EXPECT_EQ(l["apiVersion"], c.version) << what;
    EXPECT_EQ(l["resource"], c.resource) << what;
    EXPECT_EQ(l["subresource"], c.sub) << what;
    EXPECT_EQ(l["namespace"], c.ns) << what;
    EXPECT_EQ(l["name"], c.name) << what;
    EXPECT_EQ(l["userAgent"], "meshwork-operator/0.1") << what;
    EXPECT_EQ(l["code"], codes[i]) << what;
    EXPECT_EQ(l["requestURI"], c.target) << what;
  }
}

TEST_F(ApiServerTest, AuditLogAppendsWholeLinesFromConcurrentRequests) {
  const std::string path = dir_ + "/audit.jsonl";
  {
    std::ofstream(path) << R"({"verb":"get"})" << "\n";  // an earlier run's line stays
  }
  audit_log_ = std::move(AuditLog::Open(path)).value();
  Open(StoreOptions{});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 50; ++i) Call("GET", "/api/v1/namespaces/default/configmaps/c" + std::to_string(t));
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<json> lines;
  ASSERT_NO_THROW(lines = ReadAuditLog(path));
  ASSERT_EQ(lines.size(), 1u + 4 * 50);
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i]["code"], 404);
}

TEST(AuditLogTest, UnwritablePathIsAnError) {
  auto opened = AuditLog::Open("/nonexistent-meshwork-dir/audit.jsonl");
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find("No such file or directory"), std::string::npos)
      << opened.status().message();
}

TEST_F(ApiServerTest, PodWithAMissingServiceAccountIsForbidden) {
  json pod = {{"metadata", {{"name", "p"}}},
              {"spec", {{"serviceAccountName", "operator"}, {"containers", {{{"name", "c"}, {"image", "x"}}}}}}};
  HttpResponse r = Call("POST", kPods, pod.dump());
  EXPECT_EQ(r.status, 403);
  json st = json::parse(r.body);
  EXPECT_EQ(st["reason"], "Forbidden");
  EXPECT_EQ(st["message"],
            "pods \"p\" is forbidden: error looking up service account default/operator: serviceaccount \"operator\" not found");
  EXPECT_EQ(Call("GET", std::string(kPods) + "/p").status, 404);
  CallJson("POST", "/api/v1/namespaces/default/serviceaccounts", json{{"metadata", {{"name", "operator"}}}}, 201);
  CallJson("POST", kPods, pod, 201);
  // "default", or none, is always accepted (real clusters create it in every namespace).
  json plain = {{"metadata", {{"name", "q"}}}, {"spec", {{"containers", {{{"name", "c"}, {"image", "x"}}}}}}};
  json q = CallJson("POST", kPods, plain, 201);
  EXPECT_EQ(q["spec"]["serviceAccountName"], "default");
}

TEST_F(ApiServerTest, DeploymentSelectorMustMatchTemplateLabels) {
  json d = Deployment("web", 1);
  d["spec"]["template"]["metadata"]["labels"] = {{"app", "other"}};
  HttpResponse r = Call("POST", kDeployments, d.dump());
  EXPECT_EQ(r.status, 422);
  json st = json::parse(r.body);
  EXPECT_EQ(st["message"],
            "Deployment.apps \"web\" is invalid: spec.template.metadata.labels: Invalid value: "
            "map[string]string{\"app\":\"other\"}: `selector` does not match template `labels`");
  EXPECT_EQ(st["details"]["causes"][0]["field"], "spec.template.metadata.labels");
  json no_selector = Deployment("web", 1);
  no_selector["spec"].erase("selector");
  EXPECT_NE(Call("POST", kDeployments, no_selector.dump()).body.find("spec.selector: Required value"), std::string::npos);
  json negative = Deployment("web", -1);
  EXPECT_NE(Call("POST", kDeployments, negative.dump()).body.find("spec.replicas: Invalid value: -1"), std::string::npos);
  json never = Deployment("web", 1);
  never["spec"]["template"]["spec"]["restartPolicy"] = "Never";
  EXPECT_NE(json::parse(Call("POST", kDeployments, never.dump()).body)["message"].get<std::string>().find(
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\""),
            std::string::npos);
  // The selector is immutable.
  CallJson("POST", kDeployments, Deployment("web", 1), 201);
  json changed = Deployment("web", 1);
  changed["spec"]["selector"]["matchLabels"]["tier"] = "x";
  HttpResponse u = Call("PUT", std::string(kDeployments) + "/web", changed.dump());
  EXPECT_EQ(u.status, 422);
  EXPECT_NE(u.body.find("spec.selector: Invalid value"), std::string::npos);
  EXPECT_NE(u.body.find("field is immutable"), std::string::npos);
}

TEST_F(ApiServerTest, DeploymentGenerationDefaultsAndScale) {
  json d = Deployment("web", 2);
  d["spec"].erase("replicas");
  d["status"] = {{"replicas", 9}};
  json created = CallJson("POST", kDeployments, d, 201);
  EXPECT_EQ(created["metadata"]["generation"], 1);
  EXPECT_EQ(created["spec"]["replicas"], 1);  // default
  EXPECT_EQ(created["spec"]["strategy"]["type"], "Recreate");
  EXPECT_FALSE(created.contains("status"));
  // A spec change bumps generation; a status write does not.
  json p = CallJson("PATCH", std::string(kDeployments) + "/web", json{{"spec", {{"replicas", 2}}}}, 200,
                    "application/merge-patch+json");
  EXPECT_EQ(p["metadata"]["generation"], 2);
  json s = CallJson("PATCH", std::string(kDeployments) + "/web/status", json{{"status", {{"replicas", 2}}}}, 200,
                    "application/merge-patch+json");
  EXPECT_EQ(s["metadata"]["generation"], 2);
  json l = CallJson("PATCH", std::string(kDeployments) + "/web", json{{"metadata", {{"labels", {{"a", "b"}}}}}}, 200,
                    "application/merge-patch+json");
  EXPECT_EQ(l["metadata"]["generation"], 2);
  // Scale subresource: reads spec.replicas, status.replicas and the selector; writes spec.replicas.
  json scale = CallJson("GET", std::string(kDeployments) + "/web/scale", nullptr, 200);
  EXPECT_EQ(scale["kind"], "Scale");
  EXPECT_EQ(scale["spec"]["replicas"], 2);
  EXPECT_EQ(scale["status"]["replicas"], 2);
  EXPECT_EQ(scale["status"]["selector"], "app=web");
  scale["spec"]["replicas"] = 5;
  CallJson("PUT", std::string(kDeployments) + "/web/scale", scale, 200);
  json after = CallJson("GET", std::string(kDeployments) + "/web", nullptr, 200);
  EXPECT_EQ(after["spec"]["replicas"], 5);
  EXPECT_EQ(after["metadata"]["generation"], 3);
}

class DeploymentControllerTest : public ApiServerTest {
 protected:
  // The Deployment's Pods that are not being deleted.
  std::vector<json> Pods(const std::string& deployment) {
    std::vector<json> out;
    json list = CallJson("GET", kPods, nullptr, 200);
    for (const json& p : list["items"]) {
      if (p["metadata"].contains("deletionTimestamp")) continue;
      if (p["metadata"]["name"].get<std::string>().rfind(deployment + "-", 0) == 0) out.push_back(p);
    }
    return out;
  }
  // What the node agent would report: every Pod of the Deployment running and Ready.
  void MarkReady(const std::string& deployment, const std::string& phase = "Running") {
    for (const json& p : Pods(deployment)) {
      json status = {{"phase", phase},
                     {"conditions", {{{"type", "Ready"}, {"status", phase == "Running" ? "True" : "False"}}}}};
      CallJson("PATCH", std::string(kPods) + "/" + p["metadata"]["name"].get<std::string>() + "/status",
               json{{"status", status}}, 200, "application/merge-patch+json");
    }
  }
  json Get(const std::string& deployment) {
    return CallJson("GET", std::string(kDeployments) + "/" + deployment, nullptr, 200);
  }
  static std::string ConditionReason(const json& d, const std::string& type) {
    for (const json& c : d["status"].value("conditions", json::array())) {
      if (c["type"] == type) return c["status"].get<std::string>() + "/" + c["reason"].get<std::string>();
    }
    return "";
  }
};

TEST_F(DeploymentControllerTest, KeepsReplicasNamedByTemplateHashAndOwned) {
  json d = CallJson("POST", kDeployments, Deployment("web", 2), 201);
  DeploymentController dc(api_.get());
  dc.Sync();
  std::vector<json> pods = Pods("web");
  ASSERT_EQ(pods.size(), 2u);
  std::string hash = PodTemplateHash(d["spec"]["template"]);
  for (const json& p : pods) {
    std::string name = p["metadata"]["name"].get<std::string>();
    EXPECT_EQ(name.rfind("web-" + hash + "-", 0), 0u) << name;
    EXPECT_EQ(name.size(), std::string("web-" + hash + "-").size() + 5);
    EXPECT_EQ(p["metadata"]["labels"]["pod-template-hash"], hash);
    EXPECT_EQ(p["metadata"]["labels"]["app"], "web");
    EXPECT_EQ(p["metadata"]["labels"]["tier"], "x");
    const json& ref = p["metadata"]["ownerReferences"][0];
    EXPECT_EQ(ref["kind"], "Deployment");
    EXPECT_EQ(ref["uid"], d["metadata"]["uid"]);
    EXPECT_EQ(ref["controller"], true);
    EXPECT_EQ(ref["blockOwnerDeletion"], true);
    EXPECT_EQ(p["spec"]["containers"][0]["command"][0], "sleep");
  }
  // Not ready yet: progressing, not available.
  json status = Get("web")["status"];
  EXPECT_EQ(status["observedGeneration"], 1);
  EXPECT_EQ(status["replicas"], 2);
  EXPECT_EQ(status["updatedReplicas"], 2);
  EXPECT_FALSE(status.contains("availableReplicas"));
  EXPECT_EQ(status["unavailableReplicas"], 2);
  EXPECT_EQ(ConditionReason(Get("web"), "Available"), "False/MinimumReplicasUnavailable");
  EXPECT_EQ(ConditionReason(Get("web"), "Progressing"), "True/ReplicaSetUpdated");
  MarkReady("web");
  dc.Sync();
  json done = Get("web");
  EXPECT_EQ(done["status"]["readyReplicas"], 2);
  EXPECT_EQ(done["status"]["availableReplicas"], 2);
  EXPECT_FALSE(done["status"].contains("unavailableReplicas"));
  EXPECT_EQ(ConditionReason(done, "Available"), "True/MinimumReplicasAvailable");
  EXPECT_EQ(ConditionReason(done, "Progressing"), "True/NewReplicaSetAvailable");
  // A pass with nothing to do writes nothing.
  std::string rv = done["metadata"]["resourceVersion"].get<std::string>();
  dc.Sync();
  EXPECT_EQ(Get("web")["metadata"]["resourceVersion"], rv);
  // The table kubectl get deploy shows.
  HttpResponse t = Call("GET", kDeployments, "", "application/json", "application/json;as=Table;v=v1;g=meta.k8s.io");
  json table = json::parse(t.body);
  std::vector<std::string> columns;
  for (const json& c : table["columnDefinitions"]) columns.push_back(c["name"].get<std::string>());
  EXPECT_EQ(columns, (std::vector<std::string>{"Name", "Ready", "Up-to-date", "Available", "Age", "Containers",
                                               "Images", "Selector"}));
  EXPECT_EQ(table["rows"][0]["cells"][1], "2/2");
  EXPECT_EQ(table["rows"][0]["cells"][2], 2);
  EXPECT_EQ(table["rows"][0]["cells"][3], 2);
  EXPECT_EQ(table["rows"][0]["cells"][7], "app=web");
}

TEST_F(DeploymentControllerTest, ScalesUpAndDownAndReplacesFinishedPods) {
  CallJson("POST", kDeployments, Deployment("web", 1), 201);
  DeploymentController dc(api_.get());
  dc.Sync();
  ASSERT_EQ(Pods("web").size(), 1u);
  CallJson("PATCH", std::string(kDeployments) + "/web/scale", json{{"spec", {{"replicas", 3}}}}, 200,
           "application/merge-patch+json");
  dc.Sync();
  EXPECT_EQ(Pods("web").size(), 3u);
  MarkReady("web");
  CallJson("PATCH", std::string(kDeployments) + "/web/scale", json{{"spec", {{"replicas", 1}}}}, 200,
           "application/merge-patch+json");
  dc.Sync();
  EXPECT_EQ(Pods("web").size(), 1u);
  EXPECT_EQ(Get("web")["status"]["replicas"], 1);
  // A Pod that ends is replaced by a new one.
  std::string first = Pods("web")[0]["metadata"]["name"].get<std::string>();
  MarkReady("web", "Failed");
  dc.Sync();  // deletes the finished Pod and creates its replacement
  std::vector<json> pods = Pods("web");
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_NE(pods[0]["metadata"]["name"], first);
  // Scale to zero.
  CallJson("PATCH", std::string(kDeployments) + "/web/scale", json{{"spec", {{"replicas", 0}}}}, 200,
           "application/merge-patch+json");
  dc.Sync();
  EXPECT_TRUE(Pods("web").empty());
  EXPECT_EQ(ConditionReason(Get("web"), "Available"), "True/MinimumReplicasAvailable");
}

TEST_F(DeploymentControllerTest, TemplateChangeRecreatesThePods) {
  CallJson("POST", kDeployments, Deployment("web", 2), 201);
  DeploymentController dc(api_.get());
  dc.Sync();
  MarkReady("web");
  dc.Sync();
  std::string old_hash = Pods("web")[0]["metadata"]["labels"]["pod-template-hash"].get<std::string>();
  json changed = CallJson("PATCH", std::string(kDeployments) + "/web",
                          json{{"spec", {{"template", {{"metadata", {{"labels", {{"app", "web"}, {"tier", "y"}}}}}}}}}},
                          200, "application/merge-patch+json");
  EXPECT_EQ(changed["metadata"]["generation"], 2);
  dc.Sync();  // deletes the old Pods (no agent here: they go at once)
  json mid = Get("web");
  EXPECT_EQ(mid["status"]["observedGeneration"], 2);
  EXPECT_FALSE(mid["status"].contains("updatedReplicas"));
  dc.Sync();  // creates the new ones
  std::vector<json> pods = Pods("web");
  ASSERT_EQ(pods.size(), 2u);
  for (const json& p : pods) {
    EXPECT_NE(p["metadata"]["labels"]["pod-template-hash"], old_hash);
    EXPECT_EQ(p["metadata"]["labels"]["tier"], "y");
  }
  EXPECT_EQ(ConditionReason(Get("web"), "Progressing"), "True/ReplicaSetUpdated");
}

TEST_F(DeploymentControllerTest, DeletingTheDeploymentCascadesToItsPods) {
  CallJson("POST", kDeployments, Deployment("web", 2), 201);
  DeploymentController dc(api_.get());
  dc.Sync();
  ASSERT_EQ(Pods("web").size(), 2u);
  GarbageCollector gc(api_.get());
  gc.Sweep();  // the owner exists: the Pods stay
  ASSERT_EQ(Pods("web").size(), 2u);
  CallJson("DELETE", std::string(kDeployments) + "/web", json{{"propagationPolicy", "Background"}}, 200);
  gc.Sweep();
  dc.Sync();
  EXPECT_TRUE(Pods("web").empty());
}

TEST_F(DeploymentControllerTest, RefusedPodCreationIsAReplicaFailure) {
  json d = Deployment("web", 1);
  d["spec"]["template"]["spec"]["serviceAccountName"] = "operator";
  CallJson("POST", kDeployments, d, 201);
  DeploymentController dc(api_.get());
  dc.Sync();
  EXPECT_TRUE(Pods("web").empty());
  json got = Get("web");
  EXPECT_EQ(ConditionReason(got, "ReplicaFailure"), "True/FailedCreate");
  std::string message;
  for (const json& c : got["status"]["conditions"]) {
    if (c["type"] == "ReplicaFailure") message = c["message"].get<std::string>();
  }
  EXPECT_EQ(message.rfind("pods \"web-" + PodTemplateHash(got["spec"]["template"]) + "-\" is forbidden: ", 0), 0u)
      << message;
  EXPECT_NE(message.find("error looking up service account default/operator: serviceaccount \"operator\" not found"),
            std::string::npos) << message;
  // Once the ServiceAccount exists the Pod is created and the failure goes.
  CallJson("POST", "/api/v1/namespaces/default/serviceaccounts", json{{"metadata", {{"name", "operator"}}}}, 201);
  dc.Sync();
  EXPECT_EQ(Pods("web").size(), 1u);
  EXPECT_EQ(ConditionReason(Get("web"), "ReplicaFailure"), "");
}

}  // namespace
}  // namespace meshwork::controlplane
