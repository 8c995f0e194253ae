// LlamaConfig: the published preset dimensions, validation messages that name the offending key,
// and the parameter / FLOP counts the trainer reports (checked against hand sums).
#include "trainer/model/llama_config.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace meshwork::model {
namespace {

using ::testing::HasSubstr;

LlamaConfig Preset(const std::string& name) {
  auto r = PresetConfig(name);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : LlamaConfig{};
}

TEST(LlamaConfigTest, EveryListedPresetExistsAndValidates) {
  ASSERT_FALSE(PresetNames().empty());
  for (const auto& name : PresetNames()) {
    auto r = PresetConfig(name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    EXPECT_TRUE(r->Validate().ok()) << name << ": " << r->Validate().ToString();
  }
}

TEST(LlamaConfigTest, Llama3_8bPresetHasPublishedDims) {
  const LlamaConfig c = Preset("llama3-8b");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.rope_scaling.enabled());
  EXPECT_EQ(c.head_dim(), 128);
}

TEST(LlamaConfigTest, Llama3_1bPresetHasPublishedDimsAndRopeScaling) {
  const LlamaConfig c = Preset("llama3-1b");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim(), 64);
  ASSERT_TRUE(c.rope_scaling.enabled());
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
}

TEST(LlamaConfigTest, UnknownPresetErrorNamesKeyAndListsKnownPresets) {
  auto r = PresetConfig("nope");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(r.status().message(), HasSubstr("model.preset"));
  EXPECT_THAT(r.status().message(), HasSubstr("'nope'"));
  for (const auto& name : PresetNames()) EXPECT_THAT(r.status().message(), HasSubstr(name));
}

TEST(LlamaConfigTest, DefaultConfigValidates) {
  EXPECT_TRUE(LlamaConfig{}.Validate().ok()) << LlamaConfig{}.Validate().ToString();
}

// A typo's extra digits: refused by name before anything is allocated (it was libtorch's
// "can't allocate memory", exit 1, or an int64 overflow in the sizes).
TEST(LlamaConfigTest, ValidateRejectsDimsNoMachineCouldHold) {
  LlamaConfig c;
  c.intermediate_size = 1000000000000;
  Status s = c.Validate("model.");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(s.message(), HasSubstr("intermediate_size 1000000000000"));
  EXPECT_THAT(s.message(), HasSubstr("parameters, more than the 1e+15"));
  c = LlamaConfig{};
  c.vocab_size = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(c.Validate().ok());
  ASSERT_TRUE(PresetConfig("llama3-8b").ok());
  EXPECT_TRUE(PresetConfig("llama3-8b")->Validate().ok());
}

TEST(LlamaConfigTest, ValidateRejectsHiddenNotDivisibleByHeads) {
  LlamaConfig c;
  c.hidden_size = 130;
  c.num_attention_heads = 4;
  Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(s.message(), HasSubstr("'model.hidden_size'"));
  EXPECT_THAT(s.message(), HasSubstr("num_attention_heads"));
}

TEST(LlamaConfigTest, ValidateRejectsHeadsNotDivisibleByKvHeads) {
  LlamaConfig c;
  c.hidden_size = 96;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 4;
  Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(s.message(), HasSubstr("'model.num_key_value_heads'"));
}

TEST(LlamaConfigTest, ValidateRejectsMoreKvHeadsThanHeads) {
  LlamaConfig c;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 8;
  Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'model.num_key_value_heads'"));
}

TEST(LlamaConfigTest, ValidateRejectsOddHeadDim) {
  LlamaConfig c;
  c.hidden_size = 12;
  c.num_attention_heads = 4;  // head dim 3
  c.num_key_value_heads = 2;
  Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(s.message(), HasSubstr("'model.hidden_size'"));
  EXPECT_THAT(s.message(), HasSubstr("even"));
}

