// Training checkpoints (see checkpoint.h): shard files through the safetensors reader and
// writer (trainer/io), format 2's rank files through libtorch's serialize archives, meta.json
// through nlohmann::json, `latest` as one line.
#include "trainer/train/checkpoint.h"

#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "common/file.h"
#include "trainer/io/safetensors.h"
#include "trainer/model/compat.h"
#include "trainer/train/adamw.h"
#include "trainer/train/engine.h"

namespace meshwork::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Version 2 writes the AdamW state itself, per parameter, as CPU tensors; version 1 (still read)
// held libtorch's own optimizer archive, whose state the unpickler made on the load device.
constexpr int64_t kFormatVersion = 2;
constexpr int64_t kFormatVersionLibtorchOptimizer = 1;
constexpr int64_t kNoState = -1;  // in adamw/steps: the parameter has no AdamW state yet
constexpr const char* kFormatName = "meshwork-training-checkpoint";
// meta.json's version: 3, shard files that any mesh loads; 2 (still read), format 2's rank files
// (kFormatVersion above), loaded at the mesh that wrote them.
constexpr int64_t kMetaVersion = 3;
constexpr int64_t kMetaVersionRankFiles = 2;
constexpr const char* kShardFileFormat = "meshwork-shards";
constexpr const char* kStepPrefix = "step-";

std::string Join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// libtorch's messages can run to several lines; the first says what went wrong.
std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// The step of a directory named step-NNNNNNNN, or -1.
int64_t ParseStepDirName(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(std::char_traits<char>::length(kStepPrefix));
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// A 64-bit checksum of a byte stream, fed in pieces of any size (FNV-1a's multiply on 8-byte
// words, with a shift to mix high bits down). libtorch's zip reader does not check CRCs, so a
// flipped bit in a tensor would otherwise load silently.
class Checksum {
 public:
  void Update(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (size > 0 && (pending_ > 0 || size < 8)) {
      buf_[pending_++] = *p++;
      --size;
      if (pending_ == 8) Mix(Word(buf_)), pending_ = 0;
    }
    for (; size >= 8; p += 8, size -= 8) Mix(Word(p));
    while (size > 0) buf_[pending_++] = *p++, --size;
  }
  uint64_t Final() const {
    uint64_t h = h_;
    for (size_t i = 0; i < pending_; ++i) h = (h ^ buf_[i]) * kPrime;
    return h;
  }

 private:
  static constexpr uint64_t kPrime = 0x100000001b3ULL;
  static uint64_t Word(const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  void Mix(uint64_t w) {
    h_ = (h_ ^ w) * kPrime;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0xcbf29ce484222325ULL;
  unsigned char buf_[8] = {};
  size_t pending_ = 0;
};

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The checksum file next to a rank file: "<bytes> <checksum>\n".
std::string SumPath(const std::string& rank_file) { return rank_file + ".sum"; }

// Size and checksum of a whole file, read in 4 MiB pieces.
Result<std::pair<uint64_t, std::string>> FileChecksum(const std::string& path) {
  MW_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(path));
  Checksum sum;
  std::vector<char> chunk(size_t{4} << 20);
  for (uint64_t at = 0; at < file.size(); at += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), file.size() - at));
    MW_RETURN_IF_ERROR(file.ReadAt(at, chunk.data(), n));
    sum.Update(chunk.data(), n);
  }
  return std::make_pair(static_cast<uint64_t>(file.size()), Hex(sum.Final()));
}

// What `path`'s .sum file recorded: its size in bytes and its checksum.
Result<std::pair<uint64_t, std::string>> RecordedChecksum(const std::string& path) {
  auto recorded = ReadTextFile(SumPath(path));
  if (!recorded.ok()) {
    if (recorded.status().code() == StatusCode::kNotFound) {
      return NotFound("checkpoint file '" + path + "' has no checksum file '" + SumPath(path) + "'");
    }
    return recorded.status();
  }
  std::istringstream in(*recorded);
  uint64_t bytes = 0;
  std::string sum;
  if (!(in >> bytes >> sum)) {
    return InvalidInput("checksum file '" + SumPath(path) + "' is corrupt: expected '<bytes> <checksum>'");
  }
  return std::make_pair(bytes, sum);
}

// Checks `path` against its .sum file: same size, same checksum.
Status VerifyChecksum(const std::string& path) {
  MW_ASSIGN_OR_RETURN(const auto want, RecordedChecksum(path));
  const uint64_t want_bytes = want.first;
  const std::string& want_sum = want.second;
  MW_ASSIGN_OR_RETURN(const auto actual, FileChecksum(path));
  if (actual.first != want_bytes) {
    return InvalidInput("checkpoint file '" + path + "' is corrupt or truncated: " + std::to_string(actual.first) +
                        " bytes, " + std::to_string(want_bytes) + " were written");
  }
  if (actual.second != want_sum) {
    return InvalidInput("checkpoint file '" + path + "' is corrupt: its checksum " + actual.second +
                        " differs from " + want_sum + " recorded in '" + SumPath(path) + "'");
  }
  return Status::Ok();
}

Status WriteTextAtomically(const std::string& path, const std::string& text) {
  MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  MW_RETURN_IF_ERROR(out.Write(text.data(), text.size()));
  return out.Commit();
}

// A checkpoint directory is complete when its meta.json and every rank's file and checksum are there.
bool IsComplete(const std::string& step_dir) {
  auto meta = ReadMeta(step_dir);
  if (!meta.ok()) return false;
  for (const std::string& name : meta->files) {
    const std::string file = Join(step_dir, name);
    if (!fs::exists(file) || !fs::exists(SumPath(file))) return false;
  }
  return true;
}

// Deletes checkpoints older than `current` beyond the newest `keep` complete ones (current
// included), and incomplete ones older than `current` (left by a crash mid-save). Directories
// of later steps belong to a save that never completed; they are rewritten when reached.
Status Prune(const std::string& dir, int64_t current, int64_t keep) {
  std::vector<std::pair<int64_t, std::string>> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = ParseStepDirName(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) dirs.emplace_back(step, entry.path().string());
  }
  if (ec) return IOError("cannot list checkpoint directory '" + dir + "': " + ec.message());
  std::sort(dirs.rbegin(), dirs.rend());
  int64_t kept = 0;
  for (const auto& [step, path] : dirs) {
    if (step > current) continue;
    if (step == current || (kept < keep && IsComplete(path))) {
      ++kept;
      continue;
    }
    if (Status removed = RemoveTree(path); !removed.ok()) {
      return IOError("cannot delete old checkpoint '" + path + "': " + removed.message());
    }
  }
  return Status::Ok();
}

// One parameter's AdamW state as read from a file, on the CPU.
using SavedAdamWState = AdamWParamState;

