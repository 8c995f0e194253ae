#include "trainer/train/trainer.h"

#include <prometheus/registry.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <sstream>

#include "metrics/exposer.h"
#include "metrics/trainer_metrics.h"
#include "common/units.h"
#include "trainer/data/token_source.h"
#include "trainer/io/hf_checkpoint.h"
#include "trainer/model/compat.h"
#include "trainer/model/llama.h"
#include "trainer/dist/env.h"
#include "trainer/train/checkpoint.h"
#include "trainer/train/device.h"
#include "trainer/train/engine.h"
#include "trainer/train/report.h"
#include "trainer/train/schedule.h"

namespace meshwork::train {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

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
  return Status::Ok();
}

// The model the config describes: dims from the preset or from the imported checkpoint,
// deterministic initialisation, then imported weights if any, on `device`.
Result<model::LlamaForCausalLM> BuildModel(const config::TrainConfig& cfg, const torch::Device& device,
                                           std::ostream& log) {
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
  torch::manual_seed(static_cast<uint64_t>(cfg.training.seed));
  model::LlamaForCausalLM net(dims);
  net->InitWeights(cfg.model.init_std);
  if (!cfg.model.init_from.empty()) {
    MW_RETURN_IF_ERROR(io::LoadHfWeightsInto(cfg.model.init_from, *net, dims.tie_word_embeddings));
    log << "loaded weights from " << cfg.model.init_from << "\n";
  }
  net->to(device);
  return net;
}

bool UseAutocast(const config::TrainConfig& cfg, const torch::Device& device) {
  return device.is_cuda() && cfg.training.dtype != config::Dtype::kFp32;
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
    auto logits = engine.EvalForward(b.inputs.to(device));
    // Sum of per-window means, so every window weighs the same.
    total += model::CausalLmLoss(logits, b.targets.to(device)).item<double>() * static_cast<double>(n);
  }
  return total / static_cast<double>(windows);
}

// Writes the full parameters as an HF directory from rank 0; every rank takes part in gathering.
Status ExportHf(Engine& engine, const config::TrainConfig& cfg, const model::LlamaConfig& dims) {
  MW_ASSIGN_OR_RETURN(auto state, engine.FullState());
  if (engine.rank() != 0) return Status::Ok();
  model::LlamaForCausalLM copy(dims);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : copy->named_parameters()) item.value().copy_(state.at(item.key()));
  }
  const auto dtype = cfg.checkpoint.export_dtype == config::ExportDtype::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  return io::SaveHfCheckpoint(cfg.checkpoint.export_hf, dims, *copy, dtype);
}

Result<std::unique_ptr<data::TokenFile>> OpenEvalFile(const config::TrainConfig& cfg) {
  const std::string& path = cfg.eval.data.empty() ? cfg.data.val : cfg.eval.data;
  const data::TokenFormat format = cfg.data.token_format;
  return data::TokenFile::Open(path, format);
}

Status CheckEvalFits(const data::TokenFile& file, const config::TrainConfig& cfg) {
  const int64_t fit = data::NumEvalWindows(file, cfg.data.seq_len);
  if (fit < cfg.eval.windows) {
    return InvalidConfig("key 'eval.windows': " + std::to_string(cfg.eval.windows) + " windows of " +
                         std::to_string(cfg.data.seq_len + 1) + " tokens do not fit in " + file.path() +
                         " (" + std::to_string(file.size()) + " tokens, " + std::to_string(fit) +
                         " windows)");
  }
  return Status::Ok();
}

