// Hugging Face Llama directory import/export: config.json <-> LlamaConfig, and safetensors
// weights (single file or sharded) <-> module parameters matched by their HF names.
#include "trainer/io/hf_checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/file.h"

namespace meshwork::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kLmHead = "lm_head.weight";
// How many names an error message lists before "and N more".
constexpr size_t kMaxListedNames = 10;

std::string JoinPath(const std::string& dir, const std::string& file) {
  return (fs::path(dir) / file).string();
}

std::string Brief(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string ShapeString(c10::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// "'a', 'b', 'c' and 4 more"
std::string ListNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxListedNames; ++i) {
    out += (i ? ", '" : "'") + names[i] + "'";
  }
  if (names.size() > kMaxListedNames) {
    out += " and " + std::to_string(names.size() - kMaxListedNames) + " more";
  }
  return out;
}

Result<json> ReadJsonFile(const std::string& path) {
  MW_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return InvalidInput("'" + path + "' is not valid JSON: " + e.what());
  }
}

// --- config.json ------------------------------------------------------------------------------

// Typed access to one JSON object of config.json; messages name the file and the dotted key.
class ConfigObject {
 public:
  ConfigObject(const json& obj, std::string path, std::string key_prefix = "")
      : obj_(obj), path_(std::move(path)), prefix_(std::move(key_prefix)) {}

