// TrainerMetrics: every series exists at zero, RecordX moves the right ones, and
// docs/metrics.md lists exactly the metrics the registry exposes.
#include "metrics/trainer_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include "tests/common/metrics_docs.h"

namespace meshwork::metrics {
namespace {

using ::meshwork::testing::ExposedNames;
using ::meshwork::testing::ReadMetricsDocs;

using ::testing::HasSubstr;

const std::map<std::string, std::string> kLabels = {{"job", "j"}, {"rank", "0"}};

std::string Serialize(const prometheus::Registry& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry.Collect());
  return out.str();
}

// The value of the one sample line `series` (name plus labels, as serialized), or NaN.
double Sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  ADD_FAILURE() << "no series " << series << " in:\n" << text;
  return std::nan("");
}

std::string Series(const std::string& name, const std::string& extra_labels = "") {
  return name + "{job=\"j\",rank=\"0\"" + extra_labels + "}";
}

StepSample MakeSample(int64_t step) {
  StepSample s;
  s.step = step;
  s.loss = 3.0 - 0.1 * static_cast<double>(step);
  s.step_seconds = 0.2;
  s.tokens = 1000;
  s.tokens_per_second = 5000;
  s.mfu = 0.42;
  s.learning_rate = 6e-4;
  s.grad_norm = 1.5;
  return s;
}

TEST(TrainerMetricsTest, EverySeriesExistsAtZeroAfterConstruction) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  const std::string text = Serialize(registry);
  for (const char* name :
       {"meshwork_trainer_steps_total", "meshwork_trainer_tokens_total", "meshwork_trainer_step",
        "meshwork_trainer_total_steps", "meshwork_trainer_loss", "meshwork_trainer_eval_loss",
        "meshwork_trainer_tokens_per_second", "meshwork_trainer_step_seconds",
        "meshwork_trainer_step_duration_seconds_count",
        "meshwork_trainer_step_duration_seconds_sum", "meshwork_trainer_mfu_ratio",
        "meshwork_trainer_learning_rate", "meshwork_trainer_grad_norm",
        "meshwork_trainer_exposed_comm_seconds_total", "meshwork_trainer_checkpoint_stall_seconds",
        "meshwork_trainer_resumed_from_step"}) {
    EXPECT_EQ(Sample(text, Series(name)), 0.0) << name;
  }
  for (const char* c : {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "send"}) {
    EXPECT_EQ(Sample(text, Series("meshwork_trainer_comm_bytes_total", std::string(",collective=\"") + c + "\"")), 0.0) << c;
  }
  for (const char* k : {"parameters", "gradients", "optimizer", "weight_copies"}) {
    EXPECT_EQ(Sample(text, Series("meshwork_trainer_state_bytes", std::string(",kind=\"") + k + "\"")), 0.0) << k;
  }
  for (const char* device : {"cpu", "cuda"}) {
    const std::string label = std::string(",device=\"") + device + "\"";
    EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_current_bytes", label)), 0.0);
    EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_peak_bytes", label)), 0.0);
  }
  EXPECT_THAT(text, HasSubstr("# TYPE meshwork_trainer_steps_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE meshwork_trainer_tokens_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE meshwork_trainer_step_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE meshwork_trainer_mfu_ratio gauge"));
}

TEST(TrainerMetricsTest, StepDurationBucketsSpanOneMillisecondToOneMinute) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_bucket",
                                ",le=\"0.001\"")), 0.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_bucket", ",le=\"60\"")),
            0.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_bucket",
                                ",le=\"+Inf\"")), 0.0);
}

TEST(TrainerMetricsTest, RecordStepCountsStepsAccumulatesTokensAndSetsGauges) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.RecordStep(MakeSample(11));
  StepSample last = MakeSample(12);
  last.tokens = 500;
  last.step_seconds = 0.03;
  metrics.RecordStep(last);

  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_steps_total")), 2.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_tokens_total")), 1500.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step")), 12.0);
  EXPECT_DOUBLE_EQ(Sample(text, Series("meshwork_trainer_loss")), last.loss);
  EXPECT_DOUBLE_EQ(Sample(text, Series("meshwork_trainer_step_seconds")), 0.03);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_tokens_per_second")), 5000.0);
  EXPECT_DOUBLE_EQ(Sample(text, Series("meshwork_trainer_mfu_ratio")), 0.42);
  EXPECT_DOUBLE_EQ(Sample(text, Series("meshwork_trainer_learning_rate")), 6e-4);
  EXPECT_DOUBLE_EQ(Sample(text, Series("meshwork_trainer_grad_norm")), 1.5);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_count")), 2.0);
  EXPECT_DOUBLE_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_sum")), 0.23);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_bucket",
                                ",le=\"0.05\"")), 1.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step_duration_seconds_bucket",
                                ",le=\"0.25\"")), 2.0);
}

