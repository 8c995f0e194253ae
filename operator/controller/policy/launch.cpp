// Launch: the Service, the config and every missing rank of this generation; the status says how
// far the gang has got (Running once every rank runs) and carries rank 0's progress. A gang whose
// config cannot be read yet waits instead.
#include "operator/controller/policy/policy.h"

#include <algorithm>
#include <sstream>

#include "operator/controller/desired.h"

namespace meshwork::op::policy {

Decision AwaitConfig(const JobState& job, const std::string& why) {
  Decision d;
  d.phase = ConditionTrue(job.status, "Restarting") ? "Restarting" : "Created";
  d.conditions = {{"Running", "False", "ConfigMapNotReady", why}};
  d.events.push_back({"Warning", "ConfigMapNotReady", why});
  d.requeue_after = std::chrono::seconds(10);
  return d;
}

Decision Launch(const JobState& job) {
  const JobSpec& spec = job.spec;
  const Observed& in = job.in;
  const std::vector<PodView> current = job.Current();
  const std::vector<int> missing = job.Missing();
  const bool restarting = ConditionTrue(job.status, "Restarting");
  Decision d;
  d.ensure_service = !in.service_exists || !missing.empty();
  d.ensure_config_map = !missing.empty() && spec.config_map_name.empty();
  for (int i : missing) d.create.push_back(DesiredPod(in.job, spec, i, job.generation()));
  if (missing.empty()) d.status["launchedGeneration"] = job.generation();
  if (!job.status.contains("startTime")) d.status["startTime"] = FormatTime(in.now);

  const bool all_running = missing.empty() && std::all_of(current.begin(), current.end(), [](const PodView& p) {
                             return p.phase == "Running" || p.phase == "Succeeded";
                           });
  if (all_running) {
    const std::string msg = std::to_string(spec.replicas) + " pod(s) running " + std::to_string(spec.WorldSize()) +
                            " rank(s), mesh " + spec.mesh.ToString() +
                            (spec.mesh.chosen_by_trainer ? " (rank 0 chooses dpReplicate x dpShard)" : " (dpReplicate x dpShard x tp)");
    if (!ConditionTrue(job.status, "Running")) d.events.push_back({"Normal", "Running", msg});
    d.conditions = {{"Running", "True", "AllPodsRunning", msg}};
    if (restarting) d.conditions.push_back({"Restarting", "False", "GangRunning", "the new gang is running"});
    d.phase = "Running";
  } else {
    std::string waiting;
    for (const auto& pod : current) {
      if (pod.phase == "Pending" && !pod.reason.empty()) {
        waiting = "; " + pod.name + ": " + pod.reason + (pod.message.empty() ? "" : " (" + pod.message + ")");
        break;
      }
    }
    const size_t started = current.size() - std::count_if(current.begin(), current.end(), [](const PodView& p) {
                             return p.phase == "Pending";
                           });
    d.conditions = {{"Running", "False", "PodsStarting",
                     std::to_string(started) + " of " + std::to_string(spec.replicas) + " pod(s) started" + waiting}};
    d.phase = restarting ? "Restarting" : "Created";
  }
  if (in.report) d.status["trainer"] = ReportJson(*in.report, in.now, spec.WorldSize());
  if (in.report && spec.mesh.chosen_by_trainer) {
    // mesh: auto: the mesh rank 0 chose, as it reports it ("2x4x1").
    int r = 0, s = 0, t = 0;
    char x1 = 0, x2 = 0;
    std::istringstream mesh(in.report->mesh);
    if (mesh >> r >> x1 >> s >> x2 >> t && x1 == 'x' && x2 == 'x' && int64_t{r} * s * t == spec.WorldSize()) {
      d.status["meshShape"] = in.report->mesh;
      d.status["mesh"] = {{"dpReplicate", r}, {"dpShard", s}, {"tp", t}};
    }
  }
  if (!current.empty() && spec.metrics_port > 0) d.requeue_after = in.report_interval;
  return d;
}

}  // namespace meshwork::op::policy
