#include "trainer/train/setup.h"

#include <algorithm>

#include "common/blas_kernel.h"
#include "common/file.h"
#include "common/units.h"
#include "trainer/config/hardware.h"
#include "trainer/data/token_file.h"
#include "trainer/data/token_source.h"
#include "trainer/data/tokenizer.h"
#include "trainer/dist/env.h"
#include "trainer/io/hf_checkpoint.h"
#include "trainer/model/compat.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/linear_cross_entropy.h"

namespace meshwork::train {
namespace {

// With model.init_from the dims are the checkpoint's. Dims the config also names (a training
// config reused for eval, say) must agree with them: a silent mismatch would train or score a
// different model than the user wrote down.
Status CheckDimsMatch(const model::LlamaConfig& want, const model::LlamaConfig& ckpt, const std::string& dir) {
  auto check = [&](const char* key, double a, double b) -> Status {
    if (a == b) return Status::Ok();
    std::ostringstream os;
    os << "key 'model." << key << "': " << a << " differs from " << b << " in " << dir
       << "/config.json (with model.init_from the dims come from the checkpoint; drop model.preset "
          "and model dims, or make them match)";
    return InvalidConfig(os.str());
  };
  MW_RETURN_IF_ERROR(check("vocab_size", want.vocab_size, ckpt.vocab_size));
  MW_RETURN_IF_ERROR(check("hidden_size", want.hidden_size, ckpt.hidden_size));
  MW_RETURN_IF_ERROR(check("intermediate_size", want.intermediate_size, ckpt.intermediate_size));
  MW_RETURN_IF_ERROR(check("num_hidden_layers", want.num_hidden_layers, ckpt.num_hidden_layers));
  MW_RETURN_IF_ERROR(check("num_attention_heads", want.num_attention_heads, ckpt.num_attention_heads));
  MW_RETURN_IF_ERROR(check("num_key_value_heads", want.num_key_value_heads, ckpt.num_key_value_heads));
  MW_RETURN_IF_ERROR(check("tie_word_embeddings", want.tie_word_embeddings, ckpt.tie_word_embeddings));
  // Not shapes, but the same weights under another theta or epsilon compute another function.
  MW_RETURN_IF_ERROR(check("rope_theta", want.rope_theta, ckpt.rope_theta));
  MW_RETURN_IF_ERROR(check("rms_norm_eps", want.rms_norm_eps, ckpt.rms_norm_eps));
  return Status::Ok();
}

// AdamW with decoupled weight decay on matrices only; norm gains are not decayed. Under FSDP
// these are the ranks' shards: the optimizer state is sharded with them.
std::unique_ptr<AdamW> MakeOptimizer(const config::OptimizerConfig& o, std::optional<AdamWKernel> kernel,
                                     Engine& engine) {
  std::vector<AdamWGroup> groups;
  groups.push_back({engine.DecayParams(), o.weight_decay});
  groups.push_back({engine.NoDecayParams(), 0.0});
  return std::make_unique<AdamW>(std::move(groups), AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, kernel});
}

// optimizer.implementation on this device: nullopt for auto (AdamW::DefaultKernel).
Result<std::optional<AdamWKernel>> OptimizerKernel(const config::OptimizerConfig& o, const torch::Device& device) {
  switch (o.implementation) {
    case config::OptimizerImplementation::kAuto: return std::optional<AdamWKernel>();
    case config::OptimizerImplementation::kForeach: return std::optional<AdamWKernel>(AdamWKernel::kForeach);
    case config::OptimizerImplementation::kFused:
      if (!device.is_cuda() || !compat::kTorch2) {
        return InvalidConfig("key 'optimizer.implementation': fused is libtorch's CUDA kernel (libtorch 2.x), but the "
                             "device is " + device.str() + " and libtorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                             std::to_string(TORCH_VERSION_MINOR) +
                             " (use auto, foreach or meshwork)");
      }
      return std::optional<AdamWKernel>(AdamWKernel::kFused);
    case config::OptimizerImplementation::kMeshwork:
      if (device.is_cuda() && !model::FusedKernelsBuilt()) {
        return InvalidConfig("key 'optimizer.implementation': meshwork on " + device.str() +
                             ", but this build has no CUDA kernels (nvcc was not found when it was built: "
                             "docs/gpu.md); use auto, foreach or fused");
      }
      return std::optional<AdamWKernel>(AdamWKernel::kMeshwork);
  }
  return std::optional<AdamWKernel>();
}

// Each rank serves its own /metrics; ranks on one machine take consecutive ports.
Status StartMetrics(TrainingRun& r, const dist::DistEnv& env) {
  const config::TrainConfig& cfg = r.cfg;
  if (cfg.metrics.port >= 0) {
    const int64_t port = cfg.metrics.port > 0 ? cfg.metrics.port + env.local_rank : 0;
    MW_ASSIGN_OR_RETURN(r.server, metrics::MetricsServer::Start(cfg.metrics.host + ":" + std::to_string(port)));
    r.registry = r.server->registry();
    r.log() << "metrics: http://" << cfg.metrics.host << ":" << r.server->port() << "/metrics"
            << (env.world_size > 1 ? " (rank 0; rank r on port + local rank)" : "") << "\n";
  } else {
    r.registry = std::make_shared<prometheus::Registry>();
  }
  r.metrics = std::make_unique<metrics::TrainerMetrics>(
      *r.registry, std::map<std::string, std::string>{{"job", cfg.metrics.job}, {"rank", std::to_string(env.rank)}});
  r.metrics->SetTotalSteps(cfg.schedule.steps);
  if (r.first_step() > 0) r.metrics->SetResumedStep(r.first_step());
  const dist::MeshShape mesh = r.engine->mesh_shape();
  r.metrics->SetInfo(cfg.model.init_from.empty() ? cfg.model.preset : cfg.model.init_from,
                     cfg.model.init_from.empty() ? cfg.model.preset : "hf", r.device.str(), env.world_size,
                     (cfg.mesh.pp > 1 ? "pp" + std::to_string(cfg.mesh.pp) + "x" : std::string()) +
                         std::to_string(mesh.dp_replicate) + "x" + std::to_string(mesh.dp_shard) + "x" +
                         std::to_string(mesh.tp));
  return Status::Ok();
}

// training.activation_checkpointing as it applies to this run.
std::string CheckpointingNote(const config::TrainConfig& cfg, const Engine& engine) {
  switch (cfg.training.activation_checkpointing) {
    case config::ActivationCheckpointing::kAll: return "every layer";
    case config::ActivationCheckpointing::kNone: return "off";
    case config::ActivationCheckpointing::kSelective:
      return "layers 0, " + std::to_string(cfg.training.checkpoint_every) + ", " +
             std::to_string(2 * cfg.training.checkpoint_every) + ", ... (selective, training.checkpoint_every " +
             std::to_string(cfg.training.checkpoint_every) + ")";
    case config::ActivationCheckpointing::kAuto: break;
  }
  const bool fsdp = engine.world_size() > 1 || cfg.fsdp.single_process;
  const bool planned = fsdp && cfg.fsdp.mode == config::FsdpMode::kCompiled;
  if (!planned) return "off (auto: only a compiled plan uses it)";
  return cfg.training.memory_limit_mib > 0
             ? "every layer until the plan, then the layers the compiled plan picks to fit training.memory_limit_mib"
             : "the layers the compiled plan picks to fit its memory budget";
}

// The attention kernel SDPA takes for this model's shapes and dtype here, asked with one
// sequence that requires grad (as in training). Throws c10::Error where no enabled kernel can.
std::string AttentionKernelFor(const model::LlamaConfig& dims, int64_t seq, const torch::Device& device,
                               bool autocast, bool masked) {
  const int64_t heads = dims.num_attention_heads, kv = dims.num_key_value_heads, d = dims.head_dim();
  const auto options = torch::TensorOptions()
                           .device(device)
                           .dtype(autocast ? torch::kBFloat16 : torch::kFloat)
                           .requires_grad(true);
  const torch::Tensor mask = masked ? torch::ones({1, 1, seq, seq}, torch::TensorOptions().device(device).dtype(torch::kBool))
                                    : torch::Tensor();
  return compat::AttentionKernel(torch::empty({1, heads, seq, d}, options), torch::empty({1, kv, seq, d}, options),
                                 torch::empty({1, kv, seq, d}, options), mask);
}

// SDPA's name (compat::AttentionKernel) of training.attention_backend's kernel; "" for auto.
std::string AttentionKernelName(config::AttentionBackend backend) {
  switch (backend) {
    case config::AttentionBackend::kAuto: return "";
    case config::AttentionBackend::kFlash: return "flash_attention";
    case config::AttentionBackend::kCudnn: return "cudnn_attention";
    case config::AttentionBackend::kEfficient: return "efficient_attention";
    case config::AttentionBackend::kMath: return "math";
  }
  return "";
}

// Restricts attention to training.attention_backend's kernel (every kernel for auto) and checks
// that the kernel runs this model's attention on this device: an error naming the key and why
// otherwise (libtorch's reasons are in its warnings above the error), and then the process is
// left as it was (every kernel enabled).
Status RestrictAttention(const config::TrainConfig& cfg, const torch::Device& device, const model::LlamaConfig& dims) {
  const config::AttentionBackend backend = cfg.training.attention_backend;
  const std::string kernel = AttentionKernelName(backend);
  const std::string key =
      "key 'training.attention_backend': " + std::string(NameOf(config::kAttentionBackendNames, backend));
  if (!compat::RestrictAttentionKernel(kernel)) {
    return InvalidConfig(key + " needs libtorch 2.5 or later, which lets a program choose the attention kernel (this one is " +
                         std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                         (compat::kTorch2 ? "; use auto)" : ", whose attention is the composition: use auto or math)"));
  }
  if (kernel.empty() || !compat::kTorch2) return Status::Ok();
  const bool autocast = UseAutocast(cfg, device);
  std::string got;
  try {
    got = AttentionKernelFor(dims, cfg.data.seq_len, device, autocast, cfg.data.document_masking);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    got = "libtorch: " + what.substr(0, what.find('\n'));
  }
  if (got == kernel) return Status::Ok();
  compat::RestrictAttentionKernel("");
  return InvalidConfig(key + " cannot run this model's attention on " + device.str() + " (heads " +
                       std::to_string(dims.num_attention_heads) + "/" + std::to_string(dims.num_key_value_heads) +
                       ", head_dim " + std::to_string(dims.head_dim()) + ", seq_len " +
                       std::to_string(cfg.data.seq_len) + ", " + (autocast ? "bf16" : "fp32") +
                       (cfg.data.document_masking ? ", masked by data.document_masking" : "") + "): " + got +
                       " (use auto)");
}

// training.weight_copies: auto keeps them where forward casts fp32 weights for bf16 matmuls
// (autocast with the fused projections and head) and Meshwork's AdamW kernel writes them, so the
// step casts nothing; the engine still has to take them (one process).
bool WeightCopiesApply(const TrainingRun& r) {
  if (r.cfg.training.weight_copies == config::WeightCopies::kOff || !r.autocast) return false;
  const Result<bool> fused = config::UsesFusedKernels(r.cfg, r.device.is_cuda(), model::FusedKernelsBuilt());
  return fused.ok() && *fused && r.optimizer->KernelOn(r.device) == AdamWKernel::kMeshwork;
}

// The kernels the step's heavy parts take: attention (SDPA's pick for this model's shapes and
// dtype, asked with one sequence), the fused head's backward, and AdamW's update.
std::string KernelNote(const TrainingRun& r) {
  const std::string attention =
      AttentionKernelFor(r.dims, r.cfg.data.seq_len, r.device, r.autocast, r.cfg.data.document_masking);
  const bool stored = config::StoresLossGradient(r.cfg, r.device.is_cuda());
  const Result<bool> fused = config::UsesFusedKernels(r.cfg, r.device.is_cuda(), model::FusedKernelsBuilt());
  std::string elementwise = fused.ok() && *fused ? (r.device.is_cuda() ? "fused CUDA kernels" : "fused host loops")
                                                 : "composition";
  if (r.cfg.training.fused_kernels == config::FusedKernels::kAuto && r.device.is_cuda() && !model::FusedKernelsBuilt()) {
    elementwise += " (this build has no CUDA kernels: no nvcc)";
  }
  // Under autocast with fused kernels, the projections over fp32 weights are MixedLinear's (FSDP
  // gathers bf16 weights under autocast: the composition).
  const bool mixed = fused.ok() && *fused && r.autocast && r.cfg.training.merge_projections;
  return "attention " + attention + " (training.attention_backend); SwiGLU + RoPE " + elementwise + " (training.fused_kernels); projections " +
         (r.cfg.training.merge_projections ? "merged (q/k/v, gate/up)" : "separate") + " (training.merge_projections)" +
         (mixed ? ", over fp32 weights (one process; FSDP gathers bf16) one cast and fp32 weight gradients"
                : "") +
         "; output head + loss " +
         (stored ? (fused.ok() && *fused ? "stored logit gradient, fused softmax" : "stored logit gradient")
                 : "recomputed logits") +
         " (training.loss_gradient); AdamW " +
         r.optimizer->KernelFor(r.device) + " (optimizer.implementation); weight copies " +
         (r.weight_copies ? "bf16, written by AdamW" : "off") + " (training.weight_copies)";
}

void PrintRun(TrainingRun& r, const DeviceProfile& profile, int64_t tokens_per_step) {
  const config::TrainConfig& cfg = r.cfg;
  const std::string blas = BlasKernelNote();
  const Result<bool> bf16_residual = Bf16Residual(cfg, r.device);  // BuildModel checked it
  r.log() << "model: " << (cfg.model.init_from.empty() ? cfg.model.preset : cfg.model.init_from) << ", "
          << Format("%.2fM", r.dims.NumParameters() / 1e6) << " parameters (" << r.dims.num_hidden_layers
          << " layers, hidden " << r.dims.hidden_size << ", heads " << r.dims.num_attention_heads << "/"
          << r.dims.num_key_value_heads << ", vocab " << r.dims.vocab_size << ")\n"
          << "data: " << r.source->Describe() << ", batch " << cfg.data.batch_size << " x accum "
          << cfg.training.grad_accum << " x ranks " << r.engine->dp_size() << " = " << tokens_per_step
          << " tokens/step\n"
          << "parallelism: " << r.engine->Describe() << "; parameters on this rank "
          << Format("%.1f MiB", static_cast<double>(r.engine->ParamBytes()) / (1 << 20))
          << "; activation checkpointing: " << CheckpointingNote(cfg, *r.engine) << "\n"
          << "device: " << r.device.str()
          << (r.autocast ? (bf16_residual.ok() && *bf16_residual ? " (bf16 autocast, bf16 residual stream)"
                                                                 : " (bf16 autocast, fp32 residual stream)")
                         : " (fp32)")
          << ", "
          << (r.device.is_cuda() ? "allocator " + ConfigureCudaAllocator() + ", " : std::string())
          << torch::get_num_threads() << " threads"
          << (blas.empty() ? std::string() : ", " + blas) << "; mfu vs "
          << (profile.peak_flops >= 1e12 ? Format("%.1f TFLOP/s", profile.peak_flops / 1e12)
                                         : Format("%.1f GFLOP/s", profile.peak_flops / 1e9))
          << " (" << profile.basis << ")\n"
          << "kernels: " << KernelNote(r) << "\n";
  if (r.first_step() > 0) {
    r.log() << "resumed from " << r.resumed.step_dir << " (step " << r.first_step() << " of " << cfg.schedule.steps
            << ")\n";
    for (const auto& note : r.resumed.notes) r.log() << "resume: note: " << note << "\n";
  } else if (r.checkpointer->enabled()) {
    r.log() << "checkpoint: none in " << cfg.checkpoint.dir
            << (cfg.checkpoint.resume == config::Resume::kNever ? " read (checkpoint.resume: never)" : " yet")
            << "; starting at step 0\n";
  }
}

// data.document_masking's separator: data.document_separator, else the id the first token file
// (data.train, else the evaluation file) records in its header; nullopt when masking is off.
Result<std::optional<int64_t>> DocumentSeparator(const config::TrainConfig& cfg, const model::LlamaConfig& dims) {
  if (!cfg.data.document_masking) return std::optional<int64_t>();
  int64_t separator = cfg.data.document_separator;
  std::string source = "data.document_separator";
  if (separator < 0) {
    const std::string& eval_path = cfg.eval.data.empty() ? cfg.data.val : cfg.eval.data;
    const std::string& path = cfg.data.train != data::kSyntheticSourceName ? cfg.data.train : eval_path;
    if (path.empty() || path == data::kSyntheticSourceName) {
      return InvalidConfig("key 'data.document_masking': synthetic data records no document separator; set "
                           "data.document_separator to the id that ends a document");
    }
    MW_ASSIGN_OR_RETURN(auto file, data::TokenFile::Open(path, cfg.data.token_format));
    if (!file->document_separator()) {
      return InvalidConfig("key 'data.document_masking': token file '" + path +
                           "' does not record which token ends a document (written by another tool, an older "
                           "meshwork-train, or in a raw format); set data.document_separator to that id, or "
                           "prepare the text again with meshwork-train prepare-data");
    }
    separator = *file->document_separator();
    source = "token file '" + path + "'";
  }
  if (separator >= dims.vocab_size) {
    return InvalidConfig("key 'data.document_separator': " + std::to_string(separator) + " (from " + source +
                         ") is not below model.vocab_size " + std::to_string(dims.vocab_size));
  }
  return std::optional<int64_t>(separator);
}

}  // namespace

