// OperatorMetrics: every series exists at zero before the first reconcile (scraped over HTTP from
// the metrics server), increments show, the work queue's hooks feed the queue series, and
// docs/metrics.md lists exactly the operator's series.
#include "operator/runtime/operator_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "metrics/exposer.h"
#include "operator/k8s/workqueue.h"
#include "tests/operator/runtime/http_get.h"
#include "tests/common/metrics_docs.h"

namespace meshwork::runtime {
namespace {

using ::meshwork::testing::ExposedNames;
using ::meshwork::testing::ReadMetricsDocs;

using namespace std::chrono_literals;
using testing::HttpGet;
using testing::SampleValue;

class OperatorMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = metrics::MetricsServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    metrics_ = std::make_unique<OperatorMetrics>(*server_->registry(), "0.1.0-test");
  }

  std::string Scrape() {
    auto r = HttpGet(server_->port(), "/metrics");
    EXPECT_EQ(r.status, 200);
    return r.body;
  }

  std::unique_ptr<metrics::MetricsServer> server_;
  std::unique_ptr<OperatorMetrics> metrics_;
};

// Every series named in the design, with its value before anything happened.
const std::vector<std::pair<std::string, double>>& InitialSeries() {
  static const std::vector<std::pair<std::string, double>> series = {
      {"meshwork_operator_reconcile_total{result=\"success\"}", 0},
      {"meshwork_operator_reconcile_total{result=\"error\"}", 0},
      {"meshwork_operator_reconcile_total{result=\"requeue\"}", 0},
      {"meshwork_operator_reconcile_errors_total{reason=\"conflict\"}", 0},
      {"meshwork_operator_reconcile_errors_total{reason=\"api\"}", 0},
      {"meshwork_operator_reconcile_errors_total{reason=\"invalid_spec\"}", 0},
      {"meshwork_operator_reconcile_errors_total{reason=\"other\"}", 0},
      {"meshwork_operator_reconcile_duration_seconds_count", 0},
      {"meshwork_operator_reconcile_duration_seconds_sum", 0},
      {"meshwork_operator_reconcile_duration_seconds_bucket{le=\"0.001\"}", 0},
      {"meshwork_operator_reconcile_duration_seconds_bucket{le=\"10\"}", 0},
      {"meshwork_operator_reconcile_duration_seconds_bucket{le=\"+Inf\"}", 0},
      {"meshwork_operator_workqueue_depth", 0},
      {"meshwork_operator_workqueue_adds_total", 0},
      {"meshwork_operator_workqueue_queue_duration_seconds_count", 0},
      {"meshwork_operator_workqueue_work_duration_seconds_count", 0},
      {"meshwork_operator_workqueue_retries_total", 0},
      {"meshwork_operator_jobs{phase=\"Created\"}", 0},
      {"meshwork_operator_jobs{phase=\"Running\"}", 0},
      {"meshwork_operator_jobs{phase=\"Restarting\"}", 0},
      {"meshwork_operator_jobs{phase=\"Suspended\"}", 0},
      {"meshwork_operator_jobs{phase=\"Succeeded\"}", 0},
      {"meshwork_operator_jobs{phase=\"Failed\"}", 0},
      {"meshwork_operator_pods_created_total", 0},
      {"meshwork_operator_pods_deleted_total", 0},
      {"meshwork_operator_leader", 0},
      {"meshwork_operator_api_throttled_requests_total", 0},
      {"meshwork_operator_api_throttled_seconds_total", 0},
      {"meshwork_operator_info{version=\"0.1.0-test\"}", 1},
  };
  return series;
}

TEST_F(OperatorMetricsTest, EverySeriesIsExposedAtZeroBeforeAnyReconcile) {
  const std::string text = Scrape();
  for (const auto& [series, value] : InitialSeries()) {
    const double got = SampleValue(text, series);
    EXPECT_FALSE(std::isnan(got)) << series << " missing from:\n" << text;
    EXPECT_EQ(got, value) << series;
  }
}

TEST_F(OperatorMetricsTest, ReconcileCountersAndHistogramIncrement) {
  metrics_->ObserveReconcile(ReconcileResult::kSuccess, 0.02);
  metrics_->ObserveReconcile(ReconcileResult::kSuccess, 0.003);
  metrics_->ObserveReconcile(ReconcileResult::kError, 2.0);
  metrics_->ObserveReconcile(ReconcileResult::kRequeue, 0.5);
  metrics_->CountError(ReconcileErrorReason::kConflict);
  metrics_->CountError(ErrorReasonFor(k8s::Error(k8s::ErrorKind::kServerError, "boom")));
  metrics_->CountError(ReconcileErrorReason::kInvalidSpec);
  const std::string t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_total{result=\"success\"}"), 2);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_total{result=\"error\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_total{result=\"requeue\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_errors_total{reason=\"conflict\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_errors_total{reason=\"api\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_errors_total{reason=\"invalid_spec\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_errors_total{reason=\"other\"}"), 0);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_duration_seconds_count"), 4);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_duration_seconds_bucket{le=\"0.005\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_duration_seconds_bucket{le=\"0.025\"}"), 2);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_reconcile_duration_seconds_bucket{le=\"2.5\"}"), 4);
  EXPECT_NEAR(SampleValue(t, "meshwork_operator_reconcile_duration_seconds_sum"), 2.523, 1e-9);
}

