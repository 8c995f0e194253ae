// meshwork-simulate: predicts one training step of a Llama model under FSDP on a cluster
// described by a hardware profile, for the eager plan (FSDP2's schedule) and the compiled one,
// side by side. Nothing runs on a device; see docs/simulator.md for what is modelled.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/file.h"
#include "trainer/compiler/calibration.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/mesh_choice.h"
#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/pipeline/price.h"
#include "trainer/compiler/pipeline/simulate.h"
#include "trainer/compiler/plan_search.h"
#include "trainer/compiler/planner.h"
#include "trainer/compiler/simulator.h"
#include "trainer/config/hardware.h"
#include "trainer/model/llama_config.h"

namespace {

using meshwork::Result;
using meshwork::Status;
namespace compiler = meshwork::compiler;
namespace exit_code = meshwork::exit_code;

constexpr const char* kUsage = R"(usage: meshwork-simulate --profile FILE --model NAME --gpus N [options]
       meshwork-simulate --calibration FILE [calibration options] [--bucketing MODE] [--dump-plan]

  --profile FILE|NAME     hardware profile: a file, or the name of a built-in one (those of
                          bench/profiles/: h100-nvlink-node, h100-ib-400g, cpu-gloo-local)
  --model NAME            llama3-70b, llama3-405b, or a preset: tiny, llama-100m, llama3-1b,
                          llama3-8b
  --gpus N                devices in the mesh
  --tp N                  tensor parallel ranks (default 1): each holds 1/N of every layer's
                          heads and MLP width and of the vocabulary (trainer/tp); tp is the
                          innermost mesh dim, so a tp group is N consecutive GPUs of one node
  --sequence-parallel true|false   (default true) with --tp: the residual stream and norms
                          split by tokens between the tensor-parallel regions
  --async-tp true|false   (default true) with --tp: the compiled plan may overlap tensor
                          parallelism's exchanges with their matmuls (the async_tp pass); the
                          eager plan never does
  --dp-shard N|auto       size of each shard group (default: gpus / tp, fully sharded);
                          dp_replicate = gpus / (dp-shard x tp) (HSDP when > 1). auto (tp 1
                          only): every mesh the profile can build is planned and simulated, and
                          the fastest compiled plan that fits the device's memory is chosen
                          (as mesh: auto)
  --seq-len N             tokens per sequence (default 8192)
  --batch N               sequences per data parallel rank per step (default 1): per GPU
                          without tp, per tp group with it (torchtitan's local batch size)
  --bucketing MODE        the compiled plan's bucketing: none, block or auto (default auto)
  --memory-budget-gib X   the compiled plan's budget for dynamic memory (gathered weights,
                          activations, full gradients); default: device memory minus the
                          static state. The compiled plan checkpoints activations of as few
                          layers as the budget needs (the eager plan never does)
  --dump-plan             print the eager plan, and the IR before and after each pass
  --activation-checkpointing
                          checkpoint every layer in both plans (keep each layer's input,
                          recompute its forward in backward); the trainer's
                          training.activation_checkpointing: all

Pipeline schedules instead (docs/compiler.md, "Pipeline schedules"): the model's decoder layers
cut into balanced stages, each schedule's step, bubble and peak memory, with FSDP inside the stages
over --dp-shard (default: all of a stage's data parallel ranks) as the trainer runs it (a rank's
stages gathered before its program, reduce-scattered after it) and --activation-checkpointing:
  --pp N                  pipeline ranks (> 1): --gpus must be a multiple of pp x tp
  --virtual-stages V      stages per rank (default 1; interleaved-1f1b only when > 1)
  --microbatches M        micro-batches a step, each --batch sequences (default 2 x pp)
  --pipeline-schedule S   gpipe, 1f1b, interleaved-1f1b, zb-h1, pipemare (its steady step between the
                          trainer's barriers), or all (default: all that run
                          the shape); with --dump-plan each one's program and timeline

The whole plan instead (docs/simulator.md, "The whole plan"): every mesh, schedule, micro-batching and
checkpointing the trainer can run, estimated, the best scored by the simulator, the fastest that
fits chosen:
  --auto                  search (with --profile, --model, --gpus, --seq-len; --tp or --pp pin theirs)
  --global-batch N        sequences a step over every data parallel rank (required with --auto)
  --finalists K           single-program plans the simulator scores (default 4; pipelines 8 x K)
  --exhaustive            score every plan that fits by the estimate, and list each with its config
                          keys on one line ("plan: ... | step S s | peak G GiB | keys: ..."): the
                          plans to run when checking the prediction against measured steps

From a compiled-FSDP run's calibration instead (fsdp.calibration_out: its links, CPU
interference, step overhead, traced modules and fitted compute scale), both plans as that run
would make them, under:
  --calibration FILE      the file the trainer wrote
  --link-scale X          the dp_shard and dp_replicate links' bandwidth times X (default 1;
                          latencies kept): the same run on links X times as fast
  --reshard-after-forward true|false   (default true) fsdp.reshard_after_forward
  --embedding-rows true|false          (default true) fsdp.embedding_rows
  --vocab-parallel-head true|false     (default true) fsdp.vocab_parallel_head
  --memory-budget-mib N   the compiled plan's budget, as fsdp.memory_budget N (default: the eager
                          plan's peak, as fsdp.memory_budget -1)
Then the lines carry no tokens/s or MFU (the file names no device).

