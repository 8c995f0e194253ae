// PodRuntime end to end: real processes (sh, sleep, python3), their statuses, restarts, logs,
// stopping, and per-pod name resolution through both mechanisms. Every wait is bounded.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "controlplane/agent/node_agent.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kWait = 30s;  // an upper bound, never an expectation

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = kWait) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return done();
}

json MakePod(const std::string& name, json command, const std::string& restart_policy = "Never") {
  static int counter = 0;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "team"}, {"uid", name + "-uid-" + std::to_string(++counter)}}},
          {"spec",
           {{"nodeName", "local"},
            {"restartPolicy", restart_policy},
            {"containers", {{{"name", "main"}, {"image", "busybox"}, {"command", command}}}}}}};
}

json Sh(const std::string& script) { return json::array({"sh", "-c", script}); }

std::string Uid(const json& pod) { return pod["metadata"]["uid"]; }

class PodRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/meshwork-agent-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    runtime_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  RuntimeOptions Options(Resolution resolution = Resolution::kAuto) {
    RuntimeOptions o;
    o.state_dir = dir_ + "/state";
    o.restart_backoff_initial = 100ms;  // kubelet's 10s, shortened so restarts happen within a test
    o.restart_backoff_max = 400ms;
    o.monitor_interval = 10ms;
    o.resolution = resolution;
    return o;
  }

  PodRuntime& Runtime(Resolution resolution = Resolution::kAuto) {
    if (!runtime_) {
      auto rt = PodRuntime::Create(Options(resolution));
      EXPECT_TRUE(rt.ok()) << rt.status().ToString();
      runtime_ = std::move(rt).value();
    }
    return *runtime_;
  }

  // Waits for the pod's status to satisfy `pred`; returns the last status seen.
  json WaitForStatus(const std::string& uid, const std::function<bool(const json&)>& pred) {
    json last;
    bool ok = WaitUntil([&] {
      last = runtime_->StatusOf(uid);
      return !last.is_null() && pred(last);
    });
    EXPECT_TRUE(ok) << "status never matched; last: " << last.dump(2);
    return last;
  }

  json WaitForPhase(const std::string& uid, const std::string& phase) {
    return WaitForStatus(uid, [&](const json& s) { return s["phase"] == phase; });
  }

  std::string Log(const std::string& uid) { return ReadFile(runtime_->LogPath(uid, "main")); }

  std::string dir_;
  std::unique_ptr<PodRuntime> runtime_;
};