TEST_F(OperatorMetricsTest, ErrorReasonForMapsConflictAndOtherApiErrors) {
  EXPECT_EQ(ErrorReasonFor(k8s::Error(k8s::ErrorKind::kConflict, "stale")), ReconcileErrorReason::kConflict);
  EXPECT_EQ(ErrorReasonFor(k8s::Error(k8s::ErrorKind::kNotFound, "x")), ReconcileErrorReason::kApi);
  EXPECT_EQ(ErrorReasonFor(k8s::Error(k8s::ErrorKind::kUnavailable, "x")), ReconcileErrorReason::kApi);
  EXPECT_EQ(ErrorReasonFor(k8s::Error::Ok()), ReconcileErrorReason::kOther);
}

TEST_F(OperatorMetricsTest, JobsByPhaseSetsEveryPhaseAndZeroesMissingOnes) {
  metrics_->SetJobsByPhase({{"Running", 3}, {"Failed", 1}, {"Pending", 2}});
  std::string t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Running\"}"), 3);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Failed\"}"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Pending\"}"), 2);  // unknown: own series
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Created\"}"), 0);
  metrics_->SetJobsByPhase({{"Running", 2}});
  t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Running\"}"), 2);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Failed\"}"), 0);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_jobs{phase=\"Pending\"}"), 0);
}

TEST_F(OperatorMetricsTest, PodCountersAndLeaderGauge) {
  metrics_->PodCreated();
  metrics_->PodCreated();
  metrics_->PodDeleted();
  metrics_->SetLeader(true);
  std::string t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_pods_created_total"), 2);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_pods_deleted_total"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_leader"), 1);
  metrics_->SetLeader(false);
  EXPECT_EQ(SampleValue(Scrape(), "meshwork_operator_leader"), 0);
}

TEST_F(OperatorMetricsTest, ThrottledRequestsCountTheirWaits) {
  metrics_->Throttled(0.25);
  metrics_->Throttled(0.5);
  const std::string t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_api_throttled_requests_total"), 2);
  EXPECT_DOUBLE_EQ(SampleValue(t, "meshwork_operator_api_throttled_seconds_total"), 0.75);
}

TEST_F(OperatorMetricsTest, InstrumentedWorkQueueFeedsTheQueueSeries) {
  k8s::WorkQueueOptions options;
  options.base_delay = 1ms;
  metrics_->InstrumentWorkQueue(&options);
  k8s::WorkQueue queue(options);
  queue.Add("team/a");
  queue.Add("team/a");  // already queued: not an add
  queue.Add("team/b");
  std::string t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_adds_total"), 2);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_depth"), 2);

  auto key = queue.Get(1000ms);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(SampleValue(Scrape(), "meshwork_operator_workqueue_depth"), 1);
  queue.AddRateLimited(*key);  // failed: retry later
  queue.Done(*key);
  t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_retries_total"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_queue_duration_seconds_count"), 1);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_work_duration_seconds_count"), 1);
  // The retry comes back through the delay thread: one more add, depth 2 again.
  ASSERT_TRUE(testing::SampleValue(t, "meshwork_operator_workqueue_depth") >= 1);
  for (int i = 0; i < 200 && queue.Len() < 2; ++i) std::this_thread::sleep_for(5ms);
  t = Scrape();
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_adds_total"), 3);
  EXPECT_EQ(SampleValue(t, "meshwork_operator_workqueue_depth"), 2);
}

TEST(OperatorMetricsDocsTest, DocsListEveryOperatorMetricAndNoOther) {
  prometheus::Registry registry;
  OperatorMetrics metrics(registry, "v");
  const std::set<std::string> exposed = ExposedNames(registry);
  EXPECT_EQ(exposed.size(), 15u);
  const std::string docs = ReadMetricsDocs();
  ASSERT_FALSE(docs.empty()) << "cannot read docs/metrics.md";
  for (const auto& name : exposed) {
    EXPECT_THAT(docs, ::testing::HasSubstr("| `" + name + "`")) << name << " is not in docs/metrics.md";
  }
  const std::regex name_re("meshwork_operator_[a-z0-9_]+");
  for (auto it = std::sregex_iterator(docs.begin(), docs.end(), name_re); it != std::sregex_iterator(); ++it) {
    std::string name = it->str();
    for (const char* suffix : {"_bucket", "_count", "_sum"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 && !exposed.count(name)) {
        name = name.substr(0, name.size() - s.size());
      }
    }
    EXPECT_TRUE(exposed.count(name)) << "docs/metrics.md names " << it->str() << ", which the operator does not export";
  }
}

}  // namespace
}  // namespace meshwork::runtime