TEST(LlamaConfigTest, ValidateRejectsZeroValuesNamingTheKey) {
  struct Case {
    const char* key;
    void (*zero)(LlamaConfig&);
  };
  const Case cases[] = {
      {"vocab_size", [](LlamaConfig& c) { c.vocab_size = 0; }},
      {"hidden_size", [](LlamaConfig& c) { c.hidden_size = 0; }},
      {"intermediate_size", [](LlamaConfig& c) { c.intermediate_size = 0; }},
      {"num_hidden_layers", [](LlamaConfig& c) { c.num_hidden_layers = 0; }},
      {"num_attention_heads", [](LlamaConfig& c) { c.num_attention_heads = 0; }},
      {"num_key_value_heads", [](LlamaConfig& c) { c.num_key_value_heads = 0; }},
      {"max_position_embeddings", [](LlamaConfig& c) { c.max_position_embeddings = 0; }},
      {"rms_norm_eps", [](LlamaConfig& c) { c.rms_norm_eps = 0.0; }},
      {"rope_theta", [](LlamaConfig& c) { c.rope_theta = 0.0; }},
  };
  for (const auto& tc : cases) {
    LlamaConfig c;
    tc.zero(c);
    Status s = c.Validate();
    ASSERT_FALSE(s.ok()) << tc.key;
    EXPECT_EQ(s.code(), StatusCode::kInvalidConfig) << tc.key;
    EXPECT_THAT(s.message(), HasSubstr("'model." + std::string(tc.key) + "'"));
  }
}

TEST(LlamaConfigTest, ValidateUsesTheGivenKeyPrefix) {
  LlamaConfig c;
  c.vocab_size = -1;
  Status s = c.Validate("student.");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'student.vocab_size'"));
  EXPECT_THAT(s.message(), HasSubstr("-1"));
}

TEST(LlamaConfigTest, NumParametersOfLlama3_8bEqualsHandSum) {
  const LlamaConfig c = Preset("llama3-8b");
  // Per layer: q and o 4096x4096, k and v 4096x1024, gate/up/down 4096x14336, two norms.
  const int64_t attn = 2 * 4096LL * 4096 + 2 * 4096LL * 1024;
  const int64_t mlp = 3 * 4096LL * 14336;
  const int64_t layer = attn + mlp + 2 * 4096;
  const int64_t non_embedding = 32 * layer + 4096;
  const int64_t embed = 128256LL * 4096;
  EXPECT_EQ(c.NumNonEmbeddingParameters(), non_embedding);
  EXPECT_EQ(c.NumParameters(), non_embedding + 2 * embed);  // untied: embed + lm_head
  EXPECT_EQ(c.NumParameters(), 8030261248LL);
  EXPECT_GT(c.NumParameters(), 8'000'000'000LL);
  EXPECT_LT(c.NumParameters(), 8'100'000'000LL);
}

TEST(LlamaConfigTest, NumParametersCountsTiedEmbeddingOnce) {
  LlamaConfig c = Preset("llama3-1b");
  const int64_t embed = 128256LL * 2048;
  const int64_t layer = (2 * 2048LL * 2048 + 2 * 2048LL * 512) + 3 * 2048LL * 8192 + 2 * 2048;
  EXPECT_EQ(c.NumParameters(), 16 * layer + 2048 + embed);
  EXPECT_EQ(c.NumParameters(), 1235814400LL);  // Llama 3.2 1B's published 1.24B
  c.tie_word_embeddings = false;
  EXPECT_EQ(c.NumParameters(), 16 * layer + 2048 + 2 * embed);
}

TEST(LlamaConfigTest, TrainingFlopsPerTokenMatchesPalmFormula) {
  const LlamaConfig c = Preset("llama3-8b");
  const int64_t seq = 8192;
  const double n = static_cast<double>(c.NumNonEmbeddingParameters());
  const double expected = 6.0 * (n + 128256.0 * 4096.0) + 12.0 * 32.0 * 4096.0 * 8192.0;
  EXPECT_DOUBLE_EQ(c.TrainingFlopsPerToken(seq), expected);

  LlamaConfig small;  // defaults: vocab 320, hidden 128, 4 layers
  const double n_small = static_cast<double>(small.NumNonEmbeddingParameters());
  EXPECT_DOUBLE_EQ(small.TrainingFlopsPerToken(256),
                   6.0 * (n_small + 320.0 * 128.0) + 12.0 * 4.0 * 128.0 * 256.0);
  // The attention term grows linearly with sequence length.
  EXPECT_DOUBLE_EQ(small.TrainingFlopsPerToken(512) - small.TrainingFlopsPerToken(256),
                   12.0 * 4.0 * 128.0 * 256.0);
}

}  // namespace
}  // namespace meshwork::model
