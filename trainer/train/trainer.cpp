#include "trainer/train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/config/hardware.h"
#include "trainer/data/tokenizer.h"
#include "trainer/dist/env.h"
#include "trainer/io/hf_checkpoint.h"
#include "trainer/model/compat.h"
#include "trainer/model/llama.h"
#include "trainer/train/checkpoint.h"
#include "trainer/train/device.h"
#include "trainer/train/engine.h"
#include "trainer/train/plan_advice.h"
#include "trainer/train/report.h"
#include "trainer/train/schedule.h"
#include "trainer/train/setup.h"
#include "trainer/train/terminate.h"

namespace meshwork::train {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
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
  MW_RETURN_IF_ERROR(io::SaveHfCheckpoint(cfg.checkpoint.export_hf, dims, *copy, dtype));
  // The run's tokenizer (data.tokenizer, else the one the model was imported with) goes beside it, so
  // the export loads with its tokenizer.
  const std::string& tokenizer = !cfg.data.tokenizer.empty() ? cfg.data.tokenizer : cfg.model.init_from;
  if (tokenizer.empty() || (cfg.data.tokenizer.empty() && data::FindTokenizerFile(tokenizer).empty())) {
    return Status::Ok();
  }
  io::TokenizerConfigDefaults defaults;
  if (auto tok = data::LoadTokenizer(tokenizer); tok.ok()) {
    const auto& t = **tok;
    auto text = [&t](uint32_t id) {
      auto decoded = t.Decode({id});
      return decoded.ok() ? *decoded : std::string();
    };
    if (t.bos()) defaults.bos_token = text(*t.bos());
    defaults.eos_token = text(t.eos());
  }
  MW_RETURN_IF_ERROR(io::CopyTokenizerFiles(tokenizer, cfg.checkpoint.export_hf, defaults).status());
  return Status::Ok();
}

// A host batch on `device`. For a GPU it goes through page-locked memory first, so the copy is
// asynchronous (from pageable memory `non_blocking` is not).
torch::Tensor ToDevice(const torch::Tensor& host, const torch::Device& device) {
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

// One optimizer step: learning rate, forward and backward over the micro-batches (gradients
// are reduced on the last), clip to the global norm, update, and the loss averaged over ranks.
Result<StepRecord> TrainStep(TrainingRun& r, int64_t step) {
  const config::TrainConfig& cfg = r.cfg;
  Engine& engine = *r.engine;
  const auto t0 = Clock::now();
  ResetTensorPeak(r.device);  // the record's tensor peak is this step's
  MW_RETURN_IF_ERROR(engine.BeginStep());  // compiled FSDP plans before step 2
  const double lr = LearningRate(cfg.schedule, cfg.optimizer.lr, step);
  const bool updates_inside = engine.UpdatesInsideStep();  // an asynchronous pipeline's stages step themselves
  r.optimizer->set_lr(lr);
  if (!updates_inside) engine.ZeroGrad();

  const int64_t rows = cfg.data.batch_size;
  const int64_t accum = cfg.training.grad_accum;
  torch::Tensor loss_sum;  // on the device: read once, after the optimizer step
  if (engine.RunsWholeSteps()) {
    std::vector<std::pair<torch::Tensor, torch::Tensor>> microbatches;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const int64_t first_row = (micro * engine.dp_size() + engine.dp_rank()) * rows;
      MW_ASSIGN_OR_RETURN(data::Batch batch, r.source->Rows(step, first_row, rows));
      microbatches.emplace_back(ToDevice(batch.inputs, r.device), ToDevice(batch.targets, r.device));
    }
    compat::CudaAutocastGuard amp(r.autocast, torch::kBFloat16);
    MW_ASSIGN_OR_RETURN(loss_sum, engine.StepLoss(step, microbatches));
  }
  for (int64_t micro = 0; micro < accum && !engine.RunsWholeSteps(); ++micro) {
    const bool sync = micro + 1 == accum;
    // Rows of the global batch: micro-batch by micro-batch, each split across the dp ranks.
    const int64_t first_row = (micro * engine.dp_size() + engine.dp_rank()) * rows;
    MW_ASSIGN_OR_RETURN(data::Batch batch, r.source->Rows(step, first_row, rows));
    torch::Tensor loss;
    {
      compat::CudaAutocastGuard amp(r.autocast, torch::kBFloat16);
      loss = engine.Loss(ToDevice(batch.inputs, r.device), ToDevice(batch.targets, r.device), sync) /
             static_cast<double>(accum);
    }
    loss.backward();
    MW_RETURN_IF_ERROR(engine.AfterBackward(sync));
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }

  // Clip to the global norm (an infinite limit only measures it) inside the optimizer's update,
  // by torch::nn::utils::clip_grad_norm_'s rule (factor max / (norm + 1e-6) when below 1).
  const double max_norm =
      cfg.optimizer.grad_clip > 0 ? cfg.optimizer.grad_clip : std::numeric_limits<double>::infinity();
  MW_ASSIGN_OR_RETURN(const torch::Tensor grad_norm, engine.GradNorm());
  if (!updates_inside) r.optimizer->Step((max_norm / (grad_norm + 1e-6)).clamp_max(1.0));

  // The step's host-device sync, for the loss and the norm (the log, the NaN check, metrics).
  MW_ASSIGN_OR_RETURN(const double loss, engine.AverageAcrossRanks(loss_sum.item<double>()));
  if (!std::isfinite(loss)) {
    return Internal("training diverged: loss is " + Format("%g", loss) + " at step " + std::to_string(step + 1) +
                    " (lower optimizer.lr or raise schedule.warmup_steps)");
  }
  const double grad_norm_value = grad_norm.item<double>();
  const double seconds = Seconds(t0);
  engine.EndStep(seconds);
  return StepRecord{step, loss, lr, grad_norm_value, seconds, engine.TakeStats(), SampleMemory(r.device)};
}