// A version-1 file's state: libtorch's optimizer archive, loaded (on the CPU) into a
// torch::optim::AdamW with `optimizer`'s groups, which maps it to this run's parameters by
// position, then taken out per parameter.
Result<std::vector<std::optional<SavedAdamWState>>> ReadLibtorchOptimizerState(
    torch::serialize::InputArchive& archive, const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const AdamW& optimizer) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const AdamWGroup& g : optimizer.groups()) {
    groups.emplace_back(g.params, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(optimizer.lr()).weight_decay(g.weight_decay)));
  }
  torch::optim::AdamW libtorch(groups, torch::optim::AdamWOptions(optimizer.lr()));
  torch::serialize::InputArchive optimizer_archive;
  archive.read("optimizer", optimizer_archive);
  libtorch.load(optimizer_archive);
  std::vector<std::optional<SavedAdamWState>> saved(params.size());
  const auto& state = libtorch.state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(compat::OptimizerStateKey(state, params[i].second));
    if (it == state.end()) continue;
    const auto& s = dynamic_cast<const torch::optim::AdamWParamState&>(*it->second);
    saved[i] = SavedAdamWState{s.step(), s.exp_avg().cpu(), s.exp_avg_sq().cpu()};
  }
  return saved;
}

}  // namespace

CheckpointMeta RunMeta(const config::TrainConfig& cfg, const model::LlamaConfig& dims, const Engine& engine) {
  CheckpointMeta m;
  m.total_steps = cfg.schedule.steps;
  m.world_size = engine.world_size();
  const dist::MeshShape shape = engine.mesh_shape();
  m.dp_replicate = shape.dp_replicate;
  m.dp_shard = shape.dp_shard;
  m.tp = shape.tp;
  m.pp = static_cast<int>(cfg.mesh.pp);
  // Pipeline stages alone hold whole parameters: no FSDP shards them.
  m.fsdp_mode = engine.world_size() > m.pp ? NameOf(config::kFsdpModeNames, cfg.fsdp.mode) : "none";
  m.dims = dims;
  m.data_train = cfg.data.train;
  m.seed = cfg.training.seed;
  m.seq_len = cfg.data.seq_len;
  m.batch_size = cfg.data.batch_size;
  m.grad_accum = cfg.training.grad_accum;
  for (int r = 0; r < m.world_size; ++r) m.files.push_back(ShardFileName(r));
  return m;
}

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

std::string RankFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.pt", rank);
  return buf;
}

