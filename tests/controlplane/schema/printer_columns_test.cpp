// Tables for `kubectl get`: CRD printer columns, the built-in kinds' columns, and HumanDuration.
#include "controlplane/schema/printer_columns.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;
using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

// 2024-05-01T12:00:00Z
const std::chrono::system_clock::time_point kNow = std::chrono::system_clock::time_point(seconds(1714564800));

struct DurationCase {
  std::chrono::seconds d;
  const char* want;
};

class HumanDurationTest : public ::testing::TestWithParam<DurationCase> {};

TEST_P(HumanDurationTest, RoundsLikeKubernetes) {
  EXPECT_EQ(HumanDuration(GetParam().d), GetParam().want) << GetParam().d.count() << "s";
}

INSTANTIATE_TEST_SUITE_P(
    Table, HumanDurationTest,
    ::testing::Values(DurationCase{seconds(-5), "<invalid>"}, DurationCase{seconds(-1), "0s"},
                      DurationCase{seconds(0), "0s"}, DurationCase{seconds(59), "59s"},
                      DurationCase{seconds(119), "119s"}, DurationCase{seconds(120), "2m"},
                      DurationCase{seconds(303), "5m3s"}, DurationCase{seconds(599), "9m59s"},
                      DurationCase{seconds(600), "10m"}, DurationCase{minutes(179), "179m"},
                      DurationCase{minutes(180), "3h"}, DurationCase{minutes(200), "3h20m"},
                      DurationCase{hours(8), "8h"}, DurationCase{hours(47), "47h"},
                      DurationCase{hours(48), "2d"}, DurationCase{hours(53), "2d5h"},
                      DurationCase{hours(24 * 8), "8d"}, DurationCase{hours(24 * 729), "729d"},
                      DurationCase{hours(24 * 730), "2y"}, DurationCase{hours(24 * 735), "2y5d"},
                      DurationCase{hours(24 * 365 * 9), "9y"}));

