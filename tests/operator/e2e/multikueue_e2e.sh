#!/usr/bin/env bash
# MultiKueue with the real Kueue (sigs.k8s.io/kueue v0.17.0) on two meshwork-clusters, a manager
# and a worker, each with its own Kueue and Meshwork operator (docs/trainingjob.md, "Kueue"):
#   - in the manager, a TrainingJob with spec.managedBy kueue.x-k8s.io/multikueue and a
#     LocalQueue label gets its Workload from the operator and nothing else: no Pods;
#   - Kueue's MultiKueue admission check dispatches it: the worker gets a copy of the job (without
#     managedBy, labelled with the prebuilt Workload), whose Workload the worker's Kueue admits,
#     and whose gang the worker's operator runs;
#   - the worker's job succeeds, and its status is copied back to the manager's job, whose
#     Workload ends Finished.
# usage: multikueue_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

cp_bin="$1"
op_bin="$2"
src="$4"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kube_bin
e2e_require_kueue
e2e_init
worker_kubeconfig="$work/cp2/kubeconfig"
km() { timeout 60 kubectl --request-timeout=30s -n kq "$@"; }
kw() { KUBECONFIG="$worker_kubeconfig" timeout 60 kubectl --request-timeout=30s -n kq "$@"; }
finish() {
  if [ "$failed" -gt 0 ]; then
    echo "---- manager: tj, workloads, pods"; km get tj,workloads.kueue.x-k8s.io,pods -o wide 2>&1
    echo "---- worker: tj, workloads, pods"; kw get tj,workloads.kueue.x-k8s.io,pods -o wide 2>&1
    echo "---- manager: admission check, cluster"
    kubectl get admissionchecks.kueue.x-k8s.io,multikueueclusters.kueue.x-k8s.io -o yaml 2>&1 | grep -A3 'conditions:' | head -20
    echo "---- operator logs"; tail -n 15 "$work/op-manager.log"; tail -n 15 "$work/op-worker.log"
    echo "---- kueue errors"; grep -h '"level":"error"' "$work/kueue-manager.log" "$work/kueue-worker.log" | tail -n 10 | cut -c1-400
  fi
  e2e_kueue_cleanup
  e2e_summary multikueue_e2e
  exit $?
}
e2e_kueue_certs || exit 0

cat >"$work/nodes.yaml" <<'EOF'
nodes:
- {name: node-a, cpu: "4", memory: 16Gi}
EOF
# The manager ($KUBECONFIG), then the worker, each a cluster of its own.
e2e_start_controlplane "$cp_bin" --nodes "$work/nodes.yaml" || exit 1
mkdir -p "$work/cp2"
(cd "$work" && exec "$cp_bin" --data-dir "$work/cp2" --kubeconfig "$worker_kubeconfig" --nodes "$work/nodes.yaml" \
  >"$work/cp2.log" 2>&1) &
e2e_track $!
e2e_wait_serving $! "$work/cp2.log" "the worker's control plane" || exit 1

for cfg in "$KUBECONFIG" "$worker_kubeconfig"; do
  KUBECONFIG="$cfg" e2e_apply_crd "$src" || { fail "the Meshwork CRDs did not apply to $cfg"; finish; }
  e2e_kueue_apis "$cfg" || { fail "Kueue's CRDs are not served by $cfg"; finish; }
  KUBECONFIG="$cfg" kubectl create namespace kueue-system >/dev/null
  KUBECONFIG="$cfg" kubectl create namespace kq >/dev/null
done
e2e_start_kueue "$KUBECONFIG" "$work/kueue-manager" \
  'multiKueue: {externalFrameworks: [{name: "TrainingJob.v1alpha1.meshwork.dev"}]}' ||
  { fail "the manager's Kueue did not start: $(grep '"level":"error"' "$work/kueue-manager.log" | tail -3)"; finish; }
e2e_start_kueue "$worker_kubeconfig" "$work/kueue-worker" ||
  { fail "the worker's Kueue did not start: $(grep '"level":"error"' "$work/kueue-worker.log" | tail -3)"; finish; }
for side in manager worker; do
  cfg="$KUBECONFIG"
  [ "$side" = worker ] && cfg="$worker_kubeconfig"
  "$op_bin" --kubeconfig "$cfg" --metrics-bind-address "127.0.0.1:$(free_port)" --leader-elect false \
    --report-interval-s 2 --pod-delete-grace-s 2 >>"$work/op-$side.log" 2>&1 &
  e2e_track $!
done

queues() {  # the flavor and queues both clusters have; $1: the ClusterQueue's extra spec lines
  cat <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 2}