TEST_F(PodRuntimeTest, FailingContainerReportsExitCodeAndKeepsItsLog) {
  json pod = MakePod("fail", Sh("echo hi; echo oops >&2; exit 3"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Failed");
  const json& c = s["containerStatuses"][0];
  EXPECT_EQ(c["name"], "main");
  EXPECT_EQ(c["state"]["terminated"]["exitCode"], 3);
  EXPECT_EQ(c["state"]["terminated"]["reason"], "Error");
  EXPECT_EQ(c["restartCount"], 0);
  EXPECT_EQ(c["ready"], false);
  EXPECT_EQ(c["image"], "busybox");
  EXPECT_EQ(Log(Uid(pod)), "hi\noops\n");
  EXPECT_EQ(runtime_->PreviousLogPath(Uid(pod), "main"), "");
  EXPECT_EQ(runtime_->LogPath(Uid(pod), "nope"), "");
  EXPECT_EQ(runtime_->LogPath("no-such-uid", "main"), "");
  // Its own loopback address, never the machine's 127.0.x.x.
  std::string ip = s["podIP"];
  EXPECT_EQ(ip.rfind("127.", 0), 0u) << ip;
  EXPECT_NE(ip.rfind("127.0.", 0), 0u) << ip;
  EXPECT_EQ(s["podIPs"][0]["ip"], ip);
  EXPECT_EQ(s["hostIP"], "127.0.0.1");
  EXPECT_EQ(s["qosClass"], "BestEffort");
  EXPECT_FALSE(s["startTime"].get<std::string>().empty());
  EXPECT_TRUE(runtime_->Stopped(Uid(pod)));
  bool ready_false = false;
  for (const json& cond : s["conditions"]) {
    if (cond["type"] == "Ready") ready_false = cond["status"] == "False" && cond["reason"] == "PodCompleted";
  }
  EXPECT_TRUE(ready_false) << s["conditions"].dump();
}

TEST_F(PodRuntimeTest, SucceedingContainerCompletes) {
  json pod = MakePod("ok", Sh("exit 0"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Succeeded");
  EXPECT_EQ(s["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
  EXPECT_EQ(s["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0);
}

TEST_F(PodRuntimeTest, RunningPodIsReady) {
  json pod = MakePod("run", Sh("exec sleep 1000"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Running");
  EXPECT_EQ(s["containerStatuses"][0]["ready"], true);
  EXPECT_EQ(s["containerStatuses"][0]["started"], true);
  EXPECT_TRUE(s["containerStatuses"][0]["state"].contains("running"));
  EXPECT_FALSE(runtime_->Stopped(Uid(pod)));
  int ready = 0;
  for (const json& cond : s["conditions"]) {
    if ((cond["type"] == "Ready" || cond["type"] == "ContainersReady") && cond["status"] == "True") ++ready;
  }
  EXPECT_EQ(ready, 2) << s["conditions"].dump();
}

TEST_F(PodRuntimeTest, OnFailureRestartsUntilSuccessAndCounts) {
  // Fails twice, then succeeds: a counter file in the working directory survives restarts.
  json pod = MakePod("flaky", Sh("n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; "
                                 "echo attempt $n; [ $n -ge 3 ]"),
                     "OnFailure");
  pod["spec"]["containers"][0]["workingDir"] = dir_;
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Succeeded");
  const json& c = s["containerStatuses"][0];
  EXPECT_EQ(c["restartCount"], 2);
  EXPECT_EQ(c["state"]["terminated"]["exitCode"], 0);
  EXPECT_EQ(c["lastState"]["terminated"]["exitCode"], 1);
  EXPECT_EQ(Log(Uid(pod)), "attempt 3\n");
  EXPECT_EQ(ReadFile(runtime_->PreviousLogPath(Uid(pod), "main")), "attempt 2\n");
}

TEST_F(PodRuntimeTest, OnFailureBacksOffAndReportsCrashLoop) {
  json pod = MakePod("crash", Sh("echo crashed; exit 1"), "OnFailure");
  ASSERT_TRUE(Runtime().Start(pod).ok());
  bool saw_backoff = false;
  json s = WaitForStatus(Uid(pod), [&](const json& st) {
    const json& c = st["containerStatuses"][0];
    if (c["state"].contains("waiting") && c["state"]["waiting"]["reason"] == "CrashLoopBackOff") saw_backoff = true;
    return c["restartCount"].get<int>() >= 3 && saw_backoff;
  });
  EXPECT_EQ(s["phase"], "Running");
  EXPECT_EQ(s["containerStatuses"][0]["lastState"]["terminated"]["exitCode"], 1);
}

TEST_F(PodRuntimeTest, AlwaysRestartsEvenAfterSuccess) {
  json pod = MakePod("always", Sh("exit 0"), "Always");
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForStatus(Uid(pod), [](const json& st) { return st["containerStatuses"][0]["restartCount"] >= 2; });
  EXPECT_EQ(s["phase"], "Running");
}

TEST_F(PodRuntimeTest, NeverDoesNotRestart) {
  json pod = MakePod("never", Sh("exit 1"), "Never");
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Failed");
  // Several backoff periods later there is still no restart.
  std::this_thread::sleep_for(600ms);
  json s = runtime_->StatusOf(Uid(pod));
  EXPECT_EQ(s["phase"], "Failed");
  EXPECT_EQ(s["containerStatuses"][0]["restartCount"], 0);
  EXPECT_EQ(runtime_->PreviousLogPath(Uid(pod), "main"), "");
}

TEST_F(PodRuntimeTest, EnvFieldRefsAndExpansionReachTheProcess) {
  json pod = MakePod("envy", Sh("echo \"$GREETING|$WHO|$POD|$NS|$UID_|$IP|$NODE|$APP|$MISSING_REF|$HOSTNAME|$0\""));
  pod["metadata"]["labels"] = {{"app", "trainer"}};
  pod["spec"]["containers"][0]["args"] = {"$(WHO)-arg"};
  pod["spec"]["containers"][0]["env"] = json::parse(R"J([
    {"name": "WHO", "value": "world"},
    {"name": "GREETING", "value": "hello $(WHO) $$(WHO)"},
    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "UID_", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
    {"name": "MISSING_REF", "value": "$(NOT_DEFINED)"}
  ])J");
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Succeeded");
  std::string want = "hello world $(WHO)|world|envy|team|" + Uid(pod) + "|" + s["podIP"].get<std::string>() +
                     "|local|trainer|$(NOT_DEFINED)|envy|world-arg\n";
  EXPECT_EQ(Log(Uid(pod)), want);
}

// The device plugin's part: GPUs of the Pod's node handed to containers that ask for them, in
// CUDA_VISIBLE_DEVICES, freed again when a container has stopped for good; none for the rest.
TEST_F(PodRuntimeTest, GpuContainersGetTheirOwnDevicesOfTheNode) {
  RuntimeOptions o = Options();
  o.node_gpus = {{"local", 3}};
  auto rt = PodRuntime::Create(o);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  runtime_ = std::move(rt).value();
  auto gpu_pod = [](const std::string& name, int gpus, const std::string& script) {
    json pod = MakePod(name, Sh("echo \"[$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES]\"; " + script));
    pod["spec"]["containers"][0]["resources"] = {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}}};
    return pod;
  };
  json two = gpu_pod("two", 2, "sleep 30");
  ASSERT_TRUE(runtime_->Start(two).ok());
  json one = gpu_pod("one", 1, "exit 0");
  ASSERT_TRUE(runtime_->Start(one).ok());
  WaitForPhase(Uid(one), "Succeeded");
  WaitForPhase(Uid(two), "Running");
  EXPECT_TRUE(WaitUntil([&] { return Log(Uid(two)) == "[0,1|0,1]\n"; })) << Log(Uid(two));
  EXPECT_EQ(ReadFile(runtime_->LogPath(Uid(one), "main")), "[2|2]\n");

  // "one" has finished: its device is free again; then the node has none left.
  json again = gpu_pod("again", 1, "sleep 30");
  ASSERT_TRUE(runtime_->Start(again).ok());
  WaitForPhase(Uid(again), "Running");
  EXPECT_TRUE(WaitUntil([&] { return ReadFile(runtime_->LogPath(Uid(again), "main")) == "[2|2]\n"; }));
  const Status full = runtime_->Start(gpu_pod("full", 1, "exit 0"));
  EXPECT_EQ(full.code(), StatusCode::kUnavailable);
  EXPECT_NE(full.message().find("spec.containers[0] asks for 1 nvidia.com/gpu but node \"local\" has 3 and 0 of them free"),
            std::string::npos)
      << full.message();

  // No request: no GPU visible; the container's own env still wins.
  json none = MakePod("none", Sh("echo \"[$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES]\""));
  ASSERT_TRUE(runtime_->Start(none).ok());
  WaitForPhase(Uid(none), "Succeeded");
  EXPECT_EQ(ReadFile(runtime_->LogPath(Uid(none), "main")), "[|void]\n");
  json own = MakePod("own", Sh("echo \"[$CUDA_VISIBLE_DEVICES]\""));
  own["spec"]["containers"][0]["env"] = {{{"name", "CUDA_VISIBLE_DEVICES"}, {"value", "7"}}};
  ASSERT_TRUE(runtime_->Start(own).ok());
  WaitForPhase(Uid(own), "Succeeded");
  EXPECT_EQ(ReadFile(runtime_->LogPath(Uid(own), "main")), "[7]\n");
  runtime_->Stop(Uid(two), 0);
  runtime_->Stop(Uid(again), 0);
}

TEST_F(PodRuntimeTest, BadEnvIsAContainerConfigErrorNotACrash) {
  json pod = MakePod("badenv", Sh("exit 0"));
  pod["spec"]["containers"][0]["env"] = json::parse(
      R"([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nonsense"}}}])");
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForStatus(Uid(pod), [](const json& st) {
    return st["containerStatuses"][0]["state"].contains("waiting") &&
           st["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError";
  });
  EXPECT_EQ(s["phase"], "Pending");
  EXPECT_NE(s["containerStatuses"][0]["state"]["waiting"]["message"].get<std::string>().find("spec.nonsense"),
            std::string::npos);
}

TEST_F(PodRuntimeTest, ConfigMapRefsGoThroughTheResolver) {
  RuntimeOptions o = Options();
  o.data_source = [](const std::string& kind, const std::string& ns,
                     const std::string& name) -> Result<std::map<std::string, std::string>> {
    if (kind == "ConfigMap" && ns == "team" && name == "cfg") return std::map<std::string, std::string>{{"lr", "0.1"}};
    return NotFound(kind + " " + ns + "/" + name + " not found");
  };
  auto rt = PodRuntime::Create(o);
  ASSERT_TRUE(rt.ok());
  runtime_ = std::move(rt).value();
  json pod = MakePod("cm", Sh("echo lr=$LR"));
  pod["spec"]["containers"][0]["env"] = json::parse(R"([
    {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "lr"}}},
    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "absent", "optional": true}}}])");
  ASSERT_TRUE(runtime_->Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  EXPECT_EQ(Log(Uid(pod)), "lr=0.1\n");
}

