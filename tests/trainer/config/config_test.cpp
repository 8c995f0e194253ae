// The trainer config: every rejected input names its key and value, overrides apply in order,
// presets resolve before explicit dims, ToYaml round-trips, and docs/config.md lists every key.
#include "trainer/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/common/temp_dir.h"
#include "trainer/model/llama_config.h"

namespace meshwork::config {
namespace {

namespace mwt = ::meshwork::testing;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadDocs() {
  std::ifstream in(std::string(MESHWORK_SOURCE_DIR) + "/docs/config.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> KnownSections() {
  std::set<std::string> sections;
  for (const auto& k : KnownKeys()) sections.insert(k.substr(0, k.find('.')));
  return sections;
}

// --- rejected inputs ------------------------------------------------------------------------

struct Rejected {
  std::string name;                    // test name suffix
  std::string yaml;                    // the config file's text
  std::vector<std::string> overrides;  // --set assignments
  std::string key;                     // the message must name this key...
  std::string value;                   // ...and this offending value
};

void PrintTo(const Rejected& r, std::ostream* os) { *os << r.name; }

class RejectedConfigTest : public ::testing::TestWithParam<Rejected> {};

TEST_P(RejectedConfigTest, IsInvalidConfigNamingKeyAndValue) {
  const Rejected& r = GetParam();
  auto c = LoadConfigFromString(r.yaml, r.overrides);
  ASSERT_FALSE(c.ok()) << "accepted:\n" << r.yaml;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig) << c.status().ToString();
  EXPECT_THAT(c.status().message(), HasSubstr(r.key));
  EXPECT_THAT(c.status().message(), HasSubstr(r.value));
}

// One row per case reads better than the formatter's layout.
// clang-format off
const Rejected kRejected[] = {
    // Unknown keys and sections.
    {"UnknownTopLevelKey", "foo: 1\n", {}, "'foo'", "unknown key"},
    {"UnknownNestedKeySuggestsNearMiss", "data:\n  seqlen: 64\n", {}, "'data.seqlen'",
     "did you mean 'data.seq_len'?"},
    {"UnknownSection", "modle:\n  preset: tiny\n", {}, "'modle'", "unknown key"},
    {"UnknownKeyFromOverride", "", {"optimizer.learning_rate=1e-3"}, "'optimizer.learning_rate'",
     "unknown key"},
    {"SectionGivenAScalar", "optimizer: 3\n", {}, "'optimizer'", "'3'"},
    {"SectionGivenAList", "training: [cpu]\n", {}, "'training'", "a list"},
    {"TopLevelList", "- model\n- data\n", {}, "top level", "a list"},
    {"TopLevelScalar", "42\n", {}, "top level", "'42'"},
    // Wrong types.
    {"StringForInt", "data:\n  seq_len: abc\n", {}, "'data.seq_len'", "'abc'"},
    {"FloatForInt", "data:\n  batch_size: 1.5\n", {}, "'data.batch_size'", "'1.5'"},
    {"IntTooLargeForInt64", "model:\n  vocab_size: 99999999999999999999999\n", {}, "'model.vocab_size'",
     "'99999999999999999999999'"},
    {"ListForString", "data:\n  train: [a.bin, b.bin]\n", {}, "'data.train'", "a list"},
    {"MapForNumber", "optimizer:\n  lr: {value: 1}\n", {}, "'optimizer.lr'", "a mapping"},
    {"NullForNumber", "", {"optimizer.lr="}, "'optimizer.lr'", "null"},
    {"NanForNumber", "model:\n  rope_theta: .nan\n", {}, "'model.rope_theta'", "'.nan'"},
    {"SentenceForBool", "model:\n  tie_word_embeddings: yes please\n", {}, "'model.tie_word_embeddings'",
     "'yes please'"},
    {"IntegerForBool", "model:\n  tie_word_embeddings: 1\n", {}, "'model.tie_word_embeddings'", "'1'"},
    // Out of range.
    {"LrZero", "optimizer:\n  lr: 0\n", {}, "'optimizer.lr'", "got 0"},
    {"Beta2AboveOne", "optimizer:\n  beta2: 1.5\n", {}, "'optimizer.beta2'", "got 1.5"},
    {"NegativeWeightDecay", "optimizer:\n  weight_decay: -0.1\n", {}, "'optimizer.weight_decay'", "got -0.1"},
    {"SeqLenZero", "data:\n  seq_len: 0\n", {}, "'data.seq_len'", "got 0"},
    {"MetricsPort70000", "metrics:\n  port: 70000\n", {}, "'metrics.port'", "got 70000"},
    {"MetricsPortBelowMinusOne", "metrics:\n  port: -2\n", {}, "'metrics.port'", "got -2"},
    {"StepsNegative", "schedule:\n  steps: -1\n", {}, "'schedule.steps'", "got -1"},
    {"MinLrRatioAboveOne", "schedule:\n  min_lr_ratio: 1.5\n", {}, "'schedule.min_lr_ratio'", "got 1.5"},
    {"GradAccumZero", "training:\n  grad_accum: 0\n", {}, "'training.grad_accum'", "got 0"},
    {"ThreadsNegative", "training:\n  threads: -1\n", {}, "'training.threads'", "got -1"},
    {"EvalWindowsZero", "eval:\n  windows: 0\n", {}, "'eval.windows'", "got 0"},
    {"LoggingEveryZero", "logging:\n  every: 0\n", {}, "'logging.every'", "got 0"},
    {"HiddenSizeZero", "model:\n  hidden_size: 0\n", {}, "'model.hidden_size'", "got 0"},
    // Bad enum values.
    {"ScheduleDecay", "schedule:\n  decay: exponential\n", {}, "'schedule.decay'", "'exponential'"},
    {"TokenFormat", "data:\n  token_format: u8\n", {}, "'data.token_format'", "'u8'"},
    {"TrainingDtype", "training:\n  dtype: fp16\n", {}, "'training.dtype'", "'fp16'"},
    {"LossGradient", "training:\n  loss_gradient: cached\n", {}, "'training.loss_gradient'", "'cached'"},
    {"FusedKernels", "training:\n  fused_kernels: triton\n", {}, "'training.fused_kernels'", "'triton'"},
    {"ResidualDtype", "training:\n  residual_dtype: fp16\n", {}, "'training.residual_dtype'", "'fp16'"},
    {"AttentionBackend", "training:\n  attention_backend: flash3\n", {}, "'training.attention_backend'", "'flash3'"},
    {"CheckpointEveryZero", "training:\n  checkpoint_every: 0\n", {}, "'training.checkpoint_every'", "got 0"},
    {"DeviceProfile", "metrics:\n  device_profile: v100\n", {}, "'metrics.device_profile'", "'v100'"},
    {"ExportDtype", "checkpoint:\n  export_dtype: fp16\n", {}, "'checkpoint.export_dtype'", "'fp16'"},
    {"CheckpointEveryNegative", "checkpoint:\n  every: -5\n", {}, "'checkpoint.every'", "got -5"},
    {"CheckpointKeepZero", "checkpoint:\n  keep: 0\n", {}, "'checkpoint.keep'", "got 0"},
    {"CheckpointKeepNotAnInteger", "", {"checkpoint.keep=two"}, "'checkpoint.keep'", "'two'"},
    {"CheckpointResume", "checkpoint:\n  resume: always\n", {}, "'checkpoint.resume'", "'always'"},
    // Bad device strings.
    {"DeviceGpu", "training:\n  device: gpu\n", {}, "'training.device'", "'gpu'"},
    {"DeviceCudaLetterIndex", "training:\n  device: cuda:x\n", {}, "'training.device'", "'cuda:x'"},
    {"DeviceCudaNegativeIndex", "training:\n  device: cuda:-1\n", {}, "'training.device'", "'cuda:-1'"},
    // Cross-field rules.
    {"Bf16OnCpu", "training:\n  device: cpu\n  dtype: bf16\n", {}, "'training.dtype'", "'cpu'"},
    {"Bf16ResidualInFp32", "training:\n  dtype: fp32\n  residual_dtype: bf16\n", {}, "'training.residual_dtype'",
     "bf16 needs bf16 autocast, but training.dtype is 'fp32'"},
    {"Bf16ResidualOnCpu", "", {"training.device=cpu", "training.residual_dtype=bf16"}, "'training.residual_dtype'",
     "training.device is 'cpu'"},
    {"CudnnAttentionOnCpu", "", {"training.device=cpu", "training.attention_backend=cudnn"},
     "'training.attention_backend'", "cudnn is a CUDA kernel, but training.device is 'cpu'"},
    {"OptimizerImplementation", "", {"optimizer.implementation=apex"}, "'optimizer.implementation'",
     "must be one of auto, foreach, fused, meshwork, got 'apex'"},
    {"FusedAdamWOnCpu", "", {"training.device=cpu", "optimizer.implementation=fused"},
     "'optimizer.implementation'", "fused is libtorch's CUDA kernel, but training.device is 'cpu'"},
    {"EfficientAttentionOnCpu", "training:\n  device: cpu\n  attention_backend: efficient\n", {},
     "'training.attention_backend'", "efficient is a CUDA kernel"},
    {"WarmupAboveSteps", "schedule:\n  steps: 10\n  warmup_steps: 11\n", {}, "'schedule.warmup_steps'",
     "11 exceeds schedule.steps 10"},
    {"TraceOfOneStepRun", "schedule:\n  steps: 1\n  warmup_steps: 0\nfsdp:\n  trace_out: t.json\n", {},
     "'fsdp.trace_out'", "schedule.steps is 1"},
    {"TraceOfTwoStepRun", "schedule:\n  steps: 2\n  warmup_steps: 0\nfsdp:\n  trace_out: t.json\n", {},
     "'fsdp.trace_out'", "traces step 3, but schedule.steps is 2"},
    {"CalibrationOfAnEagerRun", "fsdp:\n  calibration_out: run.calibration\n", {}, "'fsdp.calibration_out'",
     "needs fsdp.mode compiled (is eager)"},
    {"CalibrationOfATwoStepRun", "schedule:\n  steps: 2\n  warmup_steps: 0\nfsdp:\n  mode: compiled\n  calibration_out: c\n",
     {}, "'fsdp.calibration_out'", "schedule.steps >= 3 (is 2)"},
    {"MeshAutoWithAnExplicitDim", "dist:\n  mesh: auto\nmesh:\n  dp_shard: 2\n", {}, "'dist.mesh'",
     "auto chooses the mesh itself, but mesh.dp_replicate=1 and mesh.dp_shard=2 set one"},
    {"MeshPolicyUnknown", "dist:\n  mesh: fastest\n", {}, "'dist.mesh'", "explicit, auto"},
    {"TpZero", "", {"mesh.tp=0"}, "'mesh.tp'", "got 0"},
    {"PpZero", "", {"mesh.pp=0"}, "'mesh.pp'", "got 0"},
    {"PpWithReplicasLeftToTheWorld", "", {"mesh.pp=2", "mesh.dp_replicate=0"}, "'mesh.dp_replicate'",
     "0 (whatever the world leaves) is not resolved beside mesh.pp=2"},
    {"PpWithMeshAuto", "", {"mesh.pp=2", "dist.mesh=auto"}, "'dist.mesh'", "but mesh.pp=2 is set"},
    {"PpCompiledWithoutFsdp", "", {"mesh.pp=2", "mesh.dp_shard=1", "fsdp.mode=compiled"}, "'fsdp.mode'", "with mesh.pp=2 and mesh.dp_shard=1 there is no FSDP inside the stages"},
    {"PpCompiledPipeMare", "", {"mesh.pp=2", "mesh.dp_shard=0", "fsdp.mode=compiled", "pipeline.schedule=pipemare", "model.tie_word_embeddings=false"}, "'fsdp.mode'", "pipeline.schedule: pipemare is asynchronous"},
    {"PpCompiledBudget", "", {"mesh.pp=2", "mesh.dp_shard=2", "fsdp.mode=compiled", "fsdp.memory_budget=100"}, "'fsdp.memory_budget'", "100, but a compiled plan with mesh.pp=2"},
    {"PpCompiledCalibration", "", {"mesh.pp=2", "mesh.dp_shard=2", "fsdp.mode=compiled", "fsdp.calibration_out=/tmp/c.yaml", "schedule.steps=5"}, "'fsdp.calibration_out'", "'/tmp/c.yaml', but a compiled plan with mesh.pp=2"},
    {"PipeMareWithFsdp", "", {"mesh.pp=2", "pipeline.schedule=pipemare", "mesh.dp_shard=2"}, "'mesh.dp_shard'",
     "2 beside pipeline.schedule: pipemare (each stage updates its parameters at its own time within a step)"},
    {"PipeMareWithTp", "", {"mesh.pp=2", "pipeline.schedule=pipemare", "mesh.tp=2"}, "'mesh.tp'",
     "2 beside pipeline.schedule: pipemare"},
    {"PipeMareWithATiedTable", "", {"mesh.pp=2", "pipeline.schedule=pipemare"}, "'model.tie_word_embeddings'",
     "would update the table's two copies at different times"},
    {"CorrectionDecayAboveOne", "", {"pipeline.correction_decay=1.5"}, "'pipeline.correction_decay'", "must be in [0, 1]"},
    {"RescheduleStepsBelowMinusOne", "", {"pipeline.lr_reschedule_steps=-2"}, "'pipeline.lr_reschedule_steps'", "got -2"},
    {"PpMoreStagesThanLayers", "", {"model.preset=tiny", "mesh.pp=4", "pipeline.schedule=interleaved-1f1b",
                                    "pipeline.virtual_stages=2"},
     "'mesh.pp'", "mesh.pp=4 x pipeline.virtual_stages=2 = 8 stages, but the model has 4 decoder layers"},
    {"PipelineScheduleUnknown", "", {"pipeline.schedule=1f2b"}, "'pipeline.schedule'", "1f2b"},
    {"VirtualStagesWithout1F1BInterleaved", "", {"pipeline.virtual_stages=2"}, "'pipeline.virtual_stages'",
     "2 stages per rank need pipeline.schedule: interleaved-1f1b"},
    {"TpWithMeshAuto", "", {"mesh.tp=2", "dist.mesh=auto"}, "'dist.mesh'", "but mesh.tp=2 is set"},
    {"CompiledWithTpSpanningTheWorld", "", {"mesh.tp=2", "mesh.dp_shard=1", "fsdp.mode=compiled"}, "'fsdp.mode'",
     "with mesh.dp_shard=1 and mesh.dp_replicate=1 mesh.tp=2 spans the whole world"},
    {"TpDoesNotSplitTheModel", "", {"model.preset=tiny", "mesh.tp=4"}, "'mesh.tp'",
     "model.num_key_value_heads=2 does not divide by mesh.tp=4"},
    {"SequenceParallelTokensDoNotDivide", "", {"mesh.tp=2", "data.batch_size=3", "data.seq_len=5"},
     "'mesh.sequence_parallel'", "data.batch_size=3 x data.seq_len=5 = 15 tokens over mesh.tp=2"},
    {"SeqLenAboveMaxPositions", "data:\n  seq_len: 2000\n", {}, "'data.seq_len'",
     "2000 exceeds model.max_position_embeddings 1024"},
    {"UnknownPreset", "model:\n  preset: gpt2\n", {}, "'model.preset'", "'gpt2'"},
    {"HiddenNotDivisibleByHeads", "model:\n  hidden_size: 130\n", {}, "'model.hidden_size'",
     "130 is not divisible by num_attention_heads 4"},
    {"KvHeadsDoNotDivideHeads", "model:\n  num_key_value_heads: 3\n", {}, "'model.num_key_value_heads'",
     "3 does not divide num_attention_heads 4"},
    {"OddHeadDim", "model:\n  hidden_size: 136\n  num_attention_heads: 8\n", {}, "'model.hidden_size'",
     "head dim 17"},
    {"EmptyTrainPath", "data:\n  train: ''\n", {}, "'data.train'", "must name a token file"},
    {"EmptyMetricsHost", "metrics:\n  host: ''\n", {}, "'metrics.host'", "must not be empty"},
    // --set syntax.
    {"SetWithoutEquals", "", {"noequals"}, "--set 'noequals'", "expected key=value"},
    {"SetWithoutKey", "", {"=3"}, "--set '=3'", "expected key=value"},
    {"SetEmptyKeyComponent", "", {"a..b=1"}, "--set 'a..b=1'", "empty component in key 'a..b'"},
    {"SetKeyUnderAnEarlierScalar", "", {"optimizer.lr=0.1", "optimizer.lr.x=1"}, "--set 'optimizer.lr.x=1'",
     "'lr' is not a section"},
    {"SetKeyUnderAFileScalar", "optimizer:\n  lr: 0.1\n", {"optimizer.lr.x=1"}, "--set 'optimizer.lr.x=1'",
     "'lr' is not a section"},
    {"SetValueNotYaml", "", {"optimizer.lr=[1"}, "--set 'optimizer.lr=[1'", "not valid YAML"},
    {"SetSectionToScalar", "", {"optimizer=3"}, "'optimizer'", "'3'"},
    // yaml-cpp alone would read these as 16 and 8: integers are decimal, digits only.
    {"HexInteger", "", {"schedule.steps=0x10"}, "schedule.steps", "0x10"},
    {"OctalPrefixInteger", "", {"schedule.steps=0o10"}, "schedule.steps", "0o10"},
    {"IntegerWithExponent", "", {"schedule.steps=1e3"}, "schedule.steps", "1e3"},
    {"IntegerWithTwoSigns", "", {"fsdp.memory_budget=+-5"}, "fsdp.memory_budget", "+-5"},
    {"IntegerPastInt64", "", {"training.seed=99999999999999999999"}, "training.seed", "99999999999999999999"},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Config, RejectedConfigTest, ::testing::ValuesIn(kRejected),
                         [](const auto& info) { return info.param.name; });

TEST(ConfigTest, UnknownKeyFarFromAnyKeyHasNoSuggestion) {
  auto c = LoadConfigFromString("foo: 1\n", {});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), Not(HasSubstr("did you mean")));
  EXPECT_THAT(c.status().message(), HasSubstr("docs/config.md"));
}

