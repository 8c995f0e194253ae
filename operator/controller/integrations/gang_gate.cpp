// gangAdmission Operator (the default): the gang's Pods are created behind the operator's
// scheduling gate (gang.h, kGangGate) and released together once every one of them fits the
// cluster's free room, so that two gangs never each hold part of what the other needs.
#include <thread>

#include "operator/controller/desired.h"
#include "operator/controller/integrations/backends.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

// Whether resourceVersion `a` is `b` or later. They are opaque to clients in general; the API
// server's are etcd revisions, decimal, so compare them as numbers when both are.
bool NotOlder(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const bool numbers = !a.empty() && !b.empty() && a.find_first_not_of("0123456789") == std::string::npos &&
                       b.find_first_not_of("0123456789") == std::string::npos;
  return numbers && (a.size() != b.size() ? a.size() > b.size() : a > b);
}

class OperatorGateBackend final : public GangBackend {
 public:
  std::string Name() const override { return "Operator"; }
  std::vector<RbacRule> Rbac() const override {
    return {{"", "pods", {"list", "patch"}}, {"", "nodes", {"list", "watch"}, /*cluster_scoped=*/true}};
  }
  void MarkPod(const JobSpec&, const std::string&, json* pod) const override {
    // After the template, whose gates stay too.
    json& gates = (*pod)["spec"]["schedulingGates"];
    if (!gates.is_array()) gates = json::array();
    gates.push_back({{"name", kGangGate}});
  }
  // A shrunk elastic job whose lost nodes stay lost: whether its gang at spec.replicas fits the
  // room left on the other nodes, read as admission reads it (the job's own Pods not counted: the
  // new gang replaces them), so that it grows back without waiting for its own nodes.
  std::optional<ReconcileOutcome> Observe(ReconcileScope& scope, Observed* in) const override {
    if (scope.finished || !scope.spec->ok()) return std::nullopt;
    const JobSpec& spec = **scope.spec;
    const json status = scope.job->value("status", json::object());
    const json elastic = status.value("elastic", json::object());
    if (!spec.elastic || !elastic.is_object() || elastic.value("shrunkFrom", int64_t{-1}) != spec.replicas) {
      return std::nullopt;
    }
    bool still_lost = false;
    for (const auto& node : elastic.value("lostNodes", json::array())) {
      still_lost = still_lost || (node.is_string() && in->unhealthy_nodes.count(node.get<std::string>()) > 0);
    }
    if (!still_lost) return std::nullopt;
    const int64_t next = status.value("restartGeneration", int64_t{0}) + 1;
    std::vector<json> gang;
    for (int i = 0; i < spec.replicas; ++i) gang.push_back(DesiredPod(in->job, spec, i, next));
    GangFit fit;
    // The lost nodes, and any node still within its grace after coming back, are not room.
    if (auto failed = Fit(scope, scope.job->value("metadata", json::object()).value("uid", ""), gang, &fit,
                          &in->unhealthy_nodes)) {
      return failed;
    }
    if (fit.fits) in->room_for_spec = "its " + std::to_string(spec.replicas) + " Pods fit the Ready nodes";
    return std::nullopt;
  }

  // Once every Pod of the current gang is in the cache, all behind the gate: releases them
  // together if they fit, else says why (an Event, once per reason) and asks to look again. Not
  // while the plan deletes Pods or ends the job.
  std::optional<ReconcileOutcome> AfterApply(ReconcileScope& scope, const Plan& plan, Applied* applied) const override {
    if (!plan.remove.empty() || scope.finished || applied->refused || plan.phase == "Failed") return std::nullopt;
    const JobSpec spec = GangSpec(**scope.spec, plan);
    const json& job = *scope.job;
    const int64_t gen = job.value("status", json::object()).value("restartGeneration", int64_t{0});
    std::vector<json> gang;
    bool gated = false;
    for (const auto& pod : scope.in->pods) {
      const PodView v = ViewPod(pod);
      if (v.generation != gen || v.terminating) continue;
      gang.push_back(pod);
      gated = gated || HasGangGate(pod);
    }
    if (!gated || static_cast<int>(gang.size()) != spec.replicas) return std::nullopt;  // not all here yet
    IntegrationShared& shared = *scope.shared;
    std::lock_guard<std::mutex> admission(shared.admission_mu);
    const std::string uid = job["metadata"].value("uid", "");
    GangFit fit;
    if (auto failed = Fit(scope, uid, gang, &fit)) return failed;
    if (!fit.fits) {
      std::lock_guard<std::mutex> lock(shared.mu);
      // Remembered only once the Event is recorded: a reconcile that fails before that says it
      // again on the next one.
      const auto last = shared.gang_waiting.find(scope.key);
      if (last == shared.gang_waiting.end() || last->second != fit.why) {
        applied->events.push_back({"Normal", "GangWaiting", "waiting until every Pod fits at once: " + fit.why});
        applied->gang_waiting = fit.why;
      }
      applied->RequeueWithin(std::chrono::seconds(3));
      return std::nullopt;
    }
    std::vector<std::pair<std::string, std::string>> released;  // Pod key, resourceVersion after the patch
    for (const auto& pod : gang) {
      if (!HasGangGate(pod)) continue;
      json gates = json::array();
      for (const auto& g : pod["spec"]["schedulingGates"]) {
        if (g.value("name", "") != kGangGate) gates.push_back(g);
      }
      const json patch = {{"spec", {{"schedulingGates", gates.empty() ? json(nullptr) : gates}}}};
      auto patched = shared.api->MergePatch(k8s::resources::Pods(), scope.ns(), pod["metadata"].value("name", ""), patch, "");
      if (!patched.ok() && !k8s::IsNotFound(patched.error())) {
        return Failed(patched.error(), "releasing the gang gate of Pod " + pod["metadata"].value("name", ""));
      }
      if (patched.ok()) released.emplace_back(k8s::ObjectKey(*patched), k8s::ResourceVersionOf(*patched));
    }
    WaitForLedger(shared, released);
    {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.gang_waiting.erase(scope.key);
    }
    applied->events.push_back({"Normal", "GangAdmitted",
                               "all " + std::to_string(gang.size()) + " Pods fit: released to the scheduler together"});
    return std::nullopt;
  }

