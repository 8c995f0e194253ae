// Hugging Face directory import/export: config.json parsing and writing, single-file and
// sharded weights, and loading into a module whose parameters carry HF names.
#include "trainer/io/hf_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "tests/trainer/io/temp_dir.h"

namespace meshwork::io {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadBytes;
using testing::ScopedTempDir;
using testing::WriteBytes;
using json = nlohmann::json;

model::LlamaConfig TinyConfig(bool tied) {
  model::LlamaConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

// A parameter-only stand-in for Meshwork's Llama: nested modules registered so that
// named_parameters() yields exactly the HF names.
std::shared_ptr<torch::nn::Module> HfNamedModel(const model::LlamaConfig& c) {
  auto weight = [](torch::nn::Module& parent, const std::string& name,
                   std::vector<int64_t> shape) {
    auto leaf = parent.register_module(name, std::make_shared<torch::nn::Module>());
    leaf->register_parameter("weight", torch::randn(shape));
  };
  const int64_t h = c.hidden_size, kv = c.num_key_value_heads * c.head_dim();
  auto root = std::make_shared<torch::nn::Module>();
  auto m = root->register_module("model", std::make_shared<torch::nn::Module>());
  weight(*m, "embed_tokens", {c.vocab_size, h});
  auto layers = m->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto layer = layers->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    auto attn = layer->register_module("self_attn", std::make_shared<torch::nn::Module>());
    weight(*attn, "q_proj", {h, h});
    weight(*attn, "k_proj", {kv, h});
    weight(*attn, "v_proj", {kv, h});
    weight(*attn, "o_proj", {h, h});
    auto mlp = layer->register_module("mlp", std::make_shared<torch::nn::Module>());
    weight(*mlp, "gate_proj", {c.intermediate_size, h});
    weight(*mlp, "up_proj", {c.intermediate_size, h});
    weight(*mlp, "down_proj", {h, c.intermediate_size});
    weight(*layer, "input_layernorm", {h});
    weight(*layer, "post_attention_layernorm", {h});
  }
  weight(*m, "norm", {h});
  if (!c.tie_word_embeddings) weight(*root, "lm_head", {c.vocab_size, h});
  return root;
}

void ExpectSameParameters(torch::nn::Module& expected, torch::nn::Module& actual) {
  const auto e = expected.named_parameters();
  const auto a = actual.named_parameters();
  ASSERT_EQ(e.size(), a.size());
  for (const auto& p : e) {
    const torch::Tensor* q = a.find(p.key());
    ASSERT_NE(q, nullptr) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), *q)) << p.key();
  }
}

void WriteJson(const std::string& path, const json& j) { WriteBytes(path, j.dump(2)); }

// --- config.json ------------------------------------------------------------------------------