// configMap and secret volumes become files in the Pod's directory (items, modes, subPath), an
// emptyDir is a directory there, and paths under a mountPath in args, env and workingDir lead
// there.
TEST_F(PodRuntimeTest, VolumesAreWrittenAndTheirMountPathsLeadToThem) {
  RuntimeOptions o = Options();
  o.data_source = [](const std::string& kind, const std::string& ns,
                     const std::string& name) -> Result<std::map<std::string, std::string>> {
    if (kind == "ConfigMap" && ns == "team" && name == "cfg") {
      return std::map<std::string, std::string>{{"config.yaml", "lr: 0.1\n"}, {"other", "x"}};
    }
    if (kind == "Secret" && ns == "team" && name == "creds") return std::map<std::string, std::string>{{"token", "s3cr3t"}};
    return NotFound(kind + " " + ns + "/" + name + " not found");
  };
  auto rt = PodRuntime::Create(o);
  ASSERT_TRUE(rt.ok());
  runtime_ = std::move(rt).value();
  json pod = MakePod("vol", Sh("cat /etc/cfg/config.yaml; cat $TOKEN_FILE; ls /etc/cfg; "
                               "stat -c %a /etc/cfg/config.yaml /run/creds/token; cat /etc/single; pwd | grep -c /volumes/scratch; "
                               "echo run >> /scratch/runs; cat /scratch/runs; ls /data 2>&1 | grep -c 'No such file'"));
  pod["metadata"]["namespace"] = "team";
  pod["spec"]["volumes"] = json::parse(R"([
    {"name": "config", "configMap": {"name": "cfg", "items": [{"key": "config.yaml", "path": "config.yaml", "mode": 384}]}},
    {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 256}},
    {"name": "scratch", "emptyDir": {}},
    {"name": "whole", "configMap": {"name": "cfg"}},
    {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}}])");
  pod["spec"]["containers"][0]["volumeMounts"] = json::parse(R"([
    {"name": "config", "mountPath": "/etc/cfg/"},
    {"name": "creds", "mountPath": "/run/creds", "readOnly": true},
    {"name": "whole", "mountPath": "/etc/single", "subPath": "other"},
    {"name": "scratch", "mountPath": "/scratch"},
    {"name": "claim", "mountPath": "/data"}])");
  pod["spec"]["containers"][0]["env"] = json::parse(R"([{"name": "TOKEN_FILE", "value": "/run/creds/token"}])");
  pod["spec"]["containers"][0]["workingDir"] = "/scratch";
  ASSERT_TRUE(runtime_->Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  // (/data, a persistentVolumeClaim, is not provided: the machine's own /data, which is not there.)
  // (The secret's and the subPath file's values have no newline of their own.)
  EXPECT_EQ(Log(Uid(pod)), "lr: 0.1\ns3cr3tconfig.yaml\n600\n400\nx1\nrun\n1\n");
}