// A checkpoint of the steps so far (checkpoint.every, the last step, or a SIGTERM).
Status SaveCheckpoint(TrainingRun& r, int64_t steps_done) {
  const config::TrainConfig& cfg = r.cfg;
  const auto t_save = Clock::now();
  MW_RETURN_IF_ERROR(r.engine->Drain());  // the checkpoint holds every update of the steps before it
  r.checkpointer->SetSamplesConsumed(r.source->SamplesBefore(steps_done));
  MW_RETURN_IF_ERROR(r.checkpointer->Save(steps_done));
  r.metrics->RecordCheckpointStall(r.checkpointer->last_stall_seconds());
  if (cfg.checkpoint.async) {
    r.log() << "checkpoint: saving " << cfg.checkpoint.dir << "/" << StepDirName(steps_done)
            << " in the background; the step stalled " << Format("%.3f", r.checkpointer->last_stall_seconds())
            << " s (the previous save's wait and the copy to host memory)\n";
  } else {
    r.log() << "checkpoint: saved " << cfg.checkpoint.dir << "/" << StepDirName(steps_done) << " in "
            << Format("%.2f", Seconds(t_save)) << " s\n";
  }
  r.log().flush();
  return Status::Ok();
}

// Between steps: evaluation every eval.every steps (not after the last: the run ends with one),
// and a checkpoint when checkpoint.every says so.
Status AfterStep(TrainingRun& r, int64_t steps_done) {
  const config::TrainConfig& cfg = r.cfg;
  const bool last = steps_done == cfg.schedule.steps;
  if (r.eval_file && cfg.eval.every > 0 && steps_done % cfg.eval.every == 0 && !last) {
    MW_ASSIGN_OR_RETURN(double loss, r.EvalLoss());
    r.metrics->RecordEval(loss);
    r.log() << "eval at step " << steps_done << ": loss " << SixDigits(loss) << "\n";
  }
  if (r.checkpointer->Due(steps_done, cfg.schedule.steps)) MW_RETURN_IF_ERROR(SaveCheckpoint(r, steps_done));
  return Status::Ok();
}

// With checkpoint.save_on_terminate (terminate.h): whether any rank has got SIGTERM, agreed at the
// end of a step by every rank (the same answer everywhere, so they all stop after the same step).
Result<bool> TerminateAgreed(TrainingRun& r, const TerminateSignal& terminate) {
  MW_ASSIGN_OR_RETURN(const double any, r.engine->AverageAcrossRanks(terminate.received() ? 1.0 : 0.0));
  return any > 0;
}