std::string ShardFileName(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

std::string MetaToJson(const CheckpointMeta& m) {
  json files = json::array();
  for (int r = 0; r < m.world_size; ++r) {
    files.push_back(static_cast<size_t>(r) < m.files.size()                ? m.files[static_cast<size_t>(r)]
                    : m.format_version == kMetaVersionRankFiles ? RankFileName(r)
                                                                             : ShardFileName(r));
  }
  const json doc = {
      {"format", kFormatName},
      {"version", m.format_version},
      {"step", m.step},
      {"total_steps", m.total_steps},
      {"world_size", m.world_size},
      {"mesh", {{"dp_replicate", m.dp_replicate}, {"dp_shard", m.dp_shard}, {"tp", m.tp}, {"pp", m.pp}}},
      {"fsdp_mode", m.fsdp_mode},
      {"shard_layout", m.shard_layout},
      {"model",
       {{"vocab_size", m.dims.vocab_size},
        {"hidden_size", m.dims.hidden_size},
        {"intermediate_size", m.dims.intermediate_size},
        {"num_hidden_layers", m.dims.num_hidden_layers},
        {"num_attention_heads", m.dims.num_attention_heads},
        {"num_key_value_heads", m.dims.num_key_value_heads},
        {"tie_word_embeddings", m.dims.tie_word_embeddings},
        {"rope_theta", m.dims.rope_theta},
        {"rms_norm_eps", m.dims.rms_norm_eps}}},
      {"data",
       {{"train", m.data_train},
        {"seed", m.seed},
        {"seq_len", m.seq_len},
        {"batch_size", m.batch_size},
        {"grad_accum", m.grad_accum},
        {"samples", m.samples}}},
      {"files", files},
  };
  return doc.dump(2) + "\n";
}

Result<CheckpointMeta> ReadMeta(const std::string& step_dir) {
  const std::string path = Join(step_dir, "meta.json");
  MW_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  CheckpointMeta m;
  try {
    const json doc = json::parse(text);
    if (doc.at("format").get<std::string>() != kFormatName) {
      return InvalidInput("checkpoint metadata '" + path + "' is not a Meshwork training checkpoint");
    }
    m.format_version = doc.at("version").get<int64_t>();
    if (m.format_version != kMetaVersion && m.format_version != kMetaVersionRankFiles) {
      return InvalidInput("checkpoint metadata '" + path + "' has format version " +
                          std::to_string(m.format_version) + "; this trainer reads versions " +
                          std::to_string(kMetaVersionRankFiles) + " and " + std::to_string(kMetaVersion));
    }
    m.step = doc.at("step").get<int64_t>();
    m.total_steps = doc.at("total_steps").get<int64_t>();
    m.world_size = doc.at("world_size").get<int>();
    m.dp_replicate = doc.at("mesh").at("dp_replicate").get<int>();
    m.dp_shard = doc.at("mesh").at("dp_shard").get<int>();
    m.tp = doc.at("mesh").value("tp", 1);  // absent before tensor parallelism
    m.pp = doc.at("mesh").value("pp", 1);  // absent before pipeline checkpoints
    m.fsdp_mode = doc.at("fsdp_mode").get<std::string>();
    m.shard_layout = doc.value("shard_layout", std::string("rows"));
    const json& d = doc.at("model");
    m.dims.vocab_size = d.at("vocab_size").get<int64_t>();
    m.dims.hidden_size = d.at("hidden_size").get<int64_t>();
    m.dims.intermediate_size = d.at("intermediate_size").get<int64_t>();
    m.dims.num_hidden_layers = d.at("num_hidden_layers").get<int64_t>();
    m.dims.num_attention_heads = d.at("num_attention_heads").get<int64_t>();
    m.dims.num_key_value_heads = d.at("num_key_value_heads").get<int64_t>();
    m.dims.tie_word_embeddings = d.at("tie_word_embeddings").get<bool>();
    // Recorded since 2026-11-28; an older checkpoint's are unknown and not checked.
    m.numerics_recorded = d.contains("rope_theta") && d.contains("rms_norm_eps");
    if (m.numerics_recorded) {
      m.dims.rope_theta = d.at("rope_theta").get<double>();
      m.dims.rms_norm_eps = d.at("rms_norm_eps").get<double>();
    }
    const json& data = doc.at("data");
    m.data_train = data.at("train").get<std::string>();
    m.seed = data.at("seed").get<int64_t>();
    m.seq_len = data.at("seq_len").get<int64_t>();
    m.batch_size = data.at("batch_size").get<int64_t>();
    m.grad_accum = data.at("grad_accum").get<int64_t>();
    m.samples = data.value("samples", int64_t{-1});
    for (const json& f : doc.at("files")) m.files.push_back(f.get<std::string>());
  } catch (const json::exception& e) {
    return InvalidInput("checkpoint metadata '" + path + "' is corrupt: " + e.what());
  }
  if (m.world_size < 1) return InvalidInput("checkpoint metadata '" + path + "': world_size must be >= 1");
  if (m.files.size() != static_cast<size_t>(m.world_size)) {
    return InvalidInput("checkpoint metadata '" + path + "' lists " + std::to_string(m.files.size()) +
                        " files for world_size " + std::to_string(m.world_size));
  }
  for (const std::string& f : m.files) {
    if (f.empty() || f.find('/') != std::string::npos || f.rfind("rank-", 0) != 0) {
      return InvalidInput("checkpoint metadata '" + path + "' lists a file '" + f + "' that is not a rank file");
    }
  }
  return m;
}

Status CheckCompatible(const CheckpointMeta& saved, const CheckpointMeta& now, const std::string& step_dir) {
  std::vector<std::string> diffs;
  auto check = [&](const std::string& what, auto a, auto b) {
    if (a == b) return;
    std::ostringstream os;
    os << std::boolalpha << what << " " << a << " in the checkpoint, " << b << " in this run";
    diffs.push_back(os.str());
  };
  // Format 2's rank files hold each rank's tensors by position: only the same mesh can read them.
  const bool fixed_mesh = saved.format_version == kMetaVersionRankFiles;
  if (fixed_mesh) {
    check("world size", saved.world_size, now.world_size);
    check("mesh dp_replicate", saved.dp_replicate, now.dp_replicate);
    check("mesh dp_shard", saved.dp_shard, now.dp_shard);
    check("mesh tp", saved.tp, now.tp);
    check("mesh pp", saved.pp, now.pp);
  }
  check("model.vocab_size", saved.dims.vocab_size, now.dims.vocab_size);
  check("model.hidden_size", saved.dims.hidden_size, now.dims.hidden_size);
  check("model.intermediate_size", saved.dims.intermediate_size, now.dims.intermediate_size);
  check("model.num_hidden_layers", saved.dims.num_hidden_layers, now.dims.num_hidden_layers);
  check("model.num_attention_heads", saved.dims.num_attention_heads, now.dims.num_attention_heads);
  check("model.num_key_value_heads", saved.dims.num_key_value_heads, now.dims.num_key_value_heads);
  check("model.tie_word_embeddings", saved.dims.tie_word_embeddings, now.dims.tie_word_embeddings);
  if (fixed_mesh && (saved.dp_shard > 1 || now.dp_shard > 1) && saved.shard_layout != now.shard_layout) {
    diffs.push_back("shard layout '" + saved.shard_layout + "' in the checkpoint, '" + now.shard_layout +
                    "' in this run (a checkpoint sharded by rows was written by a Meshwork before the flat FSDP "
                    "layout; resume it with that release)");
  }
  if (diffs.empty()) return Status::Ok();
  std::string msg = "checkpoint '" + step_dir + "' does not match this run: ";
  for (size_t i = 0; i < diffs.size(); ++i) msg += (i ? "; " : "") + diffs[i];
  msg += fixed_mesh ? " (a format 2 checkpoint's shards depend on these: resume with the same world size, mesh and "
                      "model, or point checkpoint.dir at a new directory)"
                    : " (the parameters' shapes depend on these: resume with the same model, or point "
                      "checkpoint.dir at a new directory)";
  return InvalidInput(msg);
}

std::vector<std::string> DescribeSoftDifferences(const CheckpointMeta& saved, const CheckpointMeta& now) {
  std::vector<std::string> notes;
  auto note = [&](const std::string& key, const auto& a, const auto& b) {
    if (a == b) return;
    std::ostringstream os;
    os << std::boolalpha << key << " was " << a << " when the checkpoint was written, now " << b;
    notes.push_back(os.str());
  };
  note("data.train", saved.data_train, now.data_train);
  note("training.seed", saved.seed, now.seed);
  note("data.seq_len", saved.seq_len, now.seq_len);
  note("data.batch_size", saved.batch_size, now.batch_size);
  note("training.grad_accum", saved.grad_accum, now.grad_accum);
  note("schedule.steps", saved.total_steps, now.total_steps);
  note("fsdp.mode", saved.fsdp_mode, now.fsdp_mode);
  if (saved.world_size != now.world_size || saved.dp_replicate != now.dp_replicate || saved.dp_shard != now.dp_shard ||
      saved.tp != now.tp || saved.pp != now.pp) {
    // tp and pp only where one of them has it (the line as it was before them otherwise).
    const bool tp = saved.tp > 1 || now.tp > 1;
    const bool pp = saved.pp > 1 || now.pp > 1;
    std::ostringstream os;
    os << "resharded: the checkpoint was written by world size " << saved.world_size << " ("
       << (pp ? "pp " + std::to_string(saved.pp) + " x " : "") << "dp_replicate " << saved.dp_replicate
       << " x dp_shard " << saved.dp_shard << (tp ? " x tp " + std::to_string(saved.tp) : "") << "), this run is "
       << now.world_size << " (" << (pp ? std::to_string(now.pp) + " x " : "") << now.dp_replicate << " x "
       << now.dp_shard << (tp ? " x " + std::to_string(now.tp) : "") << ")";
    notes.push_back(os.str());
  }
  // Not shapes: the weights load, but compute another function. Said, not refused: a larger
  // theta on resume is how a run extends its context.
  if (saved.numerics_recorded) {
    note("model.rope_theta", saved.dims.rope_theta, now.dims.rope_theta);
    note("model.rms_norm_eps", saved.dims.rms_norm_eps, now.dims.rms_norm_eps);
  }
  return notes;
}

Result<std::optional<std::string>> FindLatest(const std::string& dir) {
  const std::string path = Join(dir, "latest");
  auto text = ReadTextFile(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
    return text.status();
  }
  std::string name = *text;
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (ParseStepDirName(name) < 0) {
    return InvalidInput("'" + path + "' should name a step directory such as " + StepDirName(100) + ", got '" +
                        FirstLine(name).substr(0, 80) + "'");
  }
  const std::string step_dir = Join(dir, name);
  if (!fs::is_directory(step_dir)) {
    return NotFound("'" + path + "' names '" + step_dir + "', which does not exist");
  }
  return std::optional<std::string>(step_dir);
}

Status SaveRankFile(const std::string& path, int64_t step,
                    const std::vector<std::pair<std::string, torch::Tensor>>& params,
                    const AdamW& optimizer) {
  MW_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  Status written;
  Checksum sum;
  uint64_t bytes = 0;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format_version", torch::tensor(kFormatVersion));
    archive.write("step", torch::tensor(step));
    std::string names;
    for (const auto& [name, tensor] : params) names += name + "\n";
    archive.write("param_names", c10::IValue(names));
    // Keys by position: HF names hold dots, which archive keys must not. Every tensor is written
    // from a CPU copy, so a file never records the device it came from.
    std::vector<int64_t> adamw_steps(params.size(), kNoState);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string key = std::to_string(i);
      archive.write("param/" + key, params[i].second.detach().cpu());
      const AdamWParamState* state = optimizer.State(params[i].second);
      if (state == nullptr) continue;
      adamw_steps[i] = state->step;
      archive.write("adamw/" + key + "/exp_avg", state->exp_avg.detach().cpu());
      archive.write("adamw/" + key + "/exp_avg_sq", state->exp_avg_sq.detach().cpu());
    }
    archive.write("adamw/steps", torch::tensor(adamw_steps, torch::kLong));
    archive.save_to([&](const void* data, size_t size) -> size_t {
      if (written.ok()) written = out.Write(data, size);
      sum.Update(data, size);
      bytes += size;
      return written.ok() ? size : 0;
    });
  } catch (const c10::Error& e) {
    if (!written.ok()) return written;
    return IOError("cannot write checkpoint file '" + path + "': " + FirstLine(e.what_without_backtrace()));
  }
  MW_RETURN_IF_ERROR(written);
  MW_RETURN_IF_ERROR(out.Commit());
  return WriteTextAtomically(SumPath(path), std::to_string(bytes) + " " + Hex(sum.Final()) + "\n");
}

