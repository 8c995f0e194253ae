// ParseSpec: defaults, the auto mesh, and an error naming the field and value for each rule.
#include "operator/controller/plan_choice.h"
#include "operator/controller/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "operator/controller/desired.h"
#include "operator/controller/training_runtime.h"
#include "operator/controller/trainer_report.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>

namespace meshwork::op {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Job(json spec) {
  json base = {{"image", "img"}, {"config", {{"inline", "model:\n  preset: tiny\n"}}}};
  if (spec.is_object()) base.merge_patch(spec);
  return {{"metadata", {{"name", "job"}, {"namespace", "ns"}, {"uid", "u"}}}, {"spec", base}};
}

// The trainer container's environment variables that have a plain value.
std::map<std::string, std::string> PlainEnv(const json& pod) {
  std::map<std::string, std::string> env;
  for (const auto& e : pod["spec"]["containers"][0]["env"])
    if (e.contains("value")) env[e["name"]] = e["value"];
  return env;
}

// YAML -> JSON for the examples (scalars typed as YAML 1.2's core schema would).
json ToJson(const YAML::Node& n) {
  if (n.IsMap()) {
    json out = json::object();
    for (const auto& kv : n) out[kv.first.as<std::string>()] = ToJson(kv.second);
    return out;
  }
  if (n.IsSequence()) {
    json out = json::array();
    for (const auto& v : n) out.push_back(ToJson(v));
    return out;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.as<std::string>();
  if (n.Tag() == "!") return s;  // quoted
  if (s == "true" || s == "false") return s == "true";
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
  } catch (const std::exception&) {
  }
  return s;
}

TEST(SpecTest, EveryExampleJobParsesAndItsInlineConfigLoads) {
  // The example runtimes by name: a job on one is parsed with it merged, as the operator does.
  std::map<std::string, json> runtimes;
  for (const auto& entry : std::filesystem::directory_iterator(MESHWORK_SOURCE_DIR "/examples")) {
    if (entry.path().filename().string().rfind("trainingruntime-", 0) != 0) continue;
    json rt = ToJson(YAML::LoadFile(entry.path().string()));
    runtimes[rt["metadata"]["name"]] = rt;
  }
  EXPECT_GE(runtimes.size(), 1u);
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MESHWORK_SOURCE_DIR "/examples")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("trainingjob-", 0) != 0) continue;
    json job = ToJson(YAML::LoadFile(entry.path().string()));
    job["metadata"]["namespace"] = "default";
    job["metadata"]["uid"] = "uid";
    if (const std::string runtime = RuntimeName(job); !runtime.empty()) {
      ASSERT_TRUE(runtimes.count(runtime)) << name << ": no example TrainingRuntime " << runtime;
      auto merged = ApplyRuntime(job, runtimes[runtime]);
      ASSERT_TRUE(merged.ok()) << name << ": " << merged.status().message();
      job = *merged;
    }
    auto spec = ParseSpec(job);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status().message();
    if (!spec->config_inline.empty()) {
      Status s = ValidateTrainerConfig(spec->config_inline, *spec, "default", job["metadata"]["name"], "spec.config.inline");
      EXPECT_TRUE(s.ok()) << name << ": " << s.message();
    }
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(SpecTest, DefaultsMatchTheCrd) {
  auto s = ParseSpec(Job({}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->replicas, 1);
  EXPECT_EQ(s->processes_per_replica, 1);
  EXPECT_TRUE(s->gpu);
  EXPECT_EQ(s->restart_policy, RestartPolicy::kExitCode);
  EXPECT_EQ(s->permanent_exit_codes, (std::set<int>{2, 3}));
  EXPECT_EQ(s->backoff_limit, 3);
  EXPECT_EQ(s->clean_pod_policy, CleanPodPolicy::kRunning);
  EXPECT_FALSE(s->suspend);
  EXPECT_EQ(s->master_port, DefaultMasterPort("u"));
  EXPECT_EQ(s->metrics_port, 9400);
  EXPECT_FALSE(s->checkpoint_path.has_value());
}

TEST(SpecTest, DefaultMasterPortIsStablePerJobAndSpread) {
  EXPECT_EQ(DefaultMasterPort("0b8f-uid"), DefaultMasterPort("0b8f-uid"));
  std::set<int> ports;
  for (int i = 0; i < 100; ++i) {
    const int p = DefaultMasterPort("uid-" + std::to_string(i));
    EXPECT_GE(p, 20000);
    EXPECT_LT(p, 29000);
    ports.insert(p);
  }
  EXPECT_GE(ports.size(), 95u);  // collisions are rare
  // A derived port never lands on the metrics ports.
  for (int i = 0; i < 2000; ++i) {
    json j = Job({{"metricsPort", DefaultMasterPort("uid-" + std::to_string(i))}, {"processesPerReplica", 8}});
    j["metadata"]["uid"] = "uid-" + std::to_string(i);
    auto parsed = ParseSpec(j);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_TRUE(parsed->master_port < parsed->metrics_port || parsed->master_port >= parsed->metrics_port + 8);
  }
  auto s = ParseSpec(Job({{"masterPort", 31000}}));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->master_port, 31000);
}

TEST(SpecTest, AutoMeshIsFsdpForOneProcessPerPodAndHsdpOtherwise) {
  EXPECT_EQ(AutoMesh(4, 1).ToString(), "1x4x1");
  EXPECT_EQ(AutoMesh(1, 8).ToString(), "1x8x1");
  EXPECT_EQ(AutoMesh(4, 8).ToString(), "4x8x1");
  auto s = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 4}}));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->mesh.ToString(), "2x4x1");
  EXPECT_EQ(s->WorldSize(), 8);
  auto e = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 4}, {"mesh", {{"dpShard", 8}}}}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->mesh.ToString(), "1x8x1");
}