TEST(HfConfigTest, RoundTripKeepsEveryFieldIncludingRopeScaling) {
  ScopedTempDir dir;
  model::LlamaConfig c = TinyConfig(/*tied=*/false);
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = model::RopeScaling{32.0, 1.0, 4.0, 8192};
  ASSERT_TRUE(WriteHfConfig(dir.path(), c).ok());

  auto r = ReadHfConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vocab_size, c.vocab_size);
  EXPECT_EQ(r->hidden_size, c.hidden_size);
  EXPECT_EQ(r->intermediate_size, c.intermediate_size);
  EXPECT_EQ(r->num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(r->num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(r->num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(r->max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(r->rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(r->rope_theta, c.rope_theta);
  EXPECT_EQ(r->tie_word_embeddings, false);
  EXPECT_EQ(r->rope_scaling.factor, 32.0);
  EXPECT_EQ(r->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(r->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(r->rope_scaling.original_max_position_embeddings, 8192);
}

TEST(HfConfigTest, WrittenConfigHasTheKeysTransformersReads) {
  ScopedTempDir dir;
  HfConfigExtras extras;
  extras.torch_dtype = "bfloat16";
  extras.eos_token_id = 2;
  ASSERT_TRUE(WriteHfConfig(dir.path(), TinyConfig(/*tied=*/true), extras).ok());
  const json j = json::parse(ReadBytes(dir.File("config.json")));
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["head_dim"], 4);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["eos_token_id"], 2);
  EXPECT_FALSE(j.contains("bos_token_id"));
  EXPECT_FALSE(meshwork::testing::AnyNameContains(dir.path(), ".tmp"));

  auto r = ReadHfConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->rope_scaling.enabled());
  EXPECT_TRUE(r->tie_word_embeddings);
}

// The published Llama 3.2 1B config.json, verbatim apart from dropping token ids.
TEST(HfConfigTest, ReadsPublishedLlama32Config) {
  ScopedTempDir dir;
  WriteBytes(dir.File("config.json"), R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
  auto r = ReadHfConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto preset = model::PresetConfig("llama3-1b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(r->NumParameters(), preset->NumParameters());
  EXPECT_EQ(r->rope_scaling.factor, 32.0);
  EXPECT_EQ(r->rope_theta, 500000.0);
  EXPECT_TRUE(r->tie_word_embeddings);
}

TEST(HfConfigTest, OptionalKeysTakeHfDefaults) {
  ScopedTempDir dir;
  WriteJson(dir.File("config.json"), {{"vocab_size", 32000},
                                      {"hidden_size", 64},
                                      {"intermediate_size", 128},
                                      {"num_hidden_layers", 2},
                                      {"num_attention_heads", 4},
                                      {"rope_scaling", nullptr}});
  auto r = ReadHfConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_key_value_heads, 4);
  EXPECT_EQ(r->max_position_embeddings, 2048);
  EXPECT_EQ(r->rms_norm_eps, 1e-6);
  EXPECT_EQ(r->rope_theta, 10000.0);
  EXPECT_FALSE(r->tie_word_embeddings);
  EXPECT_FALSE(r->rope_scaling.enabled());
}

class HfConfigErrorTest : public ::testing::Test {
 protected:
  // A valid config with `patch` merged in (null values delete the key).
  Status ReadPatched(const json& patch) {
    json j = {{"vocab_size", 32},         {"hidden_size", 16},
              {"intermediate_size", 32},  {"num_hidden_layers", 1},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
    j.merge_patch(patch);
    WriteJson(dir_.File("config.json"), j);
    auto r = ReadHfConfig(dir_.path());
    return r.ok() ? Status::Ok() : r.status();
  }
  void ExpectInvalid(const json& patch, const std::vector<std::string>& substrings) {
    const Status s = ReadPatched(patch);
    EXPECT_EQ(s.code(), StatusCode::kInvalidInput) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("config.json"));
    for (const auto& sub : substrings) EXPECT_THAT(s.message(), HasSubstr(sub));
  }
  ScopedTempDir dir_;
};

TEST_F(HfConfigErrorTest, ValidBaseConfigReads) { EXPECT_TRUE(ReadPatched(json::object()).ok()); }

TEST_F(HfConfigErrorTest, MissingRequiredKeyIsNamed) {
  ExpectInvalid({{"hidden_size", nullptr}}, {"'hidden_size'", "missing"});
}

TEST_F(HfConfigErrorTest, WrongTypeNamesKeyAndValue) {
  ExpectInvalid({{"hidden_size", "16"}}, {"'hidden_size'", "\"16\""});
  ExpectInvalid({{"rms_norm_eps", "tiny"}}, {"'rms_norm_eps'", "\"tiny\""});
  ExpectInvalid({{"tie_word_embeddings", 1}}, {"'tie_word_embeddings'", "1"});
  ExpectInvalid({{"num_hidden_layers", 1.5}}, {"'num_hidden_layers'", "1.5"});
}

TEST_F(HfConfigErrorTest, UnsupportedRopeTypeIsNamed) {
  ExpectInvalid({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}, {"'yarn'"});
  ExpectInvalid({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}, {"'linear'"});
}

TEST_F(HfConfigErrorTest, Llama3RopeScalingNeedsAllItsKeys) {
  ExpectInvalid({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}},
                {"rope_scaling.low_freq_factor", "missing"});
}

TEST_F(HfConfigErrorTest, HeadDimMustBeHiddenOverHeads) {
  EXPECT_TRUE(ReadPatched({{"head_dim", 4}}).ok());
  ExpectInvalid({{"head_dim", 8}}, {"'head_dim'", "8"});
}

TEST_F(HfConfigErrorTest, UnsupportedArchitectureFeaturesAreRejected) {
  ExpectInvalid({{"attention_bias", true}}, {"'attention_bias'"});
  ExpectInvalid({{"hidden_act", "gelu"}}, {"'hidden_act'", "gelu"});
}

TEST_F(HfConfigErrorTest, InconsistentValuesFailValidation) {
  ExpectInvalid({{"num_key_value_heads", 3}}, {"num_key_value_heads"});
  ExpectInvalid({{"hidden_size", 18}}, {"hidden_size"});
}

TEST_F(HfConfigErrorTest, InvalidJsonIsInvalidInput) {
  WriteBytes(dir_.File("config.json"), "{\"hidden_size\": ");
  auto r = ReadHfConfig(dir_.path());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(r.status().message(), HasSubstr("config.json"));
}

TEST(HfConfigTest, MissingConfigIsNotFound) {
  ScopedTempDir dir;
  auto r = ReadHfConfig(dir.path());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("config.json"));
}

// --- weights ------------------------------------------------------------------------------------

// Splits a model's parameters over two shard files plus an index, as transformers does.
void WriteTwoShards(const std::string& dir, torch::nn::Module& module) {
  TensorMap first, second;
  json weight_map = json::object();
  int i = 0;
  for (const auto& p : module.named_parameters()) {
    const bool in_first = (i++ % 2) == 0;
    (in_first ? first : second)[p.key()] = p.value().detach();
    weight_map[p.key()] = in_first ? "model-00001-of-00002.safetensors"
                                   : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first,
                               {{"format", "pt"}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second,
                               {{"format", "pt"}})
                  .ok());
  WriteJson(dir + "/model.safetensors.index.json",
            {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}});
}

TEST(HfWeightsTest, ReadsSingleFile) {
  ScopedTempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), {{"a", torch::ones({2})}}).ok());
  auto r = ReadHfWeights(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 1u);
  EXPECT_TRUE(torch::equal(r->at("a"), torch::ones({2})));
}

