#include "trainer/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace meshwork::config {
namespace {

// One config key: how to read it from YAML into the struct, and how to print it back.
struct Field {
  std::string key;
  std::function<Status(const YAML::Node&)> apply;
  std::function<std::string()> show;
};

std::string Quote(const YAML::Node& n) {
  if (n.IsNull()) return "null";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  return n.IsMap() ? "a mapping" : "a list";
}

Status TypeError(const std::string& key, const char* expected, const YAML::Node& n) {
  return InvalidConfig("key '" + key + "': expected " + expected + ", got " + Quote(n));
}

// The shortest text that reads back as exactly `v` (so printed configs load unchanged).
std::string Shortest(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <typename T>
std::string Str(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A decimal integer: digits with an optional sign, a leading zero read as decimal (as YAML
// 1.2's core schema reads `010`). yaml-cpp's own conversion reads `010` as octal 8 and `0x10` as
// 16, which would silently turn a zero-padded `seq_len: 0512` into 330.
bool ParseDecimal(const std::string& text, int64_t* v) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') {
    ++first;
    if (first != last && *first == '-') return false;  // "+-5"
  }
  if (first == last || (*first == '-' && first + 1 == last)) return false;
  const auto [end, ec] = std::from_chars(first, last, *v, 10);
  return ec == std::errc() && end == last;
}

Field IntField(const std::string& key, int64_t* out, int64_t lo, int64_t hi,
               std::function<void()> on_set = {}) {
  return {key,
          [=](const YAML::Node& n) -> Status {
            int64_t v = 0;
            if (!n.IsScalar() || !ParseDecimal(n.Scalar(), &v)) {
              return TypeError(key, "an integer", n);
            }
            if (v < lo || v > hi) {
              std::string range = hi == std::numeric_limits<int64_t>::max()
                                      ? ">= " + Str(lo)
                                      : "in [" + Str(lo) + ", " + Str(hi) + "]";
              return InvalidConfig("key '" + key + "': must be " + range + ", got " + Str(v));
            }
            *out = v;
            if (on_set) on_set();
            return Status::Ok();
          },
          [=] { return Str(*out); }};
}

// Accepts [lo, hi], or (lo, hi] when lo_open.
Field FloatField(const std::string& key, double* out, double lo, double hi, bool lo_open,
                 std::function<void()> on_set = {}) {
  return {key,
          [=](const YAML::Node& n) -> Status {
            double v = 0;
            if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
              return TypeError(key, "a finite number", n);
            }
            if ((lo_open ? v <= lo : v < lo) || v > hi) {
              std::ostringstream os;
              os << "key '" << key << "': must be " << (lo_open ? "in (" : "in [") << Shortest(lo)
                 << ", " << Shortest(hi) << "], got " << n.Scalar();
              return InvalidConfig(os.str());
            }
            *out = v;
            if (on_set) on_set();
            return Status::Ok();
          },
          [=] { return Shortest(*out); }};
}

Field BoolField(const std::string& key, bool* out, std::function<void()> on_set = {}) {
  return {key,
          [=](const YAML::Node& n) -> Status {
            bool v = false;
            if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
              return TypeError(key, "true or false", n);
            }
            *out = v;
            if (on_set) on_set();
            return Status::Ok();
          },
          [=] { return std::string(*out ? "true" : "false"); }};
}

Field StringField(const std::string& key, std::string* out) {
  return {key,
          [=](const YAML::Node& n) -> Status {
            if (!n.IsNull() && !n.IsScalar()) return TypeError(key, "a string", n);
            *out = n.IsNull() ? "" : n.Scalar();
            return Status::Ok();
          },
          [=] { return *out; }};
}