Prints one line per plan: step time, exposed and total communication, peak memory, collectives
per step, tokens/s per device and MFU. Exit codes: 0 ok, 2 bad command line, 3 bad profile or
calibration file.
)";

int Usage(const std::string& problem) {
  std::cerr << "meshwork-simulate: error: " << problem << "\n\n" << kUsage;
  return exit_code::kConfig;
}

int Fail(const Status& s) {
  std::cerr << "meshwork-simulate: error: " << s.message() << "\n";
  return meshwork::ExitCodeFor(s.code());
}

struct Options {
  std::string profile;
  std::string model;
  int gpus = 0;
  int dp_shard = 0;  // 0: all GPUs over tp
  int tp = 1;
  bool sequence_parallel = true, async_tp = true;
  bool auto_mesh = false;
  int64_t seq_len = 8192;
  int64_t batch = 1;
  compiler::Bucketing bucketing = compiler::Bucketing::kAuto;
  double memory_budget_gib = 0;  // 0: derived from the profile
  bool dump_plan = false;
  bool activation_checkpointing = false;
  // --calibration and its options.
  std::string calibration;
  double link_scale = 1;
  bool reshard_after_forward = true, embedding_rows = true, vocab_parallel_head = true;
  int64_t memory_budget_mib = 0;  // 0: the eager plan's peak
  // Pipeline schedules (--pp > 1).
  int pp = 1;
  int virtual_stages = 1;
  int microbatches = 0;  // 0: 2 x pp
  std::string pipeline_schedule = "all";
  // --auto: the whole plan searched (plan_search.h); --tp and --pp, when given, pin theirs.
  bool auto_plan = false;
  int64_t global_batch = 0;
  int finalists = 4;
  bool exhaustive = false;  // --auto: every plan scored and listed with its keys
  bool tp_given = false, pp_given = false;
};

Status ParseBool(const std::string& flag, const std::string& text, bool* out) {
  if (text != "true" && text != "false") return meshwork::InvalidConfig(flag + ": expected true or false, got '" + text + "'");
  *out = text == "true";
  return Status::Ok();
}

// A whole-string integer in [lo, hi]; `flag` names it in the error.
Status ParseInt(const std::string& flag, const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, v);
  if (text.empty() || r.ec != std::errc() || r.ptr != end) {
    return meshwork::InvalidConfig(flag + ": expected an integer, got '" + text + "'");
  }
  if (v < lo || v > hi) {
    return meshwork::InvalidConfig(flag + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                   "], got " + text);
  }
  *out = v;
  return Status::Ok();
}