Status WriteChecksumFile(const std::string& path) {
  MW_ASSIGN_OR_RETURN(const auto sum, FileChecksum(path));
  return WriteTextAtomically(SumPath(path), std::to_string(sum.first) + " " + sum.second + "\n");
}

Status LoadRankFile(const std::string& path, int64_t step,
                    const std::vector<std::pair<std::string, torch::Tensor>>& params,
                    AdamW& optimizer) {
  if (!fs::exists(path)) return NotFound("checkpoint file '" + path + "' does not exist");
  MW_RETURN_IF_ERROR(VerifyChecksum(path));
  auto corrupt = [&](const std::string& why) {
    return InvalidInput("checkpoint file '" + path + "' is corrupt or truncated: " + why);
  };
  // Always onto the CPU: the device tensors are the ones this trainer made, and only copies go in.
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, torch::Device(torch::kCPU));
  } catch (const c10::Error& e) {
    return corrupt(FirstLine(e.what_without_backtrace()));
  }
  try {
    torch::Tensor version, saved_step;
    archive.read("format_version", version);
    const int64_t format = version.item<int64_t>();
    if (format != kFormatVersion && format != kFormatVersionLibtorchOptimizer) {
      return InvalidInput("checkpoint file '" + path + "' has format version " + std::to_string(format) +
                          "; this trainer reads versions " + std::to_string(kFormatVersionLibtorchOptimizer) +
                          " and " + std::to_string(kFormatVersion));
    }
    archive.read("step", saved_step);
    if (saved_step.item<int64_t>() != step) {
      return InvalidInput("checkpoint file '" + path + "' holds step " + std::to_string(saved_step.item<int64_t>()) +
                          ", but its directory is step " + std::to_string(step));
    }
    c10::IValue names;
    archive.read("param_names", names);
    std::string want;
    for (const auto& [name, tensor] : params) want += name + "\n";
    if (!names.isString() || names.toStringRef() != want) {
      return InvalidInput("checkpoint file '" + path + "' holds other parameters than this model has");
    }
    auto check_shape = [&](size_t i, const std::string& what, const torch::Tensor& t) -> Status {
      if (t.sizes().equals(params[i].second.sizes())) return Status::Ok();
      std::ostringstream os;
      os << "checkpoint file '" << path << "': " << what << " of parameter " << params[i].first << " has shape "
         << t.sizes() << ", this rank's is " << params[i].second.sizes() << " (a different model or shard layout)";
      return InvalidInput(os.str());
    };
    std::vector<torch::Tensor> loaded(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      archive.read("param/" + std::to_string(i), loaded[i]);
      MW_RETURN_IF_ERROR(check_shape(i, "the value", loaded[i]));
    }
    // The AdamW state, read completely before anything is changed.
    std::vector<std::optional<SavedAdamWState>> saved(params.size());
    if (format == kFormatVersionLibtorchOptimizer) {
      MW_ASSIGN_OR_RETURN(saved, ReadLibtorchOptimizerState(archive, params, optimizer));
    } else {
      torch::Tensor steps;
      archive.read("adamw/steps", steps);
      if (steps.dim() != 1 || steps.size(0) != static_cast<int64_t>(params.size())) {
        return corrupt("'adamw/steps' does not hold one step count per parameter");
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const int64_t n = steps[static_cast<int64_t>(i)].item<int64_t>();
        if (n == kNoState) continue;
        SavedAdamWState s;
        s.step = n;
        const std::string key = "adamw/" + std::to_string(i) + "/";
        archive.read(key + "exp_avg", s.exp_avg);
        archive.read(key + "exp_avg_sq", s.exp_avg_sq);
        // Files may hold max_exp_avg_sq (AMSGrad), which Meshwork never enables: not read.
        saved[i] = std::move(s);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!saved[i]) continue;
      MW_RETURN_IF_ERROR(check_shape(i, "the AdamW first moment", saved[i]->exp_avg));
      MW_RETURN_IF_ERROR(check_shape(i, "the AdamW second moment", saved[i]->exp_avg_sq));
    }
    // Only now that everything was read: copy into the trainer's own tensors (the optimizer
    // keeps its parameters), and give the optimizer state made here, on the parameter's device.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].second.copy_(loaded[i]);
      optimizer.SetState(params[i].second, saved[i]);
    }
  } catch (const c10::Error& e) {
    return corrupt(FirstLine(e.what_without_backtrace()));
  }
  return Status::Ok();
}

// --- format 3: shard files ---------------------------------------------------------------------

