// TrainerMetrics: names, help strings and buckets of the trainer's metrics (see docs/metrics.md).
#include "metrics/trainer_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace meshwork::metrics {
namespace {

using Labels = std::map<std::string, std::string>;

prometheus::Counter& MakeCounter(prometheus::Registry& r, const Labels& labels,
                                 const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r).Add({});
}

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const Labels& labels,
                             const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(r).Add({});
}

// Pre-creates the cpu and cuda series so an alert on either never finds the series absent.
prometheus::Family<prometheus::Gauge>& MakeDeviceGauges(prometheus::Registry& r,
                                                        const Labels& labels,
                                                        const std::string& name,
                                                        const std::string& help) {
  auto& family = prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(r);
  family.Add({{"device", "cpu"}});
  family.Add({{"device", "cuda"}});
  return family;
}

// 1 ms (a tiny CPU model) to 60 s (a large model's step with many micro-batches), about three
// buckets per decade so quantiles stay within a factor of ~2.
// Known label values, created at zero so that rate() and alerts see every series from the start.
// "recv" is not here: a receive sends nothing.
constexpr const char* kCollectives[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "send"};
constexpr const char* kStateKinds[] = {"parameters", "gradients", "optimizer", "weight_copies"};

prometheus::Histogram::BucketBoundaries StepDurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
          0.5,   1.0,    2.5,   5.0,  10.0,  20.0,  30.0, 60.0};
}

}  // namespace

TrainerMetrics::TrainerMetrics(prometheus::Registry& registry, const Labels& const_labels)
    : steps_total_(MakeCounter(registry, const_labels, "meshwork_trainer_steps_total",
                               "Optimizer steps completed by this process.")),
      tokens_total_(MakeCounter(registry, const_labels, "meshwork_trainer_tokens_total",
                                "Training tokens consumed by this rank.")),
      step_(MakeGauge(registry, const_labels, "meshwork_trainer_step",
                      "Last completed optimizer step (resumes from the checkpoint).")),
      total_steps_(MakeGauge(registry, const_labels, "meshwork_trainer_total_steps",
                             "Optimizer steps the run is configured to take.")),
      resumed_from_step_(MakeGauge(registry, const_labels, "meshwork_trainer_resumed_from_step",
                                   "The checkpoint's step this run resumed from; 0 for a fresh start.")),
      loss_(MakeGauge(registry, const_labels, "meshwork_trainer_loss",
                      "Training loss of the last completed step.")),
      eval_loss_(MakeGauge(registry, const_labels, "meshwork_trainer_eval_loss",
                           "Loss of the last evaluation.")),
      tokens_per_second_(MakeGauge(registry, const_labels, "meshwork_trainer_tokens_per_second",
                                   "Training throughput of this rank over the last step.")),
      step_seconds_(MakeGauge(registry, const_labels, "meshwork_trainer_step_seconds",
                              "Wall time of the last completed step.")),
      step_duration_seconds_(prometheus::BuildHistogram()
                                 .Name("meshwork_trainer_step_duration_seconds")
                                 .Help("Distribution of step wall times.")
                                 .Labels(const_labels)
                                 .Register(registry)
                                 .Add({}, StepDurationBuckets())),
      mfu_ratio_(MakeGauge(registry, const_labels, "meshwork_trainer_mfu_ratio",
                           "Model FLOPs utilisation of the last step, 0..1.")),
      learning_rate_(MakeGauge(registry, const_labels, "meshwork_trainer_learning_rate",
                               "Learning rate used by the last step.")),
      grad_norm_(MakeGauge(registry, const_labels, "meshwork_trainer_grad_norm",
                           "Global gradient norm of the last step, before clipping.")),
      memory_current_bytes_(MakeDeviceGauges(registry, const_labels,
                                             "meshwork_trainer_memory_current_bytes",
                                             "Memory in use now, per device kind.")),
      memory_limit_bytes_(MakeDeviceGauges(registry, const_labels,
                                           "meshwork_trainer_memory_limit_bytes",
                                           "Memory this process can use on the device: GPU total, or the container's limit.")),
      memory_peak_bytes_(MakeDeviceGauges(registry, const_labels,
                                          "meshwork_trainer_memory_peak_bytes",
                                          "Peak memory in use, per device kind.")),
      info_(prometheus::BuildGauge()
                .Name("meshwork_trainer_info")
                .Help("Always 1; labels describe the run (model, preset, device, world_size, mesh).")
                .Labels(const_labels)
                .Register(registry)),
      exposed_comm_seconds_total_(MakeCounter(
          registry, const_labels, "meshwork_trainer_exposed_comm_seconds_total",
          "Seconds this rank was blocked waiting on collectives that computation did not hide.")),
      comm_bytes_total_(prometheus::BuildCounter()
                            .Name("meshwork_trainer_comm_bytes_total")
                            .Help("Bytes this rank sent in collectives, by collective.")
                            .Labels(const_labels)
                            .Register(registry)),
      state_bytes_(prometheus::BuildGauge()
                       .Name("meshwork_trainer_state_bytes")
                       .Help("Bytes of model state this rank holds, by kind (sharded under FSDP).")
                       .Labels(const_labels)
                       .Register(registry)),
      checkpoint_stall_seconds_(MakeGauge(
          registry, const_labels, "meshwork_trainer_checkpoint_stall_seconds",
          "Seconds the last checkpoint save held training (async: its copy to host memory).")),
      plan_fitted_mfu_(MakeGauge(registry, const_labels, "meshwork_trainer_plan_fitted_mfu",
                                 "The hardware profile's achieved MFU refitted to the measured steps by the plan "
                                 "advice (0: not refitted yet).")),
      plan_predicted_speedup_(MakeGauge(registry, const_labels, "meshwork_trainer_plan_predicted_speedup",
                                        "The plan search's best plan's predicted speed over the running plan's at "
                                        "the refitted compute rate (0: not advised yet; 1: the running plan is the "
                                        "best).")) {
  for (const char* c : kCollectives) comm_bytes_total_.Add({{"collective", c}});
  for (const char* k : kStateKinds) state_bytes_.Add({{"kind", k}});
}