Result<Options> ParseArgs(const std::vector<std::string>& args) {
  const std::vector<std::string> valued = {"--profile", "--model", "--gpus", "--dp-shard", "--tp",
                                           "--sequence-parallel", "--async-tp", "--seq-len",
                                           "--batch", "--bucketing", "--memory-budget-gib", "--calibration",
                                           "--link-scale", "--reshard-after-forward", "--embedding-rows",
                                           "--vocab-parallel-head", "--memory-budget-mib", "--pp",
                                           "--virtual-stages", "--microbatches", "--pipeline-schedule",
                                           "--global-batch", "--finalists"};
  const std::vector<std::string> profile_only = {"--profile", "--model", "--gpus", "--dp-shard", "--tp",
                                                 "--sequence-parallel", "--async-tp", "--seq-len",
                                                 "--batch", "--memory-budget-gib", "--activation-checkpointing",
                                                 "--pp", "--virtual-stages", "--microbatches", "--pipeline-schedule"};
  const std::vector<std::string> calibration_only = {"--link-scale", "--reshard-after-forward", "--embedding-rows",
                                                     "--vocab-parallel-head", "--memory-budget-mib"};
  std::vector<std::string> given;
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    // `--flag VALUE` or `--flag=VALUE`.
    const size_t eq = args[i].rfind("--", 0) == 0 ? args[i].find('=') : std::string::npos;
    const std::string flag = args[i].substr(0, eq);
    given.push_back(flag);
    if (flag == "--dump-plan" && eq == std::string::npos) {
      o.dump_plan = true;
      continue;
    }
    if (flag == "--activation-checkpointing" && eq == std::string::npos) {
      o.activation_checkpointing = true;
      continue;
    }
    if (flag == "--auto" && eq == std::string::npos) {
      o.auto_plan = true;
      continue;
    }
    if (flag == "--exhaustive" && eq == std::string::npos) {
      o.exhaustive = true;
      continue;
    }
    if (std::find(valued.begin(), valued.end(), flag) == valued.end()) {
      return meshwork::InvalidConfig("unknown option '" + args[i] + "'");
    }
    std::string value;
    if (eq != std::string::npos) {
      value = args[i].substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return meshwork::InvalidConfig(flag + " needs a value");
    }
    int64_t n = 0;
    if (flag == "--profile") {
      o.profile = value;
    } else if (flag == "--model") {
      o.model = value;
    } else if (flag == "--gpus") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1 << 20, &n));
      o.gpus = static_cast<int>(n);
    } else if (flag == "--dp-shard" && value == "auto") {
      o.auto_mesh = true;
    } else if (flag == "--dp-shard") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1 << 20, &n));
      o.dp_shard = static_cast<int>(n);
    } else if (flag == "--tp") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1 << 10, &n));
      o.tp = static_cast<int>(n);
      o.tp_given = true;
    } else if (flag == "--global-batch") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, int64_t{1} << 30, &o.global_batch));
    } else if (flag == "--finalists") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1000, &n));
      o.finalists = static_cast<int>(n);
    } else if (flag == "--sequence-parallel") {
      MW_RETURN_IF_ERROR(ParseBool(flag, value, &o.sequence_parallel));
    } else if (flag == "--async-tp") {
      MW_RETURN_IF_ERROR(ParseBool(flag, value, &o.async_tp));
    } else if (flag == "--seq-len") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1 << 24, &o.seq_len));
    } else if (flag == "--batch") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1 << 20, &o.batch));
    } else if (flag == "--calibration") {
      o.calibration = value;
    } else if (flag == "--link-scale") {
      char* end = nullptr;
      o.link_scale = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !std::isfinite(o.link_scale) || o.link_scale <= 0) {
        return meshwork::InvalidConfig("--link-scale: expected a positive number, got '" + value + "'");
      }
    } else if (flag == "--reshard-after-forward") {
      MW_RETURN_IF_ERROR(ParseBool(flag, value, &o.reshard_after_forward));
    } else if (flag == "--embedding-rows") {
      MW_RETURN_IF_ERROR(ParseBool(flag, value, &o.embedding_rows));
    } else if (flag == "--vocab-parallel-head") {
      MW_RETURN_IF_ERROR(ParseBool(flag, value, &o.vocab_parallel_head));
    } else if (flag == "--memory-budget-mib") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, int64_t{1} << 30, &o.memory_budget_mib));
    } else if (flag == "--pp" || flag == "--virtual-stages" || flag == "--microbatches") {
      MW_RETURN_IF_ERROR(ParseInt(flag, value, 1, 1 << 16, &n));
      (flag == "--pp" ? o.pp : flag == "--virtual-stages" ? o.virtual_stages : o.microbatches) = static_cast<int>(n);
      o.pp_given = o.pp_given || flag == "--pp";
    } else if (flag == "--pipeline-schedule") {
      if (value != "all") {
        auto kind = compiler::pipeline::ParseScheduleKind(value);
        if (!kind.ok()) return meshwork::InvalidConfig("--pipeline-schedule: " + kind.status().message() + " or all");
      }
      o.pipeline_schedule = value;
    } else if (flag == "--bucketing") {
      auto b = meshwork::ParseName(compiler::kBucketingNames, value);
      if (!b) return meshwork::InvalidConfig("--bucketing: expected none, block or auto, got '" + value + "'");
      o.bucketing = *b;
    } else {  // --memory-budget-gib
      char* end = nullptr;
      o.memory_budget_gib = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !std::isfinite(o.memory_budget_gib) || o.memory_budget_gib <= 0) {
        return meshwork::InvalidConfig("--memory-budget-gib: expected a positive number of GiB, got '" + value + "'");
      }
    }
  }
  if (!o.calibration.empty()) {
    for (const std::string& flag : given)
      if (std::find(profile_only.begin(), profile_only.end(), flag) != profile_only.end())
        return meshwork::InvalidConfig(flag + " does not go with --calibration (the calibration file is the model and the cluster)");
    return o;
  }
  for (const std::string& flag : given)
    if (std::find(calibration_only.begin(), calibration_only.end(), flag) != calibration_only.end())
      return meshwork::InvalidConfig(flag + " needs --calibration FILE");
  if (o.profile.empty()) return meshwork::InvalidConfig("--profile FILE is required");
  if (o.model.empty()) return meshwork::InvalidConfig("--model NAME is required");
  if (o.gpus == 0) return meshwork::InvalidConfig("--gpus N is required");
  if (o.auto_plan) {
    // The search chooses these; giving one beside --auto contradicts it.
    for (const std::string& flag : given) {
      for (const char* chosen : {"--dp-shard", "--virtual-stages", "--microbatches", "--pipeline-schedule", "--batch",
                                 "--activation-checkpointing", "--memory-budget-gib", "--dump-plan", "--bucketing"}) {
        if (flag == chosen) return meshwork::InvalidConfig(flag + " does not go with --auto: the search chooses it");
      }
    }
    if (o.global_batch == 0) return meshwork::InvalidConfig("--auto needs --global-batch N (sequences a step)");
    return o;
  }
  for (const std::string& flag : given) {
    if (flag == "--global-batch" || flag == "--finalists" || flag == "--exhaustive") {
      return meshwork::InvalidConfig(flag + " needs --auto");
    }
  }
  if (o.gpus % o.tp != 0) {
    return meshwork::InvalidConfig("--tp: " + std::to_string(o.tp) + " does not divide --gpus " + std::to_string(o.gpus));
  }
  const bool pipeline_flags = std::any_of(given.begin(), given.end(), [](const std::string& f) {
    return f == "--virtual-stages" || f == "--microbatches" || f == "--pipeline-schedule";
  });
  if (o.pp == 1 && pipeline_flags) return meshwork::InvalidConfig("--virtual-stages, --microbatches and --pipeline-schedule need --pp > 1");
  if (o.pp > 1) {
    if (o.gpus % (o.pp * o.tp) != 0) {
      return meshwork::InvalidConfig("--pp: " + std::to_string(o.pp) + " x --tp " + std::to_string(o.tp) +
                                     " does not divide --gpus " + std::to_string(o.gpus));
    }
    if (o.auto_mesh) return meshwork::InvalidConfig("--dp-shard auto does not go with --pp; give --dp-shard N");
    // FSDP inside the stages over --dp-shard of each stage's data parallel ranks (all of them by
    // default), the rest replicas.
    const int dp = o.gpus / (o.pp * o.tp);
    if (o.dp_shard == 0) o.dp_shard = dp;
    if (dp % o.dp_shard != 0) {
      return meshwork::InvalidConfig("--dp-shard: " + std::to_string(o.dp_shard) + " does not divide the " +
                                     std::to_string(dp) + " data parallel ranks of a stage (--gpus / (--pp x --tp))");
    }
    if (o.microbatches == 0) o.microbatches = 2 * o.pp;
    return o;
  }
  if (o.auto_mesh && o.tp > 1) {
    return meshwork::InvalidConfig("--dp-shard auto chooses among data parallel meshes only; with --tp " +
                                   std::to_string(o.tp) + " give --dp-shard N");
  }
  const int dp = o.gpus / o.tp;
  if (o.dp_shard == 0) o.dp_shard = dp;  // auto: replaced by the choice
  if (dp % o.dp_shard != 0) {
    return meshwork::InvalidConfig("--dp-shard: " + std::to_string(o.dp_shard) + " does not divide --gpus " +
                                   std::to_string(o.gpus) + (o.tp > 1 ? " / --tp " + std::to_string(o.tp) : ""));
  }
  return o;
}