namespace {

// A tensor's bytes (contiguous, on the CPU) through Checksum.
std::string TensorChecksum(const torch::Tensor& t) {
  Checksum sum;
  sum.Update(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  return Hex(sum.Final());
}

// "<name>@<begin>", or for a column block "<name>@c<col_begin>@<begin>" (a tp rank's slice of a
// column-split parameter: its tp peers' pieces start at the same element of their own blocks).
std::string PieceKey(const std::string& name, int64_t begin, int64_t col_begin, int64_t cols) {
  return name + "@" + (cols > 0 ? "c" + std::to_string(col_begin) + "@" : std::string()) + std::to_string(begin);
}

// The row length of a parameter of `shape` as pieces address it: the last dim of a matrix; a
// vector is one row.
int64_t RowLength(const std::vector<int64_t>& shape) {
  if (shape.empty()) return 1;
  if (shape.size() == 1) return std::max<int64_t>(shape[0], 1);
  return std::max<int64_t>(shape.back(), 1);
}

// One piece as a shard file's metadata describes it.
struct SavedPiece {
  size_t file = 0;  // index into the checkpoint's files
  std::string key;  // its tensor's name in the file; "/exp_avg" and "/exp_avg_sq" for the moments
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t numel = 0;
  // A column block's (ShardPiece::col_begin, cols); cols 0: the whole width.
  int64_t col_begin = 0;
  int64_t cols = 0;
  int64_t adamw_step = kNoState;
  std::map<std::string, std::string> sums;  // "value", "exp_avg", "exp_avg_sq" -> checksum
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A shard file's header and pieces; its size checked against the .sum file (a cheap check that
// catches a torn or truncated file without reading it all).
struct ShardFileIndex {
  std::string path;
  io::SafetensorsHeader header;
  std::vector<SavedPiece> pieces;
};

Result<ShardFileIndex> ReadShardIndex(const std::string& path, size_t file, int64_t step) {
  if (!fs::exists(path)) return NotFound("checkpoint file '" + path + "' does not exist");
  MW_ASSIGN_OR_RETURN(const auto recorded, RecordedChecksum(path));
  const uint64_t want_bytes = recorded.first;
  std::error_code ec;
  const uint64_t bytes = fs::file_size(path, ec);
  if (ec) return IOError("cannot stat checkpoint file '" + path + "': " + ec.message());
  if (bytes != want_bytes) {
    return InvalidInput("checkpoint file '" + path + "' is corrupt or truncated: " + std::to_string(bytes) + " bytes, " +
                        std::to_string(want_bytes) + " were written");
  }
  ShardFileIndex index;
  index.path = path;
  auto header = io::ReadSafetensorsHeader(path);
  if (!header.ok()) return InvalidInput("checkpoint file '" + path + "' is corrupt: " + header.status().message());
  index.header = std::move(*header);
  const auto& meta = index.header.metadata;
  auto field = [&](const char* key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (field("format") != kShardFileFormat) {
    return InvalidInput("checkpoint file '" + path + "' is not a Meshwork shard file (no format '" + kShardFileFormat +
                        "' in its metadata)");
  }
  if (field("step") != std::to_string(step)) {
    return InvalidInput("checkpoint file '" + path + "' holds step " + field("step") + ", but its directory is step " +
                        std::to_string(step));
  }
  try {
    for (const json& p : json::parse(field("pieces"))) {
      SavedPiece piece;
      piece.file = file;
      piece.key = p.at("key").get<std::string>();
      piece.shape = p.at("shape").get<std::vector<int64_t>>();
      piece.begin = p.at("begin").get<int64_t>();
      piece.numel = p.at("numel").get<int64_t>();
      piece.adamw_step = p.at("adamw_step").get<int64_t>();
      piece.sums = p.at("sums").get<std::map<std::string, std::string>>();
      piece.col_begin = p.value("col_begin", int64_t{0});
      piece.cols = p.value("cols", int64_t{0});
      const io::SafetensorsEntry* value = index.header.Find(piece.key);
      const int64_t width = RowLength(piece.shape);
      const bool block_ok = piece.cols == 0 || (piece.shape.size() >= 2 && piece.col_begin >= 0 && piece.cols > 0 &&
                                                piece.col_begin + piece.cols <= width);
      const int64_t extent = piece.cols > 0 ? Numel(piece.shape) / width * piece.cols : Numel(piece.shape);
      if (value == nullptr || !block_ok || piece.begin < 0 || piece.numel < 0 || piece.begin + piece.numel > extent ||
          Numel(value->shape) != piece.numel) {
        return InvalidInput("checkpoint file '" + path + "' is corrupt: piece '" + piece.key +
                            "' does not match its tensor or its parameter's shape");
      }
      index.pieces.push_back(std::move(piece));
    }
  } catch (const json::exception& e) {
    return InvalidInput("checkpoint file '" + path + "' is corrupt: its pieces metadata: " + e.what());
  }
  return index;
}

}  // namespace

namespace {

// Each piece's AdamW state as the optimizer holds it now (tensors shared, not copied).
std::vector<std::optional<AdamWParamState>> StatesOf(const std::vector<ShardPiece>& pieces, const AdamW& optimizer) {
  std::vector<std::optional<AdamWParamState>> states;
  for (const ShardPiece& piece : pieces) {
    const AdamWParamState* state = optimizer.State(piece.value);
    states.push_back(state != nullptr ? std::optional<AdamWParamState>(*state) : std::nullopt);
  }
  return states;
}

}  // namespace

Status SaveShardFile(const std::string& path, int64_t step, const std::vector<ShardPiece>& pieces,
                     const AdamW& optimizer) {
  return WriteShardFile(path, step, pieces, StatesOf(pieces, optimizer));
}

Status WriteShardFile(const std::string& path, int64_t step, const std::vector<ShardPiece>& pieces,
                      const std::vector<std::optional<AdamWParamState>>& states) {
  if (states.size() != pieces.size()) return Internal("WriteShardFile: one state per piece");
  io::TensorMap tensors;
  json described = json::array();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ShardPiece& piece = pieces[i];
    const std::string key = PieceKey(piece.name, piece.begin, piece.col_begin, piece.cols);
    // Flattened fp32 CPU copies: a file never records the device or the dtype of the run.
    auto flat = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat).contiguous().reshape({-1}); };
    const torch::Tensor value = flat(piece.value);
    json sums = {{"value", TensorChecksum(value)}};
    tensors[key] = value;
    const std::optional<AdamWParamState>& state = states[i];
    if (state) {
      const torch::Tensor m = flat(state->exp_avg), v = flat(state->exp_avg_sq);
      tensors[key + "/exp_avg"] = m;
      tensors[key + "/exp_avg_sq"] = v;
      sums["exp_avg"] = TensorChecksum(m);
      sums["exp_avg_sq"] = TensorChecksum(v);
    }
    json d = {{"key", key},
              {"name", piece.name},
              {"shape", piece.shape},
              {"begin", piece.begin},
              {"numel", value.numel()},
              {"adamw_step", state ? state->step : kNoState},
              {"sums", sums}};
    if (piece.cols > 0) {
      d["col_begin"] = piece.col_begin;
      d["cols"] = piece.cols;
    }
    described.push_back(std::move(d));
  }
  MW_RETURN_IF_ERROR(io::WriteSafetensors(
      path, tensors, {{"format", kShardFileFormat}, {"step", std::to_string(step)}, {"pieces", described.dump()}}));
  return WriteChecksumFile(path);
}