json TrainingJobVersion() {
  return json::parse(R"({
    "name": "v1", "served": true, "storage": true,
    "additionalPrinterColumns": [
      {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
      {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
      {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
      {"name": "Workers", "type": "string", "jsonPath": ".spec.workers[*].name", "priority": 1},
      {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
  })");
}

json Job(const std::string& name, const std::string& created, json spec, json status) {
  return {{"apiVersion", "meshwork.dev/v1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"creationTimestamp", created},
                        {"resourceVersion", "7"}}},
          {"spec", spec},
          {"status", status}};
}

TEST(ParsePrinterColumnsTest, ReadsEveryField) {
  auto cols = ParsePrinterColumns(TrainingJobVersion());
  ASSERT_EQ(cols.size(), 5u);
  EXPECT_EQ(cols[0].name, "Phase");
  EXPECT_EQ(cols[0].type, "string");
  EXPECT_EQ(cols[0].json_path, ".status.phase");
  EXPECT_EQ(cols[3].priority, 1);
  EXPECT_TRUE(ParsePrinterColumns(json::parse(R"({"name": "v1"})")).empty());
}

TEST(BuildTableTest, TrainingJobColumnsAndCells) {
  std::vector<json> objs = {
      Job("a", "2024-05-01T11:54:57Z", {{"replicas", 4}, {"workers", {{{"name", "w0"}}, {{"name", "w1"}}}}},
          {{"phase", "Running"},
           {"conditions", {{{"type", "Scheduled"}, {"status", "True"}}, {{"type", "Ready"}, {"status", "False"}}}}}),
      Job("b", "2024-04-29T07:00:00Z", {{"replicas", 2.0}}, json::object()),
  };
  json t = BuildTable(ParsePrinterColumns(TrainingJobVersion()), objs, "Metadata", kNow);
  EXPECT_EQ(t["kind"], "Table");
  EXPECT_EQ(t["apiVersion"], "meta.k8s.io/v1");
  std::vector<std::string> names;
  for (const auto& c : t["columnDefinitions"]) names.push_back(c["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"Name", "Phase", "Replicas", "Ready", "Workers", "Age"}));
  EXPECT_EQ(t["columnDefinitions"][0]["format"], "name");
  EXPECT_EQ(t["columnDefinitions"][4]["priority"], 1);
  EXPECT_EQ(t["columnDefinitions"][1]["description"],
            "Custom resource definition column (in JSONPath format): .status.phase");

  ASSERT_EQ(t["rows"].size(), 2u);
  EXPECT_EQ(t["rows"][0]["cells"], json::parse(R"(["a", "Running", 4, "False", "w0", "5m3s"])"));
  // Missing values are null cells; a whole float becomes an integer cell.
  EXPECT_EQ(t["rows"][1]["cells"], json::parse(R"(["b", null, 2, null, null, "2d5h"])"));
  EXPECT_EQ(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
  EXPECT_EQ(t["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1");
  EXPECT_EQ(t["rows"][0]["object"]["metadata"]["name"], "a");
  EXPECT_FALSE(t["rows"][0]["object"].contains("spec"));
}

TEST(BuildTableTest, IncludeObjectModes) {
  std::vector<json> objs = {Job("a", "2024-05-01T11:00:00Z", {{"replicas", 1}}, json::object())};
  auto cols = ParsePrinterColumns(TrainingJobVersion());
  json full = BuildTable(cols, objs, "Object", kNow);
  EXPECT_EQ(full["rows"][0]["object"], objs[0]);
  json none = BuildTable(cols, objs, "None", kNow);
  EXPECT_FALSE(none["rows"][0].contains("object"));
}

TEST(BuildTableTest, AgeColumnWhenTheCrdHasNone) {
  std::vector<json> objs = {Job("a", "2024-05-01T11:00:00Z", json::object(), json::object())};
  json t = BuildTable({}, objs, "Metadata", kNow);
  ASSERT_EQ(t["columnDefinitions"].size(), 2u);
  EXPECT_EQ(t["columnDefinitions"][1]["name"], "Age");
  EXPECT_EQ(t["columnDefinitions"][1]["type"], "date");
  EXPECT_EQ(t["rows"][0]["cells"], json::parse(R"(["a", "60m"])"));
}

TEST(BuildTableTest, DateCellsForBadAndMissingTimestamps) {
  PrinterColumn started{"Started", "date", "", "", ".status.startTime", 0};
  std::vector<json> objs = {Job("a", "x", json::object(), {{"startTime", "not-a-time"}}),
                            Job("b", "x", json::object(), json::object())};
  json t = BuildTable({started}, objs, "None", kNow);
  EXPECT_EQ(t["rows"][0]["cells"][1], "<invalid>");
  EXPECT_TRUE(t["rows"][1]["cells"][1].is_null());
}

TEST(JsonPathTest, SupportedForms) {
  json obj = json::parse(R"({"metadata": {"labels": {"app": "x", "app.kubernetes.io/name": "y"}},
      "spec": {"items": [{"n": 1, "k": "a"}, {"n": 2, "k": "b"}], "on": true}})");
  EXPECT_EQ(EvaluateJsonPath(".metadata.labels.app", obj), std::vector<json>{"x"});
  EXPECT_EQ(EvaluateJsonPath(".metadata.labels.app\\.kubernetes\\.io/name", obj), std::vector<json>{"y"});
  EXPECT_EQ(EvaluateJsonPath(".metadata.labels['app.kubernetes.io/name']", obj), std::vector<json>{"y"});
  EXPECT_EQ(EvaluateJsonPath(".spec.items[1].k", obj), std::vector<json>{"b"});
  EXPECT_EQ(EvaluateJsonPath(".spec.items[-1].n", obj), std::vector<json>{2});
  EXPECT_EQ(EvaluateJsonPath(".spec.items[*].n", obj), (std::vector<json>{1, 2}));
  EXPECT_EQ(EvaluateJsonPath(".spec.items[?(@.k=='b')].n", obj), std::vector<json>{2});
  EXPECT_EQ(EvaluateJsonPath(".spec.items[?(@.n==1)].k", obj), std::vector<json>{"a"});
  EXPECT_EQ(EvaluateJsonPath(".spec.items[?(@.k != \"a\")].k", obj), std::vector<json>{"b"});
  EXPECT_EQ(EvaluateJsonPath("{.spec.on}", obj), std::vector<json>{true});
  EXPECT_TRUE(EvaluateJsonPath(".spec.missing.deeper", obj).empty());
  EXPECT_TRUE(EvaluateJsonPath(".spec.items[5]", obj).empty());
}

TEST(JsonPathTest, RefusesWhatItCannotParse) {
  EXPECT_THROW(EvaluateJsonPath("spec", json::object()), std::invalid_argument);
  EXPECT_THROW(EvaluateJsonPath("..a", json::object()), std::invalid_argument);
  EXPECT_THROW(EvaluateJsonPath(".a[", json::object()), std::invalid_argument);
  EXPECT_THROW(EvaluateJsonPath(".a[?(@.x > 1)]", json::object()), std::invalid_argument);
  EXPECT_EQ(CheckJsonPath(".status.phase"), "");
  EXPECT_NE(CheckJsonPath(".a[1:2]").find("slices are not supported"), std::string::npos);
}

json Pod(const std::string& name, json status) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"creationTimestamp", "2024-05-01T11:00:00Z"}}},
          {"spec", {{"containers", {{{"name", "a"}}, {{"name", "b"}}}}, {"nodeName", "local-0"}}},
          {"status", status}};
}

TEST(BuiltinTableTest, Pods) {
  std::vector<json> pods = {
      Pod("running", json::parse(R"({"phase": "Running", "podIP": "127.0.1.2", "containerStatuses": [
          {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
           "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-05-01T11:57:00Z"}}},
          {"name": "b", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]})")),
      Pod("done", json::parse(R"({"phase": "Succeeded", "containerStatuses": [
          {"name": "a", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
          {"name": "b", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 137}}}]})")),
      Pod("pending", json::parse(R"({"phase": "Pending"})")),
  };
  pods[2]["metadata"]["deletionTimestamp"] = "2024-05-01T11:59:00Z";
  json t = BuiltinTable("pods", pods, "Metadata", kNow);
  std::vector<std::string> names;
  for (const auto& c : t["columnDefinitions"]) {
    if (c["priority"] == 0) names.push_back(c["name"]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"Name", "Ready", "Status", "Restarts", "Age"}));
  EXPECT_EQ(t["rows"][0]["cells"][1], "1/2");
  EXPECT_EQ(t["rows"][0]["cells"][2], "CrashLoopBackOff");
  EXPECT_EQ(t["rows"][0]["cells"][3], "2 (3m ago)");
  EXPECT_EQ(t["rows"][0]["cells"][4], "60m");
  EXPECT_EQ(t["rows"][0]["cells"][5], "127.0.1.2");
  EXPECT_EQ(t["rows"][0]["cells"][6], "local-0");
  EXPECT_EQ(t["rows"][1]["cells"][2], "Completed");  // containers are read last to first
  EXPECT_EQ(t["rows"][1]["cells"][3], "0");
  EXPECT_EQ(t["rows"][2]["cells"][1], "0/2");
  EXPECT_EQ(t["rows"][2]["cells"][2], "Terminating");
}