// The model the config describes: dims from the preset or from the imported checkpoint (its
// tensors checked against the model), deterministic initialisation, on `device`.
Result<model::LlamaForCausalLM> BuildModel(const config::TrainConfig& cfg, const torch::Device& device,
                                           std::ostream& log) {
  // The choices this device settles, before any weight is made or read.
  MW_ASSIGN_OR_RETURN(const bool fused, config::UsesFusedKernels(cfg, device.is_cuda(), model::FusedKernelsBuilt()));
  MW_ASSIGN_OR_RETURN(const bool bf16_residual, Bf16Residual(cfg, device));
  model::LlamaConfig dims = cfg.model.dims;
  if (!cfg.model.init_from.empty()) {
    MW_ASSIGN_OR_RETURN(dims, io::ReadHfConfig(cfg.model.init_from));
    if (cfg.model.dims_explicit) MW_RETURN_IF_ERROR(CheckDimsMatch(cfg.model.dims, dims, cfg.model.init_from));
    if (cfg.data.seq_len > dims.max_position_embeddings) {
      return InvalidConfig("key 'data.seq_len': " + std::to_string(cfg.data.seq_len) +
                           " exceeds max_position_embeddings " +
                           std::to_string(dims.max_position_embeddings) + " of " +
                           cfg.model.init_from + "/config.json");
    }
  }
  MW_RETURN_IF_ERROR(RestrictAttention(cfg, device, dims));
  torch::manual_seed(static_cast<uint64_t>(cfg.training.seed));
  model::LlamaForCausalLM net(dims);
  net->InitWeights(cfg.model.init_std);
  if (!cfg.model.init_from.empty()) {
    MW_RETURN_IF_ERROR(io::CheckHfWeightsMatch(cfg.model.init_from, *net, dims.tie_word_embeddings));
  }
  net->to(device);
  net->set_loss_chunk_rows(model::LossChunkRows(dims.vocab_size, cfg.training.loss_chunk_mib << 20));
  net->set_loss_gradient(config::StoresLossGradient(cfg, device.is_cuda()) ? model::HeadGradient::kStored
                                                                           : model::HeadGradient::kRecompute);
  net->set_merged_projections(cfg.training.merge_projections);
  net->set_fused_kernels(fused);
  net->set_residual_dtype(bf16_residual ? torch::kBFloat16 : torch::kFloat);
  MW_ASSIGN_OR_RETURN(const std::optional<int64_t> separator, DocumentSeparator(cfg, dims));
  net->set_document_separator(separator);
  if (separator) log << "documents: masked in attention, each ended by token " << *separator << "\n";
  return net;
}

