// What the PodGroup backends share (backends.h, PodGroupBackend).
#include "operator/controller/desired.h"
#include "operator/controller/integrations/backends.h"

namespace meshwork::op {

using nlohmann::json;

json PodGroupBackend::Want(const json& job, const JobSpec& spec) const {
  return {{"apiVersion", Api().ApiVersion()},
          {"kind", "PodGroup"},
          {"metadata", ChildMetadata(job, job["metadata"].value("name", ""))},
          {"spec", GroupSpec(spec)}};
}

std::vector<RbacRule> PodGroupBackend::Rbac() const {
  return {{Api().group, "podgroups", {"get", "create", "update"}}};
}

std::optional<ReconcileOutcome> PodGroupBackend::MoreBeforeCreate(ReconcileScope& scope, const Plan& plan) const {
  if (!plan.ensure_pod_group) return std::nullopt;
  const json want = Want(*scope.job, GangSpec(**scope.spec, plan));
  const k8s::ResourceRef ref = Api();
  k8s::ObjectApi* api = scope.shared->api;
  auto failed = [&](const k8s::Error& e) {
    return Failed(e, "writing PodGroup " + scope.key + (k8s::IsNotFound(e) ? ApiMissing() : ""));
  };
  auto created = api->Create(ref, "", want);
  if (created.ok()) return std::nullopt;
  if (!k8s::IsAlreadyExists(created.error())) return failed(created.error());
  const std::string ns = want["metadata"]["namespace"];
  auto have = api->Get(ref, ns, want["metadata"]["name"]);
  if (!have.ok()) return failed(have.error());
  if (!OwnedBy(*have, (*scope.job)["metadata"].value("uid", ""))) return failed(NotOwned("PodGroup", *have, ref.ApiVersion()));
  // A resize changes the gang's size (minCount, minMember), an edit the queue or timeout: the
  // fields the operator sets follow the spec; any others (a scheduler's) stay.
  json updated = *have;
  bool changed = false;
  for (const auto& [key, value] : want["spec"].items()) {
    if (updated["spec"].value(key, json()) != value) {
      updated["spec"][key] = value;
      changed = true;
    }
  }
  if (!changed) return std::nullopt;
  auto put = api->Update(ref, ns, updated);
  return put.ok() ? std::nullopt : std::optional<ReconcileOutcome>(failed(put.error()));
}

}  // namespace meshwork::op
