#!/usr/bin/env bash
# The Helm chart on the local cluster (meshwork-cluster: real kube-apiserver), with helm and kubectl:
#   - `helm template --include-crds` of charts/meshwork-operator applies with `kubectl apply`
#     (CRD, ServiceAccount, ClusterRole and bindings, Lease Role, Service, Deployment);
#   - the Deployment rolls out: its Pod runs meshwork-operator with the chart's flags, and the
#     operator reads its service account the in-cluster way (no kubeconfig in its environment);
#   - the Pod holds the Lease named in values and answers /readyz on the chart's metrics port;
#   - a TrainingJob applied with kubectl is reconciled by that operator to Succeeded;
#   - deleting the operator Pod: the Deployment replaces it, and the new Pod takes the Lease;
#   - then `helm install` itself (release stored in Secrets), `helm upgrade` (the Pod is
#     replaced with the new flags and takes the Lease) and `helm uninstall` (everything but the
#     CRD is gone);
#   - kube-apiserver enforces RBAC: its audit log must show every operator call allowed by the
#     chart's rendered RBAC and none denied.
# helm and kubectl are the ones scripts/kube-build.sh built (3.22, 1.37). The `helm test` Pod is
# not run here: it reaches the operator through its Service's DNS name, and the local cluster has
# no Service routing (no kube-proxy; docs/cluster.md).
# usage: helm_e2e.sh CLUSTER OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

cp_bin="$1"
op_bin="$2"
train_bin="$3"
src="$4"
chart="$src/charts/meshwork-operator"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kube_bin
helm="$MESHWORK_KUBE_BIN/helm"
e2e_init
ns=meshwork-system
k() { timeout 60 kubectl --request-timeout=30s "$@"; }
dump() {
  echo "---- kubectl get all -A"; k get deploy,pods,svc,tj -A -o wide 2>&1
  echo "---- operator Pod logs"
  for p in $(k -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null); do
    echo "== $p"; k -n "$ns" logs "$p" 2>&1 | tail -n 30
  done
  echo "---- control plane"; tail -n 20 "$work/cp.log"
}

# The control plane runs the Pods with its own environment: meshwork-operator and meshwork-train
# on PATH (images are ignored locally), and no KUBECONFIG, so that the operator can only reach
# the API through the service account the node agent gives each Pod.
mkdir -p "$work/cp" "$work/data"
audit="$work/cp/logs/audit.log"   # kube-apiserver's (meshwork-cluster writes it there)
(cd "$work" && exec env -u KUBECONFIG PATH="$(dirname "$op_bin"):$(dirname "$train_bin"):$PATH" \
  "$cp_bin" --data-dir "$work/cp" --kubeconfig "$KUBECONFIG" >"$work/cp.log" 2>&1) &
e2e_track $!
e2e_wait_serving $! "$work/cp.log" "the control plane" || exit 1
"$train_bin" prepare-data --out "$work/data/train.bin" --val-out "$work/data/val.bin" "$src/README.md" "$src/docs" >/dev/null ||
  fail "prepare-data"

# ---- install: helm template | kubectl apply
port="$(free_port)"
k create namespace "$ns" >/dev/null
"$helm" template meshwork "$chart" -n "$ns" --kube-version 1.29.0 --include-crds --skip-tests \
  --set metricsPort="$port" --set operator.reportIntervalSeconds=2 --set operator.podDeleteGraceSeconds=5 \
  --set operator.leaderElection.leaseDurationSeconds=4 --set operator.leaderElection.renewDeadlineSeconds=3 \
  --set operator.leaderElection.retryPeriodSeconds=1 >"$work/rendered.yaml" 2>"$work/helm.err" ||
  { fail "helm template: $(cat "$work/helm.err")"; exit 1; }