void TrainerMetrics::RecordStep(const StepSample& s) {
  steps_total_.Increment();
  tokens_total_.Increment(s.tokens);  // prometheus-cpp ignores a negative increment
  step_.Set(static_cast<double>(s.step));
  loss_.Set(s.loss);
  step_seconds_.Set(s.step_seconds);
  step_duration_seconds_.Observe(s.step_seconds);
  tokens_per_second_.Set(s.tokens_per_second);
  mfu_ratio_.Set(s.mfu);
  learning_rate_.Set(s.learning_rate);
  grad_norm_.Set(s.grad_norm);
}

void TrainerMetrics::RecordMemory(int64_t current_bytes, int64_t peak_bytes, int64_t limit_bytes,
                                  const std::string& device) {
  // Family::Add returns the existing series for known labels, so this does not grow the family.
  memory_current_bytes_.Add({{"device", device}}).Set(static_cast<double>(current_bytes));
  memory_peak_bytes_.Add({{"device", device}}).Set(static_cast<double>(peak_bytes));
  memory_limit_bytes_.Add({{"device", device}}).Set(static_cast<double>(limit_bytes));
}

void TrainerMetrics::RecordEval(double loss) { eval_loss_.Set(loss); }

void TrainerMetrics::SetResumedStep(int64_t step) {
  step_.Set(static_cast<double>(step));
  resumed_from_step_.Set(static_cast<double>(step));
}

void TrainerMetrics::SetTotalSteps(int64_t total_steps) {
  total_steps_.Set(static_cast<double>(total_steps));
}

void TrainerMetrics::SetInfo(const std::string& model, const std::string& preset,
                             const std::string& device, int world_size, const std::string& mesh) {
  // An info metric has exactly one series; a stale one would double-count in joins.
  if (info_series_ != nullptr) info_.Remove(info_series_);
  info_series_ = &info_.Add({{"model", model},
                             {"preset", preset},
                             {"device", device},
                             {"world_size", std::to_string(world_size)},
                             {"mesh", mesh}});
  info_series_->Set(1.0);
}

void TrainerMetrics::RecordCommunication(double exposed_seconds,
                                         const std::map<std::string, double>& bytes_sent) {
  exposed_comm_seconds_total_.Increment(exposed_seconds);
  for (const auto& [collective, bytes] : bytes_sent) {
    if (bytes > 0) comm_bytes_total_.Add({{"collective", collective}}).Increment(bytes);
  }
}

void TrainerMetrics::SetStateBytes(const std::string& kind, double bytes) {
  state_bytes_.Add({{"kind", kind}}).Set(bytes);
}

void TrainerMetrics::RecordCheckpointStall(double seconds) { checkpoint_stall_seconds_.Set(seconds); }

void TrainerMetrics::RecordPlanAdvice(double fitted_mfu, double predicted_speedup) {
  plan_fitted_mfu_.Set(fitted_mfu);
  plan_predicted_speedup_.Set(predicted_speedup);
}

}  // namespace meshwork::metrics