  // The value of `key`, or nullptr when it is absent or null (HF writes null for "unset").
  const json* Find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  Status Int(const std::string& key, std::optional<int64_t> fallback, int64_t* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Fallback(key, fallback, out);
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() &&
         v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return WrongType(key, *v, "an integer");
    }
    *out = v->get<int64_t>();
    return Status::Ok();
  }

  Status Double(const std::string& key, std::optional<double> fallback, double* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Fallback(key, fallback, out);
    if (!v->is_number()) return WrongType(key, *v, "a number");
    *out = v->get<double>();
    return Status::Ok();
  }

  Status Bool(const std::string& key, std::optional<bool> fallback, bool* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Fallback(key, fallback, out);
    if (!v->is_boolean()) return WrongType(key, *v, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }

  Status String(const std::string& key, std::optional<std::string> fallback,
                std::string* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Fallback(key, fallback, out);
    if (!v->is_string()) return WrongType(key, *v, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }

  Status Error(const std::string& key, const std::string& what) const {
    return InvalidInput("'" + path_ + "': key '" + prefix_ + key + "': " + what);
  }

 private:
  template <typename T>
  Status Fallback(const std::string& key, const std::optional<T>& fallback, T* out) const {
    if (!fallback) return Error(key, "required key is missing");
    *out = *fallback;
    return Status::Ok();
  }

  Status WrongType(const std::string& key, const json& v, const char* want) const {
    return Error(key, std::string("must be ") + want + ", got " + Brief(v));
  }

  const json& obj_;
  std::string path_;
  std::string prefix_;
};

Status ReadRopeScaling(const ConfigObject& config, const std::string& path,
                       model::RopeScaling* out) {
  const json* v = config.Find("rope_scaling");
  *out = model::RopeScaling{};  // factor 0: disabled
  if (v == nullptr) return Status::Ok();
  if (!v->is_object()) return config.Error("rope_scaling", "must be an object or null, got " +
                                                               Brief(*v));
  const ConfigObject rs(*v, path, "rope_scaling.");
  // Newer transformers write "rope_type"; older configs used "type".
  std::string type;
  if (rs.Find("rope_type") != nullptr) {
    MW_RETURN_IF_ERROR(rs.String("rope_type", std::nullopt, &type));
  } else {
    MW_RETURN_IF_ERROR(rs.String("type", std::nullopt, &type));
  }
  if (type == "default") return Status::Ok();  // HF's name for plain RoPE
  if (type != "llama3") {
    return config.Error("rope_scaling", "rope_type '" + type +
                                            "' is not supported (only \"llama3\" or none)");
  }
  MW_RETURN_IF_ERROR(rs.Double("factor", std::nullopt, &out->factor));
  MW_RETURN_IF_ERROR(rs.Double("low_freq_factor", std::nullopt, &out->low_freq_factor));
  MW_RETURN_IF_ERROR(rs.Double("high_freq_factor", std::nullopt, &out->high_freq_factor));
  MW_RETURN_IF_ERROR(rs.Int("original_max_position_embeddings", std::nullopt,
                            &out->original_max_position_embeddings));
  if (!(out->factor > 0.0)) return rs.Error("factor", "must be > 0");
  if (!(out->high_freq_factor > out->low_freq_factor)) {
    return rs.Error("high_freq_factor", "must be greater than low_freq_factor");
  }
  if (out->original_max_position_embeddings <= 0) {
    return rs.Error("original_max_position_embeddings", "must be > 0");
  }
  return Status::Ok();
}

// Features of HF's LlamaConfig that Meshwork's Llama does not implement: reading such a config
// must fail rather than silently load a different model.
Status CheckSupportedFeatures(const ConfigObject& config, const model::LlamaConfig& c) {
  std::string act;
  MW_RETURN_IF_ERROR(config.String("hidden_act", "silu", &act));
  if (act != "silu") return config.Error("hidden_act", "'" + act + "' is not supported (silu)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    MW_RETURN_IF_ERROR(config.Bool(key, false, &bias));
    if (bias) return config.Error(key, "biases are not supported (must be false)");
  }
  if (config.Find("head_dim") != nullptr) {
    int64_t head_dim = 0;
    MW_RETURN_IF_ERROR(config.Int("head_dim", std::nullopt, &head_dim));
    if (c.num_attention_heads > 0 && head_dim != c.head_dim()) {
      return config.Error("head_dim", std::to_string(head_dim) +
                                          " differs from hidden_size / num_attention_heads = " +
                                          std::to_string(c.head_dim()) + " (not supported)");
    }
  }
  return Status::Ok();
}

// --- weights ------------------------------------------------------------------------------------

// One safetensors file of a checkpoint and the tensors the checkpoint takes from it.
struct Shard {
  std::string path;
  std::vector<std::string> names;
  SafetensorsHeader header;
};

// Where every tensor of dir's checkpoint lives, worked out from the safetensors headers alone
// so that names and shapes can be checked before any weight data is read.
Result<std::vector<Shard>> PlanShards(const std::string& dir) {
  const std::string single = JoinPath(dir, kWeightsFile);
  const std::string index_path = JoinPath(dir, kIndexFile);
  std::error_code ec;
  if (fs::exists(single, ec)) {
    Shard shard;
    shard.path = single;
    MW_ASSIGN_OR_RETURN(shard.header, ReadSafetensorsHeader(single));
    for (const auto& e : shard.header.tensors) shard.names.push_back(e.name);
    return std::vector<Shard>{std::move(shard)};
  }
  if (!fs::exists(index_path, ec)) {
    return NotFound("'" + dir + "' holds neither " + kWeightsFile + " nor " + kIndexFile);
  }

  MW_ASSIGN_OR_RETURN(json index, ReadJsonFile(index_path));
  const auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (wm == index.end() || !wm->is_object()) {
    return InvalidInput("'" + index_path + "': missing or non-object \"weight_map\"");
  }
  std::map<std::string, std::vector<std::string>> names_by_file;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) {
      return InvalidInput("'" + index_path + "': weight_map entry for tensor '" + name +
                          "' is not a file name: " + Brief(file));
    }
    const fs::path rel(file.get<std::string>());
    // Shards live beside the index; anything else is a corrupt or hostile index.
    if (rel.empty() || rel.is_absolute() || *rel.lexically_normal().begin() == "..") {
      return InvalidInput("'" + index_path + "': tensor '" + name + "' is mapped to '" +
                          rel.string() + "', which is not a file inside the directory");
    }
    names_by_file[rel.string()].push_back(name);
  }

  std::vector<Shard> shards;
  for (auto& [file, names] : names_by_file) {
    Shard shard;
    shard.path = JoinPath(dir, file);
    auto header = ReadSafetensorsHeader(shard.path);
    if (!header.ok()) {
      if (header.status().code() == StatusCode::kNotFound) {
        return NotFound("shard '" + shard.path + "' listed in '" + index_path + "' (for tensor '" +
                        names.front() + "') does not exist");
      }
      return header.status();
    }
    shard.header = std::move(header).value();
    for (const auto& name : names) {
      if (shard.header.Find(name) == nullptr) {
        return InvalidInput("'" + index_path + "' places tensor '" + name + "' in shard '" +
                            shard.path + "', which does not contain it");
      }
    }
    shard.names = std::move(names);
    shards.push_back(std::move(shard));
  }
  return shards;
}