// mesh: {auto: true}: the trainer's rank 0 chooses; the Pods say so and the config is checked
// for a hardware profile that can build a mesh of the gang.
TEST(SpecTest, MeshAutoIsPlannedByTheOperatorForTheGang) {
  json job = Job({{"replicas", 2}, {"processesPerReplica", 2}, {"device", "cpu"}, {"mesh", {{"auto", true}}}});
  auto s = ParseSpec(job);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->mesh.chosen_by_trainer);
  EXPECT_EQ(s->mesh.ToString(), "auto");
  // Before a plan is chosen (the config check's own load), the trainer's key for any mesh.
  const json unplanned = DesiredPod(job, *s, 0, 1);
  EXPECT_THAT(unplanned["spec"]["containers"][0]["command"].dump(), HasSubstr("dist.mesh=auto"));

  // The config alone checks as it always did; the plan is chosen apart (PlanGang).
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\n", *s, "ns", "job", "spec.config.inline").ok());
  json pipeline = "unset";
  auto planned = PlanGang("model:\n  preset: tiny\ndata:\n  seq_len: 64\n", *s, "ns", "job", 0, json(), &pipeline);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  const AdmissionPlan& plan = *planned;
  EXPECT_EQ(pipeline.is_null(), plan.mesh.pp == 1) << pipeline.dump();
  EXPECT_EQ(plan.status["worldSize"], 4);
  EXPECT_EQ(plan.status["hardwareProfile"], "CPU ranks over Gloo loopback (placeholder figures)");
  const json& mesh = plan.status["mesh"];
  EXPECT_EQ(mesh["dpReplicate"].get<int>() * mesh["dpShard"].get<int>() * mesh["tp"].get<int>() * mesh["pp"].get<int>(), 4);
  EXPECT_EQ(plan.status["meshShape"], plan.mesh.ToString());
  EXPECT_GT(plan.status["predicted"]["tokensPerSecondPerRank"].get<double>(), 0);
  EXPECT_GT(plan.status["predicted"]["peakMemoryBytes"].get<int64_t>(), 0);
  EXPECT_GT(plan.status["plansSearched"].get<int>(), 1);
  EXPECT_THAT(plan.summary, HasSubstr("for 4 ranks on CPU ranks over Gloo loopback"));
  // The gang is started with the plan's keys in place of dist.mesh=auto.
  s->plan_overrides = plan.overrides;
  const json pod = DesiredPod(job, *s, 0, 1);
  const std::string cmd = pod["spec"]["containers"][0]["command"].dump();
  EXPECT_THAT(cmd, ::testing::Not(HasSubstr("dist.mesh=auto")));
  EXPECT_THAT(cmd, HasSubstr("mesh.dp_shard=" + std::to_string(mesh["dpShard"].get<int>())));
  EXPECT_THAT(cmd, HasSubstr("mesh.tp=" + std::to_string(mesh["tp"].get<int>())));
  EXPECT_THAT(cmd, HasSubstr("training.global_batch_size="));
  EXPECT_EQ(pod["metadata"]["labels"][kMeshLabel], "auto");  // the spec's: a resize is a change of it

  // On GPUs pipelines are never chosen (no point-to-point transfers on NCCL).
  auto gpu = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 4}, {"device", "gpu"}, {"mesh", {{"auto", true}}}}));
  ASSERT_TRUE(gpu.ok());
  auto on_gpu = PlanGang("model:\n  preset: llama-100m\ndata:\n  seq_len: 2048\n", *gpu, "ns", "job", 0, json(), nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status().message();
  EXPECT_EQ(on_gpu->mesh.pp, 1);
  EXPECT_EQ(on_gpu->status["hardwareProfile"], "H100 over 400 Gb/s InfiniBand");
  // An elastic job's global batch is the one planned for.
  auto elastic = PlanGang("model:\n  preset: tiny\ndata:\n  seq_len: 64\n", *s, "ns", "job", 24, json(), nullptr);
  ASSERT_TRUE(elastic.ok()) << elastic.status().message();
  EXPECT_EQ(elastic->status["globalBatchSize"], 24);

  // A compute rate a gang measured on the same profile (status.calibration) prices the plan;
  // one measured on another profile does not.
  const json calibration = {{"achievedMfu", 0.05}, {"generation", 3},
                            {"hardwareProfile", "CPU ranks over Gloo loopback (placeholder figures)"}};
  auto calibrated = PlanGang("model:\n  preset: tiny\ndata:\n  seq_len: 64\n", *s, "ns", "job", 0, calibration, nullptr);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status().message();
  EXPECT_EQ(calibrated->status["calibrated"]["achievedMfu"], 0.05) << calibrated->status.dump();
  EXPECT_EQ(calibrated->status["calibrated"]["profileMfu"], 0.5);
  EXPECT_EQ(calibrated->status["calibrated"]["generation"], 3);
  EXPECT_THAT(calibrated->summary, HasSubstr("at the compute rate gang 3 measured, MFU 0.050 (the profile's 0.500)"));
  EXPECT_GT(calibrated->status["predicted"]["stepSeconds"].get<double>(), plan.status["predicted"]["stepSeconds"].get<double>());
  json elsewhere = calibration;
  elsewhere["hardwareProfile"] = "H100 over 400 Gb/s InfiniBand";
  auto other = PlanGang("model:\n  preset: tiny\ndata:\n  seq_len: 64\n", *s, "ns", "job", 0, elsewhere, nullptr);
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_FALSE(other->status.contains("calibrated")) << other->status.dump();
  EXPECT_EQ(other->status["predicted"], plan.status["predicted"]);

  // A profile the trainer cannot find is refused before any Pod exists, naming both fields.
  auto missing = PlanGang("model:\n  preset: tiny\ndist:\n  hardware_profile: nosuch\n", *s, "ns", "job", 0, json(), nullptr);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(missing.status().message(), HasSubstr("spec.mesh.auto: no hardware profile to plan with"));
  EXPECT_THAT(missing.status().message(), HasSubstr("dist.hardware_profile"));
  // The single-node profile cannot put a gang of 2 Pods of 2 in any plan.
  auto single = PlanGang("model:\n  preset: tiny\ndist:\n  hardware_profile: h100-nvlink-node\n", *s, "ns", "job", 0,
                         json(), nullptr);
  EXPECT_EQ(single.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(single.status().message(), HasSubstr("spec.mesh.auto: no plan of 4 ranks (2 replicas x 2 processes)"));
  // A model no plan fits on one CPU rank: refused, naming the closest plan.
  auto one = ParseSpec(Job({{"replicas", 1}, {"device", "cpu"}, {"mesh", {{"auto", true}}}}));
  ASSERT_TRUE(one.ok());
  auto too_big = PlanGang("model:\n  preset: llama3-8b\n", *one, "ns", "job", 0, json(), nullptr);
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(too_big.status().message(), HasSubstr("spec.mesh.auto: no plan of 1 ranks"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("the closest, tp 1 x pp 1 x dp_shard 1"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("GPUs of this kind would hold it"));
  // A config the trainer refuses is said as such.
  auto bad = PlanGang("model:\n  preset: nosuch\n", *s, "ns", "job", 0, json(), nullptr);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(bad.status().message(), HasSubstr("spec.mesh.auto: the trainer refuses this config"));
  // auto with a dim beside it.
  auto both = ParseSpec(Job({{"mesh", {{"auto", true}, {"dpShard", 1}}}}));
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(), HasSubstr("spec.mesh.dpShard: must not be set with spec.mesh.auto: true"));
  auto not_bool = ParseSpec(Job({{"mesh", {{"auto", "yes"}}}}));
  ASSERT_FALSE(not_bool.ok());
  EXPECT_THAT(not_bool.status().message(), HasSubstr("spec.mesh.auto"));
}

// spec.mesh.tp: each tp group is tp consecutive ranks inside one Pod; the trainer gets the
// whole mesh, tp included, on its command line and in the environment.
TEST(SpecTest, TensorParallelMeshIsAcceptedWhenEachGroupIsInOnePod) {
  json job = Job({{"replicas", 2}, {"processesPerReplica", 2}, {"mesh", {{"dpShard", 2}, {"tp", 2}}}});
  auto s = ParseSpec(job);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->mesh.ToString(), "1x2x2");
  const json pod = DesiredPod(job, *s, 1, 0);
  std::map<std::string, std::string> env = PlainEnv(pod);
  EXPECT_EQ(env["MESHWORK_MESH_TP"], "2");
  EXPECT_EQ(env["MESHWORK_MESH_DP_SHARD"], "2");
  EXPECT_EQ(env["MESHWORK_MESH_DP_REPLICATE"], "1");
  EXPECT_EQ(pod["metadata"]["labels"][kMeshLabel], "1x2x2");
  const std::string cmd = pod["spec"]["containers"][0]["command"].dump();
  EXPECT_THAT(cmd, HasSubstr(R"("--set","mesh.dp_shard=2","--set","mesh.tp=2")"));

  // HSDP with tp, and tp filling the Pod.
  auto hsdp = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 4},
                             {"mesh", {{"dpReplicate", 2}, {"dpShard", 2}, {"tp", 2}}}}));
  ASSERT_TRUE(hsdp.ok()) << hsdp.status().message();
  EXPECT_EQ(hsdp->mesh.ToString(), "2x2x2");
  auto whole_pod = ParseSpec(Job({{"replicas", 3}, {"processesPerReplica", 8}, {"mesh", {{"dpShard", 3}, {"tp", 8}}}}));
  ASSERT_TRUE(whole_pod.ok()) << whole_pod.status().message();
  EXPECT_EQ(whole_pod->mesh.ToString(), "1x3x8");
}

