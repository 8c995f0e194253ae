// A finished job (Succeeded or Failed) stays finished: it never creates anything again, even with
// no Pods left (kubeflow/trainer#2981), cleanPodPolicy still removes its Pods, and
// ttlSecondsAfterFinished deletes it.
#include "operator/controller/policy/policy.h"

namespace meshwork::op::policy {

using nlohmann::json;
using std::chrono::seconds;

Decision Finished(const json& status, CleanPodPolicy clean, const std::vector<PodView>& pods) {
  Decision d;
  d.phase = ConditionTrue(status, "Succeeded") ? "Succeeded" : "Failed";
  d.remove = Clean(clean, pods);
  return d;
}

std::optional<Decision> Ttl(const json& job, const json& status, SystemTime now, bool may_delete) {
  const json& spec = job.contains("spec") ? job["spec"] : json::object();
  if (!spec.is_object() || !spec.contains("runPolicy")) return std::nullopt;
  const int64_t ttl = IntOr(spec["runPolicy"], "ttlSecondsAfterFinished", -1);
  if (ttl < 0) return std::nullopt;
  Decision d;
  auto done = ParseTime(status.value("completionTime", ""));
  if (!done) {
    // Finished before completionTime was recorded (should not happen): count from now, as
    // recorded (whole seconds), like every later reconcile will.
    d.status["completionTime"] = FormatTime(now);
    done = ParseTime(FormatTime(now));
  }
  const auto expire = *done + seconds(ttl);
  if (may_delete && now >= expire) {
    d.delete_job = true;
  } else {
    d.requeue_after = std::chrono::duration_cast<seconds>(expire - now) + seconds(1);
  }
  return d;
}

}  // namespace meshwork::op::policy
