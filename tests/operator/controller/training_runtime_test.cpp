// A TrainingRuntime merged under a TrainingJob (training_runtime.cpp): which side wins per field,
// Pod templates merged by name, the default config merged key by key, and the errors.
#include "operator/controller/training_runtime.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/controller/desired.h"
#include "operator/controller/spec.h"
#include "trainer/config/config.h"

namespace meshwork::op {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Runtime(json spec) {
  return {{"apiVersion", "meshwork.dev/v1alpha1"}, {"kind", "TrainingRuntime"}, {"metadata", {{"name", "gpu-pool"}}},
          {"spec", std::move(spec)}};
}

json Job(json spec) {
  spec["runtimeRef"] = {{"name", "gpu-pool"}};
  return {{"metadata", {{"name", "j"}, {"namespace", "ml"}, {"uid", "u"}}}, {"spec", std::move(spec)}};
}

TEST(TrainingRuntimeTest, TheJobsValueWinsAndTheRuntimeFillsTheRest) {
  const json rt = Runtime({{"image", "registry/trainer:1.2"},
                           {"imagePullPolicy", "IfNotPresent"},
                           {"device", "cpu"},
                           {"processesPerReplica", 4},
                           {"metricsPort", 9500},
                           {"resources", {{"limits", {{"cpu", "8"}, {"memory", "32Gi"}}}}},
                           {"checkpoint", {{"path", "/ckpt"}, {"every", 100}}},
                           {"runPolicy",
                            {{"backoffLimit", 5},
                             {"restartPolicy", "OnFailure"},
                             {"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onExitCodes", {{"values", {3}}}}}}}}}}},
                           {"config", {{"inline", "model: {preset: tiny}\n"}}}});
  const json job = Job({{"replicas", 2},
                        {"device", "gpu"},
                        {"resources", {{"limits", {{"memory", "64Gi"}}}}},
                        {"checkpoint", {{"every", 10}}},
                        {"runPolicy", {{"backoffLimit", 1}}},
                        {"config", {{"inline", "schedule: {steps: 7}\n"}}}});
  auto merged = ApplyRuntime(job, rt);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  const json& s = (*merged)["spec"];
  EXPECT_EQ(s["image"], "registry/trainer:1.2");
  EXPECT_EQ(s["imagePullPolicy"], "IfNotPresent");
  EXPECT_EQ(s["device"], "gpu");  // the job's
  EXPECT_EQ(s["processesPerReplica"], 4);
  EXPECT_EQ(s["metricsPort"], 9500);
  EXPECT_EQ(s["resources"], json::parse(R"({"limits": {"cpu": "8", "memory": "64Gi"}})"));
  EXPECT_EQ(s["checkpoint"], json::parse(R"({"path": "/ckpt", "every": 10})"));
  EXPECT_EQ(s["runPolicy"]["backoffLimit"], 1);
  EXPECT_EQ(s["runPolicy"]["restartPolicy"], "OnFailure");
  EXPECT_EQ(s["runPolicy"]["failurePolicy"]["rules"].size(), 1u);
  EXPECT_EQ(s["replicas"], 2);
  // The merged spec is a job's spec like any other.
  auto spec = ParseSpec(*merged);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->runtime_name, "gpu-pool");
  EXPECT_EQ(spec->WorldSize(), 8);
  EXPECT_EQ(spec->backoff_limit, 1);
  // The config: the runtime's keys under the job's.
  auto config = config::LoadConfigFromString(spec->config_inline, {});
  ASSERT_TRUE(config.ok()) << config.status().message() << "\n" << spec->config_inline;
  EXPECT_EQ(config->schedule.steps, 7);
  EXPECT_EQ(config->model.preset, "tiny");
}

TEST(TrainingRuntimeTest, AJobWithoutAConfigTakesTheRuntimesAndAConfigMapRefCannotMergeWithIt) {
  const json rt = Runtime({{"image", "i"}, {"config", {{"inline", "model: {preset: tiny}\n"}}}});
  auto merged = ApplyRuntime(Job({{"replicas", 1}}), rt);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ((*merged)["spec"]["config"], json({{"inline", "model: {preset: tiny}\n"}}));

  auto refused = ApplyRuntime(Job({{"config", {{"configMapRef", {{"name", "cm"}}}}}}), rt);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.config.configMapRef: TrainingRuntime gpu-pool sets a default config"));
  // A runtime without a config leaves a ConfigMap job alone.
  EXPECT_TRUE(ApplyRuntime(Job({{"config", {{"configMapRef", {{"name", "cm"}}}}}}), Runtime({{"image", "i"}})).ok());

  auto bad = ApplyRuntime(Job({{"config", {{"inline", "model: [unclosed"}}}}), rt);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("spec.config.inline: not valid YAML"));
  auto list = ApplyRuntime(Job({{"config", {{"inline", "- a\n- b\n"}}}}), rt);
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(list.status().message(), HasSubstr("spec.config.inline: the config must be a mapping"));
}