bool IsIgnoredCheckpointTensor(const std::string& name, bool tie_word_embeddings) {
  // Old HF checkpoints saved the rotary inverse frequencies as a buffer; they are recomputed
  // from the config, so the stored copy carries nothing.
  static const std::string kInvFreq = "rotary_emb.inv_freq";
  if (name.size() >= kInvFreq.size() &&
      name.compare(name.size() - kInvFreq.size(), kInvFreq.size(), kInvFreq) == 0) {
    return true;
  }
  // With tied embeddings the output projection is the embedding; a stored copy is redundant.
  return tie_word_embeddings && name == kLmHead;
}

Result<std::string> HfDtypeName(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat: return std::string("float32");
    case torch::kBFloat16: return std::string("bfloat16");
    case torch::kHalf: return std::string("float16");
    case torch::kDouble: return std::string("float64");
    default:
      return InvalidInput(std::string("checkpoint dtype ") + c10::toString(dtype) +
                          " is not supported (float32, bfloat16, float16 or float64)");
  }
}

}  // namespace

Result<model::LlamaConfig> ReadHfConfig(const std::string& dir) {
  const std::string path = JoinPath(dir, kConfigFile);
  MW_ASSIGN_OR_RETURN(json root, ReadJsonFile(path));
  if (!root.is_object()) return InvalidInput("'" + path + "' is not a JSON object");
  const ConfigObject config(root, path);

  model::LlamaConfig c;
  MW_RETURN_IF_ERROR(config.Int("vocab_size", std::nullopt, &c.vocab_size));
  MW_RETURN_IF_ERROR(config.Int("hidden_size", std::nullopt, &c.hidden_size));
  MW_RETURN_IF_ERROR(config.Int("intermediate_size", std::nullopt, &c.intermediate_size));
  MW_RETURN_IF_ERROR(config.Int("num_hidden_layers", std::nullopt, &c.num_hidden_layers));
  MW_RETURN_IF_ERROR(config.Int("num_attention_heads", std::nullopt, &c.num_attention_heads));
  // The defaults are HF LlamaConfig's, which older (Llama 1/2 era) configs rely on.
  MW_RETURN_IF_ERROR(
      config.Int("num_key_value_heads", c.num_attention_heads, &c.num_key_value_heads));
  MW_RETURN_IF_ERROR(
      config.Int("max_position_embeddings", int64_t{2048}, &c.max_position_embeddings));
  MW_RETURN_IF_ERROR(config.Double("rms_norm_eps", 1e-6, &c.rms_norm_eps));
  MW_RETURN_IF_ERROR(config.Double("rope_theta", 10000.0, &c.rope_theta));
  MW_RETURN_IF_ERROR(config.Bool("tie_word_embeddings", false, &c.tie_word_embeddings));
  MW_RETURN_IF_ERROR(ReadRopeScaling(config, path, &c.rope_scaling));
  MW_RETURN_IF_ERROR(CheckSupportedFeatures(config, c));

  // A bad value here is a bad input file, not a bad Meshwork config: report it as such.
  const Status valid = c.Validate("config.json: ");
  if (!valid.ok()) return InvalidInput("'" + path + "': " + valid.message());
  return c;
}

Status WriteHfConfig(const std::string& dir, const model::LlamaConfig& c,
                     const HfConfigExtras& extras) {
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim()},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"torch_dtype", extras.torch_dtype},
      // Written out so a reader never falls back to a default that differs from Meshwork's.
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"use_cache", true},
  };
  if (c.rope_scaling.enabled()) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (extras.bos_token_id) j["bos_token_id"] = *extras.bos_token_id;
  if (extras.eos_token_id) j["eos_token_id"] = *extras.eos_token_id;

  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const json::exception& e) {  // torch_dtype that is not UTF-8
    return InvalidInput("writing config.json in '" + dir + "': " + e.what());
  }
  MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(JoinPath(dir, kConfigFile)));
  MW_RETURN_IF_ERROR(out.Write(text.data(), text.size()));
  return out.Commit();
}