Result<ShardLoadReport> LoadShards(const std::string& step_dir, const CheckpointMeta& saved,
                                   const std::vector<ShardPiece>& pieces, AdamW& optimizer) {
  ShardLoadReport report;
  std::vector<ShardFileIndex> files;
  std::map<std::string, std::vector<const SavedPiece*>> by_name;
  for (size_t f = 0; f < saved.files.size(); ++f) {
    MW_ASSIGN_OR_RETURN(ShardFileIndex index, ReadShardIndex(Join(step_dir, saved.files[f]), f, saved.step));
    files.push_back(std::move(index));
  }
  for (const ShardFileIndex& index : files) {
    for (const SavedPiece& p : index.pieces) {
      const std::string name = p.key.substr(0, p.key.find('@'));
      by_name[name].push_back(&p);
      report.bytes_in_files += p.numel * 4 * (p.adamw_step == kNoState ? 1 : 3);
    }
  }
  for (auto& [name, list] : by_name) {
    std::sort(list.begin(), list.end(), [](const SavedPiece* a, const SavedPiece* b) { return a->begin < b->begin; });
  }

  // Reads one tensor of a saved piece ("value", "exp_avg", "exp_avg_sq") and checks its checksum;
  // each is read at most once however many local pieces need it.
  std::map<std::pair<const SavedPiece*, std::string>, torch::Tensor> cache;
  std::map<size_t, ReadOnlyFile> open;
  std::vector<bool> touched(files.size(), false);
  auto read = [&](const SavedPiece& p, const std::string& what) -> Result<torch::Tensor> {
    auto cached = cache.find({&p, what});
    if (cached != cache.end()) return cached->second;
    const ShardFileIndex& index = files[p.file];
    const std::string key = what == "value" ? p.key : p.key + "/" + what;
    const io::SafetensorsEntry* entry = index.header.Find(key);
    auto sum = p.sums.find(what);
    if (entry == nullptr || sum == p.sums.end() || entry->dtype != torch::kFloat || Numel(entry->shape) != p.numel) {
      return InvalidInput("checkpoint file '" + index.path + "' is corrupt: no fp32 tensor '" + key + "' of " +
                          std::to_string(p.numel) + " elements with a checksum");
    }
    if (open.count(p.file) == 0) {
      MW_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(index.path));
      open.emplace(p.file, std::move(file));
    }
    torch::Tensor t = torch::empty({p.numel}, torch::kFloat);
    const size_t bytes = static_cast<size_t>(entry->end - entry->begin);
    Status got = open.at(p.file).ReadAt(index.header.data_start + entry->begin, t.data_ptr(), bytes);
    if (!got.ok()) return InvalidInput("checkpoint file '" + index.path + "' is corrupt or truncated: " + got.message());
    if (TensorChecksum(t) != sum->second) {
      return InvalidInput("checkpoint file '" + index.path + "' is corrupt: the checksum of tensor '" + key +
                          "' differs from the one recorded in its header");
    }
    report.bytes_read += static_cast<int64_t>(bytes);
    touched[p.file] = true;
    cache.emplace(std::make_pair(&p, what), t);
    return t;
  };

  // Everything is assembled on the CPU first; nothing of the run changes until all of it is read.
  struct Filled {
    torch::Tensor value;
    std::optional<AdamWParamState> state;
  };
  std::vector<Filled> filled;
  for (const ShardPiece& mine : pieces) {
    const int64_t n = mine.value.numel();
    auto it = by_name.find(mine.name);
    if (it == by_name.end()) {
      return InvalidInput("checkpoint '" + step_dir + "' has no tensor '" + mine.name + "', which this model has");
    }
    const auto& saved_pieces = it->second;
    if (saved_pieces.front()->shape != mine.shape) {
      return InvalidInput("checkpoint '" + step_dir + "': tensor '" + mine.name + "' has shape " +
                          ShapeText(saved_pieces.front()->shape) + ", this model's is " + ShapeText(mine.shape));
    }
    Filled out{torch::empty({n}, torch::kFloat), std::nullopt};
    torch::Tensor m, v;
    int64_t adamw_step = kNoState;
    bool first = true;
    // Copies `take` elements of saved piece `from`, from its element `src`, to this piece's `dst`
    // (the value and the AdamW moments), checking the pieces agree on the AdamW step.
    auto copy = [&](const SavedPiece& from, int64_t src, int64_t dst, int64_t take) -> Status {
      if (first) {
        adamw_step = from.adamw_step;
        if (adamw_step != kNoState) {
          m = torch::empty({n}, torch::kFloat);
          v = torch::empty({n}, torch::kFloat);
        }
        first = false;
      } else if (from.adamw_step != adamw_step) {
        return InvalidInput("checkpoint '" + step_dir + "': the pieces of tensor '" + mine.name +
                            "' have different AdamW steps (" + std::to_string(adamw_step) + " and " +
                            std::to_string(from.adamw_step) + ")");
      }
      MW_ASSIGN_OR_RETURN(torch::Tensor value, read(from, "value"));
      out.value.narrow(0, dst, take).copy_(value.narrow(0, src, take));
      if (adamw_step != kNoState) {
        MW_ASSIGN_OR_RETURN(torch::Tensor saved_m, read(from, "exp_avg"));
        MW_ASSIGN_OR_RETURN(torch::Tensor saved_v, read(from, "exp_avg_sq"));
        m.narrow(0, dst, take).copy_(saved_m.narrow(0, src, take));
        v.narrow(0, dst, take).copy_(saved_v.narrow(0, src, take));
      }
      return Status::Ok();
    };
    auto missing = [&](const std::string& what) {
      return InvalidInput("checkpoint '" + step_dir + "' holds no file with " + what + " of tensor '" + mine.name +
                          "' (a file is missing from it)");
    };
    const int64_t width = RowLength(mine.shape);
    auto whole_width = [&](int64_t col_begin, int64_t cols) { return cols == 0 || (col_begin == 0 && cols == width); };
    bool flat = whole_width(mine.col_begin, mine.cols);
    for (const SavedPiece* p : saved_pieces) flat = flat && whole_width(p->col_begin, p->cols);
    if (flat) {
      // Every piece a run of the flattened parameter: take each element from the saved piece
      // holding it that reaches furthest (replicas hold the same ones).
      for (int64_t at = mine.begin, end = mine.begin + n; at < end;) {
        const SavedPiece* from = nullptr;
        int64_t next_begin = end;
        for (const SavedPiece* p : saved_pieces) {
          if (p->begin <= at && at < p->begin + p->numel) {
            if (from == nullptr || p->begin + p->numel > from->begin + from->numel) from = p;
          } else if (p->begin > at) {
            next_begin = std::min(next_begin, p->begin);
          }
        }
        if (from == nullptr) {
          return missing("elements [" + std::to_string(at) + ", " + std::to_string(next_begin) + ")");
        }
        const int64_t take = std::min(end, from->begin + from->numel) - at;
        MW_RETURN_IF_ERROR(copy(*from, at - from->begin, at - mine.begin, take));
        at += take;
      }
    } else {
      // Column blocks (tensor parallelism's column-split slices) on either side: row by row, each
      // row's run of this piece filled from the saved pieces' runs of the same row.
      auto block_of = [&](int64_t col_begin, int64_t cols) {
        return cols > 0 ? std::pair<int64_t, int64_t>{col_begin, cols} : std::pair<int64_t, int64_t>{0, width};
      };
      const auto [c0, cw] = block_of(mine.col_begin, mine.cols);
      for (int64_t row = mine.begin / cw; n > 0 && row <= (mine.begin + n - 1) / cw; ++row) {
        // This row's elements of the piece: block columns [lo, hi), at `dst` in the piece.
        const int64_t lo = std::max<int64_t>(mine.begin - row * cw, 0), hi = std::min<int64_t>(mine.begin + n - row * cw, cw);
        const int64_t dst = row * cw + lo - mine.begin;
        for (int64_t at = c0 + lo, end = c0 + hi; at < end;) {  // global columns
          const SavedPiece* from = nullptr;
          int64_t from_end = 0;
          for (const SavedPiece* p : saved_pieces) {
            const auto [sc0, scw] = block_of(p->col_begin, p->cols);
            const int64_t slo = std::max<int64_t>(p->begin - row * scw, 0),
                          shi = std::min<int64_t>(p->begin + p->numel - row * scw, scw);
            if (slo >= shi || at < sc0 + slo || at >= sc0 + shi) continue;
            if (from == nullptr || sc0 + shi > from_end) {
              from = p;
              from_end = sc0 + shi;
            }
          }
          if (from == nullptr) return missing("row " + std::to_string(row) + ", column " + std::to_string(at));
          const auto [sc0, scw] = block_of(from->col_begin, from->cols);
          const int64_t take = std::min(end, from_end) - at;
          MW_RETURN_IF_ERROR(copy(*from, row * scw + (at - sc0) - from->begin, dst + (at - (c0 + lo)), take));
          at += take;
        }
      }
    }
    if (adamw_step != kNoState) {
      out.state = AdamWParamState{adamw_step, m.view(mine.value.sizes()), v.view(mine.value.sizes())};
    }
    filled.push_back(std::move(out));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < pieces.size(); ++i) {
    pieces[i].value.view({-1}).copy_(filled[i].value);
    optimizer.SetState(pieces[i].value, filled[i].state);
  }
  report.files_read = static_cast<int>(std::count(touched.begin(), touched.end(), true));
  return report;
}