TEST(BuiltinTableTest, NamespacesConfigMapsLeases) {
  json ns = {{"metadata", {{"name", "default"}, {"creationTimestamp", "2024-05-01T11:59:30Z"}}},
             {"status", {{"phase", "Active"}}}};
  EXPECT_EQ(BuiltinTable("namespaces", {ns}, "None", kNow)["rows"][0]["cells"],
            json::parse(R"(["default", "Active", "30s"])"));
  json cm = {{"metadata", {{"name", "c"}, {"creationTimestamp", "2024-05-01T11:59:30Z"}}},
             {"data", {{"a", "1"}, {"b", "2"}}}, {"binaryData", {{"c", "AA=="}}}};
  EXPECT_EQ(BuiltinTable("configmaps", {cm}, "None", kNow)["rows"][0]["cells"], json::parse(R"(["c", 3, "30s"])"));
  json lease = {{"metadata", {{"name", "op"}, {"creationTimestamp", "2024-05-01T11:59:30Z"}}},
                {"spec", {{"holderIdentity", "op-0"}}}};
  json lt = BuiltinTable("leases", {lease}, "None", kNow);
  EXPECT_EQ(lt["columnDefinitions"][1]["name"], "Holder");
  EXPECT_EQ(lt["rows"][0]["cells"], json::parse(R"(["op", "op-0", "30s"])"));
}