// The trainer config is checked with the spec's tp, which replaces any mesh.tp in the config
// text as the spec's other dims do.
TEST(SpecTest, TrainerConfigIsCheckedWithTheSpecsTp) {
  const std::string tokens_15 = "model:\n  preset: tiny\ndata:\n  batch_size: 3\n  seq_len: 5\n";
  auto tp2 = ParseSpec(Job({{"processesPerReplica", 2}, {"device", "cpu"}, {"mesh", {{"dpShard", 1}, {"tp", 2}}}}));
  ASSERT_TRUE(tp2.ok()) << tp2.status().message();
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\n", *tp2, "ns", "job", "spec.config.inline").ok());
  // Sequence parallelism splits each micro-batch's 3 x 5 tokens over tp: the trainer refuses 2.
  Status bad = ValidateTrainerConfig(tokens_15, *tp2, "ns", "job", "spec.config.inline");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(bad.message(), HasSubstr("spec.config.inline: the trainer refuses this config"));
  EXPECT_THAT(bad.message(), HasSubstr("mesh.tp=2"));
  // A model whose heads do not split over tp is refused here, before any Pod starts: the tiny
  // preset's 2 key/value heads over tp 4.
  auto tp4 = ParseSpec(Job({{"processesPerReplica", 4}, {"device", "cpu"}, {"mesh", {{"dpShard", 1}, {"tp", 4}}}}));
  ASSERT_TRUE(tp4.ok()) << tp4.status().message();
  Status heads = ValidateTrainerConfig("model:\n  preset: tiny\n", *tp4, "ns", "job", "spec.config.inline");
  EXPECT_EQ(heads.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(heads.message(), HasSubstr("model.num_key_value_heads=2 does not divide by mesh.tp=4"));
  // A job without tp runs at tp 1 whatever the config text says.
  auto tp1 = ParseSpec(Job({{"device", "cpu"}}));
  ASSERT_TRUE(tp1.ok());
  Status config_tp = ValidateTrainerConfig(tokens_15 + "mesh:\n  tp: 2\n", *tp1, "ns", "job", "spec.config.inline");
  EXPECT_TRUE(config_tp.ok()) << config_tp.message();
}

// spec.mesh.pp: pipeline stages, the outermost dim, in the product, on the trainer's command line,
// in the environment, the Pod's mesh label and status; the schedule is checked at admission with
// the trainer's own generator.
TEST(SpecTest, PipelineMeshReachesTheTrainerAndIsCheckedAtAdmission) {
  json job = Job({{"replicas", 2}, {"device", "cpu"}, {"mesh", {{"dpShard", 1}, {"pp", 2}}}});
  auto s = ParseSpec(job);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->mesh.pp, 2);
  EXPECT_EQ(s->mesh.ToString(), "pp2x1x1x1");
  EXPECT_STREQ(s->mesh.Dims(), "pp x dpReplicate x dpShard x tp");
  const json pod = DesiredPod(job, *s, 1, 0);
  std::map<std::string, std::string> env = PlainEnv(pod);
  EXPECT_EQ(env["MESHWORK_MESH_PP"], "2");
  EXPECT_EQ(pod["metadata"]["labels"][kMeshLabel], "pp2x1x1x1");
  EXPECT_THAT(pod["spec"]["containers"][0]["command"].dump(), HasSubstr(R"("--set","mesh.tp=1","--set","mesh.pp=2")"));
  // Without pp the trainer still gets mesh.pp=1, which replaces any mesh.pp in the config text.
  auto plain = ParseSpec(Job({{"replicas", 2}}));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->mesh.ToString(), "1x2x1");
  EXPECT_THAT(TrainerOverrides(*plain, "ns", "job", "uid"), testing::Contains("mesh.pp=1"));

  const std::string field = "spec.config.inline";
  // 1F1B over 4 micro-batches at pp 2: runs; status.pipeline says so, with the schedule's own
  // bubble, (p - 1) / (m + p - 1) = 0.2.
  json pipeline = "stale";
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  grad_accum: 4\npipeline:\n  schedule: 1f1b\n",
                                    *s, "ns", "job", field, &pipeline).ok());
  EXPECT_EQ(pipeline, json({{"schedule", "1f1b"}, {"microBatches", 4}, {"virtualStages", 1}, {"stages", 2},
                            {"scheduleBubble", 0.2}}));
  // Interleaved over 2 stages a rank: (p - 1) / (v m + p - 1) = 1/9.
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  grad_accum: 4\npipeline:\n  schedule: "
                                    "interleaved-1f1b\n  virtual_stages: 2\n",
                                    *s, "ns", "job", field, &pipeline).ok());
  EXPECT_EQ(pipeline["stages"], 4);
  EXPECT_EQ(pipeline["scheduleBubble"], 0.111);
  // PipeMare over 2 micro-batches: its steady step's, (p - 1) / (3m + p - 1) = 1/7; one that
  // would update a tied table's copies apart is refused naming the key.
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\n  tie_word_embeddings: false\ntraining:\n  grad_accum: 2\n"
                                    "pipeline:\n  schedule: pipemare\n",
                                    *s, "ns", "job", field, &pipeline).ok());
  EXPECT_EQ(pipeline["schedule"], "pipemare");
  EXPECT_EQ(pipeline["microBatches"], 2);
  EXPECT_EQ(pipeline["scheduleBubble"], 0.143);
  Status tied = ValidateTrainerConfig("model:\n  preset: tiny\npipeline:\n  schedule: pipemare\n", *s, "ns", "job", field);
  EXPECT_EQ(tied.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(tied.message(), HasSubstr("key 'model.tie_word_embeddings': true, but under pipeline.schedule: pipemare"));
  // Without pipeline stages there is none.
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\n", *plain, "ns", "job", field, &pipeline).ok());
  EXPECT_TRUE(pipeline.is_null());
  // 1F1B with one micro-batch for two stages: refused by the schedule's generator, naming it.
  Status few = ValidateTrainerConfig("model:\n  preset: tiny\npipeline:\n  schedule: 1f1b\n", *s, "ns", "job", field);
  EXPECT_EQ(few.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(few.message(), HasSubstr("spec.config.inline: the trainer refuses this config: key 'pipeline.schedule'"));
  EXPECT_THAT(few.message(), HasSubstr("training.grad_accum=1"));
  // More stages than decoder layers (tiny has 4) with virtual stages.
  Status layers = ValidateTrainerConfig(
      "model:\n  preset: tiny\ntraining:\n  grad_accum: 4\npipeline:\n  schedule: interleaved-1f1b\n  virtual_stages: 4\n",
      *s, "ns", "job", field);
  EXPECT_EQ(layers.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(layers.message(), HasSubstr("8 stages, but the model has 4 decoder layers"));
  // A checkpoint directory from spec.checkpoint: pipeline stages save and resume their own.
  auto with_ckpt = ParseSpec(Job({{"replicas", 2}, {"device", "cpu"}, {"mesh", {{"dpShard", 1}, {"pp", 2}}},
                                  {"checkpoint", {{"path", "/ckpt"}}}}));
  ASSERT_TRUE(with_ckpt.ok()) << with_ckpt.status().message();
  Status ckpt = ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  grad_accum: 2\n", *with_ckpt, "ns", "job", field);
  EXPECT_TRUE(ckpt.ok()) << ckpt.message();
  // FSDP inside the stages: 4 Pods as 2 stages sharded over 2 ranks each.
  auto with_dp = ParseSpec(Job({{"replicas", 4}, {"device", "cpu"}, {"mesh", {{"dpShard", 2}, {"pp", 2}}}}));
  ASSERT_TRUE(with_dp.ok()) << with_dp.status().message();
  EXPECT_EQ(with_dp->mesh.ToString(), "pp2x1x2x1");
  Status dp = ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  grad_accum: 2\n", *with_dp, "ns", "job", field);
  EXPECT_TRUE(dp.ok()) << dp.message();
  // Tensor parallelism inside the stages: 2 Pods of 2 processes (a tp group each) as 2 stages.
  auto with_tp = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 2}, {"device", "cpu"},
                                {"mesh", {{"dpShard", 1}, {"tp", 2}, {"pp", 2}}}}));
  ASSERT_TRUE(with_tp.ok()) << with_tp.status().message();
  EXPECT_EQ(with_tp->mesh.ToString(), "pp2x1x1x2");
  Status tp = ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  grad_accum: 2\n", *with_tp, "ns", "job", field);
  EXPECT_TRUE(tp.ok()) << tp.message();
  // Replicas of the pipeline: 4 Pods as 2 replicas x 2 stages.
  auto replicated = ParseSpec(
      Job({{"replicas", 4}, {"device", "cpu"}, {"mesh", {{"dpReplicate", 2}, {"dpShard", 1}, {"pp", 2}}}}));
  ASSERT_TRUE(replicated.ok()) << replicated.status().message();
  EXPECT_EQ(replicated->mesh.ToString(), "pp2x2x1x1");
  Status replicas =
      ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  grad_accum: 2\n", *replicated, "ns", "job", field);
  EXPECT_TRUE(replicas.ok()) << replicas.message();
}

