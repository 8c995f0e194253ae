// Liveness (/healthz) and readiness (/readyz) of the operator, served by the metrics server on
// the same port as /metrics. See docs/operator-runtime.md ("Health endpoints").
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "metrics/exposer.h"
#include "operator/k8s/informer.h"
#include "common/status.h"

namespace meshwork::runtime {

class HealthChecks {
 public:
  // "" when healthy, else a one-line reason. Called on the metrics server's thread: be quick.
  using Check = std::function<std::string()>;

  void AddLivenessCheck(std::string name, Check check);
  void AddReadinessCheck(std::string name, Check check);

  // 200 "ok\n", or 503 "<name>: <reason>\n" for the first failing check, in the order added.
  std::pair<int, std::string> Live() const;
  std::pair<int, std::string> Ready() const;

  // Serves Live() at /healthz and Ready() at /readyz on `server`. This object must outlive the
  // server.
  Status Install(metrics::MetricsServer& server);

 private:
  using Named = std::vector<std::pair<std::string, Check>>;
  static std::pair<int, std::string> Evaluate(const Named& checks);

  mutable std::mutex mu_;
  Named liveness_;
  Named readiness_;
};

// A loop calls Beat() every iteration; Check() fails once no beat came for `max_silence`. A loop
// that blocks while idle (WorkQueue::Get) should block with a timeout shorter than that and
// beat after each wake-up.
class Heartbeat {
 public:
  explicit Heartbeat(std::chrono::milliseconds max_silence);
  void Beat();
  std::string Check() const;  // a HealthChecks::Check

 private:
  std::chrono::milliseconds max_silence_;
  std::atomic<int64_t> last_ns_;  // steady clock
};

// Readiness: `informer` has applied its first list (what = e.g. "trainingjobs informer").
// Not synced: "<what> has not synced (last error: ...)".
HealthChecks::Check InformerSyncedCheck(const k8s::Informer* informer, std::string what);

}  // namespace meshwork::runtime