Result<meshwork::model::LlamaConfig> ModelConfig(const std::string& name) {
  meshwork::model::LlamaConfig c;
  if (name == "llama3-70b") {  // Llama 3 70B (no trainer preset: too large to train here)
    c.vocab_size = 128256;
    c.hidden_size = 8192;
    c.intermediate_size = 28672;
    c.num_hidden_layers = 80;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.tie_word_embeddings = false;
    return c;
  }
  if (name == "llama3-405b") {  // Llama 3.1 405B (its published config.json)
    c.vocab_size = 128256;
    c.hidden_size = 16384;
    c.intermediate_size = 53248;
    c.num_hidden_layers = 126;
    c.num_attention_heads = 128;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.tie_word_embeddings = false;
    return c;
  }
  auto preset = meshwork::model::PresetConfig(name);
  if (!preset.ok()) {
    std::string names = "llama3-70b, llama3-405b";
    for (const auto& n : meshwork::model::PresetNames()) names += ", " + n;
    return meshwork::InvalidConfig("--model: unknown model '" + name + "' (known: " + names + ")");
  }
  return preset;
}

std::string Fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

// 8.03B, 100.09M.
std::string Count(double n) { return n >= 1e9 ? Fixed(n / 1e9, 2) + "B" : Fixed(n / 1e6, 2) + "M"; }

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

struct PlanSummary {
  compiler::SimResult sim;
  double tokens_per_second = 0;  // per device
  double mfu = 0;
  bool fits = true;
};

PlanSummary Summarize(const compiler::SimResult& sim, const Options& o, const meshwork::model::LlamaConfig& config,
                      const compiler::HardwareProfile& profile) {
  PlanSummary s;
  s.sim = sim;
  // A data parallel rank's tokens, shared by its tp group's GPUs.
  const double tokens = static_cast<double>(o.batch) * static_cast<double>(o.seq_len) / o.tp;
  s.tokens_per_second = sim.step_seconds > 0 ? tokens / sim.step_seconds : 0;
  s.mfu = s.tokens_per_second * config.TrainingFlopsPerToken(o.seq_len) / profile.peak_flops_per_second;
  s.fits = sim.peak_bytes + sim.static_bytes <= profile.memory_bytes;
  return s;
}

// One line a script can parse: `<label>: step ... s | exposed comm ... s | ...`.
void PrintSummary(std::ostream& out, const std::string& label, const PlanSummary& s,
                  const compiler::HardwareProfile& profile) {
  const auto& r = s.sim;
  out << std::left << std::setw(10) << (label + ":") << "step " << Fixed(r.step_seconds, 4) << " s | exposed comm "
      << Fixed(r.exposed_comm_seconds, 4) << " s";
  if (r.tp_comm_seconds > 0) {
    out << " (tp " << Fixed(r.tp_exposed_seconds, 4) << " of its " << Fixed(r.tp_comm_seconds, 4) << ")";
  }
  out << " | comm " << Fixed(r.comm_seconds, 4) << " s | peak " << Fixed(GiB(r.peak_bytes + r.static_bytes), 2) << " GiB (dynamic " << Fixed(GiB(r.peak_bytes), 2)
      << " + static " << Fixed(GiB(r.static_bytes), 2) << ") | " << r.collectives << " collectives | "
      << Fixed(s.tokens_per_second, 0) << " tok/s/GPU | MFU " << Fixed(100 * s.mfu, 1) << "%";
  if (!s.fits) out << " | exceeds " << Fixed(GiB(profile.memory_bytes), 1) << " GiB device memory";
  out << "\n";
}

// Mixed precision as the trainer runs it on GPUs: bf16 parameters and activations, gradients
// reduced in fp32 (the FSDP default), fp32 master shards and AdamW state.
compiler::LlamaShape ShapeOf(const Options& o, const meshwork::model::LlamaConfig& config,
                             const compiler::HardwareProfile& profile) {
  compiler::LlamaShape shape;
  shape.config = config;
  shape.batch = o.batch;
  shape.seq_len = o.seq_len;
  shape.param_bytes = 2;
  shape.reduce_bytes = 4;
  shape.activation_bytes = 2;
  shape.dp_shard = o.dp_shard;
  shape.dp_replicate = o.gpus / o.tp / o.dp_shard;
  shape.tp = o.tp;
  shape.sequence_parallel = o.sequence_parallel;
  shape.flops_per_second = profile.AchievedFlopsPerSecond();
  shape.activation_checkpointing = o.activation_checkpointing;
  return shape;
}

