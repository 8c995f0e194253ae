// Launch: the Service, the config and every missing rank of this generation; the status says how
// far the gang has got (Running once every rank runs) and carries rank 0's progress. A gang whose
// config cannot be read yet waits instead.
#include "operator/controller/policy/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "operator/controller/desired.h"

namespace meshwork::op::policy {

using nlohmann::json;

Decision AwaitConfig(const JobState& job, const std::string& why) {
  Decision d;
  d.phase = ConditionTrue(job.status, "Restarting") ? "Restarting" : "Created";
  d.conditions = {{"Running", "False", "ConfigMapNotReady", why}};
  d.events.push_back({"Warning", "ConfigMapNotReady", why});
  d.requeue_after = std::chrono::seconds(10);
  return d;
}

Decision AwaitRuntime(const json& status, const std::string& reason, const std::string& why) {
  Decision d;
  d.phase = status.value("phase", "Created");
  if (d.phase == "Created") d.conditions = {{"Running", "False", reason, why}};
  d.events.push_back({"Warning", reason, why});
  d.requeue_after = std::chrono::seconds(10);
  return d;
}

namespace {

// Rank 0's report into status.trainer, with the progress a person reads (percent, and an ETA
// from the steps made since the last report), and what a step that went backwards means.
void Progress(const JobState& job, const TrainerReport& report, Decision& d) {
  json trainer = ReportJson(report, job.in.now, job.spec.WorldSize());
  const json before = job.status.value("trainer", json::object());
  const int64_t gen = job.generation();
  trainer["generation"] = gen;
  const bool same_gang = before.value("generation", int64_t{-1}) == gen;
  const int64_t last_step = before.value("step", int64_t{0});
  if (report.total_steps > 0) {
    const double percent =
        std::round(1000.0 * static_cast<double>(report.step) / static_cast<double>(report.total_steps)) / 10;
    trainer["percent"] = percent;
    char text[16];
    std::snprintf(text, sizeof text, "%.1f%%", percent);
    trainer["progress"] = text;
  }
  // ETA: the rate between the last report and this one, carried while no step was made.
  const auto last_time = ParseTime(before.value("updateTime", ""));
  if (same_gang && last_time && report.step > last_step && job.in.now > *last_time) {
    const double seconds = std::chrono::duration<double>(job.in.now - *last_time).count();
    const double per_step = seconds / static_cast<double>(report.step - last_step);
    const int64_t eta = static_cast<int64_t>(std::llround(per_step * static_cast<double>(std::max<int64_t>(0, report.total_steps - report.step))));
    trainer["etaSeconds"] = eta;
    trainer["eta"] = FormatDuration(eta);
  } else if (same_gang && report.step == last_step && before.contains("etaSeconds")) {
    trainer["etaSeconds"] = before["etaSeconds"];
    trainer["eta"] = before.value("eta", "");
  }
  if (same_gang && report.step < last_step) {
    // The same gang's Pods, yet rank 0 is behind where it was: its processes restarted in place
    // (a node or control-plane restart ran them again) and resumed from a checkpoint.
    d.status["inPlaceRestarts"] = job.status.value("inPlaceRestarts", int64_t{0}) + 1;
    d.events.push_back({"Warning", "GangRestartedInPlace",
                        "rank 0 reports step " + std::to_string(report.step) + " after " + std::to_string(last_step) +
                            ": the gang's processes restarted in place and resumed from the checkpoint of step " +
                            std::to_string(report.step) + " (" + std::to_string(last_step - report.step) +
                            " steps to redo)"});
  } else if (!same_gang && report.resumed_from_step) {
    // A new gang says where it resumed. After an elastic resize the status keeps it beside the
    // sizes, and the Event names all three.
    const int64_t from = *report.resumed_from_step;
    json resize = job.status.value("elastic", json::object()).value("lastResize", json());
    const bool resized = resize.is_object() && resize.value("generation", int64_t{-1}) == gen;
    if (resized) {
      resize["resumedFromStep"] = from;
      json elastic = job.status["elastic"];
      elastic["lastResize"] = resize;
      d.status["elastic"] = elastic;
    }
    const std::string sizes =
        resized ? " at " + std::to_string(resize.value("toReplicas", 0)) + " replicas (resized from " +
                      std::to_string(resize.value("fromReplicas", 0)) + ")"
                : "";
    if (from > 0) {
      d.events.push_back({"Normal", "ResumedFromCheckpoint",
                          "the new gang" + sizes + " resumed from the checkpoint of step " + std::to_string(from) +
                              " of " + std::to_string(report.total_steps) +
                              (last_step > 0 ? " (the previous one reached " + std::to_string(last_step) + ")" : "")});
    } else if (resized || (last_step > 0 && job.spec.checkpoint_path)) {
      d.events.push_back({"Warning", "StartedFromStepZero",
                          "the new gang" + sizes + " found no checkpoint and started from step 0" +
                              (last_step > 0 ? " (the previous one reached " + std::to_string(last_step) + ")" : "")});
    }
  } else if (!same_gang && report.step > 0 && last_step > 0) {
    // A trainer without meshwork_trainer_resumed_from_step, past step 0 after a gang that made
    // progress: it resumed from a checkpoint.
    d.events.push_back({"Normal", "ResumedFromCheckpoint",
                        "the new gang reports step " + std::to_string(report.step) + " of " +
                            std::to_string(report.total_steps) + " (the previous one reached " +
                            std::to_string(last_step) + "): it resumed from its checkpoint"});
  }
  d.status["trainer"] = trainer;
  if (report.plan_fitted_mfu) {
    // Kept past this gang: with spec.mesh.auto the next gang is planned at this compute rate.
    json calibration = {{"achievedMfu", std::round(*report.plan_fitted_mfu * 1e4) / 1e4}, {"generation", gen}};
    const json& plan = job.status.value("plan", json::object());
    if (plan.contains("hardwareProfile")) calibration["hardwareProfile"] = plan["hardwareProfile"];
    if (report.plan_predicted_speedup && std::isfinite(*report.plan_predicted_speedup)) {
      calibration["predictedSpeedup"] = std::round(*report.plan_predicted_speedup * 1e3) / 1e3;
    }
    const json before_calibration = job.status.value("calibration", json::object());
    json compared = before_calibration;
    compared.erase("updateTime");
    if (compared != calibration) {
      calibration["updateTime"] = FormatTime(job.in.now);
      d.status["calibration"] = calibration;
    }
  }
}

// A Pending Pod's reason that is normal progress, not news: its containers being created or
// initialized, or the operator's own gang gate (the gang's admission says why it waits, in a
// GangWaiting Event). Leaving these out of the Running condition spares a status write for each
// step every Pod takes; a reason that needs the user (Unschedulable, ErrImagePull, another
// party's scheduling gate) still shows.
bool RoutineWait(const PodView& pod) {
  if (pod.reason == "ContainerCreating" || pod.reason == "PodInitializing") return true;
  return pod.reason == "SchedulingGated" && pod.gang_gated;
}

}  // namespace

Decision Launch(const JobState& job) {
  const JobSpec& spec = job.spec;
  const Observed& in = job.in;
  const std::vector<PodView> current = job.Current();
  const std::vector<int> missing = job.Missing();
  const bool restarting = ConditionTrue(job.status, "Restarting");
  Decision d;
  d.ensure_service = !in.service_exists || !missing.empty();
  d.ensure_config_map = !missing.empty() && spec.config_map_name.empty();
  d.ensure_pod_group = !missing.empty();
  for (int i : missing) d.create.push_back(DesiredPod(in.job, spec, i, job.generation()));
  if (missing.empty()) d.status["launchedGeneration"] = job.generation();
  if (!job.status.contains("startTime")) d.status["startTime"] = FormatTime(in.now);

  const bool all_running = missing.empty() && std::all_of(current.begin(), current.end(), [](const PodView& p) {
                             return p.phase == "Running" || p.phase == "Succeeded";
                           });
  if (all_running) {
    const std::string msg = std::to_string(spec.replicas) + " pod(s) running " + std::to_string(spec.WorldSize()) +
                            " rank(s), mesh " + spec.mesh.ToString() +
                            (spec.mesh.chosen_by_trainer ? std::string(" (rank 0 chooses dpReplicate x dpShard)")
                                                          : " (" + std::string(spec.mesh.Dims()) + ")");
    if (!ConditionTrue(job.status, "Running")) d.events.push_back({"Normal", "Running", msg});
    d.conditions = {{"Running", "True", "AllPodsRunning", msg}};
    if (restarting) d.conditions.push_back({"Restarting", "False", "GangRunning", "the new gang is running"});
    d.phase = "Running";
  } else {
    std::string waiting;
    for (const auto& pod : current) {
      if (pod.phase == "Pending" && !pod.reason.empty() && !RoutineWait(pod)) {
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
  if (in.report) Progress(job, *in.report, d);
  if (in.report && spec.mesh.chosen_by_trainer) {
    // mesh: auto: the mesh rank 0 chose, as it reports it ("2x4x1").
    int r = 0, s = 0, t = 0;
    char x1 = 0, x2 = 0;
    std::istringstream mesh(in.report->mesh);
    if (mesh >> r >> x1 >> s >> x2 >> t && x1 == 'x' && x2 == 'x' && int64_t{r} * s * t == spec.WorldSize()) {
      d.status["meshShape"] = in.report->mesh;
      d.status["mesh"] = {{"dpReplicate", r}, {"dpShard", s}, {"tp", t}, {"pp", 1}};
    }
  }
  if (!current.empty() && spec.metrics_port > 0) d.requeue_after = in.report_interval;
  return d;
}

}  // namespace meshwork::op::policy
