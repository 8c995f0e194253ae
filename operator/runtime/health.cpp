// HealthChecks, Heartbeat and the informer readiness check (see health.h).
#include "operator/runtime/health.h"

namespace meshwork::runtime {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A reason must stay one line: the body is "<name>: <reason>\n".
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

void HealthChecks::AddLivenessCheck(std::string name, Check check) {
  std::lock_guard<std::mutex> lock(mu_);
  liveness_.emplace_back(std::move(name), std::move(check));
}

void HealthChecks::AddReadinessCheck(std::string name, Check check) {
  std::lock_guard<std::mutex> lock(mu_);
  readiness_.emplace_back(std::move(name), std::move(check));
}

std::pair<int, std::string> HealthChecks::Evaluate(const Named& checks) {
  for (const auto& [name, check] : checks) {
    std::string reason;
    try {
      reason = check();
    } catch (const std::exception& e) {
      reason = std::string("check threw: ") + e.what();
    }
    if (!reason.empty()) return {503, name + ": " + OneLine(reason) + "\n"};
  }
  return {200, "ok\n"};
}

std::pair<int, std::string> HealthChecks::Live() const {
  Named copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy = liveness_;
  }
  return Evaluate(copy);
}

std::pair<int, std::string> HealthChecks::Ready() const {
  Named copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy = readiness_;
  }
  return Evaluate(copy);
}

Status HealthChecks::Install(metrics::MetricsServer& server) {
  MW_RETURN_IF_ERROR(server.AddHandler("/healthz", [this] { return Live(); }));
  return server.AddHandler("/readyz", [this] { return Ready(); });
}

Heartbeat::Heartbeat(std::chrono::milliseconds max_silence) : max_silence_(max_silence), last_ns_(NowNs()) {}

void Heartbeat::Beat() { last_ns_ = NowNs(); }

std::string Heartbeat::Check() const {
  const int64_t silent_ms = (NowNs() - last_ns_.load()) / 1000000;
  if (silent_ms <= max_silence_.count()) return "";
  return "no heartbeat for " + std::to_string(silent_ms) + " ms (limit " + std::to_string(max_silence_.count()) +
         " ms)";
}

HealthChecks::Check InformerSyncedCheck(const k8s::Informer* informer, std::string what) {
  return [informer, what = std::move(what)]() -> std::string {
    if (informer->HasSynced()) return "";
    return what + " has not synced (last error: " + informer->LastError() + ")";
  };
}

}  // namespace meshwork::runtime