TEST_F(PodRuntimeTest, BadVolumeMountsAreConfigErrorsNamingTheField) {
  RuntimeOptions o = Options();
  o.data_source = [](const std::string& kind, const std::string& ns,
                     const std::string& name) -> Result<std::map<std::string, std::string>> {
    return NotFound(kind + " " + ns + "/" + name + " not found");
  };
  auto rt = PodRuntime::Create(o);
  ASSERT_TRUE(rt.ok());
  runtime_ = std::move(rt).value();
  const std::vector<std::pair<json, std::string>> cases = {
      {json::parse(R"({"volumes": [], "mounts": [{"name": "x", "mountPath": "/x"}]})"),
       "volumeMounts[0]: no volume named \"x\" in spec.volumes"},
      {json::parse(R"({"volumes": [{"name": "x", "emptyDir": {}}], "mounts": [{"name": "x", "mountPath": "rel"}]})"),
       "volumeMounts[0].mountPath \"rel\" must be an absolute path other than /"},
      {json::parse(R"({"volumes": [{"name": "x", "configMap": {"name": "gone"}}], "mounts": [{"name": "x", "mountPath": "/x"}]})"),
       "spec.volumes[0].configMap: ConfigMap team/gone not found"},
      {json::parse(R"({"volumes": [{"name": "x", "emptyDir": {}}], "mounts": [{"name": "x", "mountPath": "/x", "subPath": "../up"}]})"),
       "volumeMounts[0].subPath \"../up\" must be a relative path without .."},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    json pod = MakePod("badvol" + std::to_string(i), Sh("exit 0"));
    pod["spec"]["volumes"] = cases[i].first["volumes"];
    pod["spec"]["containers"][0]["volumeMounts"] = cases[i].first["mounts"];
    ASSERT_TRUE(runtime_->Start(pod).ok());
    json st = WaitForStatus(Uid(pod), [](const json& s) {
      return s["containerStatuses"][0]["state"].contains("waiting") &&
             s["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError";
    });
    EXPECT_EQ(st["containerStatuses"][0]["state"]["waiting"]["message"], cases[i].second);
  }
  // An optional ConfigMap that is missing is an empty directory.
  json pod = MakePod("optional", Sh("ls -A /x | wc -l"));
  pod["spec"]["volumes"] = json::parse(R"([{"name": "x", "configMap": {"name": "gone", "optional": true}}])");
  pod["spec"]["containers"][0]["volumeMounts"] = json::parse(R"([{"name": "x", "mountPath": "/x"}])");
  ASSERT_TRUE(runtime_->Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  EXPECT_EQ(Log(Uid(pod)), "0\n");
}

TEST_F(PodRuntimeTest, AThrowingResolverIsAConfigErrorNotACrash) {
  RuntimeOptions o = Options();
  o.data_source = [](const std::string&, const std::string&,
                     const std::string&) -> Result<std::map<std::string, std::string>> {
    throw std::runtime_error("store exploded");
  };
  auto rt = PodRuntime::Create(o);
  ASSERT_TRUE(rt.ok());
  runtime_ = std::move(rt).value();
  json pod = MakePod("throws", Sh("exit 0"));
  pod["spec"]["containers"][0]["env"] =
      json::parse(R"([{"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "lr"}}}])");
  ASSERT_TRUE(runtime_->Start(pod).ok());
  json s = WaitForStatus(Uid(pod), [](const json& st) {
    return st["containerStatuses"][0]["state"].contains("waiting") &&
           st["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError";
  });
  EXPECT_NE(s["containerStatuses"][0]["state"]["waiting"]["message"].get<std::string>().find("store exploded"),
            std::string::npos);
}