// An elastic job with an explicit mesh keeps pp, dpReplicate and tp; each gang shards over what its
// world leaves, and its global batch counts data parallel ranks, not ranks.
TEST(SpecTest, AnElasticJobsExplicitMeshKeepsTpAndPpAndShardsOverTheRest) {
  auto s = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 2}, {"device", "cpu"}, {"mesh", {{"tp", 2}}},
                          {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 4}}}}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->mesh.ToString(), "1x2x2");
  EXPECT_EQ(MeshAt(*s, 1).ToString(), "1x1x2");
  EXPECT_EQ(MeshAt(*s, 4).ToString(), "1x4x2");
  int64_t global = -1;
  Status ok = ValidateTrainerConfig("model:\n  preset: tiny\ndata:\n  batch_size: 3\n", *s, "ns", "job",
                                    "spec.config.inline", nullptr, &global);
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(global, 12);  // 3 rows x 4 data parallel ranks (8 ranks / tp 2) at maxReplicas
  bool dp_shard = false, tp = false;
  for (const auto& o : TrainerOverrides(*s, "ns", "job", "u")) {
    dp_shard |= o == "mesh.dp_shard=2";
    tp |= o == "mesh.tp=2";
  }
  EXPECT_TRUE(dp_shard && tp);

  // Pipelines: 2 stages of 1 Pod each (2 processes), 1 or 2 Pods a stage. The micro-batches each
  // size makes must run the schedule: 4 rows (1 x 2 micro-batches x 2 data parallel ranks at
  // maxReplicas) are 2 micro-batches a rank at 2 replicas, 4 at 1; 12 rows of at most 2 a
  // micro-batch are 3 micro-batches at 2 replicas, which interleaved 1F1B over 2 stages refuses.
  auto pp = ParseSpec(Job({{"replicas", 2}, {"processesPerReplica", 2}, {"device", "cpu"}, {"mesh", {{"pp", 2}}},
                           {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 2}}}}));
  ASSERT_TRUE(pp.ok()) << pp.status().ToString();
  EXPECT_EQ(pp->mesh.ToString(), "pp2x1x2x1");
  EXPECT_EQ(MeshAt(*pp, 1).ToString(), "pp2x1x1x1");
  Status fits = ValidateTrainerConfig("model:\n  preset: tiny\ndata:\n  batch_size: 1\ntraining:\n  grad_accum: 2\n",
                                      *pp, "ns", "job", "spec.config.inline", nullptr, &global);
  EXPECT_TRUE(fits.ok()) << fits.ToString();
  EXPECT_EQ(global, 4);
  Status few = ValidateTrainerConfig(
      "model:\n  preset: tiny\ndata:\n  batch_size: 2\ntraining:\n  grad_accum: 2\n  global_batch_size: 12\n"
      "pipeline:\n  schedule: interleaved-1f1b\n  virtual_stages: 2\n",
      *pp, "ns", "job", "spec.config.inline", nullptr, &global);
  EXPECT_EQ(few.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(few.message(), HasSubstr("spec.elasticPolicy: training.global_batch_size 12 at 2 replicas (4 ranks) makes "
                                       "3 micro-batches, which the pipeline cannot run: "));
}