Status ImportWeights(const config::TrainConfig& cfg, Engine& engine, std::ostream& log) {
  std::vector<io::HfSlice> slices;
  for (const ShardPiece& piece : engine.LocalShards()) {
    slices.push_back({piece.name, piece.value, piece.begin, piece.col_begin, piece.cols});
  }
  const Result<io::HfSliceReport> read = io::LoadHfSlices(cfg.model.init_from, slices);
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(engine, read.status(), StatusCode::kInvalidInput,
                                      "reading the weights of model.init_from '" + cfg.model.init_from + "'"));
  log << "loaded weights from " << cfg.model.init_from << ": this rank read " << HumanBytes(read->bytes_read)
      << " of its " << HumanBytes(read->bytes_in_files) << " ("
      << Format("%.1f%%", 100.0 * static_cast<double>(read->bytes_read) / std::max<double>(read->bytes_in_files, 1))
      << ")\n";
  return Status::Ok();
}

bool UseAutocast(const config::TrainConfig& cfg, const torch::Device& device) {
  return device.is_cuda() && cfg.training.dtype != config::Dtype::kFp32;
}

Result<bool> Bf16Residual(const config::TrainConfig& cfg, const torch::Device& device) {
  MW_ASSIGN_OR_RETURN(const bool fused, config::UsesFusedKernels(cfg, device.is_cuda(), model::FusedKernelsBuilt()));
  Result<bool> bf16 = config::UsesBf16Residual(cfg, UseAutocast(cfg, device), fused);
  if (!bf16.ok()) {
    return Status(bf16.status().code(), bf16.status().message() + " (training.device resolved to " + device.str() + ")");
  }
  return bf16;
}