// --dp-shard auto: every candidate mesh on one line each, then the choice; returns it.
Result<int> ChooseDpShard(const Options& o, const meshwork::model::LlamaConfig& config,
                          const compiler::HardwareProfile& profile) {
  compiler::PlanOptions options;
  options.bucketing = o.bucketing;
  MW_ASSIGN_OR_RETURN(const compiler::MeshChoice choice,
                      compiler::ChooseMesh(profile, ShapeOf(o, config, profile), o.gpus, options));
  std::cout << "mesh: auto (simulated): " << choice.candidates.size() << " meshes of " << o.gpus
            << " GPUs, each by its quick plan (the chosen one by its full plan)\n";
  for (const auto& c : choice.candidates) {
    std::cout << "  " << std::right << std::setw(5) << c.dp_replicate << " x " << std::left << std::setw(5)
              << c.dp_shard << " ";
    if (!c.rejected.empty()) {
      std::cout << "cannot be built: " << c.rejected << "\n";
      continue;
    }
    std::cout << "compiled step " << Fixed(c.compiled.step_seconds, 4) << " s, exposed comm "
              << Fixed(c.compiled.exposed_comm_seconds, 4) << " s, peak "
              << Fixed(GiB(c.compiled.peak_bytes + c.compiled.static_bytes), 2) << " GiB"
              << (c.fits ? "" : " (exceeds device memory)") << "\n";
  }
  std::cout << "mesh: auto chose " << choice.reason << "\n";
  return choice.dp_shard;
}

// --calibration: both plans as the calibrated run's trainer would make them under `o`.
int RunCalibrated(const Options& o) {
  auto text = meshwork::ReadTextFile(o.calibration);
  if (!text.ok()) return Fail(meshwork::InvalidInput("--calibration: " + text.status().message()));
  auto cal = compiler::ParseCalibration(*text);
  if (!cal.ok()) return Fail(meshwork::InvalidInput(o.calibration + ": " + cal.status().message()));
  const compiler::CostModel cost = compiler::ScaleLinks(cal->cost, o.link_scale);
  // The flags are the trainer's fsdp.* keys: planned as the trainer plans from them.
  meshwork::config::FsdpConfig fsdp;
  fsdp.bucketing = o.bucketing;
  fsdp.reshard_after_forward = o.reshard_after_forward;
  fsdp.embedding_rows = o.embedding_rows;
  fsdp.vocab_parallel_head = o.vocab_parallel_head;
  compiler::PlanOptions options = meshwork::config::PlanOptionsOf(fsdp);
  options.budget = o.memory_budget_mib > 0
                       ? compiler::MemoryBudget{compiler::MemoryBudget::Source::kFixed, o.memory_budget_mib << 20}
                       : compiler::MemoryBudget{compiler::MemoryBudget::Source::kEagerPeak, 0};
  std::ostringstream dump;
  auto plans = compiler::PlanStep(compiler::ScaleCompute(cal->skeleton, cal->compute_scale), cost, options,
                                  o.dump_plan ? &dump : nullptr);
  if (!plans.ok()) return Fail(plans.status());
  std::cout << "meshwork-simulate (simulated, not measured) from the calibration " << o.calibration << ": mesh dp_replicate="
            << cost.dp_replicate << " dp_shard=" << cost.dp_shard << ", compute x" << Fixed(cal->compute_scale, 3)
            << " (fitted to a measured eager step of " << Fixed(cal->eager_step_seconds, 3) << " s), links x"
            << Fixed(o.link_scale, 3) << " (shard link " << Fixed(cost.shard_link.bus_bytes_per_second / 1e9, 3)
            << " GB/s + " << Fixed(cost.shard_link.latency_seconds * 1e6, 1) << " us), memory budget "
            << Fixed(static_cast<double>(plans->ctx.memory_budget_bytes) / (1 << 20), 0) << " MiB ("
            << (o.memory_budget_mib > 0 ? "--memory-budget-mib" : "the eager plan's peak") << ")\n";
  for (const std::string& choice : plans->choices) std::cout << "  compiled plan: " << choice << "\n";
  if (o.dump_plan) std::cout << "== eager_plan ==\n" << compiler::Print(plans->eager) << dump.str();
  for (const auto& [label, plan] : {std::pair{"eager", &plans->eager}, std::pair{"compiled", &plans->compiled}}) {
    const compiler::SimResult r = compiler::Simulate(*plan, plans->ctx.cost);
    std::cout << std::left << std::setw(10) << (std::string(label) + ":") << "step " << Fixed(r.step_seconds, 4)
              << " s | exposed comm " << Fixed(r.exposed_comm_seconds, 4) << " s | comm " << Fixed(r.comm_seconds, 4)
              << " s | peak " << Fixed(static_cast<double>(r.peak_bytes + r.static_bytes) / (1 << 20), 1)
              << " MiB (dynamic " << Fixed(static_cast<double>(r.peak_bytes) / (1 << 20), 1) << " + static "
              << Fixed(static_cast<double>(r.static_bytes) / (1 << 20), 1) << ") | " << r.collectives << " collectives\n";
  }
  return exit_code::kOk;
}

