#!/usr/bin/env bash
# Real kubectl against meshwork-controlplane (docs/controlplane.md): apply (create and update) of a
# CRD and of a custom resource, get / get -o yaml / get -w, describe with events, an invalid custom
# resource refused with the field and reason, a status patch and `kubectl wait`, delete, a pod's
# logs, owner garbage collection, and a SIGKILL + restart on the same data dir and port that loses
# no acknowledged write (same objects, same resourceVersions). Then what a Helm chart applies:
# ServiceAccount and RBAC objects, a Deployment (rollout status, scale, template change, cascading
# delete), the serviceAccountName check and the pods' service-account directory.
# usage: kubectl_e2e.sh path/to/meshwork-controlplane path/to/testdata
set -uo pipefail

bin="$1"
data="$2"
if ! command -v kubectl >/dev/null; then
  echo "SKIP: kubectl is not installed"
  exit 0
fi
work="$(mktemp -d)"
cp_pid=""
cleanup() {
  if [ -n "$cp_pid" ]; then kill -9 "$cp_pid" 2>/dev/null; wait "$cp_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
export HOME="$work" KUBECONFIG="$work/kubeconfig"
passed=0
failed=0
pass() { echo "PASS: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }
k() { timeout 60 kubectl --request-timeout=30s "$@"; }

# start [PORT]: runs the control plane on the data dir, waits for its "serving on" line.
start() {
  : >"$work/cp.log"
  "$bin" --data-dir "$work/data" --port "${1:-0}" --kubeconfig "$work/kubeconfig" >"$work/cp.log" 2>&1 &
  cp_pid=$!
  if ! timeout 30 bash -c "until grep -q 'serving on' '$work/cp.log'; do sleep 0.1; done"; then
    echo "control plane did not start: $(cat "$work/cp.log")"
    exit 1
  fi
}

start
port="$(sed -n 's|.*serving on https://127.0.0.1:\([0-9]*\) .*|\1|p' "$work/cp.log")"
[ -n "$port" ] && pass "serving over HTTPS on port $port" || fail "no https port in: $(cat "$work/cp.log")"
grep -q "certificate-authority-data:" "$work/kubeconfig" && grep -q "current-context: meshwork-local" "$work/kubeconfig" &&
  pass "kubeconfig written" || fail "kubeconfig: $(cat "$work/kubeconfig")"
out="$(k --token wrong get ns 2>&1)"
[[ "$out" == *Unauthorized* || "$out" == *"provide credentials"* ]] && pass "a wrong token gets 401" || fail "wrong token: $out"
out="$(k get ns 2>&1)"
[[ "$out" == *default*Active* ]] && pass "namespaces served" || fail "get ns: $out"

# Generator commands send protobuf bodies for these kinds.
out="$(k create namespace team-a 2>&1 && k create configmap settings --from-literal=greeting=hello 2>&1)"
[[ "$out" == *"namespace/team-a created"*"configmap/settings created"* ]] && pass "kubectl create namespace / configmap" || fail "create ns/cm: $out"
out="$(k get cm settings -o jsonpath='{.data.greeting}' 2>&1)"
[[ "$out" == hello ]] && pass "configmap data decoded" || fail "cm data: $out"

# CRD: create, update, established.
out="$(k apply -f "$data/trainingjob-crd.yaml" 2>&1)"
[[ "$out" == *"trainingjobs.meshwork.dev created"* ]] && pass "apply creates the CRD" || fail "apply CRD: $out"
out="$(k apply -f "$data/trainingjob-crd-v2.yaml" 2>&1)"
[[ "$out" == *"trainingjobs.meshwork.dev configured"* ]] && pass "apply updates the CRD" || fail "apply CRD v2: $out"
out="$(k wait --for=condition=Established crd/trainingjobs.meshwork.dev --timeout=20s 2>&1)"
[[ "$out" == *"condition met"* ]] && pass "CRD is Established" || fail "wait Established: $out"
out="$(k api-resources --api-group=meshwork.dev 2>&1)"
[[ "$out" == *trainingjobs*tj*meshwork.dev/v1alpha1*true*TrainingJob* ]] && pass "discovery lists trainingjobs" || fail "api-resources: $out"

# Custom resource: create, update, read back.
out="$(k apply -f "$data/job.yaml" 2>&1)"
[[ "$out" == *"trainingjob.meshwork.dev/llama created"* ]] && pass "apply creates the TrainingJob" || fail "apply job: $out"
out="$(k get tj 2>&1)"
[[ "$out" == *REPLICAS*PHASE*llama*2* ]] && pass "get shows printer columns" || fail "get tj: $out"
out="$(k apply -f "$data/job-v2.yaml" 2>&1)"
[[ "$out" == *"trainingjob.meshwork.dev/llama configured"* ]] && pass "apply updates the TrainingJob" || fail "apply job v2: $out"
yaml="$(k get trainingjob llama -o yaml 2>&1)"
if [[ "$yaml" == *"replicas: 4"* && "$yaml" == *"generation: 2"* && "$yaml" == *"restartPolicy: Gang"* && "$yaml" == *"uid: "* ]]; then
  pass "get -o yaml: updated spec, generation 2, schema default applied"
else
  fail "get -o yaml: $yaml"
fi
out="$(k get tj -o wide 2>&1)"
[[ "$out" == *IMAGE*meshwork/trainer:latest* ]] && pass "priority-1 column in -o wide" || fail "get -o wide: $out"

# Invalid custom resource: refused with field and reason.
out="$(k apply -f "$data/job-invalid.yaml" 2>&1)"
rc=$?
if [ $rc -ne 0 ] && [[ "$out" == *"spec.replicas"*"should be greater than or equal to 1"* && "$out" == *"spec.restartPolicy"*"Unsupported value"* ]]; then
  pass "invalid TrainingJob refused: $(echo "$out" | tr '\n' ' ' | cut -c1-160)"
else
  fail "invalid TrainingJob (rc $rc): $out"
fi
out="$(k apply -f "$data/job-unknown-field.yaml" 2>&1)"
[[ "$out" == *BadRequest*'unknown field "spec.imagePullPolicyy"'* ]] && pass "unknown field refused (fieldValidation=Strict)" || fail "unknown field: $out"
out="$(k get tj broken 2>&1)"
[[ "$out" == *NotFound* ]] && pass "the invalid object was not stored" || fail "get broken: $out"

# get -w sees the status update; kubectl wait sees the condition.
timeout 20 kubectl get tj llama -w >"$work/watch.out" 2>&1 &
watch_pid=$!
sleep 1
out="$(k patch tj llama --subresource=status --type=merge \
  -p '{"status":{"phase":"Running","observedGeneration":2,"conditions":[{"type":"Ready","status":"True","reason":"AllReplicasUp","message":"4/4 up"}]}}' 2>&1)"
[[ "$out" == *patched* ]] && pass "status patched" || fail "patch status: $out"
out="$(k wait --for=condition=Ready tj/llama --timeout=20s 2>&1)"
[[ "$out" == *"condition met"* ]] && pass "kubectl wait --for=condition=Ready" || fail "wait: $out"
if timeout 15 bash -c "until grep -q Running '$work/watch.out'; do sleep 0.2; done"; then
  pass "get -w saw the update"
else
  fail "get -w output: $(cat "$work/watch.out")"
fi
kill "$watch_pid" 2>/dev/null
wait "$watch_pid" 2>/dev/null
yaml="$(k get tj llama -o yaml 2>&1)"
[[ "$yaml" == *"generation: 2"* && "$yaml" == *"phase: Running"* ]] && pass "status update kept generation" || fail "after status: $yaml"
out="$(k patch tj llama --type=merge -p '{"status":{"phase":"Hacked"},"spec":{"replicas":3}}' 2>&1)"
yaml="$(k get tj llama -o yaml 2>&1)"
[[ "$yaml" == *"phase: Running"* && "$yaml" == *"replicas: 3"* && "$yaml" == *"generation: 3"* ]] &&
  pass "main-resource patch ignores status, bumps generation" || fail "main patch: $out $yaml"

out="$(k scale tj llama --replicas=6 2>&1)"
[[ "$out" == *scaled* && "$(k get tj llama -o jsonpath='{.spec.replicas}')" == 6 ]] &&
  pass "kubectl scale through the scale subresource" || fail "scale: $out $(k get tj llama -o yaml 2>&1)"

# describe lists the object's events.
uid="$(k get tj llama -o jsonpath='{.metadata.uid}')"
cat >"$work/event.yaml" <<YAML
apiVersion: v1
kind: Event
metadata:
  name: llama.started
involvedObject:
  apiVersion: meshwork.dev/v1alpha1
  kind: TrainingJob
  name: llama
  namespace: default
  uid: $uid
reason: GangStarted
message: all 4 replicas running
type: Normal
count: 1
firstTimestamp: "2026-01-01T00:00:00Z"
lastTimestamp: "2026-01-01T00:00:00Z"
source:
  component: meshwork-operator
YAML
k apply -f "$work/event.yaml" >/dev/null 2>&1
out="$(k describe tj llama 2>&1)"
[[ "$out" == *"Replicas:"*"6"* && "$out" == *"Phase:"*"Running"* && "$out" == *GangStarted*"all 4 replicas running"* ]] &&
  pass "describe shows spec, status and events" || fail "describe: $out"

# Owner garbage collection: a ConfigMap owned by the job goes with it.
cat >"$work/owned.yaml" <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: llama-config
  ownerReferences:
  - apiVersion: meshwork.dev/v1alpha1
    kind: TrainingJob
    name: llama
    uid: $uid
data:
  world_size: "4"
YAML
out="$(k apply -f "$work/owned.yaml" 2>&1)"
[[ "$out" == *created* ]] && pass "owned ConfigMap created" || fail "owned cm: $out"

# A pod runs as a local process; its log is served.
out="$(k apply -f "$data/pod.yaml" 2>&1)"
[[ "$out" == *"pod/hello created"* ]] && pass "pod created" || fail "apply pod: $out"
out="$(k wait --for=jsonpath='{.status.phase}'=Succeeded pod/hello --timeout=30s 2>&1)"
[[ "$out" == *"condition met"* ]] && pass "pod ran to Succeeded" || fail "pod wait: $out $(k get pod hello -o yaml 2>&1)"
out="$(k logs hello 2>&1)"
[[ "$out" == hello* ]] && pass "kubectl logs shows the pod's output" || fail "logs: $out"
out="$(k describe pod hello 2>&1)"
[[ "$out" == *"Status:"*"Succeeded"* && "$out" == *Scheduled*"Successfully assigned default/hello to local"* ]] &&
  pass "describe pod shows the phase and the scheduler's event" || fail "describe pod: $out"
out="$(k run sleeper --image=none --restart=Never --command -- sh -c 'echo started; sleep 60' 2>&1)"
[[ "$out" == *created* ]] && pass "kubectl run" || fail "run: $out"
if timeout 20 bash -c "until kubectl logs sleeper 2>/dev/null | grep -q started; do sleep 0.2; done"; then
  pass "logs of a running pod"
else
  fail "logs sleeper: $(k logs sleeper 2>&1)"
fi

out="$(k delete pod sleeper --timeout=30s 2>&1)"
[[ "$out" == *deleted* ]] && pass "running pod deleted (process stopped)" || fail "delete pod: $out"
out="$(k get pod sleeper 2>&1)"
[[ "$out" == *NotFound* ]] && pass "deleted pod is gone" || fail "get sleeper after delete: $out"

# Persistence: SIGKILL after acknowledged writes, restart on the same data dir and port.
k apply -f "$data/job.yaml" >/dev/null 2>&1  # a write acknowledged just before the kill
before="$(k get tj,cm,pods,events -o jsonpath='{range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion}{"\n"}{end}' 2>&1 | sort)"
{ kill -9 "$cp_pid"; wait "$cp_pid"; } 2>/dev/null
cp_pid=""
start "$port"
after="$(k get tj,cm,pods,events -o jsonpath='{range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion}{"\n"}{end}' 2>&1 | sort)"
if [ -n "$before" ] && [ "$before" == "$after" ]; then
  pass "SIGKILL + restart kept $(echo "$before" | wc -l) objects with their resourceVersions"
else
  fail "after restart: before=[$before] after=[$after]"
fi

# Deletion: the job, then its owned ConfigMap by the garbage collector.
out="$(k delete tj llama 2>&1)"
[[ "$out" == *deleted* ]] && pass "kubectl delete" || fail "delete: $out"
out="$(k get tj llama 2>&1)"
[[ "$out" == *NotFound* ]] && pass "deleted job is gone" || fail "get after delete: $out"
if timeout 20 bash -c "until kubectl get cm llama-config 2>&1 | grep -q NotFound; do sleep 0.2; done"; then
  pass "owned ConfigMap garbage-collected"
else
  fail "owned cm still there: $(k get cm llama-config 2>&1)"
fi

# Deleting the CRD removes its resources from discovery.
out="$(k delete -f "$data/trainingjob-crd.yaml" 2>&1)"
[[ "$out" == *deleted* ]] && pass "CRD deleted" || fail "delete crd: $out"
out="$(k get trainingjobs 2>&1)"
[[ "$out" == *"doesn't have a resource type"* || "$out" == *NotFound* ]] && pass "trainingjobs gone with the CRD" || fail "after CRD delete: $out"

# ServiceAccounts and RBAC objects: stored and served (not enforced), as a Helm chart applies them.
cat >"$work/rbac.yaml" <<'YAML'
apiVersion: v1
kind: ServiceAccount
metadata:
  name: meshwork-operator
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: meshwork-operator
rules:
- apiGroups: ["meshwork.dev"]
  resources: ["trainingjobs", "trainingjobs/status"]
  verbs: ["get", "list", "watch", "update", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: meshwork-operator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: meshwork-operator
subjects:
- kind: ServiceAccount
  name: meshwork-operator
  namespace: default
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: leader-election
rules:
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: leader-election
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: leader-election
subjects:
- kind: ServiceAccount
  name: meshwork-operator
  namespace: default
YAML
out="$(k apply -f "$work/rbac.yaml" 2>&1)"
[[ "$out" == *"serviceaccount/meshwork-operator created"*"clusterrole.rbac.authorization.k8s.io/meshwork-operator created"*"clusterrolebinding.rbac.authorization.k8s.io/meshwork-operator created"*"role.rbac.authorization.k8s.io/leader-election created"*"rolebinding.rbac.authorization.k8s.io/leader-election created"* ]] &&
  pass "apply ServiceAccount, ClusterRole(Binding), Role(Binding)" || fail "apply rbac: $out"
out="$(k apply -f "$work/rbac.yaml" 2>&1)"
[[ "$(echo "$out" | grep -c unchanged)" == 5 ]] && pass "re-apply leaves them unchanged" || fail "re-apply rbac: $out"
out="$(k create serviceaccount builder 2>&1)"
[[ "$out" == *"serviceaccount/builder created"* ]] && pass "kubectl create serviceaccount (protobuf)" || fail "create sa: $out"
out="$(k get sa meshwork-operator 2>&1)"
[[ "$out" == *NAME*SECRETS*AGE*meshwork-operator*0* ]] && pass "get sa" || fail "get sa: $out"
out="$(k get clusterrolebinding meshwork-operator -o wide 2>&1)"
[[ "$out" == *ROLE*meshwork-operator*ClusterRole/meshwork-operator*default/meshwork-operator* ]] && pass "get clusterrolebinding -o wide" || fail "get crb: $out"
out="$(k get clusterrole meshwork-operator -o jsonpath='{.rules[0].resources}' 2>&1)"
[[ "$out" == *trainingjobs/status* ]] && pass "clusterrole rules stored" || fail "get clusterrole: $out"
out="$(k get role,rolebinding 2>&1)"
[[ "$out" == *role.rbac.authorization.k8s.io/leader-election*rolebinding.rbac.authorization.k8s.io/leader-election*Role/leader-election* ]] &&
  pass "get role,rolebinding" || fail "get role,rolebinding: $out"
out="$(k describe clusterrole meshwork-operator 2>&1)"
[[ "$out" == *trainingjobs.meshwork.dev*"[get list watch update patch]"* ]] && pass "describe clusterrole" || fail "describe clusterrole: $out"

# A Deployment: Pods from its template, rollout status, the READY column, scale, a template
# change (Recreate), delete cascading to the Pods.
cat >"$work/deploy.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      serviceAccountName: meshwork-operator
      terminationGracePeriodSeconds: 5
      containers:
      - name: main
        image: busybox
        command: ["sleep", "300"]
YAML
# live_pods SELECTOR: names of the selected Pods that are not being deleted.
live_pods() {
  k get pods -l "$1" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.deletionTimestamp}{"\n"}{end}' 2>/dev/null |
    awk 'NF == 1 {print $1}' | sort
}
out="$(k apply -f "$work/deploy.yaml" 2>&1)"
[[ "$out" == *"deployment.apps/web created"* ]] && pass "apply creates the Deployment" || fail "apply deploy: $out"
out="$(k rollout status deploy/web --timeout=60s 2>&1)"
[[ "$out" == *"successfully rolled out"* ]] && pass "rollout status" || fail "rollout status: $out $(k get deploy web -o yaml 2>&1)"
out="$(k wait --for=condition=Available deploy/web --timeout=60s 2>&1)"
[[ "$out" == *"condition met"* ]] && pass "wait --for=condition=Available" || fail "wait Available: $out"
out="$(k get deploy web 2>&1)"
[[ "$out" == *NAME*READY*UP-TO-DATE*AVAILABLE*AGE*web*2/2*2*2* ]] && pass "get deploy columns: $(echo "$out" | tail -1)" || fail "get deploy: $out"
out="$(k get deploy -o wide 2>&1)"
[[ "$out" == *CONTAINERS*IMAGES*SELECTOR*main*busybox*app=web* ]] && pass "get deploy -o wide" || fail "get deploy -o wide: $out"
pods="$(live_pods app=web)"
hash="$(k get pods -l app=web -o jsonpath='{.items[0].metadata.labels.pod-template-hash}' 2>&1)"
if [ "$(echo "$pods" | wc -l)" == 2 ] && [ -n "$hash" ] && ! echo "$pods" | grep -qv "^web-$hash-[a-z0-9]\{5\}$"; then
  pass "2 Pods named web-<hash>-<suffix>"
else
  fail "deployment pods: [$pods] hash=$hash"
fi
out="$(k get pods -l app=web -o jsonpath='{.items[0].metadata.ownerReferences[0].kind}/{.items[0].metadata.ownerReferences[0].name} {.items[0].status.phase}' 2>&1)"
[[ "$out" == "Deployment/web Running" ]] && pass "Pods owned by the Deployment, Running" || fail "pod owner: $out"
# kubectl's discovery cache still has the deleted CRD's trainingjobs (category all).
rm -rf "$HOME/.kube/cache"
out="$(k get all 2>&1)"
[[ "$out" == *deployment.apps/web* ]] && pass "get all lists the Deployment" || fail "get all: $out"
out="$(k scale deploy web --replicas=3 2>&1)"
[[ "$out" == *"deployment.apps/web scaled"* ]] && pass "kubectl scale deploy" || fail "scale deploy: $out"
k rollout status deploy/web --timeout=60s >/dev/null 2>&1
[ "$(live_pods app=web | wc -l)" == 3 ] && pass "scaled up to 3 Pods" || fail "after scale up: $(k get pods -l app=web 2>&1)"
k scale deploy web --replicas=1 >/dev/null 2>&1
if timeout 30 bash -c "until [ \"\$(kubectl get pods -l app=web -o name 2>/dev/null | wc -l)\" == 1 ]; do sleep 0.3; done"; then
  pass "scaled down to 1 Pod"
else
  fail "after scale down: $(k get pods -l app=web 2>&1)"
fi
out="$(k describe deploy web 2>&1)"
[[ "$out" == *"Replicas:"*"1 desired"* && "$out" == *ScalingReplicaSet* ]] && pass "describe deploy" || fail "describe deploy: $out"
before="$(live_pods app=web)"
out="$(k rollout restart deploy/web 2>&1)"
[[ "$out" == *restarted* ]] && pass "rollout restart (template change)" || fail "rollout restart: $out"
out="$(k rollout status deploy/web --timeout=60s 2>&1)"
after="$(live_pods app=web)"
newhash="$(k get pods -l app=web -o jsonpath='{.items[0].metadata.labels.pod-template-hash}' 2>&1)"
if [[ "$out" == *"successfully rolled out"* ]] && [ -n "$after" ] && [ "$before" != "$after" ] && [ "$newhash" != "$hash" ] &&
   [ "$(k get pods -l app=web -o name | wc -l)" == 1 ]; then
  pass "template change replaced the Pod ($before -> $after)"
else
  fail "after template change: $out before=[$before] after=[$after] hash $hash -> $newhash"
fi
out="$(k get deploy web -o jsonpath='{.metadata.generation} {.status.observedGeneration}' 2>&1)"
set -- $out
[ -n "${1:-}" ] && [ "$1" == "${2:-}" ] && [ "$1" -ge 4 ] && pass "generation $1 observed" || fail "generation: $out"
cat >"$work/deploy-bad.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: mismatched
spec:
  selector:
    matchLabels: {app: one}
  template:
    metadata:
      labels: {app: two}
    spec:
      containers:
      - name: main
        image: busybox
        command: ["sleep", "300"]
YAML
out="$(k apply -f "$work/deploy-bad.yaml" 2>&1)"
[[ "$out" == *'spec.template.metadata.labels: Invalid value: map[string]string{"app":"two"}: `selector` does not match template `labels`'* ]] &&
  pass "selector not matching the template's labels is refused" || fail "bad selector: $out"
out="$(k delete deploy web 2>&1)"
[[ "$out" == *deleted* ]] && pass "delete deploy" || fail "delete deploy: $out"
if timeout 30 bash -c "until [ -z \"\$(kubectl get pods -l app=web -o name 2>/dev/null)\" ]; do sleep 0.3; done"; then
  pass "the Deployment's Pods went with it"
else
  fail "pods after deleting the deployment: $(k get pods -l app=web 2>&1)"
fi

# Pods and service accounts: a missing one is refused; the token directory stands in for the mount.
cat >"$work/pod-nosa.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: nosa
spec:
  serviceAccountName: missing
  containers:
  - name: main
    image: busybox
    command: ["sleep", "1"]
YAML
out="$(k apply -f "$work/pod-nosa.yaml" 2>&1)"
[[ "$out" == *'pods "nosa" is forbidden: error looking up service account default/missing: serviceaccount "missing" not found'* ]] &&
  pass "pod with a missing serviceAccountName refused" || fail "pod nosa: $out"
cat >"$work/pod-sa.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: sa-reader
  namespace: team-a
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "echo \"dir=$MESHWORK_SERVICE_ACCOUNT_DIR\"; echo \"ns=$(cat $MESHWORK_SERVICE_ACCOUNT_DIR/namespace)\"; stat -c 'mode=%a' $MESHWORK_SERVICE_ACCOUNT_DIR/token; head -1 $MESHWORK_SERVICE_ACCOUNT_DIR/ca.crt; sleep 300"]
---
apiVersion: v1
kind: Pod
metadata:
  name: no-automount
  namespace: team-a
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "echo \"dir=$MESHWORK_SERVICE_ACCOUNT_DIR\"; sleep 300"]
YAML
out="$(k apply -f "$work/pod-sa.yaml" 2>&1)"
[[ "$out" == *"pod/sa-reader created"*"pod/no-automount created"* ]] && pass "pods with and without the token created" || fail "pod-sa: $out"
if timeout 30 bash -c "until kubectl logs -n team-a sa-reader 2>/dev/null | grep -q CERTIFICATE; do sleep 0.2; done"; then
  out="$(k logs -n team-a sa-reader 2>&1)"
  sa_dir="$(echo "$out" | sed -n 's/^dir=//p')"
  if [[ "$out" == *"ns=team-a"*"mode=600"*"-----BEGIN CERTIFICATE-----"* ]] && [ -n "$sa_dir" ] &&
     [ "$(cat "$sa_dir/token")" == "$(head -1 "$work/data/token")" ]; then
    pass "MESHWORK_SERVICE_ACCOUNT_DIR has namespace, token (0600) and ca.crt"
  else
    fail "sa-reader: $out (token file: $(ls -l "$sa_dir" 2>&1))"
  fi