out="$(k apply -f "$work/rendered.yaml" 2>&1)"
want=(customresourcedefinition.apiextensions.k8s.io/trainingjobs.meshwork.dev serviceaccount/meshwork-meshwork-operator
  clusterrole.rbac.authorization.k8s.io/meshwork-meshwork-operator
  clusterrolebinding.rbac.authorization.k8s.io/meshwork-meshwork-operator
  role.rbac.authorization.k8s.io/meshwork-meshwork-operator-leader-election
  rolebinding.rbac.authorization.k8s.io/meshwork-meshwork-operator-leader-election
  service/meshwork-meshwork-operator-metrics deployment.apps/meshwork-meshwork-operator)
missing=""
for w in "${want[@]}"; do [[ "$out" == *"$w created"* ]] || missing+=" $w"; done
[ -z "$missing" ] && pass "kubectl apply of the rendered chart creates all ${#want[@]} objects" ||
  fail "kubectl apply: missing$missing; output: $out"
k wait --for=condition=Established crd/trainingjobs.meshwork.dev --timeout=20s >/dev/null 2>&1 ||
  fail "the CRD from the chart's crds/ is not Established"

out="$(k -n "$ns" rollout status deployment/meshwork-meshwork-operator --timeout=90s 2>&1)"
[[ "$out" == *"successfully rolled out"* ]] && pass "the operator Deployment rolls out" || { fail "rollout: $out"; dump; }
pod="$(k -n "$ns" get pods -l app.kubernetes.io/name=meshwork-operator -o jsonpath='{.items[0].metadata.name}' 2>/dev/null)"
[[ "$pod" == meshwork-meshwork-operator-* ]] && pass "the Deployment's Pod is $pod" || fail "operator Pod: '$pod'"
# The Pod's own address: its own network namespace on the cluster's Pod network, or a loopback
# address where the cluster has none (docs/cluster.md, "Pod network"); the operator listens on all.
pod_ip="$(k -n "$ns" get pod "$pod" -o jsonpath='{.status.podIP}' 2>/dev/null)"
sa="$(k -n "$ns" get pod "$pod" -o jsonpath='{.spec.serviceAccountName}' 2>/dev/null)"
[ "$sa" = meshwork-meshwork-operator ] && pass "it runs as the chart's ServiceAccount" || fail "serviceAccountName '$sa'"