TEST_F(PodRuntimeTest, WorkingDirIsHonoured) {
  std::string wd = dir_ + "/work dir";
  std::filesystem::create_directories(wd);
  json pod = MakePod("wd", Sh("pwd"));
  pod["spec"]["containers"][0]["workingDir"] = wd;
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  EXPECT_EQ(Log(Uid(pod)), wd + "\n");
}

TEST_F(PodRuntimeTest, ServiceAccountDirHoldsTokenCaAndNamespace) {
  RuntimeOptions o = Options();
  o.service_account = ServiceAccountCredentials{"secret-token", "-----BEGIN CERTIFICATE-----\nX\n"};
  auto rt = PodRuntime::Create(o);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  runtime_ = std::move(rt).value();
  json pod = MakePod("sa", Sh("echo \"dir=$MESHWORK_SERVICE_ACCOUNT_DIR\"; cat \"$MESHWORK_SERVICE_ACCOUNT_DIR/namespace\""));
  ASSERT_TRUE(runtime_->Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  std::string dir = dir_ + "/state/pods/" + Uid(pod) + "/serviceaccount";
  EXPECT_EQ(Log(Uid(pod)), "dir=" + dir + "\nteam");
  EXPECT_EQ(ReadFile(dir + "/token"), "secret-token");
  EXPECT_EQ(ReadFile(dir + "/ca.crt"), "-----BEGIN CERTIFICATE-----\nX\n");
  EXPECT_EQ(ReadFile(dir + "/namespace"), "team");
  namespace fs = std::filesystem;
  EXPECT_EQ(fs::status(dir + "/token").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);

  // automountServiceAccountToken: false: no directory and no variable.
  json opted_out = MakePod("no-sa", Sh("echo \"dir=$MESHWORK_SERVICE_ACCOUNT_DIR\""));
  opted_out["spec"]["automountServiceAccountToken"] = false;
  ASSERT_TRUE(runtime_->Start(opted_out).ok());
  WaitForPhase(Uid(opted_out), "Succeeded");
  EXPECT_EQ(Log(Uid(opted_out)), "dir=\n");
  EXPECT_FALSE(fs::exists(dir_ + "/state/pods/" + Uid(opted_out) + "/serviceaccount"));
}

TEST_F(PodRuntimeTest, NoServiceAccountDirWithoutCredentials) {
  json pod = MakePod("plain", Sh("echo \"dir=$MESHWORK_SERVICE_ACCOUNT_DIR\""));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  EXPECT_EQ(Log(Uid(pod)), "dir=\n");
}

TEST_F(PodRuntimeTest, MissingWorkingDirIsAStartError) {
  json pod = MakePod("nowd", Sh("pwd"));
  pod["spec"]["containers"][0]["workingDir"] = dir_ + "/does-not-exist";
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Failed");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["reason"], "StartError");
  EXPECT_NE(t["message"].get<std::string>().find("does-not-exist"), std::string::npos) << t.dump();
}

TEST_F(PodRuntimeTest, MissingExecutableTerminatesWith127) {
  json pod = MakePod("noexe", json::array({"no-such-program-meshwork", "--flag"}));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json s = WaitForPhase(Uid(pod), "Failed");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["exitCode"], 127);
  EXPECT_EQ(t["reason"], "StartError");
  EXPECT_NE(t["message"].get<std::string>().find("executable file not found"), std::string::npos) << t.dump();
  EXPECT_EQ(Log(Uid(pod)), "");

  json abs = MakePod("noexe-abs", json::array({"/no/such/program"}));
  ASSERT_TRUE(runtime_->Start(abs).ok());
  EXPECT_EQ(WaitForPhase(Uid(abs), "Failed")["containerStatuses"][0]["state"]["terminated"]["exitCode"], 127);

  json none = MakePod("nocmd", json::array());
  ASSERT_TRUE(runtime_->Start(none).ok());
  json n = WaitForPhase(Uid(none), "Failed");
  EXPECT_NE(n["containerStatuses"][0]["state"]["terminated"]["message"].get<std::string>().find("no command"),
            std::string::npos);

  // Without an image there is no entrypoint: args alone are the command line.
  json args_only = MakePod("argsonly", json::array());
  args_only["spec"]["containers"][0]["args"] = {"sh", "-c", "echo from-args; exit 4"};
  ASSERT_TRUE(runtime_->Start(args_only).ok());
  json a = WaitForPhase(Uid(args_only), "Failed");
  EXPECT_EQ(a["containerStatuses"][0]["state"]["terminated"]["exitCode"], 4) << a.dump();
  EXPECT_EQ(Log(Uid(args_only)), "from-args\n");
}