else
  fail "sa-reader logs: $(k logs -n team-a sa-reader 2>&1) $(k get pod -n team-a sa-reader -o yaml 2>&1)"
fi
if timeout 30 bash -c "until kubectl logs -n team-a no-automount 2>/dev/null | grep -q dir=; do sleep 0.2; done" &&
   [ "$(k logs -n team-a no-automount 2>&1)" == "dir=" ]; then
  pass "automountServiceAccountToken: false gets no directory"
else
  fail "no-automount: $(k logs -n team-a no-automount 2>&1)"
fi
k delete -f "$work/pod-sa.yaml" --timeout=30s >/dev/null 2>&1
out="$(k describe sa meshwork-operator 2>&1)"
[[ "$out" == *"Name:"*meshwork-operator* ]] && pass "describe sa" || fail "describe sa: $out"
out="$(k describe rolebinding leader-election 2>&1)"
[[ "$out" == *"Role:"*leader-election*ServiceAccount*meshwork-operator* ]] && pass "describe rolebinding" || fail "describe rolebinding: $out"
out="$(k delete -f "$work/rbac.yaml" 2>&1)"
[[ "$(echo "$out" | grep -c deleted)" == 5 ]] && pass "delete ServiceAccount and RBAC objects" || fail "delete rbac: $out"
out="$(k get clusterrole,clusterrolebinding meshwork-operator 2>&1)"
[[ "$out" == *NotFound* && "$out" != *"meshwork-operator "* ]] && pass "RBAC objects gone" || fail "after delete rbac: $out"

echo "passed $passed, failed $failed"
[ "$failed" -eq 0 ]