// One of the words of `names`.
template <typename E, size_t N>
Field EnumField(const std::string& key, E* out, const EnumName<E> (&names)[N]) {
  return {key,
          [=, &names](const YAML::Node& n) -> Status {
            if (!n.IsNull() && !n.IsScalar()) return TypeError(key, "a string", n);
            const std::string v = n.IsNull() ? "" : n.Scalar();
            const std::optional<E> e = ParseName(names, v);
            if (!e) return InvalidConfig("key '" + key + "': must be one of " + NameList(names) + ", got '" + v + "'");
            *out = *e;
            return Status::Ok();
          },
          [=, &names] { return std::string(NameOf(names, *out)); }};
}

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// The table of every key. `model.preset` is applied before everything else (see Build), so
// explicit dims override the preset's.
std::vector<Field> Fields(TrainConfig& c) {
  auto* dims = &c.model.dims;
  auto mark = [&c] { c.model.dims_explicit = true; };
  return {
      StringField("model.preset", &c.model.preset),
      IntField("model.vocab_size", &dims->vocab_size, 1, kMaxInt, mark),
      IntField("model.hidden_size", &dims->hidden_size, 1, kMaxInt, mark),
      IntField("model.intermediate_size", &dims->intermediate_size, 1, kMaxInt, mark),
      IntField("model.num_hidden_layers", &dims->num_hidden_layers, 1, kMaxInt, mark),
      IntField("model.num_attention_heads", &dims->num_attention_heads, 1, kMaxInt, mark),
      IntField("model.num_key_value_heads", &dims->num_key_value_heads, 1, kMaxInt, mark),
      IntField("model.max_position_embeddings", &dims->max_position_embeddings, 1, kMaxInt, mark),
      FloatField("model.rms_norm_eps", &dims->rms_norm_eps, 0.0, 1.0, true, mark),
      FloatField("model.rope_theta", &dims->rope_theta, 0.0, 1e12, true, mark),
      BoolField("model.tie_word_embeddings", &dims->tie_word_embeddings, mark),
      StringField("model.init_from", &c.model.init_from),
      FloatField("model.init_std", &c.model.init_std, 0.0, 1.0, true),

      StringField("data.train", &c.data.train),
      StringField("data.val", &c.data.val),
      EnumField("data.token_format", &c.data.token_format, data::kTokenFormatNames),
      EnumField("data.order", &c.data.order, data::kSampleOrderNames),
      IntField("data.seq_len", &c.data.seq_len, 1, 1 << 20),
      IntField("data.batch_size", &c.data.batch_size, 1, 1 << 20),
      StringField("data.tokenizer", &c.data.tokenizer),
      BoolField("data.document_masking", &c.data.document_masking),
      IntField("data.document_separator", &c.data.document_separator, -1, kMaxInt),

      FloatField("optimizer.lr", &c.optimizer.lr, 0.0, 10.0, true),
      FloatField("optimizer.weight_decay", &c.optimizer.weight_decay, 0.0, 10.0, false),
      FloatField("optimizer.beta1", &c.optimizer.beta1, 0.0, 0.999999, false),
      FloatField("optimizer.beta2", &c.optimizer.beta2, 0.0, 0.999999999, false),
      FloatField("optimizer.eps", &c.optimizer.eps, 0.0, 1.0, true),
      FloatField("optimizer.grad_clip", &c.optimizer.grad_clip, 0.0, 1e9, false),
      EnumField("optimizer.implementation", &c.optimizer.implementation, kOptimizerImplementationNames),

      IntField("schedule.steps", &c.schedule.steps, 1, kMaxInt),
      IntField("schedule.warmup_steps", &c.schedule.warmup_steps, 0, kMaxInt),
      EnumField("schedule.decay", &c.schedule.decay, kLrDecayNames),
      FloatField("schedule.min_lr_ratio", &c.schedule.min_lr_ratio, 0.0, 1.0, false),

      StringField("training.device", &c.training.device),
      EnumField("training.dtype", &c.training.dtype, kDtypeNames),
      IntField("training.grad_accum", &c.training.grad_accum, 1, 1 << 20),
      IntField("training.global_batch_size", &c.training.global_batch_size, 0, 1LL << 40),
      IntField("training.seed", &c.training.seed, 0, kMaxInt),
      IntField("training.threads", &c.training.threads, 0, 4096),
      EnumField("training.activation_checkpointing", &c.training.activation_checkpointing,
                kActivationCheckpointingNames),
      IntField("training.checkpoint_every", &c.training.checkpoint_every, 1, 1 << 20),
      IntField("training.loss_chunk_mib", &c.training.loss_chunk_mib, 1, 1 << 20),
      EnumField("training.loss_gradient", &c.training.loss_gradient, kLossGradientNames),
      BoolField("training.merge_projections", &c.training.merge_projections),
      EnumField("training.fused_kernels", &c.training.fused_kernels, kFusedKernelsNames),
      EnumField("training.residual_dtype", &c.training.residual_dtype, kResidualDtypeNames),
      EnumField("training.weight_copies", &c.training.weight_copies, kWeightCopiesNames),
      EnumField("training.attention_backend", &c.training.attention_backend, kAttentionBackendNames),
      IntField("training.memory_limit_mib", &c.training.memory_limit_mib, 0, 1 << 30),
      StringField("training.profile_out", &c.training.profile_out),
      IntField("training.profile_steps", &c.training.profile_steps, 1, 1000),

      StringField("eval.data", &c.eval.data),
      IntField("eval.windows", &c.eval.windows, 1, kMaxInt),
      IntField("eval.every", &c.eval.every, 0, kMaxInt),

      IntField("logging.every", &c.logging.every, 1, kMaxInt),
      StringField("logging.jsonl", &c.logging.jsonl),

      IntField("mesh.dp_replicate", &c.mesh.dp_replicate, 0, 1 << 20),
      IntField("mesh.dp_shard", &c.mesh.dp_shard, 0, 1 << 20),
      IntField("mesh.tp", &c.mesh.tp, 1, 1 << 20),
      BoolField("mesh.sequence_parallel", &c.mesh.sequence_parallel),
      IntField("mesh.async_tp_chunks", &c.mesh.async_tp_chunks, 1, 1024),
      IntField("mesh.pp", &c.mesh.pp, 1, 1 << 10),

      EnumField("pipeline.schedule", &c.pipeline.schedule, kPipelineScheduleNames),
      IntField("pipeline.virtual_stages", &c.pipeline.virtual_stages, 1, 1 << 10),
      IntField("pipeline.lr_reschedule_steps", &c.pipeline.lr_reschedule_steps, -1, kMaxInt),
      BoolField("pipeline.discrepancy_correction", &c.pipeline.discrepancy_correction),
      FloatField("pipeline.correction_decay", &c.pipeline.correction_decay, 0.0, 1.0, false),

      BoolField("fsdp.reshard_after_forward", &c.fsdp.reshard_after_forward),
      BoolField("fsdp.prefetch", &c.fsdp.prefetch),
      EnumField("fsdp.mode", &c.fsdp.mode, kFsdpModeNames),
      EnumField("fsdp.bucketing", &c.fsdp.bucketing, compiler::kBucketingNames),
      BoolField("fsdp.reorder", &c.fsdp.reorder),
      BoolField("fsdp.embedding_rows", &c.fsdp.embedding_rows),
      BoolField("fsdp.vocab_parallel_head", &c.fsdp.vocab_parallel_head),
      BoolField("fsdp.replan", &c.fsdp.replan),
      IntField("fsdp.memory_budget", &c.fsdp.memory_budget, -1, int64_t{1} << 30),
      BoolField("fsdp.dump_plan", &c.fsdp.dump_plan),
      StringField("fsdp.trace_out", &c.fsdp.trace_out),
      StringField("fsdp.calibration_out", &c.fsdp.calibration_out),
      BoolField("fsdp.single_process", &c.fsdp.single_process),

      IntField("dist.timeout_seconds", &c.dist.timeout_seconds, 1, 86400),
      StringField("dist.gloo_hostname", &c.dist.gloo_hostname),
      EnumField("dist.mesh", &c.dist.mesh, kMeshPolicyNames),
      StringField("dist.hardware_profile", &c.dist.hardware_profile),
      IntField("dist.advise_after_steps", &c.dist.advise_after_steps, 0, kMaxInt),

      IntField("metrics.port", &c.metrics.port, -1, 65535),
      StringField("metrics.host", &c.metrics.host),
      StringField("metrics.job", &c.metrics.job),
      EnumField("metrics.device_profile", &c.metrics.device_profile, kDeviceProfileNames),
      FloatField("metrics.peak_tflops", &c.metrics.peak_tflops, 0.0, 1e6, false),

      StringField("checkpoint.export_hf", &c.checkpoint.export_hf),
      EnumField("checkpoint.export_dtype", &c.checkpoint.export_dtype, kExportDtypeNames),
      StringField("checkpoint.dir", &c.checkpoint.dir),
      IntField("checkpoint.every", &c.checkpoint.every, 0, kMaxInt),
      IntField("checkpoint.keep", &c.checkpoint.keep, 1, 1 << 20),
      EnumField("checkpoint.resume", &c.checkpoint.resume, kResumeNames),
      BoolField("checkpoint.async", &c.checkpoint.async),
      BoolField("checkpoint.save_on_terminate", &c.checkpoint.save_on_terminate),
  };
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Status UnknownKey(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 4;  // suggest only close matches
  for (const auto& k : known) {
    size_t d = EditDistance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return InvalidConfig("unknown key '" + key + "'" +
                       (best.empty() ? "" : " (did you mean '" + best + "'?)") +
                       "; see docs/config.md for every key");
}

// Flattens the YAML tree into dotted leaf keys, rejecting unknown keys and sections.
Status Flatten(const YAML::Node& node, const std::string& prefix, const std::set<std::string>& leaves,
               const std::set<std::string>& sections, const std::vector<std::string>& known,
               std::vector<std::pair<std::string, YAML::Node>>* out) {
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return InvalidConfig("a key under '" + prefix + "' is not a string");
    const std::string key = prefix + kv.first.Scalar();
    if (leaves.count(key)) {
      out->emplace_back(key, kv.second);
    } else if (sections.count(key)) {
      if (kv.second.IsNull()) continue;  // an empty section
      if (!kv.second.IsMap()) {
        return InvalidConfig("key '" + key + "': expected a mapping of keys, got " + Quote(kv.second));
      }
      MW_RETURN_IF_ERROR(Flatten(kv.second, key + ".", leaves, sections, known, out));
    } else {
      return UnknownKey(key, known);
    }
  }
  return Status::Ok();
}

Status ApplyOverride(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidConfig("--set '" + assignment + "': expected key=value (for example optimizer.lr=3e-4)");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return InvalidConfig("--set '" + assignment + "': value is not valid YAML: " + e.msg);
  }
  // Walk to the parent mapping, creating sections as needed.
  std::vector<std::string> parts;
  for (size_t begin = 0;;) {
    const size_t dot = key.find('.', begin);
    parts.push_back(key.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (parts.back().empty()) {
      return InvalidConfig("--set '" + assignment + "': empty component in key '" + key + "'");
    }
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  std::vector<YAML::Node> path{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node parent = path.back();
    YAML::Node child = parent[parts[i]];
    if (child.IsDefined() && !child.IsNull() && !child.IsMap()) {
      return InvalidConfig("--set '" + assignment + "': '" + parts[i] + "' is not a section");
    }
    if (!child.IsDefined() || child.IsNull()) {
      parent[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child = parent[parts[i]];
    }
    path.push_back(child);
  }
  path.back()[parts.back()] = parsed;
  return Status::Ok();
}

Status ValidateCrossFields(const TrainConfig& c) {
  if (c.schedule.warmup_steps > c.schedule.steps) {
    return InvalidConfig("key 'schedule.warmup_steps': " + Str(c.schedule.warmup_steps) +
                         " exceeds schedule.steps " + Str(c.schedule.steps));
  }
  const std::string& dev = c.training.device;
  const bool cuda_dev = dev == "cuda" || dev.rfind("cuda:", 0) == 0;
  if (dev != "auto" && dev != "cpu" && !cuda_dev) {
    return InvalidConfig("key 'training.device': must be auto, cpu, cuda or cuda:N, got '" + dev + "'");
  }
  if (dev.rfind("cuda:", 0) == 0) {
    const std::string idx = dev.substr(5);
    if (idx.empty() || idx.size() > 4 || idx.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidConfig("key 'training.device': bad CUDA device index in '" + dev + "'");
    }
  }
  if (c.training.dtype == Dtype::kBf16 && dev == "cpu") {
    return InvalidConfig("key 'training.dtype': bf16 autocast needs a CUDA device, but training.device is 'cpu'");
  }
  if (c.training.residual_dtype == ResidualDtype::kBf16 && (c.training.dtype == Dtype::kFp32 || dev == "cpu")) {
    return InvalidConfig("key 'training.residual_dtype': bf16 needs bf16 autocast, but " +
                         std::string(c.training.dtype == Dtype::kFp32 ? "training.dtype is 'fp32'"
                                                                      : "training.device is 'cpu'") +
                         " (use auto or fp32)");
  }
  if ((c.training.attention_backend == AttentionBackend::kCudnn ||
       c.training.attention_backend == AttentionBackend::kEfficient) &&
      dev == "cpu") {
    return InvalidConfig("key 'training.attention_backend': " +
                         std::string(NameOf(kAttentionBackendNames, c.training.attention_backend)) +
                         " is a CUDA kernel, but training.device is 'cpu' (use auto, flash or math)");
  }
  if (c.optimizer.implementation == OptimizerImplementation::kFused && dev == "cpu") {
    return InvalidConfig("key 'optimizer.implementation': fused is libtorch's CUDA kernel, but training.device is "
                         "'cpu' (use auto, foreach or meshwork)");
  }
  if (c.data.train.empty()) return InvalidConfig("key 'data.train': must name a token file or 'synthetic'");
  if (c.data.document_masking && c.training.attention_backend == AttentionBackend::kFlash) {
    return InvalidConfig("key 'training.attention_backend': flash cannot take data.document_masking's mask "
                         "(FlashAttention has no mask input; use auto, efficient, cudnn or math)");
  }
  if (c.model.init_from.empty()) {
    MW_RETURN_IF_ERROR(c.model.dims.Validate("model."));
    if (c.data.seq_len > c.model.dims.max_position_embeddings) {
      return InvalidConfig("key 'data.seq_len': " + Str(c.data.seq_len) +
                           " exceeds model.max_position_embeddings " +
                           Str(c.model.dims.max_position_embeddings));
    }
  }
  if (c.metrics.host.empty()) return InvalidConfig("key 'metrics.host': must not be empty");
  if (c.dist.mesh == MeshPolicy::kAuto && (c.mesh.dp_shard != 0 || c.mesh.dp_replicate != 1)) {
    return InvalidConfig("key 'dist.mesh': auto chooses the mesh itself, but mesh.dp_replicate=" +
                         Str(c.mesh.dp_replicate) + " and mesh.dp_shard=" + Str(c.mesh.dp_shard) +
                         " set one; leave them unset (1 and 0) or use dist.mesh: explicit");
  }
  if (c.mesh.tp > 1) {
    // What tensor parallelism does not compose with yet (docs/distributed.md, "Tensor parallelism").
    const std::string tp = "mesh.tp=" + Str(c.mesh.tp);
    if (c.dist.mesh == MeshPolicy::kAuto) {
      return InvalidConfig("key 'dist.mesh': auto chooses among data parallel meshes only, but " + tp +
                           " is set; use dist.mesh: explicit");
    }
    if (c.fsdp.mode == FsdpMode::kCompiled && c.mesh.dp_shard == 1 && c.mesh.dp_replicate == 1) {
      // Said here too (the engine says it at start-up for any mesh where tp is the whole world),
      // so that the operator's admission check sees it: its jobs set both dims.
      return InvalidConfig("key 'fsdp.mode': compiled plans FSDP's schedule, and with mesh.dp_shard=1 and "
                           "mesh.dp_replicate=1 " + tp + " spans the whole world: there is no FSDP to plan; use "
                           "fsdp.mode: eager, or a mesh with dp_shard > 1");
    }
    // The dims are known here unless they come with model.init_from (checked when the model is split).
    if (c.model.init_from.empty()) {
      if (std::string why = model::WhyNotSplittable(c.model.dims, static_cast<int>(c.mesh.tp)); !why.empty()) {
        return InvalidConfig("key 'mesh.tp': " + why);
      }
    }
    const int64_t tokens = c.data.batch_size * c.data.seq_len;
    if (c.mesh.sequence_parallel && tokens % c.mesh.tp != 0) {
      return InvalidConfig("key 'mesh.sequence_parallel': splits each micro-batch's data.batch_size=" +
                           Str(c.data.batch_size) + " x data.seq_len=" + Str(c.data.seq_len) + " = " + Str(tokens) +
                           " tokens over " + tp + ", which does not divide them (set mesh.sequence_parallel: false, "
                           "or a batch whose tokens divide by tp)");
    }
    if (c.mesh.async_tp_chunks > 1) {
      const std::string chunks = "mesh.async_tp_chunks=" + Str(c.mesh.async_tp_chunks);
      if (!c.mesh.sequence_parallel) {
        return InvalidConfig("key 'mesh.async_tp_chunks': " + chunks + " overlaps the all-gathers and reduce-scatters of "
                             "sequence parallelism, which mesh.sequence_parallel=false turns off");
      }
      if ((tokens / c.mesh.tp) % c.mesh.async_tp_chunks != 0) {
        return InvalidConfig("key 'mesh.async_tp_chunks': " + chunks + " does not divide each rank's " +
                             Str(tokens / c.mesh.tp) + " tokens of a micro-batch (data.batch_size=" + Str(c.data.batch_size) +
                             " x data.seq_len=" + Str(c.data.seq_len) + " over " + tp + ")");
      }
    }
  }
  if (c.mesh.pp > 1) {
    // What pipeline stages do not compose with yet (docs/distributed.md, "Pipeline parallelism").
    const std::string pp = "mesh.pp=" + Str(c.mesh.pp);
    if (c.dist.mesh == MeshPolicy::kAuto) {
      return InvalidConfig("key 'dist.mesh': auto chooses among data parallel meshes only, but " + pp +
                           " is set; use dist.mesh: explicit");
    }
    if (c.mesh.dp_replicate == 0) {
      return InvalidConfig("key 'mesh.dp_replicate': 0 (whatever the world leaves) is not resolved beside " + pp +
                           "; give the pipeline's replicas: the world is mesh.pp x mesh.dp_replicate ranks");
    }
    if (c.fsdp.mode == FsdpMode::kCompiled) {
      // Compiled places FSDP's collectives in the pipeline program (compiler/pipeline/program.h);
      // the single-program planner's budget and calibration do not apply to it.
      if (c.mesh.dp_shard == 1) {
        return InvalidConfig("key 'fsdp.mode': compiled places FSDP's collectives in the pipeline program, but with " +
                             pp + " and mesh.dp_shard=1 there is no FSDP inside the stages; use fsdp.mode: eager, or "
                             "mesh.dp_shard > 1");
      }
      if (c.pipeline.schedule == PipelineSchedule::kPipeMare) {
        return InvalidConfig("key 'fsdp.mode': compiled places FSDP's collectives in a synchronous pipeline program, "
                             "and pipeline.schedule: pipemare is asynchronous; use fsdp.mode: eager");
      }
      if (c.fsdp.memory_budget != 0) {
        return InvalidConfig("key 'fsdp.memory_budget': " + Str(c.fsdp.memory_budget) + ", but a compiled plan with " +
                             pp + " keeps every unit of a stage gathered for the step and budgets nothing; leave it 0");
      }
      if (!c.fsdp.calibration_out.empty()) {
        return InvalidConfig("key 'fsdp.calibration_out': '" + c.fsdp.calibration_out + "', but a compiled plan with " +
                             pp + " is placed without calibrating links; leave it unset");
      }
    }
    const int64_t stages = c.mesh.pp * c.pipeline.virtual_stages;
    if (c.model.init_from.empty() && c.model.dims.num_hidden_layers < stages) {
      return InvalidConfig("key 'mesh.pp': " + pp + " x pipeline.virtual_stages=" + Str(c.pipeline.virtual_stages) +
                           " = " + Str(stages) + " stages, but the model has " + Str(c.model.dims.num_hidden_layers) +
                           " decoder layers (model.num_hidden_layers); each stage needs at least one");
    }
  }
  if (c.mesh.pp > 1 && c.pipeline.schedule == PipelineSchedule::kPipeMare) {
    // Each stage updates at its own time, mid-step: what gathers a whole step's parameters, or
    // reduces them over a group at one point of the step, does not fit that (docs/config.md).
    const std::string why = " beside pipeline.schedule: pipemare (each stage updates its parameters at its own "
                            "time within a step); use 1f1b or a mesh of mesh.pp x mesh.dp_replicate";
    if (c.mesh.dp_shard > 1) return InvalidConfig("key 'mesh.dp_shard': " + Str(c.mesh.dp_shard) + why);
    if (c.mesh.tp > 1) return InvalidConfig("key 'mesh.tp': " + Str(c.mesh.tp) + why);
    // An imported model's is known once it is read: the pipeline engine checks it then.
    if (c.model.init_from.empty() && c.model.dims.tie_word_embeddings) {
      return InvalidConfig("key 'model.tie_word_embeddings': true, but under pipeline.schedule: pipemare the first and "
                           "last stages would update the table's two copies at different times; set it false");
    }
  }
  if (c.pipeline.virtual_stages > 1 && c.pipeline.schedule != PipelineSchedule::kInterleaved1F1B) {
    return InvalidConfig("key 'pipeline.virtual_stages': " + Str(c.pipeline.virtual_stages) +
                         " stages per rank need pipeline.schedule: interleaved-1f1b");
  }
  if (c.mesh.async_tp_chunks > 1 && c.mesh.tp == 1) {
    return InvalidConfig("key 'mesh.async_tp_chunks': " + Str(c.mesh.async_tp_chunks) +
                         " chunks overlap tensor parallelism's exchanges, but mesh.tp is 1");
  }
  if (!c.fsdp.trace_out.empty() && c.schedule.steps < 3) {
    return InvalidConfig("key 'fsdp.trace_out': traces step 3, but schedule.steps is " + Str(c.schedule.steps));
  }
  if (!c.fsdp.calibration_out.empty() && (c.fsdp.mode != FsdpMode::kCompiled || c.schedule.steps < 3)) {
    return InvalidConfig("key 'fsdp.calibration_out': written when the compiled plan is made, before step 3; it needs "
                         "fsdp.mode compiled (is " + std::string(NameOf(kFsdpModeNames, c.fsdp.mode)) +
                         ") and schedule.steps >= 3 (is " + Str(c.schedule.steps) + ")");
  }
  return Status::Ok();
}

Result<TrainConfig> Build(YAML::Node root, const std::vector<std::string>& overrides) {
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return InvalidConfig("config: the top level must be a mapping of sections, got " + Quote(root));
  for (const auto& o : overrides) MW_RETURN_IF_ERROR(ApplyOverride(root, o));

  TrainConfig c;
  std::vector<Field> fields = Fields(c);
  std::vector<std::string> known;
  std::set<std::string> leaves, sections;
  for (const auto& f : fields) {
    known.push_back(f.key);
    leaves.insert(f.key);
    for (size_t dot = f.key.find('.'); dot != std::string::npos; dot = f.key.find('.', dot + 1)) {
      sections.insert(f.key.substr(0, dot));
    }
  }
  std::vector<std::pair<std::string, YAML::Node>> given;
  MW_RETURN_IF_ERROR(Flatten(root, "", leaves, sections, known, &given));

  std::map<std::string, const Field*> by_key;
  for (const auto& f : fields) by_key[f.key] = &f;

  // The preset first: explicit dims given alongside it override the preset's values.
  for (const auto& [key, node] : given) {
    if (key != "model.preset") continue;
    MW_RETURN_IF_ERROR(by_key[key]->apply(node));
    c.model.dims_explicit = true;
  }
  MW_ASSIGN_OR_RETURN(c.model.dims, model::PresetConfig(c.model.preset));
  for (const auto& [key, node] : given) {
    if (key == "model.preset") continue;
    MW_RETURN_IF_ERROR(by_key[key]->apply(node));
  }
  // The default warmup shrinks to fit a short run (a 5-step smoke test must not fail on a
  // default the user never chose); a warmup the user set is checked as given.
  const bool warmup_given = std::any_of(given.begin(), given.end(),
                                        [](const auto& kv) { return kv.first == "schedule.warmup_steps"; });
  if (!warmup_given) c.schedule.warmup_steps = std::min(c.schedule.warmup_steps, c.schedule.steps);
  MW_RETURN_IF_ERROR(ValidateCrossFields(c));
  return c;
}

}  // namespace

Result<std::string> ResolveGlobalBatch(TrainConfig& c, int64_t world_size) {
  const int64_t global = c.training.global_batch_size;
  if (global == 0) return std::string();
  const std::string key = "key 'training.global_batch_size': ";
  const int64_t model_ranks = c.mesh.tp * c.mesh.pp;
  if (world_size < 1 || world_size % model_ranks != 0) {
    return InvalidConfig(key + "the world of " + Str(world_size) + " ranks does not divide by mesh.tp x mesh.pp = " +
                         Str(model_ranks) + ", so it has no whole number of data parallel ranks");
  }
  const int64_t dp = world_size / model_ranks;
  const std::string ranks = Str(dp) + " data parallel rank" + (dp == 1 ? "" : "s");
  if (global % dp != 0) {
    return InvalidConfig(key + Str(global) + " rows do not divide over " + ranks + " (world " + Str(world_size) +
                         " / mesh.tp x mesh.pp " + Str(model_ranks) + ")");
  }
  const int64_t per_rank = global / dp;
  // The smallest divisor of per_rank at or above both bounds, from the divisor pairs (i, n / i).
  const int64_t least = std::max(c.training.grad_accum, (per_rank + c.data.batch_size - 1) / c.data.batch_size);
  int64_t micro = 0;
  for (int64_t i = 1; i * i <= per_rank; ++i) {
    if (per_rank % i != 0) continue;
    for (const int64_t d : {i, per_rank / i}) {
      if (d >= least && (micro == 0 || d < micro)) micro = d;
    }
  }
  if (micro == 0) {
    return InvalidConfig(key + Str(global) + " rows are " + Str(per_rank) + " a rank over " + ranks +
                         ", which no count of at least training.grad_accum=" + Str(c.training.grad_accum) +
                         " micro-batches of at most data.batch_size=" + Str(c.data.batch_size) + " rows splits evenly");
  }
  c.training.grad_accum = micro;
  c.data.batch_size = per_rank / micro;
  if (Status s = ValidateCrossFields(c); !s.ok()) {
    return InvalidConfig(key + Str(global) + " rows over " + ranks + " make micro-batches of " + Str(c.data.batch_size) +
                         " rows x " + Str(micro) + ", and then " + s.message());
  }
  return "batch: training.global_batch_size " + Str(global) + " rows a step = " + ranks + " x " + Str(micro) +
         " micro-batch" + (micro == 1 ? "" : "es") + " (training.grad_accum) x " + Str(c.data.batch_size) +
         " rows (data.batch_size)";
}

Result<TrainConfig> LoadConfigFromString(const std::string& yaml_text,
                                         const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    return InvalidConfig("config: YAML syntax error at line " + Str(e.mark.line + 1) + ", column " +
                         Str(e.mark.column + 1) + ": " + e.msg);
  }
  return Build(root, overrides);
}

Result<TrainConfig> LoadConfig(const std::string& yaml_path, const std::vector<std::string>& overrides) {
  if (yaml_path.empty()) return Build(YAML::Node(YAML::NodeType::Map), overrides);
  YAML::Node root;
  try {
    root = YAML::LoadFile(yaml_path);
  } catch (const YAML::BadFile&) {
    return NotFound("config file '" + yaml_path + "' cannot be read (missing or not readable)");
  } catch (const YAML::ParserException& e) {
    return InvalidConfig("config file '" + yaml_path + "': YAML syntax error at line " +
                         Str(e.mark.line + 1) + ", column " + Str(e.mark.column + 1) + ": " + e.msg);
  } catch (const std::exception& e) {  // a directory, an I/O error mid-read
    return InvalidInput("config file '" + yaml_path + "' cannot be read: " + e.what());
  }
  auto result = Build(root, overrides);
  if (!result.ok() && result.status().code() == StatusCode::kInvalidConfig) {
    return InvalidConfig(yaml_path + ": " + result.status().message());
  }
  return result;
}

Result<TrainConfig> LoadConfigFromEnv(const std::string& var, const std::vector<std::string>& overrides) {
  const char* text = var.empty() ? nullptr : std::getenv(var.c_str());
  if (text == nullptr || *text == '\0') {
    return InvalidConfig("--config-env " + var + ": environment variable '" + var + "' is " +
                         (text == nullptr ? "not set" : "empty") + " (it should hold the YAML config)");
  }
  auto result = LoadConfigFromString(text, overrides);
  if (!result.ok() && result.status().code() == StatusCode::kInvalidConfig) {
    return InvalidConfig("env " + var + ": " + result.status().message());
  }
  return result;
}

namespace {

Result<YAML::Node> ParseMapping(const std::string& text, const std::string& name) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidConfig(name + ": not valid YAML: " + e.what());
  }
  if (node.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!node.IsMap()) return InvalidConfig(name + ": the config must be a mapping of keys at the top");
  return node;
}