$1
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: lq, namespace: kq}
spec: {clusterQueue: cq}
EOF
}
out="$({ queues '  admissionChecksStrategy: {admissionChecks: [{name: multikueue}]}'; cat <<EOF
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: AdmissionCheck
metadata: {name: multikueue}
spec:
  controllerName: kueue.x-k8s.io/multikueue
  parameters: {apiGroup: kueue.x-k8s.io, kind: MultiKueueConfig, name: workers}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: MultiKueueConfig
metadata: {name: workers}
spec: {clusters: [worker]}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: MultiKueueCluster
metadata: {name: worker}
spec:
  clusterSource:
    kubeConfig: {locationType: Path, location: $worker_kubeconfig}
EOF
} | kubectl apply -f - 2>&1)" || { fail "the manager's queues: $out"; finish; }
out="$(queues "" | KUBECONFIG="$worker_kubeconfig" kubectl apply -f - 2>&1)" || { fail "the worker's queues: $out"; finish; }
e2e_wait_for 60 "the MultiKueue admission check Active" bash -c \
  "[ \"\$(kubectl get admissionchecks.kueue.x-k8s.io multikueue -o jsonpath='{.status.conditions[?(@.type==\"Active\")].status}')\" = True ]" &&
  pass "the manager's MultiKueue admission check is Active (the worker cluster connected)" ||
  { fail "admission check: $(kubectl get admissionchecks.kueue.x-k8s.io multikueue -o jsonpath='{.status.conditions}' 2>&1)"; finish; }

km apply -f - >/dev/null <<'EOF' || { fail "apply of the MultiKueue job"; finish; }
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata: {name: mk1, namespace: kq, labels: {kueue.x-k8s.io/queue-name: lq}}
spec:
  managedBy: kueue.x-k8s.io/multikueue
  image: busybox
  device: cpu
  replicas: 2
  resources: {requests: {cpu: "1"}}
  command: ["sh", "-c", "sleep 4"]
  config: {inline: "model: {preset: tiny}"}
EOF

e2e_wait_for 60 "the manager's Workload" km get workloads.kueue.x-k8s.io trainingjob-mk1 &&
  [ "$(km get workloads.kueue.x-k8s.io trainingjob-mk1 -o jsonpath='{.metadata.ownerReferences[0].kind} {.spec.podSets[0].count}')" = "TrainingJob 2" ] &&
  pass "the manager's operator made the job's Workload (owned by the job, 2 Pods)" ||
  fail "manager Workload: $(km get workloads.kueue.x-k8s.io -o yaml 2>&1 | head -30)"
if e2e_wait_for 120 "the worker's copy" kw get tj mk1; then
  copy="$(kw get tj mk1 -o jsonpath='{.spec.managedBy}|{.metadata.labels.kueue\.x-k8s\.io/prebuilt-workload-name}')"
  [ "$copy" = "|trainingjob-mk1" ] && pass "MultiKueue copied the job to the worker, without managedBy, on the prebuilt Workload ($copy)" ||
    fail "worker copy: '$copy'"
else fail "no copy of mk1 in the worker"; finish; fi
if e2e_wait_for 120 "the worker's job succeeds" bash -c "[ \"\$(KUBECONFIG=$worker_kubeconfig kubectl -n kq get tj mk1 -o jsonpath='{.status.phase}')\" = Succeeded ]"; then
  pass "the worker's operator ran the gang on the worker's Kueue admission: Succeeded ($(kw get pods -l meshwork.dev/job=mk1 -o name | wc -l) Pods)"
else fail "worker mk1: $(kw get tj mk1 -o jsonpath='{.status}' 2>&1 | cut -c1-300)"; fi
e2e_wait_for 60 "the manager's job Succeeded" bash -c "[ \"\$(kubectl -n kq get tj mk1 -o jsonpath='{.status.phase}')\" = Succeeded ]" &&
  pass "the worker's status was copied to the manager's job: Succeeded" || fail "manager mk1: $(km get tj mk1 -o jsonpath='{.status}' 2>&1 | cut -c1-300)"
[ -z "$(km get pods -l meshwork.dev/job=mk1 -o name 2>/dev/null)" ] && pass "the manager ran no Pod of it" ||
  fail "manager Pods: $(km get pods -l meshwork.dev/job=mk1 -o name)"
e2e_wait_for 60 "the manager's Workload Finished" bash -c \
  "[ \"\$(kubectl -n kq get workloads.kueue.x-k8s.io trainingjob-mk1 -o jsonpath='{.status.conditions[?(@.type==\"Finished\")].status}')\" = True ]" &&
  pass "the manager's Workload is Finished" ||
  fail "manager Workload: $(km get workloads.kueue.x-k8s.io trainingjob-mk1 -o jsonpath='{.status.conditions}' 2>&1 | cut -c1-400)"
finish