TEST(HfWeightsTest, ReadsEveryTensorOfTwoShards) {
  ScopedTempDir dir;
  auto model = HfNamedModel(TinyConfig(/*tied=*/false));
  WriteTwoShards(dir.path(), *model);
  auto r = ReadHfWeights(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto params = model->named_parameters();
  ASSERT_EQ(r->size(), params.size());
  for (const auto& p : params) {
    ASSERT_EQ(r->count(p.key()), 1u) << p.key();
    EXPECT_TRUE(torch::equal(r->at(p.key()), p.value())) << p.key();
  }
}

TEST(HfWeightsTest, MissingShardFileNamesShardAndIndex) {
  ScopedTempDir dir;
  auto model = HfNamedModel(TinyConfig(/*tied=*/false));
  WriteTwoShards(dir.path(), *model);
  std::filesystem::remove(dir.File("model-00002-of-00002.safetensors"));
  auto r = ReadHfWeights(dir.path());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(r.status().message(), HasSubstr("model.safetensors.index.json"));
}

TEST(HfWeightsTest, TensorMissingFromItsShardNamesTensorAndShard) {
  ScopedTempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("s1.safetensors"), {{"a", torch::ones({2})}}).ok());
  WriteJson(dir.File("model.safetensors.index.json"),
            {{"weight_map", {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}}}});
  auto r = ReadHfWeights(dir.path());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(r.status().message(), HasSubstr("'b'"));
  EXPECT_THAT(r.status().message(), HasSubstr("s1.safetensors"));
}