TEST(ConfigTest, UnknownPresetListsTheKnownPresets) {
  auto c = LoadConfigFromString("", {"model.preset=gpt2"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  for (const auto& name : model::PresetNames()) EXPECT_THAT(c.status().message(), HasSubstr(name));
}

TEST(ConfigTest, YamlSyntaxErrorReportsLineAndColumn) {
  auto c = LoadConfigFromString("optimizer:\n  lr: 0.1\n  beta1: 0.9: 1\n", {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr("YAML syntax error at line 3, column 13"));
}

TEST(ConfigTest, YamlSyntaxErrorInFileNamesFileLineAndColumn) {
  mwt::TempDir dir;
  const std::string path = dir.File("bad.yaml");
  mwt::WriteBytes(path, "data:\n  seq_len: [64\n");
  auto c = LoadConfig(path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr(path));
  EXPECT_THAT(c.status().message(), HasSubstr("YAML syntax error at line 3, column 1"));
}

TEST(ConfigTest, MissingConfigFileIsNotFound) {
  mwt::TempDir dir;
  const std::string path = dir.File("absent.yaml");
  auto c = LoadConfig(path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr(path));
}

// A directory is not a config file: the loader must say so as a Status, not throw (errors are
// values at module boundaries).
TEST(ConfigTest, DirectoryAsConfigFileIsAnErrorNotAnException) {
  mwt::TempDir dir;
  Status status;
  EXPECT_NO_THROW({
    auto c = LoadConfig(dir.path(), {});
    status = c.ok() ? Status::Ok() : c.status();
  });
  EXPECT_FALSE(status.ok());
}

TEST(ConfigTest, InvalidValueInFileIsPrefixedWithThePath) {
  mwt::TempDir dir;
  const std::string path = dir.File("run.yaml");
  mwt::WriteBytes(path, "optimizer:\n  lr: 0\n");
  auto c = LoadConfig(path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr(path + ": key 'optimizer.lr'"));
}

// --- accepted inputs ------------------------------------------------------------------------

// --- --config-env ---------------------------------------------------------------------------

// Sets an environment variable for one test and restores the previous state after.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(ConfigEnvTest, ReadsTheYamlFromTheVariableAndAppliesSetOnTop) {
  ScopedEnv env("MESHWORK_TEST_CONFIG", "schedule:\n  steps: 42\ncheckpoint:\n  dir: /ckpt\n  every: 10\n");
  auto c = LoadConfigFromEnv("MESHWORK_TEST_CONFIG", {"checkpoint.keep=3", "schedule.steps=50"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->schedule.steps, 50);
  EXPECT_EQ(c->checkpoint.dir, "/ckpt");
  EXPECT_EQ(c->checkpoint.every, 10);
  EXPECT_EQ(c->checkpoint.keep, 3);
  EXPECT_EQ(c->checkpoint.resume, Resume::kAuto);
}

TEST(ConfigEnvTest, UnsetVariableIsAConfigErrorNamingFlagAndVariable) {
  ScopedEnv env("MESHWORK_TEST_CONFIG", nullptr);
  auto c = LoadConfigFromEnv("MESHWORK_TEST_CONFIG", {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr("--config-env MESHWORK_TEST_CONFIG"));
  EXPECT_THAT(c.status().message(), HasSubstr("not set"));
}

TEST(ConfigEnvTest, EmptyVariableIsAConfigError) {
  ScopedEnv env("MESHWORK_TEST_CONFIG", "");
  auto c = LoadConfigFromEnv("MESHWORK_TEST_CONFIG", {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr("'MESHWORK_TEST_CONFIG' is empty"));
}

TEST(ConfigEnvTest, ErrorsInTheTextArePrefixedWithTheVariable) {
  ScopedEnv env("MESHWORK_TEST_CONFIG", "checkpoint:\n  every: -1\n");
  auto c = LoadConfigFromEnv("MESHWORK_TEST_CONFIG", {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr("env MESHWORK_TEST_CONFIG: key 'checkpoint.every'"));
}

TEST(ConfigTest, CheckpointDefaults) {
  auto c = LoadConfig("", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->checkpoint.dir, "");
  EXPECT_EQ(c->checkpoint.every, 0);
  EXPECT_EQ(c->checkpoint.keep, 2);
  EXPECT_EQ(c->checkpoint.resume, Resume::kAuto);
}

TEST(ConfigTest, DefaultsWithoutAFile) {
  auto c = LoadConfig("", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.preset, "tiny");
  EXPECT_EQ(c->model.dims.hidden_size, 128);
  EXPECT_EQ(c->model.dims.vocab_size, 320);
  EXPECT_FALSE(c->model.dims_explicit);
  EXPECT_EQ(c->data.train, "synthetic");
  EXPECT_EQ(c->data.seq_len, 128);
  EXPECT_EQ(c->data.batch_size, 16);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 3e-3);
  EXPECT_EQ(c->schedule.steps, 200);
  EXPECT_EQ(c->schedule.warmup_steps, 20);
  EXPECT_EQ(c->schedule.decay, LrDecay::kCosine);
  EXPECT_EQ(c->training.device, "auto");
  EXPECT_EQ(c->training.dtype, Dtype::kAuto);
  EXPECT_EQ(c->training.loss_gradient, LossGradient::kAuto);
  EXPECT_TRUE(c->training.merge_projections);
  EXPECT_EQ(c->training.fused_kernels, FusedKernels::kAuto);
  EXPECT_EQ(c->training.residual_dtype, ResidualDtype::kAuto);
  EXPECT_EQ(c->training.attention_backend, AttentionBackend::kAuto);
  EXPECT_EQ(c->optimizer.implementation, OptimizerImplementation::kAuto);
  EXPECT_EQ(c->training.threads, 0);
  EXPECT_EQ(c->metrics.port, 9400);
  EXPECT_EQ(c->metrics.host, "0.0.0.0");
  EXPECT_EQ(c->checkpoint.export_dtype, ExportDtype::kFp32);
}

TEST(ConfigTest, EmptyTextAndEmptySectionsGiveDefaults) {
  for (const std::string yaml : {"", "# only a comment\n", "data:\noptimizer:\n"}) {
    auto c = LoadConfigFromString(yaml, {});
    ASSERT_TRUE(c.ok()) << yaml << ": " << c.status().ToString();
    EXPECT_EQ(ToYaml(*c), ToYaml(*LoadConfig("", {})));
  }
}

TEST(ConfigTest, FullFileFillsEverySection) {
  mwt::TempDir dir;
  const std::string path = dir.File("full.yaml");
  mwt::WriteBytes(path, R"(model:
  preset: llama-100m
  num_hidden_layers: 2
  rms_norm_eps: 1.0e-6
  rope_theta: 500000
  tie_word_embeddings: false
  init_std: 0.01
data:
  train: data/train.bin
  val: data/val.bin
  token_format: llmc
  seq_len: 512
  batch_size: 8
optimizer:
  lr: 6.0e-4
  weight_decay: 0.05
  beta1: 0.8
  beta2: 0.99
  eps: 1.0e-6
  grad_clip: 0.5
  implementation: fused
schedule:
  steps: 1000
  warmup_steps: 100
  decay: linear
  min_lr_ratio: 0.0
training:
  device: cuda:1
  dtype: bf16
  grad_accum: 4
  seed: 7
  threads: 2
  attention_backend: cudnn
eval:
  data: data/heldout.bin
  windows: 32
  every: 250
logging:
  every: 5
metrics:
  port: 0
  host: 127.0.0.1
  job: run-42
  device_profile: h100-sxm
  peak_tflops: 700
checkpoint:
  export_hf: out/hf
  export_dtype: bf16
)");
  auto c = LoadConfig(path, {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.preset, "llama-100m");
  EXPECT_EQ(c->model.dims.num_hidden_layers, 2);
  EXPECT_EQ(c->model.dims.hidden_size, 768);
  EXPECT_DOUBLE_EQ(c->model.dims.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->model.dims.rope_theta, 500000);
  EXPECT_FALSE(c->model.dims.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->model.init_std, 0.01);
  EXPECT_EQ(c->data.train, "data/train.bin");
  EXPECT_EQ(c->data.val, "data/val.bin");
  EXPECT_EQ(c->data.token_format, data::TokenFormat::kLlmc);
  EXPECT_EQ(c->data.seq_len, 512);
  EXPECT_EQ(c->data.batch_size, 8);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 6e-4);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.05);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c->optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->optimizer.grad_clip, 0.5);
  EXPECT_EQ(c->optimizer.implementation, OptimizerImplementation::kFused);
  EXPECT_EQ(c->schedule.steps, 1000);
  EXPECT_EQ(c->schedule.warmup_steps, 100);
  EXPECT_EQ(c->schedule.decay, LrDecay::kLinear);
  EXPECT_DOUBLE_EQ(c->schedule.min_lr_ratio, 0.0);
  EXPECT_EQ(c->training.device, "cuda:1");
  EXPECT_EQ(c->training.dtype, Dtype::kBf16);
  EXPECT_EQ(c->training.grad_accum, 4);
  EXPECT_EQ(c->training.seed, 7);
  EXPECT_EQ(c->training.threads, 2);
  EXPECT_EQ(c->training.attention_backend, AttentionBackend::kCudnn);
  EXPECT_EQ(c->eval.data, "data/heldout.bin");
  EXPECT_EQ(c->eval.windows, 32);
  EXPECT_EQ(c->eval.every, 250);
  EXPECT_EQ(c->logging.every, 5);
  EXPECT_EQ(c->metrics.port, 0);
  EXPECT_EQ(c->metrics.host, "127.0.0.1");
  EXPECT_EQ(c->metrics.job, "run-42");
  EXPECT_EQ(c->metrics.device_profile, DeviceProfileName::kH100Sxm);
  EXPECT_DOUBLE_EQ(c->metrics.peak_tflops, 700);
  EXPECT_EQ(c->checkpoint.export_hf, "out/hf");
  EXPECT_EQ(c->checkpoint.export_dtype, ExportDtype::kBf16);
}

TEST(ConfigTest, AcceptsEveryDeviceForm) {
  for (const std::string dev : {"auto", "cpu", "cuda", "cuda:0", "cuda:7"}) {
    auto c = LoadConfigFromString("", {"training.device=" + dev});
    ASSERT_TRUE(c.ok()) << dev << ": " << c.status().ToString();
    EXPECT_EQ(c->training.device, dev);
  }
  // bf16 is refused only where the device is known to be the CPU.
  for (const std::string dev : {"auto", "cuda", "cuda:0"}) {
    EXPECT_TRUE(LoadConfigFromString("", {"training.device=" + dev, "training.dtype=bf16"}).ok()) << dev;
  }
}

TEST(ConfigTest, AcceptsRangeEdges) {
  const std::vector<std::vector<std::string>> accepted = {
      {"metrics.port=-1"},
      {"metrics.port=0"},
      {"metrics.port=65535"},
      {"optimizer.grad_clip=0"},
      {"optimizer.beta2=0"},
      {"optimizer.weight_decay=0"},
      {"schedule.warmup_steps=0"},
      {"schedule.min_lr_ratio=1"},
      {"training.threads=0"},
      {"eval.every=0"},
      {"schedule.steps=10", "schedule.warmup_steps=10"},
      {"data.seq_len=1024"},  // == max_position_embeddings of tiny
  };
  for (const auto& o : accepted) {
    auto c = LoadConfigFromString("", o);
    EXPECT_TRUE(c.ok()) << o.front() << ": " << c.status().ToString();
  }
}

// A zero-padded integer is the decimal it reads as (YAML 1.2's core schema), never octal: yaml-cpp's
// own conversion made `seq_len: 0200` 128.
TEST(ConfigTest, ZeroPaddedIntegersAreDecimal) {
  auto c = LoadConfigFromString("data:\n  seq_len: 0200\n", {"checkpoint.every=0100", "metrics.port=09400",
                                                              "training.seed=+7", "metrics.port=-1"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->data.seq_len, 200);
  EXPECT_EQ(c->checkpoint.every, 100);
  EXPECT_EQ(c->training.seed, 7);
  auto port = LoadConfigFromString("", {"metrics.port=09400"});
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_EQ(port->metrics.port, 9400);
}

TEST(ConfigTest, DefaultWarmupShrinksToAShortRunAndAGivenOneIsChecked) {
  // The default warmup (20) shrinks to fit a short smoke run...
  auto short_run = LoadConfigFromString("", {"schedule.steps=5"});
  ASSERT_TRUE(short_run.ok()) << short_run.status().ToString();
  EXPECT_EQ(short_run->schedule.warmup_steps, 5);
  // ...but a warmup the user wrote is, wherever the two keys come from.
  auto c = LoadConfigFromString("schedule:\n  warmup_steps: 10\n", {"schedule.steps=5"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(c.status().message(), HasSubstr("'schedule.warmup_steps': 10 exceeds schedule.steps 5"));
}

TEST(ConfigTest, SetOverridesAFileValueAndCreatesAMissingSection) {
  auto c = LoadConfigFromString("optimizer:\n  lr: 0.1\n  beta1: 0.8\n",
                                {"optimizer.lr=0.2", "data.seq_len=64", "metrics.port=-1"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 0.2);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);  // a sibling in the file survives
  EXPECT_EQ(c->data.seq_len, 64);
  EXPECT_EQ(c->metrics.port, -1);
}

TEST(ConfigTest, SetFillsAnEmptySectionFromTheFile) {
  auto c = LoadConfigFromString("data:\n", {"data.seq_len=64"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->data.seq_len, 64);
}

TEST(ConfigTest, LaterSetWins) {
  auto c = LoadConfigFromString(
      "", {"optimizer.lr=0.1", "optimizer.lr=0.2", "schedule.decay=linear", "schedule.decay=constant"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 0.2);
  EXPECT_EQ(c->schedule.decay, LrDecay::kConstant);
}

TEST(ConfigTest, SetValuesAreYaml) {
  auto c = LoadConfigFromString("", {"metrics.job=a=b", "data.val=", "model.tie_word_embeddings=false",
                                     "metrics.host='127.0.0.1'", "optimizer.lr=3e-4"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metrics.job, "a=b");  // only the first '=' splits
  EXPECT_EQ(c->data.val, "");
  EXPECT_FALSE(c->model.dims.tie_word_embeddings);
  EXPECT_EQ(c->metrics.host, "127.0.0.1");
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 3e-4);
}

// Tensor parallelism composes with FSDP and HSDP (a mesh dp_replicate x dp_shard x tp), with
// compiled FSDP and with training checkpoints: none of these is refused at load (a tp spanning the whole world under compiled
// mode is refused at start-up, where the world size is known).
TEST(ConfigTest, TensorParallelComposesWithDataParallelDims) {
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{"mesh.tp=2", "mesh.dp_shard=2"},
        std::vector<std::string>{"mesh.tp=2", "mesh.dp_replicate=2", "mesh.dp_shard=1"},
        std::vector<std::string>{"mesh.tp=2", "mesh.dp_shard=2", "fsdp.mode=compiled"},
        std::vector<std::string>{"mesh.tp=2", "checkpoint.dir=ckpt"}}) {
    auto c = LoadConfigFromString("", set);
    ASSERT_TRUE(c.ok()) << set[1] << ": " << c.status().ToString();
    EXPECT_EQ(c->mesh.tp, 2);
  }
}

TEST(ConfigTest, ExplicitDimOverridesPreset) {
  auto c = LoadConfigFromString("", {"model.preset=llama-100m", "model.num_hidden_layers=2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.dims.num_hidden_layers, 2);
  EXPECT_EQ(c->model.dims.hidden_size, 768);
  EXPECT_EQ(c->model.dims.vocab_size, 32000);
  EXPECT_EQ(c->model.dims.num_key_value_heads, 4);
}

TEST(ConfigTest, PresetAppliesFirstWhateverTheOrder) {
  auto from_file = LoadConfigFromString("model:\n  num_hidden_layers: 2\n  preset: llama-100m\n", {});
  auto from_set = LoadConfigFromString("", {"model.num_hidden_layers=2", "model.preset=llama-100m"});
  for (const auto* c : {&from_file, &from_set}) {
    ASSERT_TRUE(c->ok()) << c->status().ToString();
    EXPECT_EQ((*c)->model.dims.num_hidden_layers, 2);
    EXPECT_EQ((*c)->model.dims.hidden_size, 768);
  }
}

TEST(ConfigTest, PresetDimsMatchPresetConfig) {
  for (const auto& name : model::PresetNames()) {
    auto c = LoadConfigFromString("", {"model.preset=" + name});
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    auto want = model::PresetConfig(name);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(c->model.dims.NumParameters(), want->NumParameters()) << name;
    EXPECT_EQ(c->model.dims.max_position_embeddings, want->max_position_embeddings) << name;
  }
}

TEST(ConfigTest, DimsExplicitOnlyWhenPresetOrDimNamed) {
  EXPECT_FALSE(LoadConfigFromString("", {})->model.dims_explicit);
  EXPECT_FALSE(LoadConfigFromString("", {"model.init_std=0.01"})->model.dims_explicit);
  EXPECT_TRUE(LoadConfigFromString("", {"model.preset=tiny"})->model.dims_explicit);
  EXPECT_TRUE(LoadConfigFromString("", {"model.hidden_size=256"})->model.dims_explicit);
  EXPECT_TRUE(LoadConfigFromString("", {"model.tie_word_embeddings=false"})->model.dims_explicit);
}

TEST(ConfigTest, InitFromWithDimsIsAcceptedAndLeftToTheCheckpointComparison) {
  // Whether the dims agree with the checkpoint is decided where config.json is read
  // (trainer_test: CheckpointDimsThatDisagreeWithTheConfigNameTheKey).
  auto c = LoadConfigFromString("model:\n  init_from: /ckpt/llama\n  preset: tiny\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->model.dims_explicit);
}

TEST(ConfigTest, InitFromAloneIsAcceptedAndDefersDimChecks) {
  // The dims come from the checkpoint's config.json at run time, so seq_len is not checked
  // against the default preset here.
  auto c = LoadConfigFromString("", {"model.init_from=/ckpt/llama", "data.seq_len=4096"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.init_from, "/ckpt/llama");
  EXPECT_FALSE(c->model.dims_explicit);
}

// --- ToYaml and KnownKeys -------------------------------------------------------------------

TEST(ConfigTest, ToYamlRoundTrips) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"model.preset=llama-100m", "model.num_hidden_layers=2", "data.train=data/train.bin",
       "data.val=data/val.bin", "optimizer.lr=6e-4", "optimizer.eps=1e-6", "schedule.decay=linear",
       "training.device=cuda:0", "training.dtype=bf16", "metrics.port=-1", "metrics.job=123",
       "checkpoint.export_hf=out/hf", "model.tie_word_embeddings=false"},
  };
  for (const auto& o : cases) {
    auto c = LoadConfigFromString("", o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::string yaml = ToYaml(*c);
    auto again = LoadConfigFromString(yaml, {});
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
    EXPECT_EQ(ToYaml(*again), yaml);
    EXPECT_EQ(again->metrics.job, c->metrics.job);
  }
}

// `meshwork-train config` prints ToYaml; a float with more than six significant digits must
// survive it, or the printed config describes a different run (or an invalid one).
TEST(ConfigTest, ToYamlKeepsFloatsExactly) {
  auto c = LoadConfigFromString("", {"optimizer.lr=1.2345678e-4"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = LoadConfigFromString(ToYaml(*c), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->optimizer.lr, c->optimizer.lr);
}

TEST(ConfigTest, ToYamlOfBeta2CloseToOneLoadsAgain) {
  auto c = LoadConfigFromString("", {"optimizer.beta2=0.9999999"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = LoadConfigFromString(ToYaml(*c), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->optimizer.beta2, c->optimizer.beta2);
}

// The printed config of an import run must load again.
TEST(ConfigTest, ToYamlOfInitFromConfigLoadsAgain) {
  auto c = LoadConfigFromString("", {"model.init_from=/ckpt/llama"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = LoadConfigFromString(ToYaml(*c), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->model.init_from, "/ckpt/llama");
}

// ToYaml writes every key, so the default warmup becomes a written one: the printed config of a
// short run must still load.
TEST(ConfigTest, ToYamlOfShortRunLoadsAgain) {
  auto c = LoadConfigFromString("", {"schedule.steps=5"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = LoadConfigFromString(ToYaml(*c), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToYaml(*again), ToYaml(*c));
}

TEST(ConfigTest, ToYamlListsEveryKnownKey) {
  auto c = LoadConfig("", {});
  ASSERT_TRUE(c.ok());
  YAML::Node root = YAML::Load(ToYaml(*c));
  for (const auto& key : KnownKeys()) {
    const auto dot = key.find('.');
    EXPECT_TRUE(root[key.substr(0, dot)][key.substr(dot + 1)].IsDefined()) << key;
  }
}

TEST(ConfigTest, KnownKeysAreDottedAndUnique) {
  const auto keys = KnownKeys();
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
  for (const auto& k : keys) {
    EXPECT_EQ(std::count(k.begin(), k.end(), '.'), 1) << k;
  }
  EXPECT_EQ(KnownSections(), (std::set<std::string>{"checkpoint", "data", "dist", "eval", "fsdp", "logging",
                                                    "mesh", "metrics", "model", "optimizer", "pipeline",
                                                    "schedule", "training"}));
}

// --- docs/config.md -------------------------------------------------------------------------

TEST(ConfigDocsTest, EveryKnownKeyIsDocumented) {
  const std::string docs = ReadDocs();
  ASSERT_FALSE(docs.empty()) << "cannot read docs/config.md";
  for (const auto& key : KnownKeys()) {
    EXPECT_NE(docs.find("`" + key + "`"), std::string::npos)
        << "docs/config.md does not document `" << key << "`";
  }
}

TEST(ConfigDocsTest, EveryDocumentedKeyIsKnown) {
  const std::string docs = ReadDocs();
  ASSERT_FALSE(docs.empty()) << "cannot read docs/config.md";
  const auto keys = KnownKeys();
  const std::set<std::string> known(keys.begin(), keys.end());
  const std::set<std::string> sections = KnownSections();
  // Inline code spans outside fenced blocks that look like `section.key`. A file name that
  // starts with a section's name (model.safetensors) must be written with a path in the docs.
  std::string prose;
  bool fenced = false;
  std::istringstream lines(docs);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    if (!fenced) prose += line + "\n";
  }
  const std::regex span("`([a-z_]+)\\.([a-z0-9_]+)`");
  int checked = 0;
  for (auto it = std::sregex_iterator(prose.begin(), prose.end(), span); it != std::sregex_iterator(); ++it) {
    if (!sections.count((*it)[1].str())) continue;
    const std::string key = (*it)[1].str() + "." + (*it)[2].str();
    EXPECT_TRUE(known.count(key)) << "docs/config.md names `" << key << "`, which the config does not accept";
    ++checked;
  }
  EXPECT_GE(checked, static_cast<int>(keys.size()));
}

TEST(ConfigDocsTest, EveryPresetIsDocumented) {
  const std::string docs = ReadDocs();
  for (const auto& name : model::PresetNames()) {
    EXPECT_NE(docs.find("`" + name + "`"), std::string::npos)
        << "docs/config.md does not list preset `" << name << "`";
  }
}

// The complete example in the docs is a valid config.
TEST(ConfigDocsTest, CompleteExampleLoads) {
  const std::string docs = ReadDocs();
  const auto heading = docs.find("## Complete example");
  ASSERT_NE(heading, std::string::npos);
  const auto begin = docs.find("```yaml\n", heading);
  ASSERT_NE(begin, std::string::npos);
  const auto body = begin + 8;
  const auto end = docs.find("\n```", body);
  ASSERT_NE(end, std::string::npos);
  const std::string yaml = docs.substr(body, end - body + 1);
  auto c = LoadConfigFromString(yaml, {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // The example sets every key, so it doubles as a reference.
  YAML::Node root = YAML::Load(yaml);
  for (const auto& key : KnownKeys()) {
    const auto dot = key.find('.');
    EXPECT_TRUE(root[key.substr(0, dot)][key.substr(dot + 1)].IsDefined()) << key;
  }
}

// training.global_batch_size: the same rows a step at every world size, by micro-batches.
TrainConfig GlobalBatchConfig(const std::string& extra) {
  auto c = LoadConfigFromString("data:\n  batch_size: 4\ntraining:\n  global_batch_size: 16\n" + extra, {});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(GlobalBatchTest, UnsetLeavesTheBatchAlone) {
  auto c = LoadConfigFromString("data:\n  batch_size: 4\n", {});
  ASSERT_TRUE(c.ok());
  auto line = ResolveGlobalBatch(*c, 3);
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(*line, "");
  EXPECT_EQ(c->data.batch_size, 4);
  EXPECT_EQ(c->training.grad_accum, 1);
}

TEST(GlobalBatchTest, FewerRanksTakeMoreMicroBatches) {
  for (const auto& [world, micro, rows] : std::vector<std::tuple<int, int, int>>{
           {4, 1, 4}, {2, 2, 4}, {1, 4, 4}, {8, 1, 2}, {16, 1, 1}}) {
    TrainConfig c = GlobalBatchConfig("");
    auto line = ResolveGlobalBatch(c, world);
    ASSERT_TRUE(line.ok()) << world << ": " << line.status().ToString();
    EXPECT_EQ(c.training.grad_accum, micro) << world;
    EXPECT_EQ(c.data.batch_size, rows) << world;
    EXPECT_EQ(c.data.batch_size * c.training.grad_accum * world, 16) << world;
    EXPECT_THAT(*line, HasSubstr("16 rows a step")) << world;
  }
}

TEST(GlobalBatchTest, GradAccumIsTheLeastMicroBatchCount) {
  TrainConfig c = GlobalBatchConfig("  grad_accum: 2\n");
  ASSERT_TRUE(ResolveGlobalBatch(c, 4).ok());
  EXPECT_EQ(c.training.grad_accum, 2);
  EXPECT_EQ(c.data.batch_size, 2);
}

TEST(GlobalBatchTest, OnlyDataParallelRanksShareTheBatch) {
  // tp 2: 4 ranks are 2 data parallel ranks.
  TrainConfig c = GlobalBatchConfig("mesh:\n  tp: 2\n  dp_shard: 2\n");
  ASSERT_TRUE(ResolveGlobalBatch(c, 4).ok());
  EXPECT_EQ(c.training.grad_accum, 2);
  EXPECT_EQ(c.data.batch_size, 4);
}

TEST(GlobalBatchTest, AGlobalBatchThatDoesNotSplitIsRefusedNamingTheKey) {
  TrainConfig c = GlobalBatchConfig("");
  auto three = ResolveGlobalBatch(c, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(three.status().message(), HasSubstr("'training.global_batch_size': 16 rows do not divide over 3 data parallel ranks"));

  // 14 rows a rank in micro-batches of at most 4 rows: 7 micro-batches of 2.
  auto odd = LoadConfigFromString("data:\n  batch_size: 4\ntraining:\n  global_batch_size: 14\n", {});
  ASSERT_TRUE(odd.ok());
  ASSERT_TRUE(ResolveGlobalBatch(*odd, 1).ok());
  EXPECT_EQ(odd->training.grad_accum, 7);
  EXPECT_EQ(odd->data.batch_size, 2);

  // A prime number of rows a rank above data.batch_size: only micro-batches of one row.
  auto prime = LoadConfigFromString("data:\n  batch_size: 4\ntraining:\n  global_batch_size: 13\n  grad_accum: 14\n", {});
  ASSERT_TRUE(prime.ok());
  auto none = ResolveGlobalBatch(*prime, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("no count of at least training.grad_accum=14 micro-batches"));
}

TEST(GlobalBatchTest, ASplitThatBreaksSequenceParallelismSaysSo) {
  // tp 2 with sequence parallelism needs a micro-batch's tokens even: 1 row of 3 tokens is not.
  auto c = LoadConfigFromString(
      "model:\n  preset: tiny\ndata:\n  batch_size: 2\n  seq_len: 3\ntraining:\n  global_batch_size: 3\n"
      "mesh:\n  tp: 2\n  dp_shard: 1\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto r = ResolveGlobalBatch(*c, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'training.global_batch_size'"));
  EXPECT_THAT(r.status().message(), HasSubstr("mesh.sequence_parallel"));
}

}  // namespace
}  // namespace meshwork::config