// The checkpoint of `steps_done` (unless that step's is saved already), committed, then the run
// ends there: the next one resumes from it.
Result<TrainSummary> StopAfterTerminate(TrainingRun& r, int64_t steps_done) {
  const config::TrainConfig& cfg = r.cfg;
  if (!r.checkpointer->Due(steps_done, cfg.schedule.steps)) MW_RETURN_IF_ERROR(SaveCheckpoint(r, steps_done));
  if (cfg.checkpoint.async) MW_RETURN_IF_ERROR(r.checkpointer->Finish());
  r.log() << "stopped by SIGTERM after step " << steps_done << " of " << cfg.schedule.steps << ": its checkpoint is "
          << cfg.checkpoint.dir << "/" << StepDirName(steps_done)
          << " (checkpoint.save_on_terminate); the next run resumes there\n";
  r.log().flush();
  r.summary.stopped_at = steps_done;
  return r.summary;
}

// dist.advise_after_steps: the plan advice (plan_advice.h) from this run's steady steps, the
// median of each rank's averaged over the ranks (a collective: every rank calls it at the same
// step). Rank 0 searches and says what it found; a failure to advise is said, not fatal.
Status AdvisePlanOnce(TrainingRun& r, const std::vector<double>& step_seconds) {
  const int64_t steady = std::max<int64_t>(2, r.engine->SteadyFromStep());
  if (static_cast<int64_t>(step_seconds.size()) < steady + 3) {
    r.log() << "plan advice: not given: " << step_seconds.size() << " steps of this run with the first steady one at "
            << steady << " leave fewer than 3 to measure (raise dist.advise_after_steps)\n";
    return Status::Ok();
  }
  std::vector<double> steady_steps(step_seconds.begin() + steady, step_seconds.end());
  std::nth_element(steady_steps.begin(), steady_steps.begin() + steady_steps.size() / 2, steady_steps.end());
  MW_ASSIGN_OR_RETURN(const double measured, r.engine->AverageAcrossRanks(steady_steps[steady_steps.size() / 2]));
  if (r.engine->rank() != 0) return Status::Ok();
  const bool cuda = r.device.is_cuda();
  const compiler::ParallelPlan running = RunningPlan(r.cfg, r.engine->mesh_shape());
  const int per_node = [] {
    auto env = dist::ReadDistEnv();
    return env.ok() ? env->local_world_size : 1;
  }();
  Result<PlanAdvice> advice = [&]() -> Result<PlanAdvice> {
    MW_ASSIGN_OR_RETURN(const compiler::HardwareProfile profile, config::MeshProfile(r.cfg, cuda, per_node));
    return AdvisePlan(profile, RunningSearch(r.cfg, running), running, measured);
  }();
  if (!advice.ok()) {
    r.log() << "plan advice: not given: " << advice.status().message() << "\n";
    return Status::Ok();
  }
  r.log() << DescribeAdvice(*advice) << "\n";
  r.metrics->RecordPlanAdvice(advice->fitted_mfu, advice->speedup);
  return Status::Ok();
}