lease=meshwork-meshwork-operator   # operator.leaderElection.id defaults to the release's full name
holder() { k -n "$ns" get lease "$lease" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
holder_is() { [ "$(holder)" = "$1" ]; }
e2e_wait_for 30 "$pod holds the Lease" holder_is "$pod" &&
  pass "the operator Pod holds Lease $ns/$lease under its Pod name" || { fail "Lease holder '$(holder)'"; dump; }
log="$(k -n "$ns" logs "$pod" 2>&1)"
[[ "$log" == *"API server https://"*"(in-cluster service account ("* && "$log" == *"namespace (all)"* &&
  "$log" == *"port $port"* ]] &&
  pass "it found the API through its service account, watches every namespace, serves metrics on port $port" ||
  fail "operator log: $log"
code="$(curl -s -o /dev/null -w '%{http_code}' "http://$pod_ip:$port/readyz")"
leader="$(curl -s "http://$pod_ip:$port/metrics" | awk '$1 == "meshwork_operator_leader" {print $2}')"
[ "$code" = 200 ] && [ "$leader" = 1 ] && pass "/readyz answers 200 and meshwork_operator_leader is 1" ||
  fail "readyz $code, leader gauge '$leader'"

# ---- a TrainingJob, reconciled by the operator the chart installed
k create namespace ml >/dev/null
master="$(free_port)"
metrics="$(free_port)"
cat >"$work/job.yaml" <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: from-helm
  namespace: ml
spec:
  image: meshwork/trainer:e2e
  device: cpu
  replicas: 2
  masterPort: $master
  metricsPort: $metrics
  config:
    inline: |
      model: {preset: tiny}
      data: {train: $work/data/train.bin, val: $work/data/val.bin, seq_len: 64, batch_size: 4}
      schedule: {steps: 20, warmup_steps: 5}
      eval: {windows: 4}
      logging: {every: 5}
EOF
out="$(k apply -f "$work/job.yaml" 2>&1)"
[[ "$out" == *created* ]] && pass "a TrainingJob applies" || fail "apply job: $out"
phase() { k -n ml get tj from-helm -o jsonpath='{.status.phase}' 2>/dev/null; }
succeeded() { [ "$(phase)" = Succeeded ]; }
if e2e_wait_for 300 "from-helm succeeds" succeeded; then
  step="$(k -n ml get tj from-helm -o jsonpath='{.status.trainer.step}/{.status.trainer.totalSteps}')"
  [ "$step" = 20/20 ] && pass "the chart's operator runs it to Succeeded, step $step" || fail "status.trainer: $step"
else
  fail "from-helm did not succeed: $(k -n ml get tj from-helm -o jsonpath='{.status}' 2>&1)"
  dump
fi
created="$(curl -s "http://$pod_ip:$port/metrics" | awk '$1 ~ /^meshwork_operator_pods_created_total/ {s += $2} END {print s + 0}')"
[ "$created" -ge 2 ] 2>/dev/null && pass "the operator's Pod counter shows the $created Pods it created" ||
  fail "meshwork_operator_pods_created_total: '$created'"

# ---- a gang launched while the job's Service is there (a suspend, then a resume): the operator
# checks that Service is the job's own (get services), which the RBAC audit below must allow
sed -e 's/name: from-helm/name: cycle/' -e "s/masterPort: $master/masterPort: $(free_port)/" \
  -e "s/metricsPort: $metrics/metricsPort: $(free_port)/" -e 's/steps: 20, warmup_steps: 5/steps: 100000, warmup_steps: 5/' \
  "$work/job.yaml" >"$work/cycle.yaml"
cycle_phase() { [ "$(k -n ml get tj cycle -o jsonpath='{.status.phase}' 2>/dev/null)" = "$1" ]; }
cycle_gen() { [ "$(k -n ml get tj cycle -o jsonpath='{.status.restartGeneration}/{.status.launchedGeneration}' 2>/dev/null)" = "$1" ]; }
suspend_cycle() { k -n ml patch tj cycle --type=merge -p "{\"spec\":{\"runPolicy\":{\"suspend\":$1}}}" >/dev/null 2>&1; }
if k apply -f "$work/cycle.yaml" >/dev/null 2>&1 && e2e_wait_for 120 "cycle runs" cycle_phase Running &&
   suspend_cycle true && e2e_wait_for 60 "cycle is suspended" cycle_phase Suspended &&
   suspend_cycle false && e2e_wait_for 120 "cycle's second gang is created" cycle_gen 1/1; then
  pass "a job suspended and resumed gets its second gang (its Service already there)"
else
  fail "suspend and resume: $(k -n ml get tj cycle -o jsonpath='{.status}' 2>&1)"
  dump
fi
k -n ml delete tj cycle --wait=false >/dev/null 2>&1

# ---- the Deployment replaces a deleted operator Pod; the new one takes the Lease
k -n "$ns" delete pod "$pod" --wait=false >/dev/null 2>&1
new_pod() { k -n "$ns" get pods -l app.kubernetes.io/name=meshwork-operator -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}' 2>/dev/null | grep -vx "$pod"; }
if e2e_wait_for 60 "a replacement operator Pod" new_pod; then
  replacement="$(new_pod | head -n 1)"
  e2e_wait_for 30 "$replacement holds the Lease" holder_is "$replacement" &&
    pass "a deleted operator Pod is replaced by $replacement, which takes the Lease" ||
    { fail "Lease holder after the replacement: '$(holder)'"; dump; }
else
  fail "no replacement for the deleted operator Pod"
  dump
fi

# ---- the chart's RBAC allows every API call the operator made, and kube-apiserver, which
# enforces RBAC, denied none (its audit log). The operator's client sends User-Agent
# meshwork-operator/<version>.
out="$(python3 "$src/tests/helm/rbac_audit_check.py" "$audit" "$work/rendered.yaml" meshwork-operator/ 2>&1)"
if [ $? = 0 ]; then
  pass "every API call the operator made is allowed by the chart's RBAC ($(sed -n 's/^\([0-9]*\) distinct API calls.*/\1/p' <<<"$out") distinct calls)"
  echo "$out"
else
  fail "the chart's RBAC does not cover the operator's API calls: $out"
fi

# ---- helm install, upgrade, uninstall
"$helm" template meshwork "$chart" -n "$ns" --kube-version 1.29.0 --skip-tests --set metricsPort="$port" >"$work/no-crd.yaml"
k delete -f "$work/no-crd.yaml" --wait=true >/dev/null 2>&1
gone() { [ -z "$(k -n "$ns" get pods -o name 2>/dev/null)" ]; }
e2e_wait_for 60 "the applied chart's Pods are gone" gone || fail "kubectl delete of the rendered chart left Pods"
port2="$(free_port)"
release=meshwork-operator
lease=$release
leader_pod() { k -n "$ns" get pods -l app.kubernetes.io/instance=$release -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}' 2>/dev/null | head -n 1; }
holds_lease() { local p; p="$(leader_pod)"; [ -n "$p" ] && holder_is "$p"; }
out="$("$helm" install "$release" "$chart" -n "$ns" --set metricsPort="$port2" \
  --set operator.leaderElection.leaseDurationSeconds=4 --set operator.leaderElection.renewDeadlineSeconds=3 \
  --set operator.leaderElection.retryPeriodSeconds=1 2>&1)"
[[ "$out" == *"STATUS: deployed"* && "$out" == *"helm test $release -n $ns"* ]] &&
  pass "helm install deploys the release and prints the NOTES" || fail "helm install: $out"
out="$(k -n "$ns" rollout status deployment/$release --timeout=90s 2>&1)"
[[ "$out" == *"successfully rolled out"* ]] && e2e_wait_for 30 "the installed operator leads" holds_lease &&
  pass "the installed operator ($(leader_pod)) rolls out and takes the Lease" || { fail "after helm install: $out, Lease '$(holder)'"; dump; }
out="$("$helm" upgrade "$release" "$chart" -n "$ns" --reuse-values --set operator.workers=2 2>&1)"
args_of_leader() { k -n "$ns" get pod "$(leader_pod)" -o jsonpath='{.spec.containers[0].args}' 2>/dev/null; }
upgraded() { [[ "$(args_of_leader)" == *'"--workers=2"'* ]] && holds_lease; }
[[ "$out" == *"has been upgraded"* ]] && e2e_wait_for 90 "the upgraded Pod leads" upgraded &&
  pass "helm upgrade replaces the Pod with --workers=2, and it takes the Lease" || { fail "helm upgrade: $out; args $(args_of_leader)"; dump; }
out="$("$helm" uninstall "$release" -n "$ns" 2>&1)"
left() { k get deploy,sa,svc,role,rolebinding -n "$ns" -l app.kubernetes.io/instance=$release -o name 2>/dev/null
         k get clusterrole,clusterrolebinding -l app.kubernetes.io/instance=$release -o name 2>/dev/null; }
nothing_left() { [ -z "$(left)" ] && gone; }
[[ "$out" == *"uninstalled"* ]] && e2e_wait_for 60 "the release's objects are gone" nothing_left &&
  k get crd trainingjobs.meshwork.dev >/dev/null 2>&1 &&
  pass "helm uninstall removes every object but the CRD" || fail "helm uninstall: $out; left: $(left)"

e2e_summary helm_e2e