// Mean loss over contiguous windows, batched by data.batch_size, without grads. Every rank
// evaluates the same windows (the sharded forward needs all ranks), so all get the same value.
Result<double> EvalLoss(Engine& engine, const model::LlamaConfig& dims, const data::TokenFile& file,
                        int64_t seq_len, int64_t windows, int64_t batch, const torch::Device& device,
                        bool autocast) {
  double total = 0;
  for (int64_t first = 0; first < windows; first += batch) {
    const int64_t n = std::min(batch, windows - first);
    MW_ASSIGN_OR_RETURN(data::Batch b, data::EvalWindows(file, seq_len, first, n, dims.vocab_size));
    compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
    // Sum of per-window means, so every window weighs the same.
    total += engine.EvalBatchLoss(b.inputs.to(device), b.targets.to(device)).item<double>() * static_cast<double>(n);
  }
  return total / static_cast<double>(windows);
}

Result<std::unique_ptr<data::TokenFile>> OpenEvalFile(const config::TrainConfig& cfg) {
  const std::string& path = cfg.eval.data.empty() ? cfg.data.val : cfg.eval.data;
  MW_ASSIGN_OR_RETURN(auto file, data::TokenFile::Open(path, cfg.data.token_format));
  const int64_t fit = data::NumEvalWindows(*file, cfg.data.seq_len);
  if (fit < cfg.eval.windows) {
    return InvalidConfig("key 'eval.windows': " + std::to_string(cfg.eval.windows) + " windows of " +
                         std::to_string(cfg.data.seq_len + 1) + " tokens do not fit in " + file->path() +
                         " (" + std::to_string(file->size()) + " tokens, " + std::to_string(fit) +
                         " windows)");
  }
  return file;
}

