// What the training loop reports: after every step the Prometheus metrics, the logging.jsonl
// record and, every logging.every steps, the progress line; at the end the run's totals and its
// closing lines. The loop hands it one StepRecord per step and reads nothing back.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>

#include "metrics/trainer_metrics.h"
#include "common/status.h"
#include "trainer/train/device.h"
#include "trainer/train/engine.h"
#include "trainer/train/trainer.h"

namespace meshwork::train {

std::string Format(const char* fmt, double v);  // one number through printf's `fmt`
std::string Duration(double seconds);           // "45s", "2m00s" (never "1m60s"), "1h05m"

// One optimizer step, as the loop measured it.
struct StepRecord {
  int64_t step = 0;  // 0-based
  double loss = 0;   // mean over the ranks
  double lr = 0;
  double grad_norm = 0;
  double seconds = 0;
  EngineStats comm;      // the engine's TakeStats() after the step
  MemorySample memory;
};

class ProgressReport {
 public:
  struct Run {
    int64_t first_step = 0;  // the step a resumed run starts at
    int64_t total_steps = 0;
    int64_t tokens_per_step = 0;  // global
    int64_t log_every = 1;
    int world_size = 1;
    double flops_per_token = 0;
    double peak_flops = 0;  // of one device, what MFU is relative to
    int64_t steady_from_step = 1;  // Engine::SteadyFromStep()
  };

  // `jsonl_path` non-empty: appends one JSON object per step there (rank 0 passes
  // logging.jsonl, the others ""); an IOError naming the key when it cannot be opened.
  // `summary` collects the run's totals and must outlive the report.
  static Result<std::unique_ptr<ProgressReport>> Create(Run run, const std::string& jsonl_path,
                                                        metrics::TrainerMetrics& metrics, std::ostream& out,
                                                        TrainSummary& summary);

  // The loop starts now (ETA and throughput count from here).
  void Start();
  // An IOError naming logging.jsonl when its line could not be written (a full disk): the run
  // stops rather than go on losing its record.
  Status Step(const StepRecord& r);
  // The run's totals into the summary: steps, tokens, seconds, throughput without the first
  // (warm-up) step, mean MFU.
  void Finish();
  // The closing lines: communication totals (several ranks) and "done: ...".
  void PrintSummary(bool has_eval) const;

 private:
  ProgressReport(Run run, std::string jsonl_path, std::unique_ptr<std::ofstream> jsonl, metrics::TrainerMetrics& metrics,
                 std::ostream& out, TrainSummary& summary)
      : run_(run),
        jsonl_path_(std::move(jsonl_path)),
        jsonl_(std::move(jsonl)),
        metrics_(metrics),
        out_(out),
        summary_(summary) {}

  using Clock = std::chrono::steady_clock;
  Run run_;
  std::string jsonl_path_;
  std::unique_ptr<std::ofstream> jsonl_;
  metrics::TrainerMetrics& metrics_;
  std::ostream& out_;
  TrainSummary& summary_;
  Clock::time_point start_, after_first_;
};

}  // namespace meshwork::train