// --- asynchronous saves -----------------------------------------------------------------------

namespace {

// One rank's part of a save, for both ways of saving: its shard file (and, on rank 0, meta.json)
// under step_dir, after removing the temporary files this rank left in an earlier attempt at the
// step (killed mid-write).
Status WriteStepFiles(const std::string& step_dir, int rank, int64_t step, const std::vector<ShardPiece>& pieces,
                      const std::vector<std::optional<AdamWParamState>>& states, const CheckpointMeta& meta) {
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec && !fs::is_directory(step_dir)) {
    return IOError("cannot create checkpoint directory '" + step_dir + "': " + ec.message());
  }
  const std::string mine = ShardFileName(rank);
  const std::string own_prefix = mine.substr(0, mine.find('.') + 1);  // "rank-00003.": either format's files
  for (const auto& entry : fs::directory_iterator(step_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool own = name.rfind(own_prefix, 0) == 0 || (rank == 0 && name.rfind("meta.json", 0) == 0);
    if (own && name.find(".tmp.") != std::string::npos) fs::remove(entry.path(), ec);
  }
  MW_RETURN_IF_ERROR(WriteShardFile(Join(step_dir, mine), step, pieces, states));
  if (rank == 0) MW_RETURN_IF_ERROR(WriteTextAtomically(Join(step_dir, "meta.json"), MetaToJson(meta)));
  return SyncDirectory(step_dir);
}

// MESHWORK_CHECKPOINT_TEST_PAUSE=PHASE:STEP:SECONDS holds the save of step STEP at PHASE ("copy":
// before the step's state is copied; "write": in the thread, before the rank file is written;
// "commit": on rank 0, once every rank's files are there, before `latest` moves), saying so on
// stderr, so that a test can kill the process there (tests/integration/checkpoint_resume_test.cpp).
// Unset in real runs.
void TestPause(const char* phase, int64_t step) {
  static const std::string spec = [] {
    const char* v = std::getenv("MESHWORK_CHECKPOINT_TEST_PAUSE");
    return std::string(v != nullptr ? v : "");
  }();
  const std::string want = std::string(phase) + ":" + std::to_string(step) + ":";
  if (spec.rfind(want, 0) != 0) return;
  std::cerr << "checkpoint: test pause at " << phase << " of step " << step << std::endl;
  std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(spec.c_str() + want.size())));
}

}  // namespace

struct Checkpointer::InFlight {
  int64_t step = 0;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::promise<Status> written;  // this rank's files (and rank 0's meta.json) on disk, or why not
  Status committed;              // rank 0: the commit's outcome, read after join
};

Checkpointer::Checkpointer(config::CheckpointConfig cfg, Engine& engine, AdamW& optimizer,
                           CheckpointMeta run)
    : cfg_(std::move(cfg)), engine_(engine), optimizer_(optimizer), run_(std::move(run)) {}

Checkpointer::~Checkpointer() {
  if (in_flight_ && in_flight_->thread.joinable()) {
    in_flight_->stop = true;
    in_flight_->thread.join();
  }
}

Status Checkpointer::Finish() {
  if (!in_flight_) return Status::Ok();
  std::unique_ptr<InFlight> flight = std::move(in_flight_);
  const std::string step_dir = Join(cfg_.dir, StepDirName(flight->step));
  // First every rank's own write, agreed: a rank whose write failed never writes its .sum, and
  // rank 0's thread, waiting for it, is then told to stop rather than joined forever.
  const Status written = flight->written.get_future().get();
  const Status all_written =
      AgreeAcrossRanks(engine_, written, StatusCode::kIOError, "writing " + step_dir + " in the background");
  if (!all_written.ok()) flight->stop = true;
  flight->thread.join();
  MW_RETURN_IF_ERROR(all_written);
  return AgreeAcrossRanks(engine_, flight->committed, StatusCode::kIOError, "committing " + step_dir);
}