Result<double> TrainingRun::EvalLoss() {
  return train::EvalLoss(*engine, dims, *eval_file, cfg.data.seq_len, cfg.eval.windows, cfg.data.batch_size, device,
                         autocast);
}

namespace {

// The run's tokenizer (data.tokenizer, else model.init_from's where the directory carries one): the
// model needs an id for each of its tokens, and a token file that records its tokenizer's
// vocabulary size must have the same one (text prepared with the byte-level vocabulary for an
// imported Llama would train on meaningless ids). An init_from tokenizer this build cannot read is
// reported and not checked; a data.tokenizer named explicitly must load.
Status CheckTokenizer(const config::TrainConfig& cfg, const model::LlamaConfig& dims, std::ostream& log) {
  const bool named = !cfg.data.tokenizer.empty();
  const std::string& dir = named ? cfg.data.tokenizer : cfg.model.init_from;
  const std::string key = named ? "data.tokenizer" : "model.init_from";
  if (!named && (dir.empty() || data::FindTokenizerFile(dir).empty())) return Status::Ok();
  auto tok = data::LoadTokenizer(dir);
  if (!tok.ok()) {
    if (named) {
      return Status(tok.status().code(), "key 'data.tokenizer': " + tok.status().message());
    }
    log << "note: the tokenizer in " << dir << " was not checked against the model and the data: "
        << tok.status().message() << "\n";
    return Status::Ok();
  }
  const int64_t n = (*tok)->VocabSize();
  if (n > dims.vocab_size) {
    return InvalidInput(key + " '" + dir + "' is a tokenizer of " + std::to_string(n) + " tokens, but the model's vocab_size is " +
                        std::to_string(dims.vocab_size));
  }
  const std::string& eval_path = cfg.eval.data.empty() ? cfg.data.val : cfg.eval.data;
  for (const std::string& path : {cfg.data.train, eval_path}) {
    if (path.empty() || path == data::kSyntheticSourceName) continue;
    MW_ASSIGN_OR_RETURN(auto file, data::TokenFile::Open(path, cfg.data.token_format));
    const int64_t recorded = file->tokenizer_vocab_size();
    if (recorded != 0 && recorded != n) {
      return InvalidInput("token file '" + path + "' was written by a tokenizer of " + std::to_string(recorded) +
                          " tokens (its header), but " + key + " '" + dir + "' is one of " + std::to_string(n) +
                          ": prepare the text with `meshwork-train prepare-data --tokenizer " + dir + "`");
    }
  }
  log << "tokenizer: " << (*tok)->description() << "\n";
  return Status::Ok();
}

// Where the data continues: step 0 at sample 0, or a resumed step at the sample its checkpoint
// recorded (older checkpoints: the step times this run's rows a step). With data.order epochs a
// resume under another global batch continues the same sequence of windows, and says so.
Status SetDataPosition(TrainingRun& r) {
  const config::TrainConfig& cfg = r.cfg;
  const int64_t rows = cfg.data.batch_size * cfg.training.grad_accum * r.engine->dp_size();
  const int64_t step = r.resumed.step;
  int64_t samples = step * rows;
  if (step > 0 && r.resumed.saved.samples >= 0) samples = r.resumed.saved.samples;
  if (step > 0 && cfg.data.order == data::SampleOrder::kEpochs && r.resumed.saved.RowsPerStep() != rows) {
    r.resumed.notes.push_back("data: the checkpoint's run took " + std::to_string(r.resumed.saved.RowsPerStep()) +
                              " rows a step, this one takes " + std::to_string(rows) +
                              "; the epoch order continues at sample " + std::to_string(samples) +
                              (r.resumed.saved.samples < 0 ? " (assumed: the checkpoint predates the recorded position)"
                                                           : ""));
  }
  return r.source->SetPosition(step, samples, rows);
}

}  // namespace