Result<TrainSummary> TrainImpl(const config::TrainConfig& cfg, std::ostream& log) {
  // --- set-up -----------------------------------------------------------------------------
  if (cfg.training.threads > 0) torch::set_num_threads(static_cast<int>(cfg.training.threads));
  MW_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(cfg.training.device));
  if (cfg.training.dtype == config::Dtype::kBf16 && !device.is_cuda()) {
    return InvalidConfig("key 'training.dtype': bf16 autocast needs a CUDA device, but training.device '" +
                         cfg.training.device + "' resolved to " + device.str());
  }
  const bool autocast = UseAutocast(cfg, device);
  MW_ASSIGN_OR_RETURN(model::LlamaForCausalLM net, BuildModel(cfg, device, log));
  const model::LlamaConfig dims = net->config();
  MW_ASSIGN_OR_RETURN(dist::DistEnv env, dist::ReadDistEnv());
  // Only rank 0 talks; the others train silently (their errors still reach stderr via main).
  std::ostringstream discard;
  std::ostream& out = env.rank == 0 ? log : discard;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeEngine(cfg, std::move(net), device, out));

  const data::TokenFormat format = cfg.data.token_format;
  MW_ASSIGN_OR_RETURN(auto source, data::MakeTokenSource(cfg.data.train, format, cfg.data.seq_len,
                                                         dims.vocab_size,
                                                         static_cast<uint64_t>(cfg.training.seed)));
  std::unique_ptr<data::TokenFile> eval_file;
  if (!cfg.data.val.empty() || !cfg.eval.data.empty()) {
    MW_ASSIGN_OR_RETURN(eval_file, OpenEvalFile(cfg));
    MW_RETURN_IF_ERROR(CheckEvalFits(*eval_file, cfg));
  }

  // Each rank serves its own /metrics; ranks on one machine take consecutive ports.
  std::unique_ptr<metrics::MetricsServer> server;
  std::shared_ptr<prometheus::Registry> registry;
  if (cfg.metrics.port >= 0) {
    const int64_t port = cfg.metrics.port > 0 ? cfg.metrics.port + env.local_rank : 0;
    MW_ASSIGN_OR_RETURN(server, metrics::MetricsServer::Start(cfg.metrics.host + ":" + std::to_string(port)));
    registry = server->registry();
    out << "metrics: http://" << cfg.metrics.host << ":" << server->port() << "/metrics"
        << (env.world_size > 1 ? " (rank 0; rank r on port + local rank)" : "") << "\n";
  } else {
    registry = std::make_shared<prometheus::Registry>();
  }
  metrics::TrainerMetrics metrics(*registry, {{"job", cfg.metrics.job}, {"rank", std::to_string(env.rank)}});
  metrics.SetTotalSteps(cfg.schedule.steps);
  metrics.SetInfo(cfg.model.init_from.empty() ? cfg.model.preset : cfg.model.init_from,
                  cfg.model.init_from.empty() ? cfg.model.preset : "hf", device.str(), env.world_size);

  const DeviceProfile profile = ResolveDeviceProfile(cfg.metrics.device_profile, cfg.metrics.peak_tflops, device);
  const double flops_per_token = dims.TrainingFlopsPerToken(cfg.data.seq_len);

  // AdamW with decoupled weight decay on matrices only; norm gains are not decayed. Under FSDP
  // these are the ranks' shards: the optimizer state is sharded with them.
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(cfg.optimizer.lr)
            .betas({cfg.optimizer.beta1, cfg.optimizer.beta2})
            .eps(cfg.optimizer.eps)
            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(engine->DecayParams(), adamw(cfg.optimizer.weight_decay));
  groups.emplace_back(engine->NoDecayParams(), adamw(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(cfg.optimizer.lr));

  // Resume: every rank loads its shards and AdamW state from checkpoint.dir/latest, if any; the
  // loop then continues at the next step (the data order and the learning rate are functions of
  // the step, so nothing else needs restoring).
  Checkpointer checkpointer(cfg.checkpoint, *engine, optimizer, RunMeta(cfg, dims, *engine));
  MW_ASSIGN_OR_RETURN(const ResumePoint resumed, checkpointer.Resume());
  const int64_t first_step = resumed.step;

  const int64_t rows = cfg.data.batch_size;
  const int64_t accum = cfg.training.grad_accum;
  const int64_t dp = engine->dp_size();
  const int64_t tokens_per_step = rows * accum * dp * cfg.data.seq_len;  // global
  TrainSummary summary;
  ProgressReport::Run shape;
  shape.first_step = first_step;
  shape.total_steps = cfg.schedule.steps;
  shape.tokens_per_step = tokens_per_step;
  shape.log_every = cfg.logging.every;
  shape.world_size = engine->world_size();
  shape.flops_per_token = flops_per_token;
  shape.peak_flops = profile.peak_flops;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<ProgressReport> report,
                      ProgressReport::Create(shape, engine->rank() == 0 ? cfg.logging.jsonl : std::string(), metrics,
                                             out, summary));
  out << "model: " << (cfg.model.init_from.empty() ? cfg.model.preset : cfg.model.init_from) << ", "
      << Format("%.2fM", dims.NumParameters() / 1e6) << " parameters (" << dims.num_hidden_layers
      << " layers, hidden " << dims.hidden_size << ", heads " << dims.num_attention_heads << "/"
      << dims.num_key_value_heads << ", vocab " << dims.vocab_size << ")\n"
      << "data: " << source->Describe() << ", batch " << rows << " x accum " << accum << " x ranks " << dp
      << " = " << tokens_per_step << " tokens/step\n"
      << "parallelism: " << engine->Describe() << "; parameters on this rank "
      << Format("%.1f MiB", static_cast<double>(engine->ParamBytes()) / (1 << 20)) << "\n"
      << "device: " << device.str() << (autocast ? " (bf16 autocast)" : " (fp32)") << ", "
      << torch::get_num_threads() << " threads; mfu vs "
      << (profile.peak_flops >= 1e12 ? Format("%.1f TFLOP/s", profile.peak_flops / 1e12)
                                     : Format("%.1f GFLOP/s", profile.peak_flops / 1e9))
      << " (" << profile.basis << ")\n";

  if (first_step > 0) {
    metrics.SetResumedStep(first_step);
    out << "resumed from " << resumed.step_dir << " (step " << first_step << " of " << cfg.schedule.steps << ")\n";
    for (const auto& note : resumed.notes) out << "resume: note: " << note << "\n";
  } else if (checkpointer.enabled()) {
    out << "checkpoint: none in " << cfg.checkpoint.dir
        << (cfg.checkpoint.resume == config::Resume::kNever ? " read (checkpoint.resume: never)" : " yet") << "; starting at step 0\n";
  }

  summary.resumed_from = first_step;
  summary.param_bytes = engine->ParamBytes();
  metrics.SetStateBytes("parameters", static_cast<double>(summary.param_bytes));
  metrics.SetStateBytes("gradients", static_cast<double>(summary.param_bytes));
  metrics.SetStateBytes("optimizer", 2.0 * static_cast<double>(summary.param_bytes));
  auto eval_loss = [&]() {
    return EvalLoss(*engine, dims, *eval_file, cfg.data.seq_len, cfg.eval.windows, rows, device, autocast);
  };
  if (eval_file && first_step == 0) {
    MW_ASSIGN_OR_RETURN(summary.initial_eval_loss, eval_loss());
    metrics.RecordEval(summary.initial_eval_loss);
    out << "eval before training: loss " << SixDigits(summary.initial_eval_loss) << "\n";
  }

  // --- the loop ---------------------------------------------------------------------------
  report->Start();
  for (int64_t step = first_step; step < cfg.schedule.steps; ++step) {
    const auto t0 = Clock::now();
    MW_RETURN_IF_ERROR(engine->BeginStep());  // compiled FSDP plans before step 2
    const double lr = LearningRate(cfg.schedule, cfg.optimizer.lr, step);
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
    engine->ZeroGrad();

    // Forward and backward over the micro-batches; gradients are reduced on the last one.
    double local_loss = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const bool sync = micro + 1 == accum;
      // Rows of the global batch: micro-batch by micro-batch, each split across the dp ranks.
      const int64_t first_row = (micro * dp + engine->dp_rank()) * rows;
      MW_ASSIGN_OR_RETURN(data::Batch batch, source->Rows(step, first_row, rows));
      torch::Tensor loss;
      {
        compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
        auto logits = engine->Forward(batch.inputs.to(device, /*non_blocking=*/true), sync);
        loss = model::CausalLmLoss(logits, batch.targets.to(device, /*non_blocking=*/true)) /
               static_cast<double>(accum);
      }
      loss.backward();
      MW_RETURN_IF_ERROR(engine->AfterBackward(sync));
      // Host-device sync: the loss value is needed for the log, the NaN check and metrics.
      local_loss += loss.item<double>();
    }

    // Clip to the global norm (an infinite limit only measures it), then step.
    const double max_norm = cfg.optimizer.grad_clip > 0 ? cfg.optimizer.grad_clip
                                                        : std::numeric_limits<double>::infinity();
    MW_ASSIGN_OR_RETURN(const double grad_norm, engine->ClipGradNorm(max_norm));
    optimizer.step();

    MW_ASSIGN_OR_RETURN(const double loss, engine->AverageAcrossRanks(local_loss));
    if (!std::isfinite(loss)) {
      return Internal("training diverged: loss is " + Format("%g", loss) + " at step " +
                      std::to_string(step + 1) + " (lower optimizer.lr or raise schedule.warmup_steps)");
    }
    // Report: metrics and logging.jsonl every step, a log line every logging.every steps.
    report->Step({step, loss, lr, grad_norm, Seconds(t0), engine->TakeStats(), SampleMemory(device)});

    const bool last = step + 1 == cfg.schedule.steps;
    if (eval_file && cfg.eval.every > 0 && (step + 1) % cfg.eval.every == 0 && !last) {
      MW_ASSIGN_OR_RETURN(double el, eval_loss());
      metrics.RecordEval(el);
      out << "eval at step " << step + 1 << ": loss " << SixDigits(el) << "\n";
    }
    if (checkpointer.Due(step + 1, cfg.schedule.steps)) {
      const auto t_save = Clock::now();
      MW_RETURN_IF_ERROR(checkpointer.Save(step + 1));
      out << "checkpoint: saved " << cfg.checkpoint.dir << "/" << StepDirName(step + 1) << " in "
          << Format("%.2f", Seconds(t_save)) << " s\n";
      out.flush();
    }
  }

  // --- wrap-up ----------------------------------------------------------------------------
  report->Finish();
  if (eval_file) {
    MW_ASSIGN_OR_RETURN(summary.final_eval_loss, eval_loss());
    metrics.RecordEval(summary.final_eval_loss);
    out << "eval after training: loss " << SixDigits(summary.final_eval_loss) << "\n";
  }
  if (!cfg.checkpoint.export_hf.empty()) {
    MW_RETURN_IF_ERROR(ExportHf(*engine, cfg, dims));
    out << "exported Hugging Face model to " << cfg.checkpoint.export_hf << "\n";
  }
  report->PrintSummary(eval_file != nullptr);
  return summary;
}