void MergeInto(YAML::Node base, const YAML::Node& overlay) {
  for (const auto& kv : overlay) {
    const std::string key = kv.first.as<std::string>();
    YAML::Node mine = base[key];
    if (mine.IsMap() && kv.second.IsNull()) continue;  // "model:" with nothing under it: the base's stays
    if (mine.IsMap() && kv.second.IsMap()) {
      MergeInto(mine, kv.second);
    } else {
      base[key] = YAML::Clone(kv.second);
    }
  }
}

}  // namespace

Result<std::string> MergeYaml(const std::string& base, const std::string& overlay, const std::string& base_name,
                              const std::string& overlay_name) {
  MW_ASSIGN_OR_RETURN(YAML::Node merged, ParseMapping(base, base_name));
  MW_ASSIGN_OR_RETURN(YAML::Node top, ParseMapping(overlay, overlay_name));
  try {
    MergeInto(merged, top);
  } catch (const YAML::Exception& e) {  // a key that is not a scalar
    return InvalidConfig(overlay_name + ": cannot be merged onto " + base_name + ": " + e.what());
  }
  YAML::Emitter out;
  out << merged;
  return std::string(out.c_str()) + "\n";
}

std::string ToYaml(const TrainConfig& c) {
  TrainConfig copy = c;
  std::vector<Field> fields = Fields(copy);
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  const std::set<std::string> dim_keys = {"model.preset", "model.vocab_size", "model.hidden_size",
      "model.intermediate_size", "model.num_hidden_layers", "model.num_attention_heads",
      "model.num_key_value_heads", "model.max_position_embeddings", "model.rms_norm_eps",
      "model.rope_theta", "model.tie_word_embeddings"};
  for (const auto& f : fields) {
    // With init_from the dims come from its config.json; printing them would make the output a
    // config that LoadConfig refuses.
    if (!c.model.init_from.empty() && dim_keys.count(f.key)) continue;
    const auto dot = f.key.find('.');
    const std::string s = f.key.substr(0, dot);
    if (s != section) {
      if (!section.empty()) out << YAML::EndMap;
      out << YAML::Key << s << YAML::Value << YAML::BeginMap;
      section = s;
    }
    out << YAML::Key << f.key.substr(dot + 1) << YAML::Value << f.show();
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return out.c_str();
}

std::vector<std::string> KnownKeys() {
  TrainConfig c;
  std::vector<std::string> keys;
  for (const auto& f : Fields(c)) keys.push_back(f.key);
  return keys;
}

}  // namespace meshwork::config
