#include "trainer/train/trainer.h"

#include <prometheus/registry.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "metrics/exposer.h"
#include "metrics/trainer_metrics.h"
#include "trainer/data/token_source.h"
#include "trainer/io/hf_checkpoint.h"
#include "trainer/model/compat.h"
#include "trainer/model/llama.h"
#include "trainer/train/device.h"
#include "trainer/train/schedule.h"

namespace meshwork::train {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Mib(int64_t bytes) { return Format("%.0f MiB", static_cast<double>(bytes) / (1 << 20)); }

std::string Duration(double s) {
  if (s < 60) return Format("%.0fs", s);
  if (s < 3600) return Format("%.0fm", std::floor(s / 60)) + Format("%02.0fs", std::fmod(s, 60));
  return Format("%.0fh", std::floor(s / 3600)) + Format("%02.0fm", std::fmod(s / 60, 60));
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
  return device.is_cuda() && (cfg.training.dtype == "bf16" || cfg.training.dtype == "auto");
}

// Mean loss over contiguous windows, batched by data.batch_size, in eval mode without grads.
Result<double> EvalLoss(model::LlamaForCausalLM& net, const data::TokenFile& file, int64_t seq_len,
                        int64_t windows, int64_t batch, const torch::Device& device, bool autocast) {
  torch::NoGradGuard no_grad;
  net->eval();
  double total = 0;
  for (int64_t first = 0; first < windows; first += batch) {
    const int64_t n = std::min(batch, windows - first);
    MW_ASSIGN_OR_RETURN(data::Batch b,
                        data::EvalWindows(file, seq_len, first, n, net->config().vocab_size));
    compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
    auto logits = net->forward(b.inputs.to(device));
    // Sum of per-window means, so every window weighs the same.
    total += model::CausalLmLoss(logits, b.targets.to(device)).item<double>() * static_cast<double>(n);
  }
  net->train();
  return total / static_cast<double>(windows);
}

Result<std::unique_ptr<data::TokenFile>> OpenEvalFile(const config::TrainConfig& cfg) {
  const std::string& path = cfg.eval.data.empty() ? cfg.data.val : cfg.eval.data;
  MW_ASSIGN_OR_RETURN(auto format, data::ParseTokenFormat(cfg.data.token_format));
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
  if (cfg.training.dtype == "bf16" && !device.is_cuda()) {
    return InvalidConfig("key 'training.dtype': bf16 autocast needs a CUDA device, but training.device '" +
                         cfg.training.device + "' resolved to " + device.str());
  }
  const bool autocast = UseAutocast(cfg, device);
  MW_ASSIGN_OR_RETURN(model::LlamaForCausalLM net, BuildModel(cfg, device, log));
  const model::LlamaConfig& dims = net->config();

  MW_ASSIGN_OR_RETURN(auto format, data::ParseTokenFormat(cfg.data.token_format));
  MW_ASSIGN_OR_RETURN(auto source, data::MakeTokenSource(cfg.data.train, format, cfg.data.seq_len,
                                                         dims.vocab_size,
                                                         static_cast<uint64_t>(cfg.training.seed)));
  std::unique_ptr<data::TokenFile> eval_file;
  if (!cfg.data.val.empty() || !cfg.eval.data.empty()) {
    MW_ASSIGN_OR_RETURN(eval_file, OpenEvalFile(cfg));
    MW_RETURN_IF_ERROR(CheckEvalFits(*eval_file, cfg));
  }

  std::unique_ptr<metrics::MetricsServer> server;
  std::shared_ptr<prometheus::Registry> registry;
  if (cfg.metrics.port >= 0) {
    MW_ASSIGN_OR_RETURN(server, metrics::MetricsServer::Start(cfg.metrics.host + ":" +
                                                              std::to_string(cfg.metrics.port)));
    registry = server->registry();
    log << "metrics: http://" << cfg.metrics.host << ":" << server->port() << "/metrics\n";
  } else {
    registry = std::make_shared<prometheus::Registry>();
  }
  metrics::TrainerMetrics metrics(*registry, {{"job", cfg.metrics.job}, {"rank", "0"}});
  metrics.SetTotalSteps(cfg.schedule.steps);
  metrics.SetInfo(cfg.model.init_from.empty() ? cfg.model.preset : cfg.model.init_from,
                  cfg.model.init_from.empty() ? cfg.model.preset : "hf", device.str(), 1);

  MW_ASSIGN_OR_RETURN(DeviceProfile profile, ResolveDeviceProfile(cfg.metrics.device_profile,
                                                                  cfg.metrics.peak_tflops, device));
  const double flops_per_token = dims.TrainingFlopsPerToken(cfg.data.seq_len);

  // AdamW with decoupled weight decay on matrices only; norm gains are not decayed.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : net->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(cfg.optimizer.lr)
            .betas({cfg.optimizer.beta1, cfg.optimizer.beta2})
            .eps(cfg.optimizer.eps)
            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(cfg.optimizer.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(cfg.optimizer.lr));
  std::vector<torch::Tensor> params = net->parameters();

  const int64_t rows = cfg.data.batch_size;
  const int64_t accum = cfg.training.grad_accum;
  const int64_t tokens_per_step = rows * accum * cfg.data.seq_len;
  log << "model: " << (cfg.model.init_from.empty() ? cfg.model.preset : cfg.model.init_from) << ", "
      << Format("%.2fM", dims.NumParameters() / 1e6) << " parameters (" << dims.num_hidden_layers
      << " layers, hidden " << dims.hidden_size << ", heads " << dims.num_attention_heads << "/"
      << dims.num_key_value_heads << ", vocab " << dims.vocab_size << ")\n"
      << "data: " << source->Describe() << ", batch " << rows
      << " x accum " << accum << " = " << tokens_per_step << " tokens/step\n"
      << "device: " << device.str() << (autocast ? " (bf16 autocast)" : " (fp32)") << ", "
      << torch::get_num_threads() << " threads; mfu vs "
      << (profile.peak_flops >= 1e12 ? Format("%.1f TFLOP/s", profile.peak_flops / 1e12)
                                     : Format("%.1f GFLOP/s", profile.peak_flops / 1e9))
      << " (" << profile.basis << ")\n";

  TrainSummary summary;
  if (eval_file) {
    MW_ASSIGN_OR_RETURN(summary.initial_eval_loss,
                        EvalLoss(net, *eval_file, cfg.data.seq_len, cfg.eval.windows, rows, device, autocast));
    metrics.RecordEval(summary.initial_eval_loss);
    log << "eval before training: loss " << SixDigits(summary.initial_eval_loss) << "\n";
  }

  // --- the loop ---------------------------------------------------------------------------
  net->train();
  const auto start = Clock::now();
  Clock::time_point after_first;
  double mfu_sum = 0;
  for (int64_t step = 0; step < cfg.schedule.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = LearningRate(cfg.schedule, cfg.optimizer.lr, step);
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
    optimizer.zero_grad();

    // Forward and backward over the micro-batches; gradients accumulate in .grad.
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t micro = 0; micro < accum; ++micro) {
      MW_ASSIGN_OR_RETURN(data::Batch batch, source->Rows(step, micro * rows, rows));
      torch::Tensor loss;
      {
        compat::CudaAutocastGuard amp(autocast, torch::kBFloat16);
        auto logits = net->forward(batch.inputs.to(device, /*non_blocking=*/true));
        loss = model::CausalLmLoss(logits, batch.targets.to(device, /*non_blocking=*/true)) /
               static_cast<double>(accum);
      }
      loss.backward();
      loss_sum += loss.detach();
    }

    // Clip to the global norm (an infinite limit only measures it), then step.
    const double max_norm = cfg.optimizer.grad_clip > 0 ? cfg.optimizer.grad_clip
                                                        : std::numeric_limits<double>::infinity();
    const double grad_norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
    optimizer.step();

    // Host-device sync: the loss value is needed for the log, the NaN check and metrics.
    const double loss = loss_sum.item<double>();
    if (!std::isfinite(loss)) {
      return Internal("training diverged: loss is " + Format("%g", loss) + " at step " +
                      std::to_string(step + 1) + " (lower optimizer.lr or raise schedule.warmup_steps)");
    }
    const double step_s = Seconds(t0);
    if (step == 0) after_first = Clock::now();

    // Progress: metrics every step, a log line every logging.every steps.
    summary.losses.push_back(loss);
    const double tps = static_cast<double>(tokens_per_step) / step_s;
    const double mfu = tps * flops_per_token / profile.peak_flops;
    if (step > 0) mfu_sum += mfu;
    const MemorySample mem = SampleMemory(device);
    summary.peak_memory_bytes = std::max(summary.peak_memory_bytes, mem.peak_bytes);
    summary.memory_device = mem.device;
    metrics.RecordStep({step + 1, loss, step_s, static_cast<double>(tokens_per_step), tps, mfu, lr, grad_norm});
    metrics.RecordMemory(mem.current_bytes, mem.peak_bytes, mem.device);

    const bool last = step + 1 == cfg.schedule.steps;
    if ((step + 1) % cfg.logging.every == 0 || last || step == 0) {
      const double eta = Seconds(start) / static_cast<double>(step + 1) *
                         static_cast<double>(cfg.schedule.steps - step - 1);
      log << "step " << step + 1 << "/" << cfg.schedule.steps << " | loss " << Format("%.4f", loss)
          << " | lr " << Format("%.2e", lr) << " | grad_norm " << Format("%.3f", grad_norm) << " | "
          << Format("%.0f", tps) << " tok/s | step " << Format("%.1f", step_s * 1e3) << " ms | mfu "
          << Format("%.2f", mfu * 100) << "% | mem " << Mib(mem.current_bytes) << " (peak "
          << Mib(mem.peak_bytes) << ", " << mem.device << ") | eta " << Duration(eta) << "\n";
      log.flush();
    }
    if (eval_file && cfg.eval.every > 0 && (step + 1) % cfg.eval.every == 0 && !last) {
      MW_ASSIGN_OR_RETURN(double el, EvalLoss(net, *eval_file, cfg.data.seq_len, cfg.eval.windows,
                                              rows, device, autocast));
      metrics.RecordEval(el);
      log << "eval at step " << step + 1 << ": loss " << SixDigits(el) << "\n";
    }
  }