TEST(TrainingRuntimeTest, PodTemplatesMergeByName) {
  const json base = json::parse(R"({
    "metadata": {"labels": {"team": "platform", "tier": "batch"}},
    "spec": {"nodeSelector": {"pool": "h100"}, "tolerations": [{"key": "gpu"}], "priorityClassName": "low",
             "volumes": [{"name": "data", "hostPath": {"path": "/data"}}, {"name": "scratch", "emptyDir": {}}],
             "containers": [{"name": "trainer", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "A", "value": "1"}],
                             "volumeMounts": [{"name": "data", "mountPath": "/data"}], "securityContext": {"runAsUser": 1000}},
                            {"name": "sidecar", "image": "s:1"}]}})");
  const json overlay = json::parse(R"({
    "metadata": {"labels": {"tier": "interactive"}},
    "spec": {"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "spot"}],
             "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "mine"}}],
             "containers": [{"name": "trainer", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                             "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}]},
                            {"name": "logger", "image": "l:1"}]}})");
  const json m = MergePodTemplates(base, overlay);
  EXPECT_EQ(m["metadata"]["labels"], json({{"team", "platform"}, {"tier", "interactive"}}));
  EXPECT_EQ(m["spec"]["nodeSelector"], json({{"pool", "h100"}, {"zone", "a"}}));
  EXPECT_EQ(m["spec"]["tolerations"], json::parse(R"([{"key": "spot"}])"));  // a list: replaced
  EXPECT_EQ(m["spec"]["priorityClassName"], "low");
  EXPECT_EQ(m["spec"]["volumes"], json::parse(R"([{"name": "data", "persistentVolumeClaim": {"claimName": "mine"}},
                                                  {"name": "scratch", "emptyDir": {}}])"));
  const json& containers = m["spec"]["containers"];
  ASSERT_EQ(containers.size(), 3u);
  EXPECT_EQ(containers[0]["env"], json::parse(R"([{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "A", "value": "1"}])"));
  EXPECT_EQ(containers[0]["volumeMounts"], json::parse(R"([{"name": "data", "mountPath": "/data", "readOnly": true}])"));
  EXPECT_EQ(containers[0]["securityContext"]["runAsUser"], 1000);
  EXPECT_EQ(containers[1]["name"], "sidecar");
  EXPECT_EQ(containers[2]["name"], "logger");
  EXPECT_EQ(MergePodTemplates(base, json()), base);
  EXPECT_EQ(MergePodTemplates(json(), overlay), overlay);
}

TEST(TrainingRuntimeTest, AJobsCheckpointVolumeReplacesTheRuntimesAndOddTemplatesDoNotThrow) {
  json rt_spec = json::object();
  rt_spec["checkpoint"] = json::parse(R"({"path": "/ckpt", "volume": {"persistentVolumeClaim": {"claimName": "c"}}})");
  rt_spec["template"] = json::parse(R"({"spec": "not an object"})");
  json job_spec = json::object();
  job_spec["checkpoint"] = json::parse(R"({"volume": {"nfs": {"server": "s", "path": "/p"}}})");
  job_spec["template"] = json::parse(R"({"spec": {"containers": [{"name": "trainer"}]}})");
  auto merged = ApplyRuntime(Job(job_spec), Runtime(rt_spec));
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ((*merged)["spec"]["checkpoint"], json::parse(R"({"path": "/ckpt", "volume": {"nfs": {"server": "s", "path": "/p"}}})"));
  EXPECT_EQ((*merged)["spec"]["template"]["spec"]["containers"][0]["name"], "trainer");
}

TEST(TrainingRuntimeTest, RuntimeNameAndMergeYaml) {
  EXPECT_EQ(RuntimeName(Job({})), "gpu-pool");
  EXPECT_EQ(RuntimeName({{"spec", {{"image", "x"}}}}), "");
  EXPECT_EQ(RuntimeName({{"spec", {{"runtimeRef", "gpu-pool"}}}}), "");  // malformed: ParseSpec names it
  json bad = Job({{"image", "i"}, {"config", {{"inline", "model: {preset: tiny}"}}}});
  bad["spec"]["runtimeRef"] = "gpu-pool";
  EXPECT_THAT(ParseSpec(bad).status().message(), HasSubstr("spec.runtimeRef: must be an object {name}"));

  auto merged = config::MergeYaml("a: {b: 1, c: [1, 2]}\nd: x\n", "a: {c: [3]}\ne: y\n", "base", "top");
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(*merged, "a: {b: 1, c: [3]}\nd: x\ne: y\n");
  EXPECT_EQ(*config::MergeYaml("", "a: 1", "base", "top"), "a: 1\n");
  // An empty section in the job ("model:") keeps the runtime's.
  EXPECT_EQ(*config::MergeYaml("model: {preset: tiny}\n", "model:\n", "base", "top"), "model: {preset: tiny}\n");
}

}  // namespace
}  // namespace meshwork::op