Result<EvalResult> EvaluateImpl(const config::TrainConfig& cfg, std::ostream& log) {
  if (cfg.model.init_from.empty()) {
    return InvalidConfig("eval needs weights: pass --weights DIR (key 'model.init_from')");
  }
  if (cfg.eval.data.empty() && cfg.data.val.empty()) {
    return InvalidConfig("eval needs a token file: pass --data FILE (key 'eval.data')");
  }
  if (cfg.training.threads > 0) torch::set_num_threads(static_cast<int>(cfg.training.threads));
  MW_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(cfg.training.device));
  MW_ASSIGN_OR_RETURN(model::LlamaForCausalLM net, BuildModel(cfg, device, log));
  const model::LlamaConfig dims = net->config();
  MW_ASSIGN_OR_RETURN(auto file, OpenEvalFile(cfg));
  MW_RETURN_IF_ERROR(CheckEvalFits(*file, cfg));
  std::unique_ptr<Engine> engine = MakeLocalEngine(std::move(net));
  EvalResult r;
  MW_ASSIGN_OR_RETURN(r.loss, EvalLoss(*engine, dims, *file, cfg.data.seq_len, cfg.eval.windows,
                                       cfg.data.batch_size, device, UseAutocast(cfg, device)));
  r.windows = cfg.eval.windows;
  r.tokens = cfg.eval.windows * cfg.data.seq_len;
  return r;
}

// libtorch reports failures by throwing c10::Error; they become Status values here so that
// nothing escapes into main unhandled.
template <typename F>
auto Guard(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const StatusError& e) {
    return Status(e.status().code(), std::string(what) + ": " + e.status().message());
  } catch (const c10::Error& e) {
    return Internal(std::string(what) + ": libtorch error: " + e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return Unavailable(std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return Internal(std::string(what) + ": " + e.what());
  }
}

}  // namespace

std::string SixDigits(double v) { return Format("%#.6g", v); }

Result<TrainSummary> Train(const config::TrainConfig& cfg, std::ostream& log) {
  return Guard("train", [&] { return TrainImpl(cfg, log); });
}

Result<EvalResult> Evaluate(const config::TrainConfig& cfg, std::ostream& log) {
  return Guard("eval", [&] { return EvaluateImpl(cfg, log); });
}

}  // namespace meshwork::train