TEST_F(PodRuntimeTest, StopEndsTheProcessAndItsChildren) {
  json pod = MakePod("sleeper", Sh("sleep 1000 & echo $! > child.pid; wait"), "Always");
  pod["spec"]["containers"][0]["workingDir"] = dir_;
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Running");
  std::string pid_file = dir_ + "/child.pid";
  ASSERT_TRUE(WaitUntil([&] { return !ReadFile(pid_file).empty(); }));
  pid_t child = std::stoi(ReadFile(pid_file));
  ASSERT_EQ(kill(child, 0), 0);
  runtime_->Stop(Uid(pod), 10);
  ASSERT_TRUE(WaitUntil([&] { return runtime_->Stopped(Uid(pod)); }));
  json s = runtime_->StatusOf(Uid(pod));
  EXPECT_EQ(s["phase"], "Failed");  // SIGTERM is exit code 143, and Always does not restart a stopped pod
  EXPECT_EQ(s["containerStatuses"][0]["state"]["terminated"]["exitCode"], 143);
  EXPECT_EQ(s["containerStatuses"][0]["restartCount"], 0);
  // The background `sleep` got the signal too (same process group); init reaps it.
  EXPECT_TRUE(WaitUntil([&] { return kill(child, 0) != 0; })) << "child " << child << " survived";
}

