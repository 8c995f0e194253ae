// Dimensions of a Llama-style decoder, named as in Hugging Face's LlamaConfig, plus the named
// presets. Torch-free so config parsing and the HF importer can use it cheaply.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshwork::model {

// Llama 3's rope_scaling ("rope_type": "llama3"); factor 0 means no scaling.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool enabled() const { return factor > 0.0; }
};

struct LlamaConfig {
  int64_t vocab_size = 320;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 384;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t max_position_embeddings = 1024;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = true;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // Parameter count, embeddings included (the tied output projection counted once).
  int64_t NumParameters() const;
  // Parameters outside the token embedding / output projection, the N of "6·N" FLOPs.
  int64_t NumNonEmbeddingParameters() const;
  // Training FLOPs per token (forward + backward): 6·N_non_embedding + 6·vocab·hidden for the
  // output projection + attention scores 12·layers·hidden·seq_len (PaLM appendix B).
  double TrainingFlopsPerToken(int64_t seq_len) const;

  // Checks internal consistency; messages name the key under `prefix` (e.g. "model.").
  Status Validate(const std::string& prefix = "model.") const;
};

// Why `config` cannot be split over `tp` tensor parallel ranks (heads, kv-heads, intermediate size
// or vocabulary not divisible: each rank gets an equal slice of each), naming the key and the
// values; "" when it can. The trainer checks it at config load (dims known) and again when it
// splits the model (trainer/tp), where a model loaded with model.init_from first has its dims.
std::string WhyNotSplittable(const LlamaConfig& config, int tp);

// Named presets. "tiny" trains in seconds on a CPU; "llama-100m" is the ~100M-parameter
// benchmark model; "llama3-1b" and "llama3-8b" follow the public Llama 3.2 1B / Llama 3 8B
// configs.
Result<LlamaConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace meshwork::model
