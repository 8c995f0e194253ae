// Success: every rank of the current gang exited 0 (successPolicy AllRanks), or the Pod of
// replica 0, which holds rank 0, did (Rank0: the other ranks are then stopped as cleanPodPolicy
// says, and a failure of theirs after or beside it does not matter). The report in status.trainer is completed:
// the run reached its last step, and rank 0's final log line has the final loss and the run's
// throughput (the last scrape may be a few steps old).
#include "operator/controller/policy/policy.h"

#include <algorithm>
#include <cmath>

namespace meshwork::op::policy {

using nlohmann::json;

std::optional<Decision> Success(const JobState& job) {
  const std::vector<PodView> current = job.Current();
  const JobSpec& spec = job.spec;
  std::string reason, message;
  if (spec.success_policy == SuccessPolicy::kRank0) {
    const auto rank0 = std::find_if(current.begin(), current.end(),
                                    [](const PodView& p) { return p.index == 0 && p.phase == "Succeeded"; });
    if (rank0 == current.end()) return std::nullopt;
    reason = "Rank0Succeeded";
    message = "pod " + rank0->name + " (rank 0) exited 0; successPolicy is Rank0";
  } else {
    if (!job.Missing().empty() ||
        !std::all_of(current.begin(), current.end(), [](const PodView& p) { return p.phase == "Succeeded"; })) {
      return std::nullopt;
    }
    reason = "AllRanksSucceeded";
    message = "all " + std::to_string(spec.WorldSize()) + " ranks in " + std::to_string(spec.replicas) +
              " pod(s) exited 0";
  }
  Decision d = Finish(job.status, "Succeeded", reason, message, job.in.now);
  d.remove = Clean(spec.clean_pod_policy, job.pods);
  if (!job.in.report && !job.status.contains("trainer")) {
    // A run that ended between two scrapes: its last log line still says how far it got.
    const auto final_report = job.in.final_report ? job.in.final_report() : std::nullopt;
    if (!final_report || final_report->last_step <= 0) return d;
    d.status["trainer"] = {{"step", final_report->last_step},
                           {"totalSteps", final_report->last_step},
                           {"loss", std::round(final_report->loss * 1e4) / 1e4},
                           {"tokensPerSecond", std::round(final_report->tokens_per_second * 10) / 10},
                           {"percent", 100.0},
                           {"progress", "100.0%"},
                           {"updateTime", FormatTime(job.in.now)}};
    return d;
  }
  json trainer = job.in.report ? ReportJson(*job.in.report, job.in.now, spec.WorldSize()) : job.status["trainer"];
  if (trainer.value("totalSteps", int64_t{0}) > 0) {
    trainer["step"] = trainer["totalSteps"];
    trainer["percent"] = 100.0;
    trainer["progress"] = "100.0%";
  }
  trainer.erase("eta");  // nothing left
  trainer.erase("etaSeconds");
  if (job.in.final_report) {
    if (const auto final_report = job.in.final_report()) {
      trainer["loss"] = std::round(final_report->loss * 1e4) / 1e4;
      trainer["tokensPerSecond"] = std::round(final_report->tokens_per_second * 10) / 10;
    }
  }
  d.status["trainer"] = trainer;
  return d;
}

}  // namespace meshwork::op::policy