// --pp: the pipeline schedules for the model cut into pp x virtual stages, side by side.
int RunPipeline(const Options& o, const meshwork::model::LlamaConfig& config, const compiler::HardwareProfile& profile) {
  namespace pipeline = compiler::pipeline;
  std::vector<pipeline::ScheduleKind> kinds;
  if (o.pipeline_schedule == "all") {
    kinds = pipeline::AllSchedules();
  } else {
    kinds = {*pipeline::ParseScheduleKind(o.pipeline_schedule)};
  }
  // One micro-batch of --batch sequences on one tp group (pipeline::PricePipeline).
  Options one = o;
  one.dp_shard = 1;
  one.gpus = o.tp;
  pipeline::PipelinePlan plan;
  plan.llama = ShapeOf(one, config, profile);
  plan.gpus = o.gpus;
  plan.pp = o.pp;
  plan.virtual_stages = o.virtual_stages;
  plan.microbatches = o.microbatches;
  plan.dp_shard = o.dp_shard;
  if (o.activation_checkpointing) plan.checkpointed.assign(static_cast<size_t>(config.num_hidden_layers), true);
  std::vector<std::pair<pipeline::ScheduleKind, meshwork::Result<pipeline::PricedPipeline>>> priced;
  const pipeline::PricedPipeline* first = nullptr;
  for (pipeline::ScheduleKind kind : kinds) {
    plan.schedule = kind;
    priced.emplace_back(kind, pipeline::PricePipeline(profile, plan));
    if (!priced.back().second.ok() && o.pipeline_schedule != "all") return Fail(priced.back().second.status());
  }
  for (const auto& [kind, r] : priced) {
    if (r.ok()) {
      first = &*r;
      break;
    }
  }
  if (first == nullptr) return Fail(priced.front().second.status());

  const int replicas = o.gpus / (o.pp * o.tp * o.dp_shard);
  const auto& part = first->stages.partition;
  std::cout << "meshwork-simulate (simulated, not measured): pipeline schedules for " << o.model << ", "
            << Count(static_cast<double>(config.NumParameters())) << " parameters, on " << o.gpus << " x " << profile.name
            << "\n  pp " << o.pp << " x " << o.virtual_stages << " virtual stages, tp " << o.tp << ", dp_shard "
            << o.dp_shard << " x dp_replicate " << replicas << " (FSDP inside the stages), "
            << o.gpus / (o.pp * o.tp) << " pipelines; " << o.microbatches << " micro-batches of " << o.batch
            << " x " << o.seq_len << " tokens; transfers of "
            << Fixed(static_cast<double>(first->boundary_bytes) / (1 << 20), 1) << " MiB on the "
            << (first->inter_node ? "inter" : "intra") << "-node link ("
            << Fixed(first->link.bus_bytes_per_second / 1e9, 1) << " GB/s + " << Fixed(first->link.latency_seconds * 1e6, 1)
            << " us)\n  stages (decoder layers, first to last):";
  for (size_t s = 0; s + 1 < part.first_layer.size(); ++s) std::cout << " " << part.first_layer[s + 1] - part.first_layer[s];
  std::cout << " (the embedding with the first, the head with the last); slowest stage " << Fixed(part.max_seconds, 4)
            << " s a micro-batch\n"
            << "  FSDP: a group per decoder layer, gathered ahead of its first use and reduce-scattered as its last "
               "backward ends; shard link "
            << Fixed(first->fsdp_cost.shard_link.bus_bytes_per_second / 1e9, 1) << " GB/s + "
            << Fixed(first->fsdp_cost.shard_link.latency_seconds * 1e6, 1) << " us; the fullest rank gathers "
            << Fixed(GiB(std::max_element(first->per_rank.begin(), first->per_rank.end(),
                                          [](const auto& a, const auto& b) { return a.gathered_bytes < b.gathered_bytes; })
                             ->gathered_bytes),
                     2)
            << " GiB" << (o.activation_checkpointing ? "; every layer checkpointed" : "") << "\n";
  for (const auto& [kind, r] : priced) {
    const std::string label = std::string(pipeline::ScheduleName(kind)) + ":";
    if (!r.ok()) {
      std::cout << std::left << std::setw(18) << label << "does not run this shape: " << r.status().message() << "\n";
      continue;
    }
    std::cout << std::left << std::setw(18) << label << "step " << Fixed(r->step_seconds, 4) << " s (program "
              << Fixed(r->run.step_seconds, 4) << " s, bubble " << Fixed(100 * r->run.bubble_fraction, 1)
              << "%; FSDP exposed " << Fixed(r->step_seconds - r->run.step_seconds, 4) << " s) | peak "
              << Fixed(GiB(r->peak_bytes), 2) << " GiB (activations " << Fixed(GiB(r->activation_bytes), 2)
              << ", the fullest rank)"
              << (r->peak_bytes > profile.memory_bytes
                      ? " exceeds " + Fixed(GiB(profile.memory_bytes), 1) + " GiB device memory"
                      : "")
              << " | " << Fixed(r->tokens_per_second, 0) << " tok/s/GPU | MFU " << Fixed(100 * r->mfu, 1) << "%\n";
    if (o.dump_plan) std::cout << pipeline::Print(r->program) << pipeline::Timeline(r->program, r->run) << "\n";
  }
  return exit_code::kOk;
}

// One scored or estimated plan on a line: its step, peak memory, tokens/s and MFU.
std::string ScoreLine(const compiler::PlanScore& s, const compiler::HardwareProfile& profile) {
  std::ostringstream out;
  out << "step " << Fixed(s.step_seconds, 3) << " s | peak " << Fixed(GiB(s.peak_bytes), 1) << " of "
      << Fixed(GiB(profile.memory_bytes), 1) << " GiB | " << Fixed(s.tokens_per_second, 0) << " tok/s/GPU | MFU "
      << Fixed(100 * s.mfu, 1) << "%";
  if (s.bubble > 0) out << " | bubble " << Fixed(100 * s.bubble, 1) << "%";
  return out.str();
}