Result<TrainSummary> TrainImpl(const config::TrainConfig& cfg, std::ostream& log) {
  MW_ASSIGN_OR_RETURN(std::unique_ptr<TrainingRun> run, SetUpTraining(cfg, log));
  TrainingRun& r = *run;
  if (r.eval_file && r.first_step() == 0) {
    MW_ASSIGN_OR_RETURN(r.summary.initial_eval_loss, r.EvalLoss());
    r.metrics->RecordEval(r.summary.initial_eval_loss);
    r.log() << "eval before training: loss " << SixDigits(r.summary.initial_eval_loss) << "\n";
  }

  // SIGTERM saves and stops only where there is somewhere to save (terminate.h).
  std::unique_ptr<TerminateSignal> terminate;
  if (cfg.checkpoint.save_on_terminate && r.checkpointer->enabled()) terminate = TerminateSignal::Install();
  r.report->Start();
  std::vector<double> step_seconds;  // this run's, for the plan advice
  for (int64_t step = r.first_step(); step < cfg.schedule.steps; ++step) {
    if (r.profiler) MW_RETURN_IF_ERROR(r.profiler->BeforeStep(step));
    MW_ASSIGN_OR_RETURN(const StepRecord record, TrainStep(r, step));
    // The first forward makes the copies: their bytes are known from then on.
    if (r.weight_copies) r.metrics->SetStateBytes("weight_copies", static_cast<double>(r.weight_copies->bytes()));
    if (r.profiler) MW_RETURN_IF_ERROR(r.profiler->AfterStep(step, record.seconds, r.log()));
    MW_RETURN_IF_ERROR(r.report->Step(record));  // metrics and logging.jsonl every step, a line every logging.every
    MW_RETURN_IF_ERROR(AfterStep(r, step + 1));
    step_seconds.push_back(record.seconds);
    if (static_cast<int64_t>(step_seconds.size()) == cfg.dist.advise_after_steps) {
      MW_RETURN_IF_ERROR(AdvisePlanOnce(r, step_seconds));
    }
    if (terminate && step + 1 < cfg.schedule.steps) {
      MW_ASSIGN_OR_RETURN(const bool stop, TerminateAgreed(r, *terminate));
      if (stop) return StopAfterTerminate(r, step + 1);
    }
  }
  // Past the last step (its checkpoint saved) there is nothing left to save: SIGTERM kills again,
  // and one that came during that step kills now.
  if (terminate) {
    const bool came = terminate->received();
    terminate.reset();
    if (came) std::raise(SIGTERM);
  }
  // An asynchronous pipeline's last micro-batches through their backwards and updates before the
  // final evaluation and export (a checkpoint at the last step has drained already: no-op).
  MW_RETURN_IF_ERROR(r.engine->Drain());
  r.report->Finish();
  // An asynchronous save still in flight is committed (and its failure reported) before the run ends.
  if (cfg.checkpoint.async) {
    const auto t_wait = Clock::now();
    MW_RETURN_IF_ERROR(r.checkpointer->Finish());
    r.log() << "checkpoint: the last background save is committed (waited " << Format("%.2f", Seconds(t_wait))
            << " s)\n";
  }

  if (r.eval_file) {
    MW_ASSIGN_OR_RETURN(r.summary.final_eval_loss, r.EvalLoss());
    r.metrics->RecordEval(r.summary.final_eval_loss);
    r.log() << "eval after training: loss " << SixDigits(r.summary.final_eval_loss) << "\n";
  }
  if (!cfg.checkpoint.export_hf.empty()) {
    MW_RETURN_IF_ERROR(ExportHf(*r.engine, cfg, r.dims));
    r.log() << "exported Hugging Face model to " << cfg.checkpoint.export_hf << "\n";
  }
  r.report->PrintSummary(r.eval_file != nullptr);
  return r.summary;
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
  std::unique_ptr<Engine> engine = MakeLocalEngine(std::move(net));
  MW_RETURN_IF_ERROR(ImportWeights(cfg, *engine, log));
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
  } catch (const c10::OutOfMemoryError& e) {
    return Unavailable(std::string(what) + ": out of device memory: " + e.what_without_backtrace() +
                       " (lower data.batch_size, or let compiled FSDP plan within the memory: fsdp.mode: compiled, "
                       "training.activation_checkpointing: auto)");
  } catch (const c10::Error& e) {
    // libtorch 1.13's CPU allocator reports running out as a plain c10::Error.
    if (std::string_view(e.what_without_backtrace()).find("can't allocate memory") != std::string_view::npos) {
      const std::string message = e.what_without_backtrace();
      return Unavailable(std::string(what) + ": out of host memory: " + message.substr(0, message.find('\n')) +
                         " (lower data.batch_size or data.seq_len, or the model dims)");
    }
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
  return Guard("train", [&]() -> Result<TrainSummary> {
    // The global batch resolves against this launch's world (an elastic job's resize changes it);
    // every rank resolves alike from the same config and world size.
    MW_ASSIGN_OR_RETURN(const dist::DistEnv env, dist::ReadDistEnv());
    config::TrainConfig resolved = cfg;
    MW_ASSIGN_OR_RETURN(const std::string batch, config::ResolveGlobalBatch(resolved, env.world_size));
    if (!batch.empty() && env.rank == 0) log << batch << "\n";
    return TrainImpl(resolved, log);
  });
}

Result<EvalResult> Evaluate(const config::TrainConfig& cfg, std::ostream& log) {
  return Guard("eval", [&] { return EvaluateImpl(cfg, log); });
}

}  // namespace meshwork::train