TEST(HfWeightsTest, IndexPointingOutsideTheDirectoryIsRejected) {
  ScopedTempDir dir;
  WriteJson(dir.File("model.safetensors.index.json"),
            {{"weight_map", {{"a", "../elsewhere.safetensors"}}}});
  auto r = ReadHfWeights(dir.path());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(r.status().message(), HasSubstr("'a'"));
}

TEST(HfWeightsTest, DirectoryWithoutWeightsIsNotFound) {
  ScopedTempDir dir;
  auto r = ReadHfWeights(dir.path());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("model.safetensors"));
}

// --- module save / load ------------------------------------------------------------------------

TEST(HfCheckpointTest, SaveThenLoadGivesIdenticalParameters) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ScopedTempDir dir;
    const auto c = TinyConfig(tied);
    auto saved = HfNamedModel(c);
    ASSERT_TRUE(SaveHfCheckpoint(dir.path(), c, *saved).ok());

    auto config = ReadHfConfig(dir.path());
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_EQ(config->tie_word_embeddings, tied);
    auto loaded = HfNamedModel(*config);
    const Status s = LoadHfWeightsInto(dir.path(), *loaded, config->tie_word_embeddings);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectSameParameters(*saved, *loaded);
  }
}

TEST(HfCheckpointTest, SaveWritesFormatPtMetadataAndRequestedDtype) {
  ScopedTempDir dir;
  const auto c = TinyConfig(/*tied=*/true);
  auto model = HfNamedModel(c);
  ASSERT_TRUE(SaveHfCheckpoint(dir.path() + "/new/sub", c, *model, torch::kBFloat16).ok());
  auto header = ReadSafetensorsHeader(dir.path() + "/new/sub/model.safetensors");
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->tensors.size(), model->named_parameters().size());
  for (const auto& e : header->tensors) EXPECT_EQ(e.dtype, torch::kBFloat16) << e.name;
  const json j = json::parse(ReadBytes(dir.path() + "/new/sub/config.json"));
  EXPECT_EQ(j["torch_dtype"], "bfloat16");

  // Loading converts back to the parameters' float32, with bfloat16's rounding.
  auto loaded = HfNamedModel(c);
  ASSERT_TRUE(LoadHfWeightsInto(dir.path() + "/new/sub", *loaded, true).ok());
  const auto loaded_params = loaded->named_parameters();
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor* q = loaded_params.find(p.key());
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(*q, p.value().to(torch::kBFloat16).to(torch::kFloat))) << p.key();
  }
}

TEST(HfCheckpointTest, SaveRejectsConfigThatDisagreesWithModelAboutTying) {
  ScopedTempDir dir;
  auto untied_model = HfNamedModel(TinyConfig(/*tied=*/false));
  const Status s = SaveHfCheckpoint(dir.path(), TinyConfig(/*tied=*/true), *untied_model);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("lm_head.weight"));
}

TEST(HfCheckpointTest, TiedModelIgnoresStoredLmHead) {
  ScopedTempDir dir;
  auto untied = HfNamedModel(TinyConfig(/*tied=*/false));
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), TinyConfig(/*tied=*/false), *untied).ok());
  auto tied = HfNamedModel(TinyConfig(/*tied=*/true));
  const Status s = LoadHfWeightsInto(dir.path(), *tied, /*tie_word_embeddings=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(torch::equal(*tied->named_parameters().find("model.embed_tokens.weight"),
                           *untied->named_parameters().find("model.embed_tokens.weight")));
}

TEST(HfCheckpointTest, UntiedModelReportsMissingLmHeadWithHint) {
  ScopedTempDir dir;
  auto tied = HfNamedModel(TinyConfig(/*tied=*/true));
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), TinyConfig(/*tied=*/true), *tied).ok());
  auto untied = HfNamedModel(TinyConfig(/*tied=*/false));
  const Status s = LoadHfWeightsInto(dir.path(), *untied, /*tie_word_embeddings=*/false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("tie_word_embeddings"));
}

