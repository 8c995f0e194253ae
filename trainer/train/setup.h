// Everything the training loop needs before its first step, made once and in order: device,
// model, parallelism (the engine applies FSDP and, compiled, plans after step 2), data, metrics,
// optimizer, resume from the latest checkpoint, the reporter, and the opening log lines.
#pragma once

#include <prometheus/registry.h>
#include <torch/torch.h>

#include <memory>
#include <ostream>
#include <sstream>
#include <string>

#include "common/status.h"
#include "metrics/exposer.h"
#include "metrics/trainer_metrics.h"
#include "trainer/config/config.h"
#include "trainer/data/token_file.h"
#include "trainer/data/token_source.h"
#include "trainer/model/llama.h"
#include "trainer/train/adamw.h"
#include "trainer/train/checkpoint.h"
#include "trainer/train/device.h"
#include "trainer/train/engine.h"
#include "trainer/train/profile.h"
#include "trainer/train/report.h"
#include "trainer/train/trainer.h"

namespace meshwork::train {

// One training run's parts. Members are declared in the order they are made, so each outlives
// what refers to it (the checkpointer holds the engine and the optimizer, the report the
// metrics, the log and the summary).
struct TrainingRun {
  const config::TrainConfig& cfg;
  std::ostringstream discard;  // ranks other than 0 log here
  std::ostream* out = nullptr;  // the log on rank 0, `discard` elsewhere
  torch::Device device = torch::kCPU;
  bool autocast = false;
  model::LlamaConfig dims;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<data::TokenSource> source;
  std::unique_ptr<data::TokenFile> eval_file;  // null: no evaluation
  std::unique_ptr<metrics::MetricsServer> server;  // null: metrics.port -1
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<metrics::TrainerMetrics> metrics;
  std::unique_ptr<AdamW> optimizer;
  // Persistent bf16 weight copies the model reads and the optimizer writes (training.weight_copies;
  // model/weight_copies.h), or null.
  std::shared_ptr<model::WeightCopies> weight_copies;
  std::unique_ptr<Checkpointer> checkpointer;
  ResumePoint resumed;
  TrainSummary summary;
  std::unique_ptr<ProgressReport> report;
  std::unique_ptr<StepProfiler> profiler;  // null: training.profile_out unset, or not rank 0

  explicit TrainingRun(const config::TrainConfig& c) : cfg(c) {}
  std::ostream& log() { return *out; }
  int64_t first_step() const { return resumed.step; }
  // Mean loss over eval.windows windows of the eval file (every rank takes part).
  Result<double> EvalLoss();
};

Result<std::unique_ptr<TrainingRun>> SetUpTraining(const config::TrainConfig& cfg, std::ostream& log);

// Shared with `meshwork-train eval`. With model.init_from the checkpoint's tensors are checked
// against the model here, from their headers; ImportWeights reads them once an engine holds the
// model.
Result<model::LlamaForCausalLM> BuildModel(const config::TrainConfig& cfg, const torch::Device& device,
                                           std::ostream& log);
// model.init_from's weights into `engine`'s parameters: each rank reads only the bytes of its
// own pieces (Engine::LocalShards: an FSDP shard, a tensor parallel slice, or all of a parameter
// on one process), so a sharded run reads about one copy of the checkpoint per replica (HSDP's
// dp_replicate; each tp rank also reads the replicated norms), not one per rank.
// Collective: when one rank cannot read its part, every rank fails (InvalidInput).
Status ImportWeights(const config::TrainConfig& cfg, Engine& engine, std::ostream& log);
bool UseAutocast(const config::TrainConfig& cfg, const torch::Device& device);
// Whether the residual stream runs in bf16 on `device` (config::UsesBf16Residual, its error
// saying what the device resolved to).
Result<bool> Bf16Residual(const config::TrainConfig& cfg, const torch::Device& device);
// eval.data (or data.val), checked to hold eval.windows windows.
Result<std::unique_ptr<data::TokenFile>> OpenEvalFile(const config::TrainConfig& cfg);
Result<double> EvalLoss(Engine& engine, const model::LlamaConfig& dims, const data::TokenFile& file,
                        int64_t seq_len, int64_t windows, int64_t batch, const torch::Device& device,
                        bool autocast);

}  // namespace meshwork::train
