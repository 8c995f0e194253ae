// The integrations' registry and what every one of them shares (integration.h).
#include "operator/controller/integration.h"
#include "operator/controller/integrations/backends.h"
#include "operator/controller/kueue.h"

namespace meshwork::op {

using nlohmann::json;

ReconcileOutcome Failed(const k8s::Error& e, const std::string& what) {
  ReconcileOutcome o;
  o.ok = false;
  o.error_reason = k8s::IsConflict(e) ? "conflict" : "api";
  o.message = what + ": " + e.ToString();
  return o;
}

bool OwnedBy(const json& object, const std::string& uid) {
  const json refs = object.value("metadata", json::object()).value("ownerReferences", json::array());
  for (const auto& ref : refs) {
    if (ref.is_object() && ref.value("uid", "") == uid) return true;
  }
  return false;
}

k8s::Error NotOwned(const std::string& kind, const json& object, const std::string& detail) {
  const json& meta = object["metadata"];
  return k8s::Error(k8s::ErrorKind::kAlreadyExists,
                    kind + " " + meta.value("namespace", "") + "/" + meta.value("name", "") +
                        (detail.empty() ? "" : " (" + detail + ")") +
                        " exists and is not owned by this TrainingJob; rename the job or delete the " + kind);
}

const std::string& ReconcileScope::ns() const {
  static const std::string kDefault = "default";
  const json& meta = (*job)["metadata"];
  auto it = meta.find("namespace");
  return it != meta.end() && it->is_string() ? it->get_ref<const std::string&>() : kDefault;
}

JobSpec GangSpec(const JobSpec& spec, const Plan& plan) {
  JobSpec gang = spec;
  if (plan.gang_replicas > 0) gang.replicas = plan.gang_replicas;
  return gang;
}

std::optional<ReconcileOutcome> GangBackend::BeforeCreate(ReconcileScope& scope, Plan* plan) const {
  const std::string name = (*scope.job)["metadata"].value("name", "");
  for (json& pod : plan->create) MarkPod(**scope.spec, name, &pod);
  return MoreBeforeCreate(scope, *plan);
}

namespace {

// gangAdmission None: the Pods go straight to the scheduler (a cluster where Kueue places gangs).
class NoGang final : public GangBackend {
 public:
  std::string Name() const override { return "None"; }
};

}  // namespace

const GangBackend& GangBackendFor(GangAdmission admission) {
  static const NoGang none;
  switch (admission) {
    case GangAdmission::kOperator: return OperatorGate();
    case GangAdmission::kPodGroup: return KubernetesPodGroup();
    case GangAdmission::kVolcano: return VolcanoPodGroup();
    case GangAdmission::kCoscheduling: return CoschedulingPodGroup();
    case GangAdmission::kNone: break;
  }
  return none;
}

std::vector<const Integration*> IntegrationsOf(const json& job, const Result<JobSpec>& spec) {
  std::vector<const Integration*> out;
  if (spec.ok()) out.push_back(&GangBackendFor(spec->gang_admission));
  if (!KueueQueue(job).empty()) out.push_back(&KueueIntegration());
  return out;
}

std::vector<const Integration*> AllIntegrations() {
  std::vector<const Integration*> out = {&KueueIntegration()};
  for (GangAdmission g : {GangAdmission::kOperator, GangAdmission::kPodGroup, GangAdmission::kVolcano,
                          GangAdmission::kCoscheduling, GangAdmission::kNone}) {
    out.push_back(&GangBackendFor(g));
  }
  return out;
}

}  // namespace meshwork::op