TEST(HfCheckpointTest, RotaryInverseFrequencyBuffersAreIgnored) {
  ScopedTempDir dir;
  const auto c = TinyConfig(/*tied=*/true);
  auto model = HfNamedModel(c);
  TensorMap weights;
  for (const auto& p : model->named_parameters()) weights[p.key()] = p.value().detach();
  weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch::ones({2});
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), weights).ok());
  auto loaded = HfNamedModel(c);
  const Status s = LoadHfWeightsInto(dir.path(), *loaded, true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectSameParameters(*model, *loaded);
}

TEST(HfCheckpointTest, LoadsFromShardedCheckpoint) {
  ScopedTempDir dir;
  auto saved = HfNamedModel(TinyConfig(/*tied=*/false));
  WriteTwoShards(dir.path(), *saved);
  auto loaded = HfNamedModel(TinyConfig(/*tied=*/false));
  const Status s = LoadHfWeightsInto(dir.path(), *loaded, false);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectSameParameters(*saved, *loaded);
}

// --- slices: what one rank of a sharded run reads ---------------------------------------------

// Runs of the flattened tensor and column blocks (a tensor parallel rank's slice of a
// row-parallel weight, FSDP's run of it), from a bf16 file into fp32, from both shards of a
// sharded checkpoint: each equals the same elements of the whole tensor, and only their bytes
// are read.
TEST(HfCheckpointTest, SlicesHoldTheirElementsOfTheWholeTensorsAndReadOnlyThem) {
  ScopedTempDir dir;
  const auto c = TinyConfig(/*tied=*/false);
  auto saved = HfNamedModel(c);
  WriteTwoShards(dir.path(), *saved);
  const auto params = saved->named_parameters();
  const torch::Tensor down = params.find("model.layers.0.mlp.down_proj.weight")->detach();  // [8, 12]
  const torch::Tensor embed = params.find("model.embed_tokens.weight")->detach();           // [16, 8]
  const torch::Tensor head = params.find("lm_head.weight")->detach();

  std::vector<HfSlice> slices = {
      // elements 5..36 of the embedding flattened: parts of rows 0 and 4, rows 1-3 whole
      {"model.embed_tokens.weight", torch::empty({32}), 5},
      // columns [6, 12) of down_proj (tp rank 1 of 2), its elements 3..16 (FSDP's run of the block)
      {"model.layers.0.mlp.down_proj.weight", torch::empty({14}), 3, 6, 6},
      // the whole width as a block is a plain run
      {"lm_head.weight", torch::empty({16, 8}), 0, 0, 8},
  };
  auto read = LoadHfSlices(dir.path(), slices);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(torch::equal(slices[0].out, embed.reshape({-1}).narrow(0, 5, 32)));
  EXPECT_TRUE(torch::equal(slices[1].out, down.narrow(1, 6, 6).reshape({-1}).narrow(0, 3, 14)));
  EXPECT_TRUE(torch::equal(slices[2].out, head));
  EXPECT_EQ(read->bytes_read, (32 + 14 + 128) * 4);
  EXPECT_EQ(read->files_read, 2);
  int64_t all = 0;
  for (const auto& p : params) all += p.value().numel() * 4;
  EXPECT_EQ(read->bytes_in_files, all);

  // bf16 on disk: converted to the slice's dtype.
  ScopedTempDir bf16;
  ASSERT_TRUE(SaveHfCheckpoint(bf16.path(), c, *saved, torch::kBFloat16).ok());
  std::vector<HfSlice> block = {{"model.layers.0.mlp.down_proj.weight", torch::empty({48}), 0, 0, 6}};
  read = LoadHfSlices(bf16.path(), block);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(torch::equal(block[0].out, down.narrow(1, 0, 6).reshape({-1}).to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_EQ(read->bytes_read, 48 * 2);
}

TEST(HfCheckpointTest, ASliceOutsideItsTensorOrOfNoTensorNamesIt) {
  ScopedTempDir dir;
  const auto c = TinyConfig(/*tied=*/true);
  auto saved = HfNamedModel(c);
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), c, *saved).ok());
  std::vector<HfSlice> past = {{"model.norm.weight", torch::empty({4}), 6}};
  auto read = LoadHfSlices(dir.path(), past);
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(read.status().message(), HasSubstr("'model.norm.weight' of shape [8] holds no elements [6, 10)"));
  std::vector<HfSlice> wide = {{"model.layers.0.self_attn.o_proj.weight", torch::empty({4}), 0, 6, 4}};
  read = LoadHfSlices(dir.path(), wide);
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(read.status().message(), HasSubstr("of its columns [6, 10)"));
  std::vector<HfSlice> none = {{"lm_head.weight", torch::empty({4})}};
  read = LoadHfSlices(dir.path(), none);
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(read.status().message(), HasSubstr("has no tensor 'lm_head.weight'"));
}

