// Every metric the training loop exports, declared in one place and created at zero so that
// dashboards and alerts see each series from the first scrape. Listed in docs/metrics.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace meshwork::metrics {

// What one completed optimizer step reports.
struct StepSample {
  int64_t step = 0;                // the step just completed (1-based)
  double loss = 0.0;               // training loss of this step
  double step_seconds = 0.0;       // wall time of this step
  // Tokens and throughput are this process's (rank's) share, so that sum by (job) in PromQL
  // gives the job's figure without double counting.
  double tokens = 0.0;             // tokens this rank consumed in this step
  double tokens_per_second = 0.0;  // this rank's throughput over this step
  double mfu = 0.0;                // model FLOPs utilisation, 0..1
  double learning_rate = 0.0;      // learning rate used by this step
  double grad_norm = 0.0;          // global gradient norm before clipping
};

class TrainerMetrics {
 public:
  // Registers the trainer's metrics in `registry`, which must outlive this object.
  // `const_labels` (e.g. {"job", name}, {"rank", "0"}) go on every series; label names must be
  // valid Prometheus names (prometheus-cpp throws std::invalid_argument otherwise: a bug, not a
  // config error, since the names come from code).
  TrainerMetrics(prometheus::Registry& registry,
                 const std::map<std::string, std::string>& const_labels);
  TrainerMetrics(const TrainerMetrics&) = delete;
  TrainerMetrics& operator=(const TrainerMetrics&) = delete;

  void RecordStep(const StepSample& sample);
  // `device` is "cpu" or "cuda" (both pre-created); another name adds a series. `limit_bytes`
  // is the device's capacity for this process (0: unknown).
  void RecordMemory(int64_t current_bytes, int64_t peak_bytes, int64_t limit_bytes,
                    const std::string& device);
  void RecordEval(double loss);
  void SetTotalSteps(int64_t total_steps);
  // After a resume: meshwork_trainer_step shows the checkpoint's step before the first new one,
  // and meshwork_trainer_resumed_from_step keeps it for the run's life (0: a fresh start).
  void SetResumedStep(int64_t step);
  // meshwork_trainer_info{model,preset,device,world_size} = 1; a second call replaces the series.
  // `mesh`: "<dp_replicate>x<dp_shard>x<tp>", the mesh in use (dist.mesh: auto's choice too).
  void SetInfo(const std::string& model, const std::string& preset, const std::string& device,
               int world_size, const std::string& mesh);
  // Communication of this rank since the last call: seconds blocked on collectives, and bytes
  // sent per collective ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier",
  // "send": pipeline stages' point-to-point transfers).
  void RecordCommunication(double exposed_seconds, const std::map<std::string, double>& bytes_sent);
  // Bytes this rank holds of the model's state ("parameters", "gradients", "optimizer",
  // "weight_copies").
  void SetStateBytes(const std::string& kind, double bytes);
  // How long the last checkpoint save held training (checkpoint.async: the copy to host memory
  // and the wait for the previous save; else the whole save).
  void RecordCheckpointStall(double seconds);
  // The plan advice (train/plan_advice.h): the compute rate (achieved MFU of the hardware
  // profile) refitted to the measured steps, and the search's best plan's predicted speed over the
  // running plan's at that rate (1: the running plan is the best).
  void RecordPlanAdvice(double fitted_mfu, double predicted_speedup);

 private:
  prometheus::Counter& steps_total_;
  prometheus::Counter& tokens_total_;
  prometheus::Gauge& step_;
  prometheus::Gauge& total_steps_;
  prometheus::Gauge& resumed_from_step_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& eval_loss_;
  prometheus::Gauge& tokens_per_second_;
  prometheus::Gauge& step_seconds_;
  prometheus::Histogram& step_duration_seconds_;
  prometheus::Gauge& mfu_ratio_;
  prometheus::Gauge& learning_rate_;
  prometheus::Gauge& grad_norm_;
  prometheus::Family<prometheus::Gauge>& memory_current_bytes_;
  prometheus::Family<prometheus::Gauge>& memory_limit_bytes_;
  prometheus::Family<prometheus::Gauge>& memory_peak_bytes_;
  prometheus::Family<prometheus::Gauge>& info_;
  prometheus::Counter& exposed_comm_seconds_total_;
  prometheus::Family<prometheus::Counter>& comm_bytes_total_;
  prometheus::Family<prometheus::Gauge>& state_bytes_;
  prometheus::Gauge& checkpoint_stall_seconds_;
  prometheus::Gauge& plan_fitted_mfu_;
  prometheus::Gauge& plan_predicted_speedup_;
  prometheus::Gauge* info_series_ = nullptr;
};

}  // namespace meshwork::metrics