 private:
  // Whether `gang` fits beside what the other Pods take: the Nodes from their informer's cache,
  // else one list (unit tests); the other Pods' room from the ledger (its size the node count and
  // the Pods released but not bound yet), else one list. The gang's own Pods are what is being
  // placed, not what takes room.
  // `left_out`: nodes not to place on (by name).
  static std::optional<ReconcileOutcome> Fit(ReconcileScope& scope, const std::string& uid,
                                             const std::vector<json>& gang, GangFit* fit,
                                             const std::map<std::string, NodeHealth>* left_out = nullptr) {
    IntegrationShared& shared = *scope.shared;
    json nodes = {{"items", json::array()}};
    if (shared.nodes != nullptr) {
      for (auto& n : shared.nodes->List()) nodes["items"].push_back(std::move(n));
    } else {
      auto listed = shared.api->List(k8s::resources::Nodes(), "", {});
      if (!listed.ok()) return Failed(listed.error(), "listing Nodes for gang admission of " + scope.key);
      nodes = std::move(*listed);
    }
    if (left_out != nullptr && !left_out->empty()) {
      json kept = json::array();
      for (auto& n : nodes["items"]) {
        if (!left_out->count(n["metadata"].value("name", ""))) kept.push_back(std::move(n));
      }
      nodes["items"] = std::move(kept);
    }
    if (shared.room != nullptr) {
      *fit = FitGang(nodes, shared.room->Taken(uid), gang);
      return std::nullopt;
    }
    k8s::ListOptions lo;
    lo.field_selector = "status.phase!=Succeeded,status.phase!=Failed";
    auto listed = shared.api->List(k8s::resources::Pods(), shared.pods_namespace, lo);
    if (!listed.ok()) return Failed(listed.error(), "listing Pods for gang admission of " + scope.key);
    json others = {{"items", json::array()}};
    for (auto& p : listed.value()["items"]) {
      if (!OwnedBy(p, uid)) others["items"].push_back(std::move(p));
    }
    *fit = FitGang(nodes, others, gang);
    return std::nullopt;
  }

  // The next admission must count the released Pods as released: wait (admission_mu held) until
  // the ledger has each at the patch's version or later; a few milliseconds. A Pod absent from it
  // is not taken for done: its informer may not have seen it yet (it lags the own-Pods cache the
  // gang was read from), and the next admission would miss its requests and count its room twice,
  // unless the own-Pods cache says it finished or went (it then holds none).
  static void WaitForLedger(const IntegrationShared& shared,
                            const std::vector<std::pair<std::string, std::string>>& released) {
    if (shared.room == nullptr) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (const auto& [pod_key, version] : released) {
      while (std::chrono::steady_clock::now() < deadline) {
        const std::string seen = shared.room->VersionOf(pod_key);
        if (!seen.empty() && NotOlder(seen, version)) break;
        if (seen.empty()) {
          const auto own = shared.pods->Get(pod_key);
          const std::string phase = own ? own->value("status", json::object()).value("phase", "") : "";
          if (!own || phase == "Succeeded" || phase == "Failed") break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
};

}  // namespace

const GangBackend& OperatorGate() {
  static const OperatorGateBackend backend;
  return backend;
}

}  // namespace meshwork::op