// --auto: the whole plan searched (compiler::SearchPlans), the choice, the runners-up scored
// beside it, the best estimates not scored, and why the others lost.
int RunAuto(const Options& o, const meshwork::model::LlamaConfig& config, const compiler::HardwareProfile& profile) {
  compiler::SearchSpec spec;
  spec.config = config;
  spec.seq_len = o.seq_len;
  spec.global_batch = o.global_batch;
  spec.gpus = o.gpus;
  spec.tp = o.tp_given ? o.tp : 0;
  spec.pp = o.pp_given ? o.pp : 0;
  spec.finalists = o.finalists;
  spec.exhaustive = o.exhaustive;
  auto search = compiler::SearchPlans(profile, spec);
  if (!search.ok()) return Fail(search.status());
  const compiler::PlanSearch& r = *search;
  std::cout << "meshwork-simulate --auto (simulated, not measured): " << o.model << ", "
            << Count(static_cast<double>(config.NumParameters())) << " parameters, on " << o.gpus << " x "
            << profile.name << "; " << o.global_batch << " sequences of " << o.seq_len << " tokens a step\n"
            << "  searched " << r.enumerated << " plans in " << Fixed(r.seconds, 2) << " s (estimates "
            << Fixed(r.estimate_seconds, 2) << " s, the finalists " << Fixed(r.score_seconds, 2) << " s, the choice's full plan "
            << Fixed(r.full_plan_seconds, 2) << " s): " << r.rejected.size()
            << " out (rules or memory), " << r.finalists.size() + r.estimated.size() << " fit by the estimate, "
            << r.finalists.size() << " scored by the planner and the simulator\n";
  const compiler::PlanCandidate& best = r.chosen();
  std::cout << "chosen: " << compiler::Describe(best.plan) << "\n  " << ScoreLine(*best.simulated, profile)
            << "\n  estimated beforehand: " << ScoreLine(best.estimate, profile) << "\n";
  for (const std::string& choice : best.choices) std::cout << "  compiled plan: " << choice << "\n";
  std::cout << "  as the trainer's config (docs/config.md; the model's keys beside it):\n";
  std::istringstream yaml(compiler::PlanConfigYaml(best.plan, o.seq_len, o.global_batch));
  for (std::string line; std::getline(yaml, line);) std::cout << "    " << line << "\n";
  std::cout << "runners-up (scored):\n";
  for (size_t i = 1; i < r.finalists.size(); ++i) {
    const compiler::PlanCandidate& c = r.finalists[i];
    std::cout << "  " << i + 1 << ". " << compiler::Describe(c.plan) << "\n     " << ScoreLine(*c.simulated, profile)
              << " (x" << Fixed(c.simulated->step_seconds / best.simulated->step_seconds, 3) << " the chosen step)\n";
  }
  std::cout << "next by the estimate (not scored):\n";
  for (size_t i = 0; i < std::min<size_t>(5, r.estimated.size()); ++i) {
    std::cout << "  " << compiler::Describe(r.estimated[i].plan) << "\n     " << ScoreLine(r.estimated[i].estimate, profile)
              << " (estimated)\n";
  }
  if (o.exhaustive) {
    std::cout << "every plan scored, fastest first (--exhaustive):\n";
    for (const compiler::PlanCandidate& c : r.finalists) {
      std::string keys = compiler::PlanConfigYaml(c.plan, o.seq_len, o.global_batch);
      while (!keys.empty() && keys.back() == '\n') keys.pop_back();
      for (auto at = keys.find('\n'); at != std::string::npos; at = keys.find('\n', at)) keys.replace(at, 1, "; ");
      std::cout << "plan: " << compiler::Describe(c.plan) << " | step " << Fixed(c.simulated->step_seconds, 6)
                << " s | peak " << Fixed(c.simulated->peak_bytes / double(1 << 30), 3) << " GiB | keys: " << keys << "\n";
    }
  }
  // Why the others lost: the first reason of each kind, with how many plans it ruled out.
  std::map<std::string, std::pair<int, std::string>> reasons;
  for (const compiler::PlanCandidate& c : r.rejected) {
    const std::string kind = c.rejected.substr(0, c.rejected.find(':'));
    auto& [count, example] = reasons[kind];
    if (count++ == 0) example = compiler::Describe(c.plan) + ": " + c.rejected.substr(kind.size() + 2);
  }
  std::cout << "out before scoring:\n";
  for (const auto& [kind, entry] : reasons) {
    std::cout << "  " << entry.first << " x " << kind << ", e.g. " << entry.second << "\n";
  }
  return exit_code::kOk;
}