Result<TensorMap> ReadHfWeights(const std::string& dir) {
  MW_ASSIGN_OR_RETURN(std::vector<Shard> shards, PlanShards(dir));
  TensorMap out;
  for (const auto& shard : shards) {
    MW_ASSIGN_OR_RETURN(TensorMap tensors, ReadSafetensors(shard.path));
    for (const auto& name : shard.names) out[name] = std::move(tensors.at(name));
  }
  return out;
}

namespace {

// One parameter of the model as the checkpoint must hold it.
struct HfParam {
  std::string name;
  std::vector<int64_t> shape;
};

// The checks of CheckHfWeightsMatch on a planned checkpoint.
Status CheckShardsMatch(const std::string& dir, const std::vector<Shard>& shards, const std::vector<HfParam>& params,
                        bool tie_word_embeddings) {
  // Match names and shapes from the headers first: a wrong checkpoint should fail in
  // milliseconds, with every problem listed, not after gigabytes were read.
  std::unordered_map<std::string, const SafetensorsEntry*> stored;
  for (const auto& shard : shards) {
    for (const auto& name : shard.names) stored[name] = shard.header.Find(name);
  }
  std::set<std::string> known;
  std::vector<std::string> missing, unexpected, mismatched;
  for (const HfParam& p : params) {
    known.insert(p.name);
    auto it = stored.find(p.name);
    if (it == stored.end()) {
      missing.push_back(p.name);
    } else if (it->second->shape != p.shape) {
      mismatched.push_back("'" + p.name + "' is " + ShapeString(it->second->shape) + " in the checkpoint but " +
                           ShapeString(p.shape) + " in the model");
    }
  }
  for (const auto& [name, entry] : stored) {
    if (known.count(name) == 0 && !IsIgnoredCheckpointTensor(name, tie_word_embeddings)) {
      unexpected.push_back(name);
    }
  }
  std::sort(unexpected.begin(), unexpected.end());
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return Status::Ok();
  std::string msg = "checkpoint '" + dir + "' does not match the model:";
  if (!missing.empty()) {
    msg += " " + std::to_string(missing.size()) + " parameter(s) missing from the checkpoint: " + ListNames(missing) +
           ";";
    if (!tie_word_embeddings && std::find(missing.begin(), missing.end(), kLmHead) != missing.end()) {
      msg += " (no lm_head.weight: is the checkpoint's tie_word_embeddings true?);";
    }
  }
  if (!unexpected.empty()) {
    msg += " " + std::to_string(unexpected.size()) + " unexpected tensor(s) in the checkpoint: " +
           ListNames(unexpected) + ";";
  }
  if (!mismatched.empty()) {
    msg += " " + std::to_string(mismatched.size()) + " shape mismatch(es): ";
    for (size_t i = 0; i < mismatched.size() && i < kMaxListedNames; ++i) {
      msg += (i ? ", " : "") + mismatched[i];
    }
    if (mismatched.size() > kMaxListedNames) {
      msg += " and " + std::to_string(mismatched.size() - kMaxListedNames) + " more";
    }
    msg += ";";
  }
  msg.pop_back();
  return InvalidInput(msg);
}

std::vector<HfParam> ParamsOf(torch::nn::Module& module) {
  std::vector<HfParam> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.push_back({p.key(), p.value().sizes().vec()});
  return out;
}

}  // namespace

Status CheckHfWeightsMatch(const std::string& dir, torch::nn::Module& module, bool tie_word_embeddings) {
  MW_ASSIGN_OR_RETURN(std::vector<Shard> shards, PlanShards(dir));
  return CheckShardsMatch(dir, shards, ParamsOf(module), tie_word_embeddings);
}