TEST_F(PodRuntimeTest, StopKillsAProcessThatIgnoresSigtermAfterTheGrace) {
  json pod = MakePod("stubborn", Sh("trap '' TERM; echo ready; while true; do sleep 0.05; done"));
  pod["spec"]["terminationGracePeriodSeconds"] = 1;
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Running");
  ASSERT_TRUE(WaitUntil([&] { return Log(Uid(pod)) == "ready\n"; }));  // the trap is in place
  runtime_->Stop(Uid(pod), std::nullopt);  // the pod's own 1s grace
  ASSERT_TRUE(WaitUntil([&] { return runtime_->Stopped(Uid(pod)); }));
  json t = runtime_->StatusOf(Uid(pod))["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["exitCode"], 137) << t.dump();
  EXPECT_EQ(t["signal"], 9);
}

TEST_F(PodRuntimeTest, StopWithZeroGraceKillsAtOnceAndRemoveForgets) {
  json pod = MakePod("zero", Sh("trap '' TERM; while true; do sleep 0.05; done"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Running");
  runtime_->Stop(Uid(pod), 0);
  ASSERT_TRUE(WaitUntil([&] { return runtime_->Stopped(Uid(pod)); }));
  EXPECT_EQ(runtime_->StatusOf(Uid(pod))["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137);
  std::string log = runtime_->LogPath(Uid(pod), "main");
  runtime_->Remove(Uid(pod));
  ASSERT_TRUE(WaitUntil([&] { return runtime_->StatusOf(Uid(pod)).is_null(); }));
  EXPECT_EQ(runtime_->LogPath(Uid(pod), "main"), "");
  EXPECT_FALSE(std::filesystem::exists(log));
}

TEST_F(PodRuntimeTest, PollReportsEachChangeOnce) {
  json pod = MakePod("poll", Sh("exit 0"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  std::vector<std::string> phases;
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& [uid, status] : runtime_->Poll()) {
      EXPECT_EQ(uid, Uid(pod));
      phases.push_back(status["phase"]);
    }
    return !phases.empty() && phases.back() == "Succeeded";
  }));
  EXPECT_TRUE(runtime_->Poll().empty()) << "nothing changed since the last Poll";
}

// SetHosts rewrites the hosts files of the Pods that may still run, not of finished ones (kept
// finished Pods, each file listing every name, made each change cost O(Pods x names)).
TEST_F(PodRuntimeTest, SetHostsSkipsFinishedPods) {
  json done = MakePod("done", Sh("true"));
  json running = MakePod("running", Sh("while true; do sleep 0.05; done"));
  ASSERT_TRUE(Runtime().Start(done).ok());
  ASSERT_TRUE(runtime_->Start(running).ok());
  WaitForPhase(Uid(done), "Succeeded");
  WaitForPhase(Uid(running), "Running");
  runtime_->SetHosts({{"late.job.team.svc", "127.1.2.3"}});
  auto hosts_file = [&](const json& pod) { return ReadFile(dir_ + "/state/pods/" + Uid(pod) + "/hosts"); };
  EXPECT_NE(hosts_file(running).find("127.1.2.3"), std::string::npos) << hosts_file(running);
  EXPECT_EQ(hosts_file(done).find("127.1.2.3"), std::string::npos) << hosts_file(done);
  EXPECT_NE(hosts_file(done).find("localhost"), std::string::npos) << "the finished Pod's file is still there";
}

// A finished Pod's reported status is its last (Poll builds it no more): stopping it for its
// deletion changes nothing in it, and StatusOf, built anew, is the same object.
TEST_F(PodRuntimeTest, AFinishedPodsStatusChangesNoMore) {
  json pod = MakePod("final", Sh("exit 3"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  json last;
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& [uid, status] : runtime_->Poll()) last = status;
    return last.is_object() && last["phase"] == "Failed";
  }));
  runtime_->Stop(Uid(pod), 0);
  ASSERT_TRUE(WaitUntil([&] { return runtime_->Stopped(Uid(pod)); }));
  EXPECT_TRUE(runtime_->Poll().empty());
  EXPECT_EQ(runtime_->StatusOf(Uid(pod)), last);
}

TEST_F(PodRuntimeTest, StartRefusesBadPodsNamingTheField) {
  PodRuntime& rt = Runtime();
  json pod = MakePod("bad", Sh("true"));
  json no_uid = pod;
  no_uid["metadata"].erase("uid");
  EXPECT_NE(rt.Start(no_uid).message().find("metadata.uid"), std::string::npos);
  json policy = pod;
  policy["spec"]["restartPolicy"] = "Sometimes";
  EXPECT_NE(rt.Start(policy).message().find("\"Sometimes\""), std::string::npos);
  json dup = pod;
  dup["spec"]["containers"].push_back(dup["spec"]["containers"][0]);
  EXPECT_NE(rt.Start(dup).message().find("spec.containers[1].name"), std::string::npos);
  json none = pod;
  none["spec"]["containers"] = json::array();
  EXPECT_NE(rt.Start(none).message().find("spec.containers"), std::string::npos);
  EXPECT_FALSE(rt.Start(json("pod")).ok());
  EXPECT_TRUE(rt.StatusOf(Uid(pod)).is_null());
  // Starting the same uid twice is harmless.
  ASSERT_TRUE(rt.Start(pod).ok());
  ASSERT_TRUE(rt.Start(pod).ok());
}

TEST_F(PodRuntimeTest, CreateRefusesBadOptions) {
  RuntimeOptions o = Options();
  o.first_pod_ip = "127.0.0.1";
  EXPECT_FALSE(PodRuntime::Create(o).ok());
  o.first_pod_ip = "10.0.0.1";
  EXPECT_FALSE(PodRuntime::Create(o).ok());
  o.first_pod_ip = "";
  o.state_dir = "";
  EXPECT_NE(PodRuntime::Create(o).status().message().find("state_dir"), std::string::npos);
  o = Options(Resolution::kPreload);
  o.preload_library = dir_ + "/missing.so";
  EXPECT_NE(PodRuntime::Create(o).status().message().find("missing.so"), std::string::npos);
}

TEST_F(PodRuntimeTest, DestroyingTheRuntimeStopsItsPods) {
  // "$$" is Kubernetes' escape for "$", so the shell sees "echo $$".
  json pod = MakePod("orphan", Sh("echo $$$$; exec sleep 1000"));
  ASSERT_TRUE(Runtime().Start(pod).ok());
  WaitForPhase(Uid(pod), "Running");
  ASSERT_TRUE(WaitUntil([&] { return !Log(Uid(pod)).empty(); }));
  std::string first_line = Log(Uid(pod));
  ASSERT_FALSE(first_line.empty() || !isdigit(static_cast<unsigned char>(first_line[0]))) << "log: " << first_line;
  pid_t pid = std::stoi(first_line);
  ASSERT_EQ(kill(pid, 0), 0);
  runtime_.reset();
  EXPECT_TRUE(WaitUntil([&] { return kill(pid, 0) != 0; })) << "pid " << pid << " survived the runtime";
}

TEST_F(PodRuntimeTest, EveryPodGetsItsOwnAddress) {
  json a = MakePod("a", Sh("exit 0"));
  json b = MakePod("b", Sh("exit 0"));
  ASSERT_TRUE(Runtime().Start(a).ok());
  ASSERT_TRUE(runtime_->Start(b).ok());
  EXPECT_NE(runtime_->PodIP(Uid(a)), runtime_->PodIP(Uid(b)));
  RuntimeOptions o = Options();
  o.state_dir = dir_ + "/pinned";
  o.first_pod_ip = "127.9.8.7";
  auto pinned = PodRuntime::Create(o);
  ASSERT_TRUE(pinned.ok());
  json c = MakePod("c", Sh("exit 0"));
  ASSERT_TRUE((*pinned)->Start(c).ok());
  EXPECT_EQ((*pinned)->PodIP(Uid(c)), "127.9.8.7");
}

// ---- name resolution ------------------------------------------------------------------------

// The server pod answers one line on its own IP; the client pod finds it by its headless-Service
// name, then waits for a name that only appears after it started (SetHosts while it runs).
constexpr const char* kServer = R"(
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((os.environ["POD_IP"], 18080))
s.listen(4)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hello from " + socket.gethostname().encode() + b"\n")
    c.close()
)";

