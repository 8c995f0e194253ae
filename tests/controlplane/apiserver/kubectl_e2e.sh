#!/usr/bin/env bash
# Real kubectl against meshwork-controlplane (docs/controlplane.md): apply (create and update) of a
# CRD and of a custom resource, get / get -o yaml / get -w, describe with events, an invalid custom
# resource refused with the field and reason, a status patch and `kubectl wait`, delete, a pod's
# logs, owner garbage collection, and a SIGKILL + restart on the same data dir and port that loses
# no acknowledged write (same objects, same resourceVersions).
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

echo "passed $passed, failed $failed"
[ "$failed" -eq 0 ]