  // --- wrap-up ----------------------------------------------------------------------------
  summary.steps = cfg.schedule.steps;
  summary.tokens = tokens_per_step * cfg.schedule.steps;
  summary.seconds = Seconds(start);
  // The first step pays one-off costs (allocator growth, thread pools); leave it out of the
  // throughput figure when there is anything else to measure.
  const int64_t timed_steps = cfg.schedule.steps > 1 ? cfg.schedule.steps - 1 : 1;
  const double timed_s = cfg.schedule.steps > 1 ? Seconds(after_first) : summary.seconds;
  summary.tokens_per_second = static_cast<double>(tokens_per_step * timed_steps) / timed_s;
  summary.mean_mfu = summary.tokens_per_second * flops_per_token / profile.peak_flops;
  if (eval_file) {
    MW_ASSIGN_OR_RETURN(summary.final_eval_loss,
                        EvalLoss(net, *eval_file, cfg.data.seq_len, cfg.eval.windows, rows, device, autocast));
    metrics.RecordEval(summary.final_eval_loss);
    log << "eval after training: loss " << SixDigits(summary.final_eval_loss) << "\n";
  }
  if (!cfg.checkpoint.export_hf.empty()) {
    const auto dtype = cfg.checkpoint.export_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    MW_RETURN_IF_ERROR(io::SaveHfCheckpoint(cfg.checkpoint.export_hf, dims, *net, dtype));
    log << "exported Hugging Face model to " << cfg.checkpoint.export_hf << "\n";
  }
  log << "done: " << summary.steps << " steps, " << summary.tokens << " tokens in "
      << Format("%.1f", summary.seconds) << " s | final loss " << Format("%.4f", summary.losses.back())
      << " | " << Format("%.0f", summary.tokens_per_second) << " tok/s | mfu "
      << Format("%.2f", summary.mean_mfu * 100) << "% | peak mem " << Mib(summary.peak_memory_bytes)
      << " (" << summary.memory_device << ")";
  if (eval_file) {
    log << " | eval loss " << SixDigits(summary.initial_eval_loss) << " -> "
        << SixDigits(summary.final_eval_loss);
  }
  log << "\n";
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
  MW_ASSIGN_OR_RETURN(auto file, OpenEvalFile(cfg));
  MW_RETURN_IF_ERROR(CheckEvalFits(*file, cfg));
  EvalResult r;
  MW_ASSIGN_OR_RETURN(r.loss, EvalLoss(net, *file, cfg.data.seq_len, cfg.eval.windows,
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
  } catch (const c10::Error& e) {
    return Internal(std::string(what) + ": libtorch error: " + e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kUnavailable, std::string(what) + ": out of memory");
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