Result<HfSliceReport> LoadHfSlices(const std::string& dir, const std::vector<HfSlice>& slices) {
  MW_ASSIGN_OR_RETURN(std::vector<Shard> shards, PlanShards(dir));
  HfSliceReport report;
  std::unordered_map<std::string, size_t> shard_of;
  for (size_t i = 0; i < shards.size(); ++i) {
    for (const auto& name : shards[i].names) {
      shard_of[name] = i;
      const SafetensorsEntry* entry = shards[i].header.Find(name);
      report.bytes_in_files += static_cast<int64_t>(entry->end - entry->begin);
    }
  }
  // Each slice is read into a buffer of the file's dtype, then copied into its parameter: one
  // slice in memory at a time.
  std::map<size_t, ReadOnlyFile> open;
  torch::NoGradGuard no_grad;
  for (const HfSlice& slice : slices) {
    auto where = shard_of.find(slice.name);
    if (where == shard_of.end()) return InvalidInput("checkpoint '" + dir + "' has no tensor '" + slice.name + "'");
    const Shard& shard = shards[where->second];
    const SafetensorsEntry& entry = *shard.header.Find(slice.name);
    const int64_t numel = c10::multiply_integers(entry.shape);
    const int64_t width = entry.shape.size() >= 2 ? entry.shape.back() : std::max<int64_t>(numel, 1);
    const int64_t count = slice.out.numel();
    const bool block = slice.cols > 0 && !(slice.col_begin == 0 && slice.cols == width);
    // A block's rows (width 0 only where the tensor is empty: no rows to read).
    const int64_t extent = block ? (width > 0 ? numel / width : 0) * slice.cols : numel;
    if ((block && (entry.shape.size() < 2 || slice.col_begin < 0 || slice.col_begin + slice.cols > width)) ||
        slice.begin < 0 || slice.begin + count > extent) {
      return InvalidInput("checkpoint '" + dir + "': tensor '" + slice.name + "' of shape " +
                          ShapeString(entry.shape) + " holds no elements [" + std::to_string(slice.begin) + ", " +
                          std::to_string(slice.begin + count) + ")" +
                          (block ? " of its columns [" + std::to_string(slice.col_begin) + ", " +
                                       std::to_string(slice.col_begin + slice.cols) + ")"
                                 : std::string()));
    }
    if (open.count(where->second) == 0) {
      MW_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(shard.path));
      open.emplace(where->second, std::move(file));
    }
    const ReadOnlyFile& file = open.at(where->second);
    torch::Tensor buffer = torch::empty({count}, torch::TensorOptions().dtype(entry.dtype));
    const int64_t elem = static_cast<int64_t>(buffer.element_size());
    auto* out = static_cast<char*>(buffer.data_ptr());
    const uint64_t base = shard.header.data_start + entry.begin;
    auto read_at = [&](int64_t element, int64_t n, int64_t dst) -> Status {
      Status got = file.ReadAt(base + static_cast<uint64_t>(element * elem), out + dst * elem,
                               static_cast<size_t>(n * elem));
      if (!got.ok()) return InvalidInput("checkpoint file '" + shard.path + "', tensor '" + slice.name + "': " + got.message());
      report.bytes_read += n * elem;
      return Status::Ok();
    };
    if (!block) {
      // A run of the flattened tensor is one run of the file.
      if (count > 0) MW_RETURN_IF_ERROR(read_at(slice.begin, count, 0));
    } else {
      // A column block, flattened row-major: each row's part of the slice is one run of the file.
      for (int64_t at = slice.begin, end = slice.begin + count; at < end;) {
        const int64_t row = at / slice.cols, col = at % slice.cols;
        const int64_t take = std::min(end - at, slice.cols - col);
        MW_RETURN_IF_ERROR(read_at(row * width + slice.col_begin + col, take, at - slice.begin));
        at += take;
      }
    }
    try {
      slice.out.view({-1}).copy_(buffer);  // converts the dtype, moves to the device
    } catch (const c10::Error& e) {
      return Internal("copying checkpoint tensor '" + slice.name + "' from '" + shard.path + "' into the model failed: " +
                      e.what_without_backtrace());
    }
  }
  report.files_read = static_cast<int>(open.size());
  return report;
}

Status LoadHfWeightsInto(const std::string& dir, torch::nn::Module& module, bool tie_word_embeddings) {
  MW_RETURN_IF_ERROR(CheckHfWeightsMatch(dir, module, tie_word_embeddings));
  std::vector<HfSlice> whole;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) whole.push_back({p.key(), p.value()});
  return LoadHfSlices(dir, whole).status();
}