int Run(Options o) {
  if (!o.calibration.empty()) return RunCalibrated(o);
  auto profile = compiler::FindHardwareProfile(o.profile);
  if (!profile.ok()) return Fail(profile.status());
  auto config = ModelConfig(o.model);
  if (!config.ok()) return Fail(config.status());
  if (o.auto_plan) return RunAuto(o, *config, *profile);
  if (o.auto_mesh) {
    auto chosen = ChooseDpShard(o, *config, *profile);
    if (!chosen.ok()) return Fail(chosen.status());
    o.dp_shard = *chosen;
  }
  if (o.tp > 1) {
    if (std::string why = meshwork::model::WhyNotSplittable(*config, o.tp); !why.empty()) {
      return Fail(meshwork::InvalidConfig("--tp: " + why));
    }
  }
  if (o.pp > 1) return RunPipeline(o, *config, *profile);
  const int dp_replicate = o.gpus / o.tp / o.dp_shard;
  auto cost = compiler::MakeCostModel(*profile, dp_replicate, o.dp_shard, o.tp);
  if (!cost.ok()) return Fail(cost.status());
  const compiler::Graph skeleton = compiler::LlamaSkeleton(ShapeOf(o, *config, *profile));

  compiler::PlanOptions plan_options;
  plan_options.bucketing = o.bucketing;
  // Overlapped TP chunks sequence parallelism's all-gathers and reduce-scatters (the trainer
  // refuses mesh.async_tp_chunks without it): no overlap of all-reduces.
  plan_options.async_tp = o.async_tp && o.sequence_parallel;
  // The compiled plan's budget: what the device holds beyond the static shards, unless given.
  std::string budget_source;
  if (o.memory_budget_gib > 0) {
    plan_options.budget = {compiler::MemoryBudget::Source::kFixed,
                           static_cast<int64_t>(o.memory_budget_gib * 1024.0 * 1024.0 * 1024.0)};
    budget_source = "--memory-budget-gib";
  } else {
    plan_options.budget = {compiler::MemoryBudget::Source::kDeviceMemory, profile->memory_bytes};
  }
  std::ostringstream dump;
  auto plans = compiler::PlanStep(skeleton, *cost, plan_options, o.dump_plan ? &dump : nullptr);
  if (!plans.ok()) return Fail(plans.status());
  const compiler::PassContext& ctx = plans->ctx;
  if (o.memory_budget_gib <= 0) budget_source = "device memory - static state";
  const compiler::SimResult eager_sim = compiler::Simulate(plans->eager, ctx.cost);

  std::cout << "meshwork-simulate (simulated, not measured): " << o.model << ", "
            << Count(static_cast<double>(config->NumParameters())) << " parameters, on " << o.gpus
            << " x " << profile->name << "\n"
            << "  mesh dp_replicate=" << dp_replicate << " dp_shard=" << o.dp_shard;
  if (o.tp > 1) std::cout << " tp=" << o.tp << (o.sequence_parallel ? " with sequence parallelism" : "");
  std::cout << "; seq " << o.seq_len << ", batch " << o.batch << (o.tp > 1 ? " per tp group" : " per GPU")
            << "; bf16 params and activations, fp32 gradient reduction\n"
            << "  compute at " << Fixed(profile->peak_flops_per_second / 1e12, 0) << " TFLOP/s x "
            << Fixed(profile->achieved_mfu, 2) << " achieved MFU; shard link "
            << Fixed(ctx.cost.shard_link.bus_bytes_per_second / 1e9, 1) << " GB/s + "
            << Fixed(ctx.cost.shard_link.latency_seconds * 1e6, 1) << " us";
  if (o.tp > 1) {
    std::cout << ", tp link " << Fixed(ctx.cost.tp_link.bus_bytes_per_second / 1e9, 1) << " GB/s + "
              << Fixed(ctx.cost.tp_link.latency_seconds * 1e6, 1) << " us";
  }
  if (dp_replicate > 1) {
    std::cout << ", replicate link " << Fixed(ctx.cost.replicate_link.bus_bytes_per_second / 1e9, 1) << " GB/s + "
              << Fixed(ctx.cost.replicate_link.latency_seconds * 1e6, 1) << " us";
  }
  std::cout << "\n  eager: block buckets, prefetch one; compiled: bucketing "
            << compiler::BucketingName(o.bucketing) << ", memory budget " << Fixed(GiB(ctx.memory_budget_bytes), 2)
            << " GiB (" << budget_source << ")\n";

  for (const std::string& choice : plans->choices) std::cout << "  compiled plan: " << choice << "\n";
  if (o.dump_plan) std::cout << "== eager_plan ==\n" << compiler::Print(plans->eager) << dump.str();
  const compiler::SimResult compiled_sim = compiler::Simulate(plans->compiled, ctx.cost);

  const PlanSummary e = Summarize(eager_sim, o, *config, *profile);
  const PlanSummary c = Summarize(compiled_sim, o, *config, *profile);
  PrintSummary(std::cout, "eager", e, *profile);
  PrintSummary(std::cout, "compiled", c, *profile);
  const double e_peak = static_cast<double>(e.sim.peak_bytes + e.sim.static_bytes);
  const double c_peak = static_cast<double>(c.sim.peak_bytes + c.sim.static_bytes);
  std::cout << "compiled vs eager: step x" << Fixed(c.sim.step_seconds / e.sim.step_seconds, 3) << ", peak memory x"
            << Fixed(c_peak / e_peak, 3) << ", tokens/s x" << Fixed(c.tokens_per_second / e.tokens_per_second, 3)
            << "\n";
  return exit_code::kOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& a : args) {
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return exit_code::kOk;
    }
  }
  auto options = ParseArgs(args);
  if (!options.ok()) return Usage(options.status().message());
  try {
    return Run(*options);
  } catch (const std::exception& e) {
    // Modules return Status; anything thrown this far is a bug, reported rather than aborting.
    std::cerr << "meshwork-simulate: internal error: " << e.what() << "\n";
    return exit_code::kRuntime;
  }
}