Status Checkpointer::SaveAsync(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  MW_RETURN_IF_ERROR(Finish());
  const std::string step_dir = Join(cfg_.dir, StepDirName(step));
  // Rank 0 commits when it sees every rank's .sum: this rank's files of an earlier attempt at
  // this step (a run that died before committing it) must be gone before any rank looks.
  Status cleared = [&]() -> Status {
    MW_RETURN_IF_ERROR(Uncommit(step));
    const std::string mine = Join(step_dir, ShardFileName(engine_.rank()));
    std::error_code ec;
    for (const std::string& path : {SumPath(mine), mine}) {
      fs::remove(path, ec);
      if (ec) return IOError("cannot remove '" + path + "' before rewriting it: " + ec.message());
    }
    return Status::Ok();
  }();
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, cleared, StatusCode::kIOError, "preparing " + step_dir));

  // The copy: what the step stalls for. The optimizer's next update writes these tensors.
  TestPause("copy", step);
  std::vector<ShardPiece> pieces = engine_.LocalShards();
  std::vector<std::optional<AdamWParamState>> states;
  {
    torch::NoGradGuard no_grad;
    auto host = [](const torch::Tensor& t) {
      torch::Tensor out = torch::empty(t.sizes(), t.options().device(torch::kCPU).dtype(torch::kFloat)
                                                       .pinned_memory(t.is_cuda()));
      out.copy_(t);
      return out;
    };
    for (ShardPiece& p : pieces) {
      const AdamWParamState* state = optimizer_.State(p.value);
      states.push_back(state != nullptr ? std::optional<AdamWParamState>(AdamWParamState{
                                              state->step, host(state->exp_avg), host(state->exp_avg_sq)})
                                        : std::nullopt);
      p.value = host(p.value);
    }
  }
  CheckpointMeta meta = run_;
  meta.step = step;
  auto flight = std::make_unique<InFlight>();
  flight->step = step;
  InFlight* f = flight.get();
  const int rank = engine_.rank();
  flight->thread = std::thread([this, f, step, step_dir, rank, meta, pieces = std::move(pieces),
                                states = std::move(states)]() {
    TestPause("write", step);
    const Status written = WriteStepFiles(step_dir, rank, step, pieces, states, meta);
    f->written.set_value(written);
    if (rank != 0 || !written.ok()) return;
    // Rank 0 commits as soon as every rank's .sum (written after its file) is on the shared
    // storage, without waiting for the training loop to ask.
    f->committed = [&]() -> Status {
      for (const std::string& name : meta.files) {
        while (!fs::exists(SumPath(Join(step_dir, name)))) {
          if (f->stop) return Internal("the save of " + step_dir + " was stopped before every rank's files were written");
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
      TestPause("commit", step);
      return Commit(step);
    }();
  });
  in_flight_ = std::move(flight);
  last_stall_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

bool Checkpointer::Due(int64_t step, int64_t total_steps) const {
  return enabled() && ((cfg_.every > 0 && step % cfg_.every == 0) || step == total_steps);
}

Status Checkpointer::WriteFiles(int64_t step) {
  CheckpointMeta meta = run_;
  meta.step = step;
  const std::vector<ShardPiece> pieces = engine_.LocalShards();
  return WriteStepFiles(Join(cfg_.dir, StepDirName(step)), engine_.rank(), step, pieces, StatesOf(pieces, optimizer_),
                        meta);
}

Status Checkpointer::Commit(int64_t step) {
  if (engine_.rank() != 0) return Status::Ok();
  MW_RETURN_IF_ERROR(WriteTextAtomically(Join(cfg_.dir, "latest"), StepDirName(step) + "\n"));
  MW_RETURN_IF_ERROR(SyncDirectory(cfg_.dir));
  return Prune(cfg_.dir, step, cfg_.keep);
}

Status Checkpointer::Uncommit(int64_t step) {
  if (engine_.rank() != 0) return Status::Ok();
  auto latest = FindLatest(cfg_.dir);
  // A `latest` that cannot be read names nothing this save could damage; Commit rewrites it.
  if (!latest.ok() || !*latest || fs::path(**latest).filename().string() != StepDirName(step)) return Status::Ok();
  std::error_code ec;
  fs::remove(Join(cfg_.dir, "latest"), ec);
  if (ec) return IOError("cannot remove '" + Join(cfg_.dir, "latest") + "' before rewriting " + **latest + ": " + ec.message());
  return SyncDirectory(cfg_.dir);
}

Status Checkpointer::Save(int64_t step) {
  if (cfg_.async) return SaveAsync(step);
  const auto start = std::chrono::steady_clock::now();
  const std::string step_dir = Join(cfg_.dir, StepDirName(step));
  // Before any rank writes (the agreement is the barrier): no `latest` names what is rewritten.
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, Uncommit(step), StatusCode::kIOError, "uncommitting " + step_dir));
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, WriteFiles(step), StatusCode::kIOError, "writing " + step_dir));
  // Every rank's files are on disk: the checkpoint is complete once `latest` names it.
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, Commit(step), StatusCode::kIOError, "committing " + step_dir));
  last_stall_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

Result<bool> WillResume(const config::CheckpointConfig& cfg, Engine& engine) {
  double mine = 0;
  if (!cfg.dir.empty() && cfg.resume == config::Resume::kAuto) {
    const Result<std::optional<std::string>> latest = FindLatest(cfg.dir);
    mine = latest.ok() && latest->has_value() ? 1.0 : 0.0;
  }
  MW_ASSIGN_OR_RETURN(const double all, engine.AverageAcrossRanks(mine));
  return all == 1.0;
}

Result<ResumePoint> Checkpointer::Resume() {
  ResumePoint point;
  if (!enabled()) return point;
  // Every rank can write here (found now, not at the first save); a rank that cannot fails
  // them all at once rather than leave the others waiting in the next collective.
  Status writable = EnsureWritableDirectory(cfg_.dir);
  if (!writable.ok()) writable = IOError("key 'checkpoint.dir': " + writable.message());
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, writable, StatusCode::kIOError, "checking checkpoint.dir " + cfg_.dir));
  if (cfg_.resume == config::Resume::kNever) return point;

  // Every rank reads `latest` itself (checkpoint.dir is storage all ranks share); they must agree.
  std::optional<std::string> latest;
  Status found = Status::Ok();
  if (auto r = FindLatest(cfg_.dir); r.ok()) {
    latest = *r;
  } else {
    found = r.status();
  }
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, found, StatusCode::kInvalidInput, "reading " + cfg_.dir + "/latest"));
  const double mine = latest ? static_cast<double>(ParseStepDirName(fs::path(*latest).filename().string())) : -1.0;
  MW_ASSIGN_OR_RETURN(const double mean, engine_.AverageAcrossRanks(mine));
  MW_ASSIGN_OR_RETURN(const double mean_square, engine_.AverageAcrossRanks(mine * mine));
  if (mean * mean != mean_square) {
    return InvalidInput("ranks see different checkpoints in '" + Join(cfg_.dir, "latest") +
                        "' (checkpoint.dir must be storage that every rank shares)");
  }
  if (!latest) return point;

  point.step = static_cast<int64_t>(mine);
  point.step_dir = *latest;
  Status loaded = [&]() -> Status {
    MW_ASSIGN_OR_RETURN(CheckpointMeta saved, ReadMeta(point.step_dir));
    if (saved.step != point.step) {
      return InvalidInput("checkpoint metadata '" + Join(point.step_dir, "meta.json") + "' says step " +
                          std::to_string(saved.step) + ", but its directory is step " + std::to_string(point.step));
    }
    MW_RETURN_IF_ERROR(CheckCompatible(saved, run_, point.step_dir));
    point.notes = DescribeSoftDifferences(saved, run_);
    point.saved = saved;
    if (saved.format_version == kMetaVersionRankFiles) {
      return LoadRankFile(Join(point.step_dir, saved.files[static_cast<size_t>(engine_.rank())]), point.step,
                          engine_.LocalParams(), optimizer_);
    }
    const auto start = std::chrono::steady_clock::now();
    MW_ASSIGN_OR_RETURN(const ShardLoadReport read, LoadShards(point.step_dir, saved, engine_.LocalShards(), optimizer_));
    std::ostringstream os;
    os << "rank " << engine_.rank() << " read " << std::fixed << std::setprecision(1)
       << static_cast<double>(read.bytes_read) / (1 << 20) << " MiB of the checkpoint's "
       << static_cast<double>(read.bytes_in_files) / (1 << 20) << " MiB, from " << read.files_read << " of "
       << saved.files.size() << " files, in " << std::setprecision(3)
       << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s";
    point.notes.push_back(os.str());
    return Status::Ok();
  }();
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine_, loaded, StatusCode::kInvalidInput, "loading " + point.step_dir));
  return point;
}

}  // namespace meshwork::train