// An elastic job's Pods get the global batch its config makes at maxReplicas, checked at every size
// it may take; one that does not split at some size is refused at admission, naming it.
TEST(SpecTest, AnElasticJobsGlobalBatchIsTheConfigsAtMaxReplicasAndSplitsAtEverySize) {
  auto s = ParseSpec(Job({{"replicas", 2}, {"device", "cpu"}, {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 4}}}}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  int64_t global = -1;
  Status ok = ValidateTrainerConfig("model:\n  preset: tiny\ndata:\n  batch_size: 3\n", *s, "ns", "job",
                                    "spec.config.inline", nullptr, &global);
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(global, 12);  // 3 rows x 4 ranks at maxReplicas
  s->global_batch_size = global;
  bool passed = false;
  for (const auto& o : TrainerOverrides(*s, "ns", "job", "u")) passed |= o == "training.global_batch_size=12";
  EXPECT_TRUE(passed);

  // 4 rows a step at 4 ranks cannot split over 3.
  auto three = ParseSpec(Job({{"replicas", 2}, {"device", "cpu"}, {"elasticPolicy", {{"maxReplicas", 4}}}}));
  ASSERT_TRUE(three.ok());
  Status bad = ValidateTrainerConfig("model:\n  preset: tiny\ndata:\n  batch_size: 1\n", *three, "ns", "job",
                                     "spec.config.inline", nullptr, &global);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(bad.message(), HasSubstr("spec.elasticPolicy: the global batch of 4 rows (data.batch_size 1 x "
                                       "training.grad_accum 1 x 4 data parallel ranks at maxReplicas) does not split at 3 replicas"));
  // The config's own training.global_batch_size is kept as it is.
  Status given = ValidateTrainerConfig("model:\n  preset: tiny\ntraining:\n  global_batch_size: 24\n", *three, "ns",
                                       "job", "spec.config.inline", nullptr, &global);
  EXPECT_TRUE(given.ok()) << given.ToString();
  EXPECT_EQ(global, 24);
  // Not elastic: none.
  auto plain = ParseSpec(Job({{"device", "cpu"}}));
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\n", *plain, "ns", "job", "spec.config.inline", nullptr,
                                    &global).ok());
  EXPECT_EQ(global, 0);
}