Status SaveHfCheckpoint(const std::string& dir, const model::LlamaConfig& c,
                        torch::nn::Module& module, torch::ScalarType dtype) {
  MW_ASSIGN_OR_RETURN(std::string dtype_name, HfDtypeName(dtype));
  const auto params = module.named_parameters(/*recurse=*/true);
  // transformers ties lm_head to the embedding when the config says so and overwrites any
  // stored lm_head; a disagreement here would silently change the model on reload.
  const bool has_lm_head = params.find(kLmHead) != nullptr;
  if (has_lm_head == c.tie_word_embeddings) {
    return Internal(std::string("saving '") + dir + "': tie_word_embeddings is " +
                    (c.tie_word_embeddings ? "true" : "false") + " but the model " +
                    (has_lm_head ? "has" : "has no") + " lm_head.weight parameter");
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IOError("cannot create directory '" + dir + "': " + ec.message());

  TensorMap tensors;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : params) tensors.emplace(p.key(), p.value().detach().to(dtype));
  }
  // Weights first: a fresh directory that lacks config.json (a crash between the two writes)
  // does not look like a complete checkpoint to HF tools.
  MW_RETURN_IF_ERROR(
      WriteSafetensors(JoinPath(dir, kWeightsFile), tensors, {{"format", "pt"}}));
  HfConfigExtras extras;
  extras.torch_dtype = dtype_name;
  return WriteHfConfig(dir, c, extras);
}

namespace {
Status WriteWhole(const std::string& to, const std::string& bytes) {
  MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(to));
  MW_RETURN_IF_ERROR(out.Write(bytes.data(), bytes.size()));
  return out.Commit();
}
}  // namespace

Result<std::vector<std::string>> CopyTokenizerFiles(const std::string& from, const std::string& to_dir,
                                                    const TokenizerConfigDefaults& defaults) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // (source, name in the export)
  std::vector<std::pair<fs::path, std::string>> files;
  fs::path dir = from;
  if (fs::is_regular_file(from, ec)) {
    dir = fs::path(from).parent_path();
    files.emplace_back(from, fs::path(from).extension() == ".model" ? "tokenizer.model" : "tokenizer.json");
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) files.emplace_back(dir / name, name);
  } else {
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}) {
      files.emplace_back(dir / name, name);
    }
  }
  std::vector<std::string> copied;
  bool has_tokenizer = false, has_config = false;
  for (const auto& [source, name] : files) {
    if (!fs::is_regular_file(source, ec)) continue;
    std::ifstream in(source, std::ios::binary);
    if (!in) return IOError("cannot open '" + source.string() + "' to copy it beside the export");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return IOError("cannot read '" + source.string() + "' to copy it beside the export");
    MW_RETURN_IF_ERROR(WriteWhole((fs::path(to_dir) / name).string(), bytes));
    copied.push_back(name);
    has_tokenizer = has_tokenizer || name == "tokenizer.json" || name == "tokenizer.model";
    has_config = has_config || name == "tokenizer_config.json";
  }
  if (has_tokenizer && !has_config) {
    // PreTrainedTokenizerFast reads tokenizer.json as it is (its normalizer, pre-tokenizer and
    // post-processor); LlamaTokenizer reads a SentencePiece model.
    const bool spm = std::find(copied.begin(), copied.end(), "tokenizer.json") == copied.end();
    nlohmann::ordered_json config;
    config["tokenizer_class"] = spm ? "LlamaTokenizer" : "PreTrainedTokenizerFast";
    if (!defaults.bos_token.empty()) config["bos_token"] = defaults.bos_token;
    if (!defaults.eos_token.empty()) config["eos_token"] = defaults.eos_token;
    config["add_bos_token"] = false;  // what `meshwork-train tokenize` gives: the text's ids alone
    config["add_eos_token"] = false;
    config["clean_up_tokenization_spaces"] = false;
    MW_RETURN_IF_ERROR(WriteWhole((fs::path(to_dir) / "tokenizer_config.json").string(), config.dump(2) + "\n"));
    copied.push_back("tokenizer_config.json");
  }
  return copied;
}

}  // namespace meshwork::io
