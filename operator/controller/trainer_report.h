// Reading what a trainer reports: rank 0's Prometheus /metrics (docs/metrics.md), scraped by the
// operator into TrainingJob.status.trainer, and the final progress line of its log.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "operator/controller/decide.h"
#include "common/status.h"

namespace meshwork::op {

// The trainer's series in Prometheus text format -> a report; nullopt when
// meshwork_trainer_step is absent (not a Meshwork trainer, or not started yet).
std::optional<TrainerReport> ParseTrainerMetrics(const std::string& text);

// The run's summary (FinalReport, decide.h) from the trainer's last log line, "done: N steps,
// T tokens in S s | final loss L | X tok/s | ...": the final loss and the run's mean throughput
// (all ranks' tokens); nullopt when `log` has no such line.
std::optional<FinalReport> ParseFinalLine(const std::string& log);

// GET http://ip:port/path over HTTP/1.0 with an overall timeout; the body on a 200.
// kUnavailable when the endpoint cannot be reached in time or answers something else.
Result<std::string> HttpGet(const std::string& ip, int port, const std::string& path,
                            std::chrono::milliseconds timeout);

}  // namespace meshwork::op