TEST(SpecTest, ErrorsNameTheFieldAndTheValue) {
  json seventeen_rules = json::array();
  for (int i = 0; i < 17; ++i) seventeen_rules.push_back({{"action", "FailJob"}, {"onExitCodes", {{"values", {1}}}}});
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"image", nullptr}}, "spec.image: is required"},
      {{{"replicas", 0}}, "spec.replicas: 0 is outside [1, 4096]"},
      {{{"replicas", "two"}}, "spec.replicas: must be an integer, got \"two\""},
      {{{"device", "tpu"}}, "spec.device: unsupported value \"tpu\" (supported: gpu, cpu)"},
      {{{"config", nullptr}}, "spec.config: is required"},
      {{{"config", {{"configMapRef", {{"name", "c"}}}}}}, "spec.config: set exactly one of inline and configMapRef"},
      {{{"mesh", {{"dpShard", 2}, {"dpReplicate", 2}}}},
       "spec.mesh: dpReplicate x dpShard x tp = 2x2x1 = 4 does not equal replicas x processesPerReplica = 1x1 = 1"},
      // A tp group is tp consecutive ranks: it must fit in a Pod's processesPerReplica ranks.
      {{{"mesh", {{"dpShard", 1}, {"tp", 2}}}},
       "spec.mesh.tp: 2 does not divide processesPerReplica 1 (a tensor parallel group must be inside one Pod"},
      {{{"replicas", 2}, {"processesPerReplica", 3}, {"mesh", {{"dpShard", 3}, {"tp", 2}}}},
       "spec.mesh.tp: 2 does not divide processesPerReplica 3"},
      {{{"mesh", {{"dpShard", 1}, {"tp", 0}}}}, "spec.mesh.tp: 0 is outside [1, 64]"},
      {{{"processesPerReplica", 64}, {"mesh", {{"dpShard", 1}, {"tp", 128}}}}, "spec.mesh.tp: 128 is outside [1, 64]"},
      {{{"replicas", 2}, {"processesPerReplica", 2}, {"mesh", {{"dpShard", 1}, {"tp", 2}}}},
       "spec.mesh: dpReplicate x dpShard x tp = 1x1x2 = 2 does not equal replicas x processesPerReplica = 2x2 = 4"},
      {{{"mesh", {{"auto", true}, {"tp", 2}}}}, "spec.mesh.tp: must not be set with spec.mesh.auto: true"},
      {{{"mesh", {{"auto", true}, {"pp", 2}}}}, "spec.mesh.pp: must not be set with spec.mesh.auto: true"},
      {{{"mesh", {{"dpShard", 1}, {"pp", 0}}}}, "spec.mesh.pp: 0 is outside [1, 1024]"},
      {{{"elasticPolicy", {{"minReplicas", 1}}}}, "spec.elasticPolicy.maxReplicas: is required"},
      {{{"elasticPolicy", {{"minReplicas", 3}, {"maxReplicas", 2}}}},
       "spec.elasticPolicy: minReplicas 3 exceeds maxReplicas 2"},
      {{{"replicas", 3}, {"elasticPolicy", {{"maxReplicas", 2}}}}, "spec.replicas: 3 is outside spec.elasticPolicy's 1 to 2"},
      {{{"elasticPolicy", {{"maxReplicas", 5000}}}}, "spec.elasticPolicy.maxReplicas: 5000 is outside [1, 4096]"},
      // An elastic job's dpShard follows its replicas: it is left out, and every size must divide.
      {{{"replicas", 2}, {"mesh", {{"dpShard", 2}}}, {"elasticPolicy", {{"maxReplicas", 2}}}},
       "spec.mesh.dpShard: 2 is fixed, but spec.elasticPolicy changes the world with spec.replicas: leave dpShard out"},
      {{{"replicas", 2}, {"mesh", {{"tp", 1}}}}, "spec.mesh.dpShard: is required when spec.mesh is set (an elastic job"},
      {{{"replicas", 2}, {"device", "cpu"}, {"mesh", {{"pp", 2}}}, {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 4}}}},
       "spec.elasticPolicy: at 1 replicas the world of 1 ranks (x processesPerReplica 1) does not divide by spec.mesh's "
       "pp x dpReplicate x tp = 2, so dpShard would not be whole"},
      {{{"replicas", 3}, {"device", "cpu"}, {"mesh", {{"pp", 2}}}, {"elasticPolicy", {{"minReplicas", 2}, {"maxReplicas", 4}}}},
       "spec.mesh: at 3 replicas the world of 3 ranks (x processesPerReplica 1) does not divide by spec.mesh's pp x "
       "dpReplicate x tp = 2"},
      {{{"replicas", 2}, {"mesh", {{"dpShard", 2}, {"pp", 2}}}},
       "spec.mesh: pp x dpReplicate x dpShard x tp = pp2x1x2x1 = 4 does not equal replicas x processesPerReplica = 2x1 = 2"},
      {{{"replicas", 2}, {"device", "gpu"}, {"mesh", {{"dpShard", 1}, {"pp", 2}}}},
       "spec.mesh.pp: 2 pipeline stages need point-to-point transfers between GPUs"},
      {{{"checkpoint", {{"path", "ckpt"}}}}, "spec.checkpoint.path: \"ckpt\" must be absolute"},
      {{{"runPolicy", {{"restartPolicy", "Always"}}}}, "spec.runPolicy.restartPolicy: unsupported value \"Always\""},
      {{{"runPolicy", {{"permanentExitCodes", {0}}}}}, "spec.runPolicy.permanentExitCodes[0]: 0 must be an exit code"},
      {{{"runPolicy", {{"backoffLimit", -1}}}}, "spec.runPolicy.backoffLimit: -1 is outside"},
      {{{"runPolicy", {{"nodeLossGraceSeconds", 86401}}}}, "spec.runPolicy.nodeLossGraceSeconds: 86401 is outside"},
      {{{"runPolicy", {{"nodeLossGraceSeconds", "30s"}}}}, "spec.runPolicy.nodeLossGraceSeconds:"},
      {{{"masterPort", 9400}}, "spec.masterPort: 9400 collides with the metrics ports"},
      // The drill's job that stayed Created 0/2 for ever: the Pod it makes is refused.
      {{{"resources", {{"requests", {{"cpu", "abc"}, {"memory", "1Gi"}}}}}},
       "spec.resources.requests.cpu: invalid quantity \"abc\""},
      {{{"resources", {{"requests", {{"memory", "-5Gi"}}}}}}, "spec.resources.requests.memory: invalid quantity \"-5Gi\""},
      {{{"resources", {{"limits", {{"nvidia.com/gpu", -1}}}}}}, "spec.resources.limits.nvidia.com/gpu: invalid quantity \"-1\""},
      {{{"resources", {{"limits", {{"cpu", true}}}}}}, "spec.resources.limits.cpu: must be a quantity, got true"},
      {{{"resources", {{"requests", "2"}}}}, "spec.resources.requests: must be a map of resource name to quantity"},
      {{{"runPolicy", {{"successPolicy", "Rank1"}}}},
       "spec.runPolicy.successPolicy: unsupported value \"Rank1\" (supported: AllRanks, Rank0)"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"onExitCodes", {{"values", {1}}}}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].action: is required"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "Retry"}, {"onExitCodes", {{"values", {1}}}}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].action: unsupported value \"Retry\" (supported: FailJob, RestartGang, "
       "RestartGangAndIgnoreBackoff)"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0]: needs at least one of onExitCodes, onPodConditions and onMessagePattern"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onExitCodes", {{"values", {0}}}}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].onExitCodes.values[0]: 0 must be an exit code in [1, 255] (0 is success)"},
      {{{"runPolicy",
         {{"failurePolicy",
           {{"rules", {{{"action", "FailJob"}, {"onExitCodes", {{"operator", "Equals"}, {"values", {3}}}}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].onExitCodes.operator: unsupported value \"Equals\""},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onExitCodes", {{"values", json::array()}}}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].onExitCodes.values: must be a non-empty list of exit codes, got []"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onPodConditions", {{{"reason", "X"}}}}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].onPodConditions[0].type: is required"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onMessagePattern", "NCCL(timeout"}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].onMessagePattern: \"NCCL(timeout\" is not a POSIX extended regular "
       "expression"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onMessagePattern", "(a)\\1"}}}}}}}}},
       "spec.runPolicy.failurePolicy.rules[0].onMessagePattern: \"(a)\\\\1\" has a back-reference (\\1), which is not supported"},
      {{{"runPolicy",
         {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onMessagePattern", "((a{1,255}){1,255}){1,255}"}}}}}}}}},
       "has a bounded repetition ({m,n}), which is not supported"},
      {{{"runPolicy", {{"failurePolicy", {{"rules", seventeen_rules}}}}}},
       "spec.runPolicy.failurePolicy.rules: 17 rules; at most 16"},
      // Each scheduler's own field, set for another, would be silently ignored.
      {{{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Coscheduling"}, {"queue", "research"}}}}}},
       "spec.runPolicy.schedulingPolicy.queue: \"research\" is Volcano's queue: set it with gangAdmission Volcano"},
      {{{"runPolicy", {{"schedulingPolicy", {{"priorityClass", "high"}}}}}},
       "spec.runPolicy.schedulingPolicy.priorityClass: \"high\" goes on Volcano's PodGroup"},
      {{{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Volcano"}, {"scheduleTimeoutSeconds", 60}}}}}},
       "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: 60 is the coscheduling plugin's"},
      {{{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Coscheduling"}, {"scheduleTimeoutSeconds", 0}}}}}},
       "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: 0 is outside"},
      {{{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Yunikorn"}}}}}},
       "spec.runPolicy.schedulingPolicy.gangAdmission: unsupported value \"Yunikorn\" (supported: Operator, PodGroup, "
       "Volcano, Coscheduling, None)"},
  };
  for (const auto& [spec, message] : cases) {
    auto s = ParseSpec(Job(spec));
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidConfig);
    EXPECT_THAT(s.status().message(), HasSubstr(message));
  }
}

TEST(SpecTest, FailurePolicyRulesAndSuccessPolicyAreRead) {
  const json rules = json::array(
      {{{"name", "bad-data"}, {"action", "FailJob"}, {"onExitCodes", {{"values", {42, 43}}}}},
       {{"action", "RestartGangAndIgnoreBackoff"},
        {"onPodConditions", {{{"type", "DisruptionTarget"}, {"reason", "PreemptionByScheduler"}}, {{"type", "Evicted"}}}}},
       {{"action", "RestartGang"}, {"onExitCodes", {{"operator", "NotIn"}, {"values", {0, 1}}}},
        {"onMessagePattern", "NCCL.*(timeout|timed out)"}}});
  auto s = ParseSpec(Job({{"runPolicy", {{"successPolicy", "Rank0"}, {"failurePolicy", {{"rules", rules}}}}}}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->success_policy, SuccessPolicy::kRank0);
  ASSERT_EQ(s->failure_rules.size(), 3u);
  EXPECT_EQ(s->failure_rules[0].name, "bad-data");
  EXPECT_EQ(s->failure_rules[0].action, FailureAction::kFailJob);
  EXPECT_EQ(s->failure_rules[0].exit_code_in, true);
  EXPECT_EQ(s->failure_rules[0].exit_codes, (std::set<int>{42, 43}));
  EXPECT_FALSE(s->failure_rules[1].exit_code_in.has_value());
  EXPECT_EQ(s->failure_rules[1].pod_conditions,
            (std::vector<std::pair<std::string, std::string>>{{"DisruptionTarget", "PreemptionByScheduler"}, {"Evicted", ""}}));
  EXPECT_EQ(s->failure_rules[2].exit_code_in, false);
  EXPECT_EQ(s->failure_rules[2].message_pattern, "NCCL.*(timeout|timed out)");
  auto d = ParseSpec(Job({}));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->success_policy, SuccessPolicy::kAllRanks);
  EXPECT_TRUE(d->failure_rules.empty());
}

TEST(SpecTest, FindPatternIsAnExtendedRegexSearch) {
  EXPECT_TRUE(*FindPattern("NCCL.*timeout", "Error\nwatchdog: NCCL collective timeout after 600 s"));
  EXPECT_FALSE(*FindPattern("^timeout", "NCCL timeout"));
  EXPECT_TRUE(*FindPattern("out of memory|OOM", "OOMKilled"));
  // A long message with a pattern that would make a backtracking matcher crawl.
  EXPECT_FALSE(*FindPattern("(a|aa)*c", std::string(4096, 'a')));
  EXPECT_FALSE(FindPattern("(", "x").ok());
  EXPECT_TRUE(*FindPattern("^RuntimeError", "Error\nRuntimeError: boom"));  // ^ at each line
  // An escaped brace is a brace, not a repetition.
  json ok = Job({{"runPolicy", {{"failurePolicy", {{"rules", {{{"action", "FailJob"}, {"onMessagePattern", "\\{x\\}"}}}}}}}}});
  EXPECT_TRUE(ParseSpec(ok).ok()) << ParseSpec(ok).status().message();
}

TEST(SpecTest, JobNamesMustMakeHostnames) {
  json j = Job({});
  j["metadata"]["name"] = "9lives";
  EXPECT_THAT(ParseSpec(j).status().message(), HasSubstr("metadata.name: \"9lives\" must start with a lower-case letter"));
  j["metadata"]["name"] = std::string(53, 'a');
  EXPECT_THAT(ParseSpec(j).status().message(), HasSubstr("at most 52"));
}

TEST(SpecTest, TrainerConfigIsCheckedWithTheTrainersOwnRules) {
  auto s = ParseSpec(Job({{"device", "cpu"}}));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(ValidateTrainerConfig("model:\n  preset: tiny\n", *s, "ns", "job", "spec.config.inline").ok());
  Status bad = ValidateTrainerConfig("model:\n  preset: huge\n", *s, "ns", "job", "spec.config.inline");
  EXPECT_THAT(bad.message(), HasSubstr("spec.config.inline: the trainer refuses this config"));
  EXPECT_THAT(bad.message(), HasSubstr("huge"));
  // Issue 20: a config reaches the trainer as a ConfigMap volume's file, so one over 128 KiB (the
  // old environment variable's limit) runs; one over a ConfigMap's 1 MiB is refused naming the
  // field and the size.
  const std::string head = "model:\n  preset: tiny\n#";
  const std::string fits = head + std::string(1048576 - head.size() - 1, 'x') + "\n";
  ASSERT_EQ(fits.size(), 1048576u);
  EXPECT_TRUE(ValidateTrainerConfig(fits, *s, "ns", "job", "spec.config.inline").ok());
  const std::string big = fits + "#\n";
  Status too_big = ValidateTrainerConfig(big, *s, "ns", "job", "spec.config.inline");
  EXPECT_THAT(too_big.message(), HasSubstr("spec.config.inline: " + std::to_string(big.size()) + " bytes of config"));
  EXPECT_THAT(too_big.message(), HasSubstr("a ConfigMap, which holds at most 1048576 bytes"));
  Status typo = ValidateTrainerConfig("optimizr:\n  lr: 1\n", *s, "ns", "job", "spec.config.inline");
  EXPECT_THAT(typo.message(), HasSubstr("optimizr"));
  s->args = {"--set", "optimizer.lr=-1"};
  EXPECT_FALSE(ValidateTrainerConfig("model:\n  preset: tiny\n", *s, "ns", "job", "f").ok());
}

TEST(DesiredTest, PodRunsTheLauncherWithTheRankEnvironment) {
  json job = Job({{"replicas", 2}, {"processesPerReplica", 2}, {"masterPort", 29500}, {"checkpoint", {{"every", 50}}}});
  auto s = ParseSpec(job);
  ASSERT_TRUE(s.ok());
  json pod = DesiredPod(job, *s, 1, 3);
  EXPECT_EQ(pod["metadata"]["name"], "job-1");
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["kind"], "TrainingJob");
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(pod["spec"]["hostname"], "job-1");
  EXPECT_EQ(pod["spec"]["subdomain"], "job");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  const json& c = pod["spec"]["containers"][0];
  const std::string cmd = c["command"].dump();
  EXPECT_THAT(cmd, HasSubstr(R"("meshwork-train","launch","--nproc","2","--nnodes","2","--node-rank","1")"));
  EXPECT_THAT(cmd, HasSubstr(R"("--master-addr","job-0.job.ns.svc","--master-port","29500")"));
  EXPECT_THAT(cmd, HasSubstr(R"("train","--config","/etc/meshwork/config/config.yaml")"));
  EXPECT_THAT(cmd, HasSubstr("mesh.dp_replicate=2"));
  EXPECT_THAT(cmd, HasSubstr("checkpoint.dir=/checkpoints/ns/job/u"));
  EXPECT_THAT(cmd, HasSubstr("checkpoint.every=50"));
  std::map<std::string, json> env;
  for (const auto& e : c["env"]) env[e["name"]] = e;
  EXPECT_EQ(env["WORLD_SIZE"]["value"], "4");
  EXPECT_EQ(env["RANK"]["value"], "2");
  EXPECT_EQ(env["MASTER_ADDR"]["value"], "job-0.job.ns.svc");
  EXPECT_EQ(env["PET_NPROC_PER_NODE"]["value"], "2");
  EXPECT_EQ(env["MESHWORK_RESTART_GENERATION"]["value"], "3");
  EXPECT_EQ(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");  // rank 0's store binds it
  EXPECT_EQ(env["MESHWORK_RENDEZVOUS_TOKEN"]["valueFrom"]["secretKeyRef"],
            json::parse(R"({"name": "job-rendezvous", "key": "token"})"));
  EXPECT_EQ(env["MESHWORK_CONFIG_FILE"]["value"], "/etc/meshwork/config/config.yaml");
  // The config's ConfigMap as a volume, its key as config.yaml; the checkpoint volume after it.
  EXPECT_EQ(pod["spec"]["volumes"][0], json::parse(R"({"name": "meshwork-config", "configMap": {"name": "job-config",
    "items": [{"key": "config.yaml", "path": "config.yaml"}]}})"));
  EXPECT_EQ(c["volumeMounts"][0],
            json::parse(R"({"name": "meshwork-config", "mountPath": "/etc/meshwork/config", "readOnly": true})"));
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], 2);
  // One metrics port per local rank (the trainer serves rank i on metricsPort + i).
  EXPECT_EQ(c["ports"], json::parse(R"([
    {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"},
    {"name": "metrics", "containerPort": 9400, "protocol": "TCP"},
    {"name": "metrics-1", "containerPort": 9401, "protocol": "TCP"}])"));
  // A failed rank's log tail becomes its termination message (failurePolicy's onMessagePattern).
  EXPECT_EQ(c["terminationMessagePolicy"], "FallbackToLogsOnError");
}

TEST(DesiredTest, CommandOverrideTemplateAndService) {
  json job = Job({{"device", "cpu"},
                  {"command", {"sh", "-c", "exit 0"}},
                  {"template",
                   {{"metadata", {{"labels", {{"team", "a"}, {kJobLabel, "evil"}}}}},
                    {"spec",
                     {{"nodeSelector", {{"pool", "gpu"}}},
                      {"restartPolicy", "Always"},
                      {"containers",
                       {{{"name", "trainer"}, {"env", {{{"name", "X"}, {"value", "1"}}}}, {"terminationMessagePolicy", "File"}},
                        {{"name", "sidecar"}, {"image", "s"}}}}}}}}});
  auto s = ParseSpec(job);
  ASSERT_TRUE(s.ok()) << s.status().message();
  json pod = DesiredPod(job, *s, 0, 0);
  EXPECT_EQ(pod["spec"]["containers"][0]["command"], json({"sh", "-c", "exit 0"}));
  EXPECT_FALSE(pod["spec"]["containers"][0].contains("resources"));  // cpu: no GPU asked for
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "a");
  EXPECT_EQ(pod["metadata"]["labels"][kJobLabel], "job");  // ours win
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");       // ours win
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "gpu");
  EXPECT_EQ(pod["spec"]["containers"].size(), 2u);
  EXPECT_EQ(pod["spec"]["containers"][0]["env"].back()["name"], "X");
  EXPECT_EQ(pod["spec"]["containers"][0]["terminationMessagePolicy"], "File");  // the template's

  json svc = DesiredService(job, *s);
  EXPECT_EQ(svc["metadata"]["name"], "job");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(svc["spec"]["selector"][kJobLabel], "job");
}

TEST(TrainerReportTest, ParsesTheTrainersSeries) {
  const std::string text =
      "# HELP meshwork_trainer_step Last step\n# TYPE meshwork_trainer_step gauge\n"
      "meshwork_trainer_step{job=\"tiny\"} 120\n"
      "meshwork_trainer_steps_total{job=\"tiny\"} 999\n"
      "meshwork_trainer_total_steps{job=\"tiny\"} 300\n"
      "meshwork_trainer_loss{job=\"tiny\"} 2.5\n"
      "meshwork_trainer_tokens_per_second{job=\"tiny\"} 4096.5\n"
      "meshwork_trainer_info{amesh=\"no\",device=\"cpu\",job=\"tiny\",mesh=\"2x4x1\",model=\"tiny\"} 1\n";
  auto r = ParseTrainerMetrics(text);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 120);
  EXPECT_EQ(r->total_steps, 300);
  EXPECT_DOUBLE_EQ(r->loss, 2.5);
  EXPECT_DOUBLE_EQ(r->tokens_per_second, 4096.5);
  EXPECT_EQ(r->mesh, "2x4x1");
  EXPECT_FALSE(r->resumed_from_step.has_value()) << "an older trainer";
  EXPECT_EQ(ParseTrainerMetrics("meshwork_trainer_step 1\nmeshwork_trainer_resumed_from_step{job=\"t\"} 40\n")->resumed_from_step,
            40);
  EXPECT_EQ(ParseTrainerMetrics("meshwork_trainer_step 1\n")->mesh, "") << "no info series: no mesh";
  EXPECT_FALSE(ParseTrainerMetrics("other_metric 1\n").has_value());
  // The plan advice: absent until the trainer has refitted (its gauges read 0 before).
  EXPECT_FALSE(r->plan_fitted_mfu.has_value());
  EXPECT_FALSE(ParseTrainerMetrics("meshwork_trainer_step 3\nmeshwork_trainer_plan_fitted_mfu{job=\"t\"} 0\n")
                   ->plan_fitted_mfu.has_value());
  auto advised = ParseTrainerMetrics(
      "meshwork_trainer_step 12\nmeshwork_trainer_plan_fitted_mfu{job=\"t\"} 0.0312\n"
      "meshwork_trainer_plan_predicted_speedup{job=\"t\"} 1.25\n");
  ASSERT_TRUE(advised.has_value());
  EXPECT_DOUBLE_EQ(advised->plan_fitted_mfu.value_or(-1), 0.0312);
  EXPECT_DOUBLE_EQ(advised->plan_predicted_speedup.value_or(-1), 1.25);
}

TEST(TrainerReportTest, ParsesTheFinalLine) {
  const std::string log =
      "step 200/200 | loss 2.1 | ...\n"
      "done: 200 steps, 409600 tokens in 214.0 s | final loss 2.1042 | 1917 tok/s | mfu 7.59% | peak mem 291 MiB (cpu)\n";
  auto r = ParseFinalLine(log);
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->loss, 2.1042);
  EXPECT_DOUBLE_EQ(r->tokens_per_second, 1917);
  auto resumed = ParseFinalLine("done: 50 steps (resumed at step 150), 1 tokens in 1.0 s | final loss 1.5 | 20 tok/s | mfu 1%\n");
  ASSERT_TRUE(resumed.has_value());
  EXPECT_DOUBLE_EQ(resumed->loss, 1.5);
  EXPECT_FALSE(ParseFinalLine("step 1/2 | loss 3\n").has_value());
  EXPECT_FALSE(ParseFinalLine("done: 2 steps | final loss n/a | x tok/s\n").has_value());
}

TEST(TrainerReportTest, HttpGetFailsCleanlyWhenNothingListens) {
  auto r = HttpGet("127.0.0.1", 1, "/metrics", std::chrono::milliseconds(500));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("http://127.0.0.1:1/metrics"));
  EXPECT_EQ(HttpGet("not-an-ip", 80, "/", std::chrono::milliseconds(100)).status().code(), StatusCode::kInvalidConfig);
}

}  // namespace
}  // namespace meshwork::op
