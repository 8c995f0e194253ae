#include "trainer/model/llama_config.h"

#include <sstream>
#include <string>
#include <utility>

namespace meshwork::model {

int64_t LlamaConfig::NumNonEmbeddingParameters() const {
  const int64_t kv_dim = num_key_value_heads * head_dim();
  const int64_t attn = hidden_size * hidden_size * 2 + hidden_size * kv_dim * 2;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t norms = 2 * hidden_size;
  return num_hidden_layers * (attn + mlp + norms) + hidden_size;  // + final norm
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t embed = vocab_size * hidden_size;
  return NumNonEmbeddingParameters() + embed + (tie_word_embeddings ? 0 : embed);
}

double LlamaConfig::TrainingFlopsPerToken(int64_t seq_len) const {
  const double n = static_cast<double>(NumNonEmbeddingParameters());
  const double head = static_cast<double>(vocab_size) * static_cast<double>(hidden_size);
  const double attn = 12.0 * static_cast<double>(num_hidden_layers) *
                      static_cast<double>(hidden_size) * static_cast<double>(seq_len);
  return 6.0 * (n + head) + attn;
}

Status LlamaConfig::Validate(const std::string& p) const {
  auto positive = [&](const char* key, int64_t v) -> Status {
    if (v <= 0) {
      std::ostringstream os;
      os << "key '" << p << key << "': must be > 0, got " << v;
      return InvalidConfig(os.str());
    }
    return Status::Ok();
  };
  MW_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  MW_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  MW_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  MW_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  MW_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  MW_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  MW_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  std::ostringstream os;
  if (hidden_size % num_attention_heads != 0) {
    os << "key '" << p << "hidden_size': " << hidden_size
       << " is not divisible by num_attention_heads " << num_attention_heads;
    return InvalidConfig(os.str());
  }
  if (head_dim() % 2 != 0) {
    os << "key '" << p << "hidden_size': head dim " << head_dim()
       << " (hidden_size / num_attention_heads) must be even for rotary embeddings";
    return InvalidConfig(os.str());
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    os << "key '" << p << "num_key_value_heads': " << num_key_value_heads
       << " does not divide num_attention_heads " << num_attention_heads;
    return InvalidConfig(os.str());
  }
  if (!(rms_norm_eps > 0.0)) {
    os << "key '" << p << "rms_norm_eps': must be > 0, got " << rms_norm_eps;
    return InvalidConfig(os.str());
  }
  if (!(rope_theta > 0.0)) {
    os << "key '" << p << "rope_theta': must be > 0, got " << rope_theta;
    return InvalidConfig(os.str());
  }
  // Dims no device could hold (a value with digits too many): refused here, naming them, rather
  // than as an allocator's failure or an int64 overflow in the sizes later. Counted in double.
  const double h = static_cast<double>(hidden_size);
  const double embed = static_cast<double>(vocab_size) * h * (tie_word_embeddings ? 1.0 : 2.0);
  const double per_layer = 3.0 * h * static_cast<double>(intermediate_size) + 4.0 * h * h;
  const double parameters = embed + per_layer * static_cast<double>(num_hidden_layers);
  constexpr double kMaxParameters = 1e15;
  if (parameters > kMaxParameters) {
    os << "keys '" << p << "*': vocab_size " << vocab_size << ", hidden_size " << hidden_size
       << ", intermediate_size " << intermediate_size << " and num_hidden_layers " << num_hidden_layers
       << " give about " << parameters << " parameters, more than the " << kMaxParameters
       << " any machine could hold";
    return InvalidConfig(os.str());
  }
  return Status::Ok();
}

std::vector<std::string> PresetNames() { return {"tiny", "llama-100m", "llama3-1b", "llama3-8b"}; }

std::string WhyNotSplittable(const LlamaConfig& c, int tp) {
  if (tp < 1) return "tp=" + std::to_string(tp) + " must be at least 1";
  auto check = [tp](const char* key, int64_t value) -> std::string {
    if (value % tp == 0) return "";
    return std::string(key) + "=" + std::to_string(value) + " does not divide by mesh.tp=" + std::to_string(tp) +
           " (tensor parallelism gives each rank an equal slice of it)";
  };
  for (auto [key, value] : {std::pair<const char*, int64_t>{"model.num_attention_heads", c.num_attention_heads},
                            {"model.num_key_value_heads", c.num_key_value_heads},
                            {"model.intermediate_size", c.intermediate_size},
                            {"model.vocab_size", c.vocab_size}}) {
    if (std::string why = check(key, value); !why.empty()) return why;
  }
  return "";
}

Result<LlamaConfig> PresetConfig(const std::string& name) {
  LlamaConfig c;
  if (name == "tiny") {
    // Byte-level vocabulary (256 bytes + specials, padded to a multiple of 64).
    c.vocab_size = 320;
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 1024;
    c.rope_theta = 10000.0;
    c.tie_word_embeddings = true;
  } else if (name == "llama-100m") {
    c.vocab_size = 32000;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 2048;
    c.rope_theta = 10000.0;
    c.tie_word_embeddings = true;
  } else if (name == "llama3-1b") {  // Llama 3.2 1B
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rope_scaling = RopeScaling{32.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = true;
  } else if (name == "llama3-8b") {  // Llama 3 8B
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.tie_word_embeddings = false;
  } else {
    std::string names;
    for (const auto& n : PresetNames()) names += (names.empty() ? "" : ", ") + n;
    return InvalidConfig("key 'model.preset': unknown preset '" + name + "' (known: " + names + ")");
  }
  return c;
}

}  // namespace meshwork::model