constexpr const char* kClient = R"(
import socket, subprocess, time
def ask(name):
    ip = socket.getaddrinfo(name, 18080, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    c = socket.create_connection((ip, 18080), timeout=5)
    print(name, ip, c.makefile().readline().strip(), flush=True)
ask("job-0.job.team.svc")
ask("job-0.job.team.svc.cluster.local")
ask("job-0.job")
print("getent", subprocess.run(["getent", "hosts", "job-0.job.team.svc"], capture_output=True, text=True).stdout.split()[0], flush=True)
print("gethostbyname", socket.gethostbyname("job-0.job.team.svc"), flush=True)
print("waiting", flush=True)
for _ in range(600):
    try:
        print("late", socket.getaddrinfo("late.job.team.svc", 1, socket.AF_INET)[0][4][0], flush=True)
        break
    except socket.gaierror:
        time.sleep(0.05)
)";

class ResolutionTest : public PodRuntimeTest, public ::testing::WithParamInterface<Resolution> {};

TEST_P(ResolutionTest, PodsReachEachOtherByHeadlessServiceNames) {
  if (system("python3 -c 'import socket' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 is not installed";
  auto rt = PodRuntime::Create(Options(GetParam()));
  if (!rt.ok() && GetParam() == Resolution::kMountNamespace) {
    GTEST_SKIP() << "no private mount namespace here: " << rt.status().message();
  }
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  runtime_ = std::move(rt).value();
  ASSERT_EQ(runtime_->resolution(), GetParam());

  json server = MakePod("job-0", json::array({"python3", "-c", kServer}), "Never");
  server["spec"]["hostname"] = "job-0";
  server["spec"]["subdomain"] = "job";
  server["spec"]["containers"][0]["env"] =
      json::parse(R"([{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}])");
  ASSERT_TRUE(runtime_->Start(server).ok());
  ASSERT_TRUE(WaitUntil([&] { return Log(Uid(server)).find("listening") != std::string::npos; }))
      << Log(Uid(server));
  json server_with_ip = server;
  server_with_ip["status"]["podIP"] = runtime_->PodIP(Uid(server));
  auto hosts = HeadlessServiceHosts(
      {server_with_ip}, {{{"metadata", {{"name", "job"}, {"namespace", "team"}}}, {"spec", {{"clusterIP", "None"}}}}});
  ASSERT_EQ(hosts.size(), 1u);
  runtime_->SetHosts(hosts);

  json client = MakePod("client", json::array({"python3", "-c", kClient}), "Never");
  ASSERT_TRUE(runtime_->Start(client).ok());
  ASSERT_TRUE(WaitUntil([&] { return Log(Uid(client)).find("waiting") != std::string::npos ||
                                     runtime_->StatusOf(Uid(client))["phase"] == "Failed"; }))
      << Log(Uid(client));
  const std::string ip = runtime_->PodIP(Uid(server));
  std::string hello = GetParam() == Resolution::kMountNamespace ? "hello from job-0" : "hello from ";
  std::string log = Log(Uid(client));
  EXPECT_NE(log.find("job-0.job.team.svc " + ip + " " + hello), std::string::npos) << log;
  EXPECT_NE(log.find("job-0.job.team.svc.cluster.local " + ip), std::string::npos) << log;
  EXPECT_NE(log.find("job-0.job " + ip), std::string::npos) << log;
  EXPECT_NE(log.find("getent " + ip), std::string::npos) << log;
  EXPECT_NE(log.find("gethostbyname " + ip), std::string::npos) << log;

  // A name added while the client runs is seen at its next lookup.
  hosts["late.job.team.svc"] = "127.1.2.3";
  runtime_->SetHosts(hosts);
  WaitForPhase(Uid(client), "Succeeded");
  EXPECT_NE(Log(Uid(client)).find("late 127.1.2.3"), std::string::npos) << Log(Uid(client));
}

TEST_F(PodRuntimeTest, HostnameIsThePodsInAMountNamespace) {
  auto rt = PodRuntime::Create(Options(Resolution::kMountNamespace));
  if (!rt.ok()) GTEST_SKIP() << "no private mount namespace here: " << rt.status().message();
  runtime_ = std::move(rt).value();
  json pod = MakePod("named", Sh("cat /proc/sys/kernel/hostname"));
  pod["spec"]["hostname"] = "worker-3";
  ASSERT_TRUE(runtime_->Start(pod).ok());
  WaitForPhase(Uid(pod), "Succeeded");
  EXPECT_EQ(Log(Uid(pod)), "worker-3\n");
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, ResolutionTest,
                         ::testing::Values(Resolution::kMountNamespace, Resolution::kPreload),
                         [](const ::testing::TestParamInfo<Resolution>& info) {
                           return info.param == Resolution::kMountNamespace ? std::string("MountNamespace")
                                                                            : std::string("Preload");
                         });

}  // namespace
}  // namespace meshwork::controlplane::agent