TEST(TrainerMetricsTest, RecordMemoryEvalAndTotalStepsSetTheirGauges) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.RecordMemory(100, 200, 80, "cuda");
  metrics.RecordMemory(300, 400, 500, "cpu");
  metrics.RecordEval(1.25);
  metrics.SetTotalSteps(1000);

  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_current_bytes", ",device=\"cuda\"")),
            100.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_peak_bytes", ",device=\"cuda\"")),
            200.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_current_bytes", ",device=\"cpu\"")),
            300.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_peak_bytes", ",device=\"cpu\"")), 400.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_limit_bytes", ",device=\"cuda\"")), 80.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_memory_limit_bytes", ",device=\"cpu\"")), 500.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_eval_loss")), 1.25);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_total_steps")), 1000.0);
}

TEST(TrainerMetricsTest, AResumeSetsTheStepAndKeepsWhereItResumedFrom) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.SetResumedStep(40);
  StepSample sample;
  sample.step = 41;
  metrics.RecordStep(sample);
  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_step")), 41.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_resumed_from_step")), 40.0);
}

TEST(TrainerMetricsTest, ThePlanAdviceSetsItsGaugesFromZero) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  EXPECT_EQ(Sample(Serialize(registry), Series("meshwork_trainer_plan_fitted_mfu")), 0.0) << "not advised yet";
  metrics.RecordPlanAdvice(0.0312, 1.25);
  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_plan_fitted_mfu")), 0.0312);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_plan_predicted_speedup")), 1.25);
}

TEST(TrainerMetricsTest, CommunicationAccumulatesAndStateBytesAreSet) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.RecordCommunication(0.5, {{"all_gather", 1000}, {"reduce_scatter", 0}});
  metrics.RecordCommunication(0.25, {{"all_gather", 24}, {"reduce_scatter", 8}});
  metrics.SetStateBytes("parameters", 4096);
  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_exposed_comm_seconds_total")), 0.75);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_comm_bytes_total", ",collective=\"all_gather\"")), 1024.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_comm_bytes_total", ",collective=\"reduce_scatter\"")), 8.0);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_state_bytes", ",kind=\"parameters\"")), 4096.0);
}

TEST(TrainerMetricsTest, SetInfoKeepsExactlyOneSeries) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.SetInfo("llama", "tiny", "cpu", 1, "1x1x1");
  metrics.SetInfo("llama", "small", "cuda", 8, "2x4x1");

  const std::string text = Serialize(registry);
  EXPECT_EQ(Sample(text, Series("meshwork_trainer_info", ",device=\"cuda\",mesh=\"2x4x1\",model=\"llama\","
                                                         "preset=\"small\",world_size=\"8\"")),
            1.0);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("preset=\"tiny\"")));
}

TEST(TrainerMetricsTest, DocsListEveryExposedMetric) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.SetInfo("llama", "tiny", "cpu", 1, "1x1x1");
  const std::string docs = ReadMetricsDocs();
  ASSERT_FALSE(docs.empty()) << "cannot read docs/metrics.md";
  const std::set<std::string> exposed = ExposedNames(registry);
  EXPECT_EQ(exposed.size(), 23u);
  for (const auto& name : exposed) {
    // A table row starts with the name in backticks.
    EXPECT_THAT(docs, HasSubstr("| `" + name + "`")) << name << " is not in docs/metrics.md";
  }
}

TEST(TrainerMetricsTest, DocsListNoMetricTheTrainerDoesNotExpose) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry, kLabels);
  metrics.SetInfo("llama", "tiny", "cpu", 1, "1x1x1");  // the info family is empty until then
  const std::set<std::string> exposed = ExposedNames(registry);
  const std::string docs = ReadMetricsDocs();
  const std::regex name_re("meshwork_trainer_[a-z0-9_]+");
  for (auto it = std::sregex_iterator(docs.begin(), docs.end(), name_re);
       it != std::sregex_iterator(); ++it) {
    std::string name = it->str();
    for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
      const auto family = name.substr(0, name.size() - std::min(name.size(), suffix.size()));
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          exposed.count(family) != 0) {
        name = family;
      }
    }
    EXPECT_EQ(exposed.count(name), 1u) << "docs/metrics.md names " << name
                                       << ", which the trainer does not expose";
  }
}

}  // namespace
}  // namespace meshwork::metrics