Result<std::unique_ptr<TrainingRun>> SetUpTraining(const config::TrainConfig& cfg, std::ostream& log) {
  auto run = std::make_unique<TrainingRun>(cfg);
  TrainingRun& r = *run;
  if (cfg.training.threads > 0) torch::set_num_threads(static_cast<int>(cfg.training.threads));
  MW_ASSIGN_OR_RETURN(r.device, ResolveDevice(cfg.training.device));
  if (cfg.training.dtype == config::Dtype::kBf16 && !r.device.is_cuda()) {
    return InvalidConfig("key 'training.dtype': bf16 autocast needs a CUDA device, but training.device '" +
                         cfg.training.device + "' resolved to " + r.device.str());
  }
  r.autocast = UseAutocast(cfg, r.device);
  MW_ASSIGN_OR_RETURN(const std::optional<AdamWKernel> adamw_kernel, OptimizerKernel(cfg.optimizer, r.device));
  if (!r.device.is_cuda()) CountCpuTensorBytes();  // CUDA's allocator counts its own
  MW_RETURN_IF_ERROR(LimitTensorMemory(r.device, cfg.training.memory_limit_mib << 20));
  MW_ASSIGN_OR_RETURN(model::LlamaForCausalLM net, BuildModel(cfg, r.device, log));
  r.dims = net->config();
  MW_ASSIGN_OR_RETURN(dist::DistEnv env, dist::ReadDistEnv());
  // Only rank 0 talks; the others train silently (their errors still reach stderr via main).
  r.out = env.rank == 0 ? &log : &r.discard;
  MW_ASSIGN_OR_RETURN(r.engine, MakeEngine(cfg, std::move(net), r.device, r.log()));
  if (!cfg.model.init_from.empty()) {
    // A run that resumes takes every weight from its checkpoint: reading the import first would
    // only cost time, on every gang restart. All ranks decide alike (WillResume is collective);
    // a checkpoint that then fails to load stops the run, it never falls back to the import.
    MW_ASSIGN_OR_RETURN(const bool resumes, WillResume(cfg.checkpoint, *r.engine));
    if (resumes) {
      r.log() << "model.init_from " << cfg.model.init_from << ": not read, the run resumes from " << cfg.checkpoint.dir
              << "/latest\n";
    } else {
      MW_RETURN_IF_ERROR(ImportWeights(cfg, *r.engine, r.log()));
    }
  }

  MW_RETURN_IF_ERROR(CheckTokenizer(cfg, r.dims, r.log()));
  MW_ASSIGN_OR_RETURN(r.source, data::MakeTokenSource(cfg.data.train, cfg.data.token_format, cfg.data.seq_len,
                                                      r.dims.vocab_size, static_cast<uint64_t>(cfg.training.seed),
                                                      cfg.data.order));
  if (!cfg.data.val.empty() || !cfg.eval.data.empty()) {
    MW_ASSIGN_OR_RETURN(r.eval_file, OpenEvalFile(cfg));
  }
  const DeviceProfile profile = ResolveDeviceProfile(cfg.metrics.device_profile, cfg.metrics.peak_tflops, r.device);

  r.optimizer = MakeOptimizer(cfg.optimizer, adamw_kernel, *r.engine);
  r.engine->AttachOptimizer(r.optimizer.get());
  if (WeightCopiesApply(r)) {
    auto copies = std::make_shared<model::WeightCopies>(torch::kBFloat16);
    if (r.engine->AttachWeightCopies(copies)) {
      r.optimizer->SetWeightCopies(copies);
      r.weight_copies = std::move(copies);
    }
  }
  // Resume: every rank loads its shards and AdamW state from checkpoint.dir/latest, if any; the
  // loop then continues at the next step (the data order and the learning rate are functions of
  // the step, so nothing else needs restoring).
  // Output paths are checked now, not when first written: a bad one would otherwise be found
  // only at the first checkpoint or, for the export, after the whole run.
  // (checkpoint.dir: by every rank, in Checkpointer::Resume.)
  // Rank 0 writes them; every rank learns the outcome, so that all exit alike (4) rather than
  // the others failing in their next collective.
  Status outputs = Status::Ok();
  if (!cfg.checkpoint.export_hf.empty() && r.engine->rank() == 0) {
    if (Status s = EnsureWritableDirectory(cfg.checkpoint.export_hf); !s.ok()) {
      outputs = IOError("key 'checkpoint.export_hf': " + s.message());
    }
  }
  if (!cfg.fsdp.calibration_out.empty() && r.engine->rank() == 0 && outputs.ok()) {
    const std::string& path = cfg.fsdp.calibration_out;
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (Status s = EnsureWritableDirectory(dir); !s.ok()) {
      outputs = IOError("key 'fsdp.calibration_out': " + s.message());
    }
  }
  MW_RETURN_IF_ERROR(AgreeAcrossRanks(*r.engine, outputs, StatusCode::kIOError, "checking the output paths on rank 0"));
  r.checkpointer = std::make_unique<Checkpointer>(cfg.checkpoint, *r.engine, *r.optimizer, RunMeta(cfg, r.dims, *r.engine));
  MW_ASSIGN_OR_RETURN(r.resumed, r.checkpointer->Resume());
  MW_RETURN_IF_ERROR(SetDataPosition(r));
  // /metrics opens only now, its step already the checkpoint's: a resumed gang never reports
  // step 0 while it loads (the operator's STEP went 117 -> 0 -> 113; issue 20).
  MW_RETURN_IF_ERROR(StartMetrics(r, env));

  const int64_t tokens_per_step = cfg.data.batch_size * cfg.training.grad_accum * r.engine->dp_size() * cfg.data.seq_len;
  ProgressReport::Run shape;
  shape.first_step = r.first_step();
  shape.total_steps = cfg.schedule.steps;
  shape.tokens_per_step = tokens_per_step;
  shape.log_every = cfg.logging.every;
  shape.world_size = r.engine->world_size();
  shape.flops_per_token = r.dims.TrainingFlopsPerToken(cfg.data.seq_len);
  shape.peak_flops = profile.peak_flops;
  shape.steady_from_step = r.engine->SteadyFromStep();
  MW_ASSIGN_OR_RETURN(r.report, ProgressReport::Create(shape, r.engine->rank() == 0 ? cfg.logging.jsonl : std::string(),
                                                       *r.metrics, r.log(), r.summary));
  PrintRun(r, profile, tokens_per_step);

  if (!cfg.training.profile_out.empty()) {
    // Steady steps: after the warm-up step (and, compiled, the plan and re-plan). Every rank
    // checks, rank 0 profiles.
    MW_RETURN_IF_ERROR(StepProfiler::Available());
    const int64_t first = r.first_step() + std::max<int64_t>(2, r.engine->SteadyFromStep());
    if (first + cfg.training.profile_steps > cfg.schedule.steps) {
      return InvalidConfig("key 'training.profile_steps': " + std::to_string(cfg.training.profile_steps) +
                           " steady steps from step " + std::to_string(first + 1) + " end after schedule.steps " +
                           std::to_string(cfg.schedule.steps));
    }
    if (r.engine->rank() == 0) {
      MW_ASSIGN_OR_RETURN(r.profiler, StepProfiler::Create(cfg.training.profile_out, first,
                                                           cfg.training.profile_steps, r.device.is_cuda()));
    }
  }
  r.summary.resumed_from = r.first_step();
  r.summary.param_bytes = r.engine->ParamBytes();
  r.metrics->SetStateBytes("parameters", static_cast<double>(r.summary.param_bytes));
  r.metrics->SetStateBytes("gradients", static_cast<double>(r.summary.param_bytes));
  r.metrics->SetStateBytes("optimizer", 2.0 * static_cast<double>(r.summary.param_bytes));
  return run;
}

}  // namespace meshwork::train