TEST(BuiltinTableTest, Services) {
  json headless = json::parse(R"({"metadata": {"name": "job", "creationTimestamp": "2024-05-01T11:00:00Z"},
      "spec": {"type": "ClusterIP", "clusterIP": "None", "selector": {"job": "a"},
               "ports": [{"port": 29500, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}})");
  json np = json::parse(R"({"metadata": {"name": "np", "creationTimestamp": "2024-05-01T11:00:00Z"},
      "spec": {"type": "NodePort", "clusterIP": "10.0.0.5", "ports": [{"port": 80, "nodePort": 30080}]}})");
  json t = BuiltinTable("services", {headless, np}, "None", kNow);
  std::vector<std::string> names;
  for (const auto& c : t["columnDefinitions"]) names.push_back(c["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age", "Selector"}));
  EXPECT_EQ(t["rows"][0]["cells"],
            json::parse(R"(["job", "ClusterIP", "None", "<none>", "29500/TCP,53/UDP", "60m", "job=a"])"));
  EXPECT_EQ(t["rows"][1]["cells"],
            json::parse(R"(["np", "NodePort", "10.0.0.5", "<none>", "80:30080/TCP", "60m", "<none>"])"));
}

TEST(BuiltinTableTest, Events) {
  json ev = json::parse(R"({"metadata": {"name": "job.1", "creationTimestamp": "2024-05-01T11:00:00Z"},
      "type": "Warning", "reason": "BackOff", "message": " restarting failed container \n",
      "involvedObject": {"kind": "Pod", "name": "job-0", "fieldPath": "spec.containers{a}"},
      "source": {"component": "meshwork-agent", "host": "local-0"},
      "firstTimestamp": "2024-05-01T11:00:00Z", "lastTimestamp": "2024-05-01T11:58:00Z", "count": 4})");
  json t = BuiltinTable("events", {ev}, "None", kNow);
  EXPECT_EQ(t["columnDefinitions"][0]["name"], "Last Seen");
  EXPECT_EQ(t["rows"][0]["cells"],
            json::parse(R"(["2m", "Warning", "BackOff", "pod/job-0", "spec.containers{a}",
                            "meshwork-agent, local-0", "restarting failed container", "60m", "4", "job.1"])"));
}

TEST(BuiltinTableTest, DefaultConvertorShowsCreatedAt) {
  json crd = {{"metadata", {{"name", "trainingjobs.meshwork.dev"}, {"creationTimestamp", "2024-05-01T13:00:00+02:00"}}}};
  json t = BuiltinTable("customresourcedefinitions", {crd}, "Metadata", kNow);
  EXPECT_EQ(t["columnDefinitions"][1]["name"], "Created At");
  EXPECT_EQ(t["rows"][0]["cells"], json::parse(R"(["trainingjobs.meshwork.dev", "2024-05-01T11:00:00Z"])"));
  EXPECT_EQ(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
}

}  // namespace
}  // namespace meshwork::controlplane::schema

namespace meshwork::controlplane::schema {
namespace {

TEST(CheckPrinterColumnsTest, AcceptsTheTrainingJobColumns) {
  auto got = CheckPrinterColumns(TrainingJobVersion()["additionalPrinterColumns"],
                                 "spec.versions[0].additionalPrinterColumns");
  EXPECT_TRUE(got.empty()) << got.front().field << ": " << got.front().message;
  EXPECT_TRUE(CheckPrinterColumns(nullptr, "x").empty());
}

TEST(CheckPrinterColumnsTest, RefusesBadColumnsNamingTheField) {
  json cols = json::parse(R"([
    {"type": "string", "jsonPath": ".a"},
    {"name": "T", "type": "text", "jsonPath": ".a"},
    {"name": "F", "type": "string", "format": "percent", "jsonPath": ".a"},
    {"name": "P", "type": "string", "jsonPath": "status.phase"},
    {"name": "Q", "type": "string", "jsonPath": ".a[", "priority": -1}
  ])");
  const std::string p = "spec.versions[0].additionalPrinterColumns";
  std::vector<FieldCause> want = {
      {"FieldValueRequired", p + "[0].name", "Required value"},
      {"FieldValueInvalid", p + "[1].type", "Invalid value: \"text\": must be one of boolean,date,integer,number,string"},
      {"FieldValueInvalid", p + "[2].format",
       "Invalid value: \"percent\": must be one of byte,date,date-time,double,float,int32,int64,password"},
      {"FieldValueInvalid", p + "[3].jsonPath", "Invalid value: \"status.phase\": must be a simple json path starting with ."},
      {"FieldValueInvalid", p + "[4].jsonPath", "Invalid value: \".a[\": must be a simple json path starting with ."},
      {"FieldValueInvalid", p + "[4].priority", "Invalid value: -1: must be a non-negative 32-bit integer"},
  };
  auto got = CheckPrinterColumns(cols, p);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i << ": " << got[i].message;
}

}  // namespace
}  // namespace meshwork::controlplane::schema