// A file cut short after its header: the slice past its end is an error naming the file.
TEST(HfCheckpointTest, ATruncatedFileIsAnErrorNamingIt) {
  ScopedTempDir dir;
  const auto c = TinyConfig(/*tied=*/true);
  auto saved = HfNamedModel(c);
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), c, *saved).ok());
  const std::string path = dir.path() + "/model.safetensors";
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok());
  std::filesystem::resize_file(path, header->data_start + 16);
  std::vector<HfSlice> all;
  for (const auto& p : saved->named_parameters()) all.push_back({p.key(), torch::empty_like(p.value())});
  auto read = LoadHfSlices(dir.path(), all);
  EXPECT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(path));
}

TEST(HfCheckpointTest, ShapeMismatchNamesTensorAndBothShapes) {
  ScopedTempDir dir;
  auto c = TinyConfig(/*tied=*/true);
  auto saved = HfNamedModel(c);
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), c, *saved).ok());
  c.intermediate_size = 20;
  auto wider = HfNamedModel(c);
  const torch::Tensor before = wider->named_parameters().find("model.norm.weight")->clone();
  const Status s = LoadHfWeightsInto(dir.path(), *wider, true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.0.mlp.gate_proj.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("[12, 8] in the checkpoint"));
  EXPECT_THAT(s.message(), HasSubstr("[20, 8] in the model"));
  // Nothing is copied when the checkpoint does not match.
  EXPECT_TRUE(torch::equal(*wider->named_parameters().find("model.norm.weight"), before));
}

TEST(HfCheckpointTest, MissingAndUnexpectedTensorsAreAllNamed) {
  ScopedTempDir dir;
  const auto c = TinyConfig(/*tied=*/true);
  auto model = HfNamedModel(c);
  TensorMap weights;
  for (const auto& p : model->named_parameters()) weights[p.key()] = p.value().detach();
  weights.erase("model.norm.weight");
  weights.erase("model.layers.1.mlp.up_proj.weight");
  weights["model.layers.0.self_attn.q_proj.bias"] = torch::zeros({8});
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), weights).ok());

  const Status s = LoadHfWeightsInto(dir.path(), *model, true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("2 parameter(s) missing"));
  EXPECT_THAT(s.message(), HasSubstr("'model.norm.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.1.mlp.up_proj.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("1 unexpected tensor(s)"));
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.0.self_attn.q_proj.bias'"));
  EXPECT_THAT(s.message(), Not(HasSubstr("tie_word_embeddings")));
}

TEST(HfCheckpointTest, LongListsOfMissingNamesAreCut) {
  ScopedTempDir dir;
  auto c = TinyConfig(/*tied=*/true);
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"),
                               {{"model.embed_tokens.weight", torch::zeros({16, 8})}})
                  .ok());
  auto model = HfNamedModel(c);  // 2 layers * 9 + norm = 19 parameters missing
  const Status s = LoadHfWeightsInto(dir.path(), *model, true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("19 parameter(s) missing"));
  EXPECT_THAT(s.message(), HasSubstr("and 9 more"));
}

}  // namespace
}  // namespace meshwork::io
