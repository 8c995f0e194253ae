// Import and export of Hugging Face Llama model directories (config.json plus model.safetensors
// or a sharded model.safetensors.index.json), so Meshwork can start from and hand back
// checkpoints that `transformers` loads with LlamaForCausalLM.from_pretrained.
//
// Parameter names are copied verbatim: Meshwork's Llama registers its parameters under exactly
// the HF names ("model.layers.0.self_attn.q_proj.weight", ...). No q/k permutation is applied:
// Meshwork's rotary embedding uses HF's rotate_half convention (first half / second half of
// each head), which is the layout HF checkpoints are stored in. (Meta's original consolidated
// .pth checkpoints use interleaved pairs and would need the permutation; they are not read here.)
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/io/safetensors.h"
#include "trainer/model/llama_config.h"

namespace meshwork::io {

// Parses dir/config.json. Required keys: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads. Optional keys take HF LlamaConfig's defaults:
// num_key_value_heads (= num_attention_heads), max_position_embeddings (2048),
// rms_norm_eps (1e-6), rope_theta (10000), tie_word_embeddings (false), rope_scaling (none;
// only "llama3" is supported). A key of the wrong type, or a model that Meshwork's Llama cannot
// express (head_dim != hidden/heads, biases, an activation other than silu), is InvalidInput
// naming "config.json" and the key. Missing file: NotFound.
Result<model::LlamaConfig> ReadHfConfig(const std::string& dir);

// Optional config.json fields Meshwork does not model but tools read.
struct HfConfigExtras {
  std::string torch_dtype = "float32";
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
};

// Writes dir/config.json for LlamaForCausalLM (the directory must exist).
Status WriteHfConfig(const std::string& dir, const model::LlamaConfig& c,
                     const HfConfigExtras& extras = {});

// Reads every weight of dir: model.safetensors, or else each shard that
// model.safetensors.index.json lists. A shard file that is missing, or a tensor the index
// places in a shard that does not hold it, is an error naming both.
Result<TensorMap> ReadHfWeights(const std::string& dir);

// Checks dir's tensors against the model's parameters from the safetensors headers alone, so a
// wrong checkpoint fails in milliseconds: every parameter must be in the checkpoint with the same
// shape, and every checkpoint tensor must be a parameter (except "lm_head.weight" when
// `tie_word_embeddings`, and "*rotary_emb.inv_freq", a buffer old HF checkpoints carry).
// Mismatches are InvalidInput listing the tensors.
Status CheckHfWeightsMatch(const std::string& dir, torch::nn::Module& module, bool tie_word_embeddings);

// What one rank holds of a parameter, to be filled from the checkpoint: elements
// [begin, begin + out.numel()) of the tensor `name` flattened; with `cols` > 0, of its column
// block [col_begin, col_begin + cols) flattened row-major (a tensor parallel rank's slice of a
// row-parallel weight). `out` is written in place, converted to its dtype and device.
struct HfSlice {
  std::string name;
  torch::Tensor out;
  int64_t begin = 0;
  int64_t col_begin = 0;
  int64_t cols = 0;
};
struct HfSliceReport {
  int64_t bytes_read = 0;      // bytes of the files read for the slices
  int64_t bytes_in_files = 0;  // bytes of all the checkpoint's tensors
  int files_read = 0;          // safetensors files a slice was read from
};
// Fills `slices` from dir's checkpoint, reading only their bytes (a run of the file per slice, or
// per row of a column block), so each rank of a sharded run reads about its share, with one
// slice in memory at a time. InvalidInput naming the tensor: one the checkpoint lacks, a slice
// outside it; naming the file: a truncated one (the slices before it are then filled already:
// the caller stops). Call CheckHfWeightsMatch first.
Result<HfSliceReport> LoadHfSlices(const std::string& dir, const std::vector<HfSlice>& slices);

// CheckHfWeightsMatch, then every parameter of `module` filled whole by LoadHfSlices (one tensor
// in memory at a time).
Status LoadHfWeightsInto(const std::string& dir, torch::nn::Module& module,
                         bool tie_word_embeddings);

// Creates dir and writes config.json and model.safetensors (metadata {"format": "pt"}, which
// transformers requires) holding every named parameter of `module` converted to `dtype`
// (float32, bfloat16, float16 or float64). `module`'s lm_head.weight must be present exactly
// when the config is untied.
Status SaveHfCheckpoint(const std::string& dir, const model::LlamaConfig& c,
                        torch::nn::Module& module, torch::ScalarType dtype = torch::kFloat32);

// The tokenizer files of a Hugging Face model directory (tokenizer.json, tokenizer.model,
// tokenizer_config.json, special_tokens_map.json) copied from `from` into `to_dir`, each
// written atomically, so an exported model loads with the tokenizer it was trained with. `from` is
// a directory, or a tokenizer file (copied as tokenizer.json or tokenizer.model, whatever its name,
// with the configuration files beside it). Where no tokenizer_config.json comes along, one is
// written from `defaults` (the class that reads the file as it is, and the document separators), so
// transformers' AutoTokenizer loads the directory. Returns the names written (none when `from`
// holds no tokenizer). IOError naming the file on a failed copy.
struct TokenizerConfigDefaults {
  std::string bos_token;  // "" when the tokenizer has none
  std::string eos_token;
};
Result<std::vector<std::string>> CopyTokenizerFiles(const std::string& from, const std::string& to_dir,
                                                    const TokenizerConfigDefaults& defaults = {});

}  // namespace meshwork::io
