#!/usr/bin/env bash
# meshwork-operator end to end on the local control plane, with real kubectl and real trainers
# (docs/trainingjob.md). Two operator replicas run with leader election throughout.
#   - apply -> Pods train -> Succeeded, with step, loss and tokens/s in status, and Events
#   - SIGKILL one trainer mid-run -> the whole gang restarts (restarts = 1), resumes from its
#     checkpoint and succeeds (kubeflow/training-operator#1478: a restarted worker that could
#     not rejoin)
#   - a permanent exit code -> Failed, no restart
#   - tensor parallelism: a dp_shard 2 x tp 2 job (2 Pods x 2 processes, a tp group per Pod) trains
#   - a job on a TrainingRuntime (the example files): waits for it, then runs with it merged
#   - failurePolicy rules (a message rule on the log tail: FailJob; an exit-code rule:
#     RestartGangAndIgnoreBackoff) and successPolicy Rank0
#   - retryable failures with ExitCode policy -> exactly backoffLimit restarts, then Failed, and
#     cleanPodPolicy All still deletes the Pods (#2045 ExitCode ignoring backoffLimit, #3419
#     cleanPodPolicy ignored when the backoff limit trips)
#   - ttlSecondsAfterFinished deletes the job, which is not re-created (kubeflow/trainer#2981)
#   - activeDeadlineSeconds, suspend and resume, delete with cascade
#   - SIGKILL the leading operator mid-run -> the standby takes over, no duplicate Pods, the job
#     succeeds; the killed one comes back as a standby
#   - invalid specs: refused by the schema (and its CEL rules), or Failed with InvalidSpec and an
#     Event, without a reconcile loop; a template whose Pod the API server refuses (422) too
#   - operator /metrics counters move (#2408), /healthz, /readyz, SIGTERM releases the lease
# usage: operator_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

cp_bin="$1"
op_bin="$2"
train_bin="$3"
src="$4"
if ! command -v kubectl >/dev/null; then
  echo "SKIP: kubectl is not installed (scripts/setup.sh installs it)"
  exit 0
fi
source "$src/tests/common/e2e_lib.sh"
e2e_init   # $work, HOME and KUBECONFIG in it, and the cleanup of every process of this run
export PATH="$(dirname "$train_bin"):$PATH"
k() { timeout 60 kubectl --request-timeout=30s -n e2e "$@"; }
jp() { k get tj "$1" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [ "$(jp "$1" '{.status.phase}')" = "$2" ]; }
reason_of() { jp "$1" "{.status.conditions[?(@.type==\"$2\")].reason}"; }
pods_of() { k get pods -l "meshwork.dev/job=$1" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{end}' 2>/dev/null; }
no_pods() { [ -z "$(pods_of "$1")" ]; }
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
dump() {
  echo "---- kubectl get tj,pods"; k get tj,pods -o wide 2>&1
  echo "---- operator logs"; tail -n 40 "$work"/op-*.log
}

# start_operator NAME PORT: one replica, short lease so that a takeover is quick.
start_operator() {
  "$op_bin" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$2" --identity "$1" \
    --lease-duration-s 4 --renew-deadline-s 3 --retry-period-s 1 --report-interval-s 2 \
    --pod-delete-grace-s 5 >>"$work/op-$1.log" 2>&1 &
  local pid=$!
  e2e_track "$pid"
  eval "pid_$1=$pid"
}

# ---- control plane, CRD, data, two operators
mkdir -p "$work/data"
e2e_start_controlplane "$cp_bin" || exit 1
out="$(kubectl apply -f "$src/crds/" 2>&1)"
[[ "$out" == *"trainingjobs.meshwork.dev created"* && "$out" == *"trainingruntimes.meshwork.dev created"* ]] &&
  pass "the TrainingJob and TrainingRuntime CRDs apply" || fail "apply CRDs: $out"
kubectl wait --for=condition=Established crd/trainingjobs.meshwork.dev crd/trainingruntimes.meshwork.dev \
  --timeout=20s >/dev/null 2>&1
kubectl create namespace e2e >/dev/null
for f in "$src"/examples/trainingjob-*.yaml "$src"/examples/trainingruntime-*.yaml; do
  out="$(kubectl apply --dry-run=server -f "$f" 2>&1)"
  [[ "$out" == *"(server dry run)"* ]] && pass "the schema accepts $(basename "$f")" || fail "dry run of $f: $out"
done
"$train_bin" prepare-data --out "$work/data/train.bin" --val-out "$work/data/val.bin" "$src/README.md" "$src/docs" >/dev/null ||
  fail "prepare-data"

port_a="$(free_port)"
port_b="$(free_port)"
start_operator a "$port_a"
e2e_wait_for 30 "operator a leads" grep -q "became leader" "$work/op-a.log" || fail "operator a did not lead: $(cat "$work/op-a.log")"
start_operator b "$port_b"
e2e_wait_for 20 "operator b ready" curl -sf "http://127.0.0.1:$port_b/readyz" || fail "operator b not ready"
[ "$(metric "$port_a" meshwork_operator_leader)" = 1 ] && [ "$(metric "$port_b" meshwork_operator_leader)" = 0 ] &&
  pass "exactly one of two replicas leads" || fail "leader gauges: a=$(metric "$port_a" meshwork_operator_leader) b=$(metric "$port_b" meshwork_operator_leader)"
code_a="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port_a/healthz")"
code_b="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port_b/readyz")"
[ "$code_a" = 200 ] && [ "$code_b" = 200 ] && pass "/healthz and /readyz answer 200 (the standby is ready too)" ||
  fail "healthz $code_a, standby readyz $code_b"
zero="$(curl -s "http://127.0.0.1:$port_a/metrics" | grep -c '^meshwork_operator_reconcile_total{result="\(success\|error\|requeue\)"}')"
[ "$zero" = 3 ] && pass "reconcile counters exist from the start, every result" || fail "reconcile_total series: $zero"

# job NAME PORT STEPS EXTRA_SPEC_YAML: a tiny FSDP job (2 Pods x 1 process) on the e2e data.
job() {
  cat <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: $1
  namespace: e2e
spec:
  image: meshwork/trainer:e2e
  device: cpu
  replicas: 2
  masterPort: $2
  metricsPort: $(( $2 + 1000 ))
  checkpoint: {path: $work/ckpt, every: 10}
$4
  config:
    inline: |
      model: {preset: tiny}
      data: {train: $work/data/train.bin, val: $work/data/val.bin, seq_len: 64, batch_size: 4}
      schedule: {steps: $3, warmup_steps: 5}
      eval: {windows: 4}
      logging: {every: 5}
EOF
}
# cmd_job NAME COMMAND EXTRA_SPEC_YAML: Pods run COMMAND instead of the trainer.
cmd_job() {
  cat <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: $1
  namespace: e2e
spec:
  image: busybox
  device: cpu
  replicas: 2
  command: ["sh", "-c", "$2"]
$3
  config:
    inline: "model: {preset: tiny}"
EOF
}

# ---- invalid specs
out="$(job bad-mesh 29600 10 '  mesh: {dpShard: 3}' | kubectl apply -f - 2>&1)"
[[ "$out" == *"dpReplicate x dpShard x tp must equal replicas x processesPerReplica"* ]] &&
  pass "a mesh that does not fit is refused by the CRD's CEL rule" || fail "bad mesh: $out"
out="$(job bad-replicas 29600 10 '  runPolicy: {backoffLimit: -1}' | kubectl apply -f - 2>&1)"
[[ "$out" == *"spec.runPolicy.backoffLimit"*"greater than or equal to 0"* ]] &&
  pass "a negative backoffLimit is refused by the schema" || fail "bad backoffLimit: $out"
job bad-preset 29600 10 "" | sed 's/preset: tiny/preset: tinyy/' | kubectl apply -f - >/dev/null
cmd_job no-image true "" | sed '/image: busybox/d' | kubectl apply -f - >/dev/null
if e2e_wait_for 30 "bad-preset fails" phase_is bad-preset Failed && e2e_wait_for 30 "no-image fails" phase_is no-image Failed; then
  msg="$(jp bad-preset '{.status.conditions[?(@.type=="Failed")].message}')"
  [ "$(reason_of bad-preset Failed)" = InvalidSpec ] && [[ "$msg" == *spec.config.inline*model.preset*tinyy* ]] &&
    pass "unknown preset: Failed/InvalidSpec naming the field and value" || fail "bad-preset condition: $msg"
  msg="$(jp no-image '{.status.conditions[?(@.type=="Failed")].message}')"
  [[ "$msg" == "spec.image: is required"* ]] && pass "image-less job: Failed/InvalidSpec naming spec.image" || fail "no-image: $msg"
  ev="$(k get events --field-selector involvedObject.name=bad-preset -o jsonpath='{range .items[*]}{.reason}/{.type} {end}')"
  [[ "$ev" == *InvalidSpec/Warning* ]] && pass "an InvalidSpec Warning event is recorded" || fail "events: $ev"
  no_pods bad-preset && no_pods no-image && pass "no Pods for invalid jobs" || fail "pods of invalid jobs: $(pods_of bad-preset) $(pods_of no-image)"
  before="$(metric "$port_a" 'meshwork_operator_reconcile_total{result="success"}')"
  sleep 3
  after="$(metric "$port_a" 'meshwork_operator_reconcile_total{result="success"}')"
  [ "$before" = "$after" ] && pass "no reconcile loop on invalid jobs ($before reconciles, still $after 3 s later)" ||
    fail "reconciles went from $before to $after with nothing changing"
else
  fail "invalid jobs did not fail"; dump
fi
# A template the CRD takes (free-form) but whose Pod the API server refuses (422): Failed/
# InvalidSpec with the server's message, not a Pod create retried for ever (the job used to sit
# Created 0/2 without a word).
cmd_job bad-template true '  template: {spec: {containers: [{name: trainer, securityContext: {runAsUser: -5}}]}}' |
  kubectl apply -f - >/dev/null
if e2e_wait_for 30 "bad-template fails" phase_is bad-template Failed; then
  msg="$(jp bad-template '{.status.conditions[?(@.type=="Failed")].message}')"
  [ "$(reason_of bad-template Failed)" = InvalidSpec ] &&
    [[ "$msg" == "spec.template: the API server refused Pod bad-template-0"*"runAsUser"* ]] && no_pods bad-template &&
    pass "a template whose Pod the API server refuses: Failed/InvalidSpec with the server's message" ||
    fail "bad-template: $(reason_of bad-template Failed): $msg; pods $(pods_of bad-template)"
else fail "bad-template: phase $(jp bad-template '{.status.phase}')"; dump; fi

# ---- jobs that run commands
cmd_job permanent 'exit 3' "" | kubectl apply -f - >/dev/null
cmd_job flaky 'exit 1' '  runPolicy: {restartPolicy: ExitCode, backoffLimit: 1, cleanPodPolicy: All}' | kubectl apply -f - >/dev/null
cmd_job ttl 'exit 0' '  runPolicy: {ttlSecondsAfterFinished: 3}' | kubectl apply -f - >/dev/null
cmd_job deadline 'sleep 300' '  runPolicy: {activeDeadlineSeconds: 5}' | kubectl apply -f - >/dev/null
cmd_job sleeper 'sleep 300' "" | kubectl apply -f - >/dev/null
# Issue 20: failure-policy rules and successPolicy. A rank whose log ends with an NCCL timeout
# fails the job by a message rule (the node agent's FallbackToLogsOnError termination message);
# an exit code a rule says to ignore restarts without counting (backoffLimit 0); with Rank0,
# rank 0's exit 0 ends the job while rank 1 still runs.
cmd_job ncclhang 'echo step 10; echo watchdog: NCCL collective operation timeout after 600000 ms >&2; exit 7' \
  '  runPolicy: {backoffLimit: 3, failurePolicy: {rules: [{name: nccl-hang, action: FailJob, onMessagePattern: "NCCL.*timeout"}]}}' |
  kubectl apply -f - >/dev/null
cmd_job ignored '[ $MESHWORK_RESTART_GENERATION = 0 ] && exit 9; exit 0' \
  '  runPolicy: {backoffLimit: 0, failurePolicy: {rules: [{action: RestartGangAndIgnoreBackoff, onExitCodes: {values: [9]}}]}}' |
  kubectl apply -f - >/dev/null
cmd_job rankzero '[ $RANK = 0 ] && exit 0; sleep 300' '  runPolicy: {successPolicy: Rank0}' | kubectl apply -f - >/dev/null

# Issue 20: a config over 128 KiB (an environment variable's limit) reaches the Pods as the file
# of the ConfigMap volume; the command checks the size of what it got.
{
  cat <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: bigconfig
  namespace: e2e
spec:
  image: busybox
  device: cpu
  replicas: 2
  command: ["sh", "-c", "n=\$(wc -c < \$MESHWORK_CONFIG_FILE); echo config bytes \$n; test \$n -gt 200000"]
  config:
    inline: |
      model: {preset: tiny}
EOF
  for i in $(seq 2500); do echo "      # padding line $i: a config this long used to fail every rank with Argument list too long"; done
} >"$work/bigconfig.yaml"
out="$(kubectl apply -f "$work/bigconfig.yaml" 2>&1)"
[[ "$out" == *created* ]] || fail "bigconfig apply: $out"

if e2e_wait_for 60 "permanent fails" phase_is permanent Failed; then
  [ "$(reason_of permanent Failed)" = PermanentExitCode ] && [ "$(jp permanent '{.status.restarts}')" = 0 ] &&
    pass "exit code 3 (permanent by default): Failed/PermanentExitCode, 0 restarts" ||
    fail "permanent: $(reason_of permanent Failed) restarts $(jp permanent '{.status.restarts}')"
else fail "permanent did not fail"; dump; fi

if e2e_wait_for 60 "ncclhang fails" phase_is ncclhang Failed; then
  msg="$(jp ncclhang '{.status.conditions[?(@.type=="Failed")].message}')"
  [ "$(reason_of ncclhang Failed)" = FailurePolicy ] && [ "$(jp ncclhang '{.status.restarts}')" = 0 ] &&
    [[ "$msg" == *"NCCL collective operation timeout"*"failurePolicy rule 0 (nccl-hang) matched: FailJob"* ]] &&
    pass "a failurePolicy message rule fails the job on the rank's log tail, with no restart" ||
    fail "ncclhang: $(reason_of ncclhang Failed) restarts $(jp ncclhang '{.status.restarts}'): $msg"
else fail "ncclhang did not fail"; dump; fi

if e2e_wait_for 90 "ignored succeeds" phase_is ignored Succeeded; then
  [ "$(jp ignored '{.status.uncountedRestarts}')" = 1 ] && [ "$(jp ignored '{.status.restarts}')" = 0 ] &&
    k get events --field-selector involvedObject.name=ignored -o jsonpath='{.items[*].reason}' | grep -q GangRestartUncounted &&
    pass "RestartGangAndIgnoreBackoff: with backoffLimit 0 the gang restarted once (uncountedRestarts 1, restarts 0) and succeeded" ||
    fail "ignored: $(jp ignored '{.status}')"
else fail "ignored: phase $(jp ignored '{.status.phase}') $(jp ignored '{.status.conditions[*].message}')"; dump; fi

if e2e_wait_for 60 "rankzero succeeds" phase_is rankzero Succeeded; then
  [ "$(reason_of rankzero Succeeded)" = Rank0Succeeded ] &&
    e2e_wait_for 30 "rankzero's running rank stopped" bash -c "[ \"\$(kubectl -n e2e get pods -l meshwork.dev/job=rankzero -o name 2>/dev/null)\" = pod/rankzero-0 ]" &&
    pass "successPolicy Rank0: rank 0's exit 0 ends the job, the rank still running is stopped" ||
    fail "rankzero: $(reason_of rankzero Succeeded) pods $(pods_of rankzero)"
else fail "rankzero: phase $(jp rankzero '{.status.phase}')"; dump; fi

if e2e_wait_for 90 "bigconfig succeeds" phase_is bigconfig Succeeded; then
  pass "a job whose config is $(wc -c <"$work/bigconfig.yaml") bytes (over 128 KiB) runs: the config arrives as a ConfigMap volume file"
else fail "bigconfig: phase $(jp bigconfig '{.status.phase}') $(jp bigconfig '{.status.conditions[*].message}')"; dump; fi

if e2e_wait_for 90 "flaky fails" phase_is flaky Failed; then
  [ "$(reason_of flaky Failed)" = BackoffLimitExceeded ] && [ "$(jp flaky '{.status.restarts}')" = 1 ] &&
    pass "ExitCode policy: exactly backoffLimit (1) restart, then BackoffLimitExceeded" ||
    fail "flaky: $(reason_of flaky Failed) restarts $(jp flaky '{.status.restarts}')"
  e2e_wait_for 30 "flaky pods cleaned" no_pods flaky && pass "cleanPodPolicy All deletes the Pods when the backoff limit trips" ||
    fail "flaky pods left: $(pods_of flaky)"
else fail "flaky did not fail"; dump; fi

if e2e_wait_for 60 "ttl deleted" bash -c "! kubectl -n e2e get tj ttl >/dev/null 2>&1"; then
  # The garbage collector removes the Pods after their owner, asynchronously (seconds on a real
  # kube-controller-manager).
  e2e_wait_for 30 "ttl pods garbage-collected" no_pods ttl
  sleep 5
  if ! k get tj ttl >/dev/null 2>&1 && no_pods ttl; then
    pass "ttlSecondsAfterFinished deletes the job and its Pods; 5 s later none has come back"
  else fail "ttl job or pods came back: $(k get tj ttl 2>&1) $(pods_of ttl)"; fi
else fail "ttl job not deleted"; dump; fi

if e2e_wait_for 60 "deadline fails" phase_is deadline Failed; then
  [ "$(reason_of deadline Failed)" = DeadlineExceeded ] && pass "activeDeadlineSeconds: Failed/DeadlineExceeded" ||
    fail "deadline reason: $(reason_of deadline Failed)"
  e2e_wait_for 30 "deadline pods stopped" no_pods deadline && pass "the deadline stops the running Pods" || fail "deadline pods: $(pods_of deadline)"
else fail "deadline did not fail"; dump; fi

if e2e_wait_for 60 "sleeper runs" phase_is sleeper Running; then
  k patch tj sleeper --type=merge -p '{"spec":{"runPolicy":{"suspend":true}}}' >/dev/null
  if e2e_wait_for 30 "sleeper suspended" phase_is sleeper Suspended && e2e_wait_for 30 "sleeper pods gone" no_pods sleeper; then
    pass "suspend: phase Suspended, Pods deleted"
  else fail "suspend: $(jp sleeper '{.status.phase}') pods $(pods_of sleeper)"; fi
  k patch tj sleeper --type=merge -p '{"spec":{"runPolicy":{"suspend":false}}}' >/dev/null
  if e2e_wait_for 30 "sleeper resumed" phase_is sleeper Running; then
    gen="$(k get pod sleeper-0 -o jsonpath='{.metadata.labels.meshwork\.dev/restart-generation}')"
    [ "$gen" = 1 ] && [ "$(jp sleeper '{.status.restarts}')" = 0 ] &&
      pass "resume: a new gang (generation 1), not counted as a restart" || fail "resume: generation $gen restarts $(jp sleeper '{.status.restarts}')"
  else fail "resume: $(jp sleeper '{.status.phase}')"; fi
  out="$(k scale tj sleeper --replicas 1 2>&1)"
  if [[ "$out" == *scaled* ]] && e2e_wait_for 60 "sleeper resized" bash -c "[ \"\$(kubectl -n e2e get pods -l meshwork.dev/job=sleeper,meshwork.dev/world-size=1 -o name 2>/dev/null | wc -l)\" = 1 ] && [ \"\$(kubectl -n e2e get pods -l meshwork.dev/job=sleeper -o name 2>/dev/null | wc -l)\" = 1 ]" &&
    e2e_wait_for 30 "sleeper running at world size 1" phase_is sleeper Running; then
    [ "$(jp sleeper '{.status.worldSize}')" = 1 ] && [ "$(jp sleeper '{.status.restarts}')" = 0 ] &&
      pass "kubectl scale --replicas 1: a new gang of 1, not counted as a restart" || fail "scale: $(jp sleeper '{.status}')"
  else fail "scale: $out; pods $(pods_of sleeper)"; fi
  k delete tj sleeper --wait=false >/dev/null
  if e2e_wait_for 60 "sleeper children gone" bash -c "[ -z \"\$(kubectl -n e2e get pods,svc,cm,secret -l meshwork.dev/job=sleeper -o name 2>/dev/null)\" ]"; then
    pass "deleting the job removes its Pods, Service, ConfigMap and rendezvous Secret"
  else fail "children left: $(k get pods,svc,cm,secret -l meshwork.dev/job=sleeper -o name)"; fi
else fail "sleeper did not run"; dump; fi

# ---- a Pod name taken by a Pod the job does not own
k run squat-0 --image=none --restart=Never --command -- sleep 300 >/dev/null
cmd_job squat 'exit 0' "" | kubectl apply -f - >/dev/null
if e2e_wait_for 60 "PodNameTaken event" bash -c "kubectl -n e2e get events --field-selector involvedObject.name=squat -o jsonpath='{.items[*].reason}' | grep -q PodNameTaken"; then
  pass "a Pod name taken by a foreign Pod is reported (Warning PodNameTaken)"
else fail "no PodNameTaken event: $(k get events --field-selector involvedObject.name=squat -o jsonpath='{.items[*].reason}')"; fi
k delete pod squat-0 --wait=false >/dev/null
e2e_wait_for 90 "squat succeeds once the name is free" phase_is squat Succeeded &&
  [ "$(jp squat '{.status.restarts}')" = 0 ] && pass "then the job starts and succeeds" || fail "squat: $(jp squat '{.status}')"

# ---- a job on a TrainingRuntime (issue 20): the example files as they are, the job first. It
# waits for its runtime (RuntimeNotFound), then runs with the runtime's image, label, device and
# default config under its own keys (60 steps, not the runtime's 150). The runtime's data paths
# are relative to the control plane's directory ($work).
mkdir -p "$work/.meshwork" && ln -sfn "$work/data" "$work/.meshwork/data"
rt_metrics="$(free_port)"
sed "s|^  replicas: 2|  replicas: 2\n  metricsPort: $rt_metrics|" "$src/examples/trainingjob-on-runtime.yaml" |
  k apply -f - >/dev/null
if e2e_wait_for 30 "tiny-on-runtime waits for its runtime" bash -c \
  "[ \"\$(kubectl -n e2e get tj tiny-on-runtime -o jsonpath='{.status.conditions[?(@.type==\"Running\")].reason}')\" = RuntimeNotFound ]"; then
  no_pods tiny-on-runtime && pass "a job whose TrainingRuntime does not exist waits (Running=False/RuntimeNotFound), no Pods" ||
    fail "tiny-on-runtime made Pods before its runtime existed: $(pods_of tiny-on-runtime)"
else fail "tiny-on-runtime: $(jp tiny-on-runtime '{.status}')"; fi
out="$(kubectl apply -f "$src/examples/trainingruntime-cpu-small.yaml" 2>&1)"
[[ "$out" == *"trainingruntime.meshwork.dev/cpu-small created"* ]] || fail "apply the runtime: $out"
if e2e_wait_for 120 "tiny-on-runtime succeeds" phase_is tiny-on-runtime Succeeded; then
  image="$(k get pod tiny-on-runtime-0 -o jsonpath='{.spec.containers[0].image} {.metadata.labels.platform\.example\.com/runtime}')"
  config="$(k get cm tiny-on-runtime-config -o jsonpath='{.data.config\.yaml}')"
  [ "$image" = "ghcr.io/meshwork/trainer:0.1.0-cpu cpu-small" ] && [ "$(jp tiny-on-runtime '{.status.trainer.step}')" = 60 ] &&
    [[ "$config" == *"preset: tiny"* && "$config" == *"steps: 60"* && "$config" == *"warmup_steps: 20"* ]] &&
    [[ "$(k get tj tiny-on-runtime -o wide)" == *RUNTIME*cpu-small* ]] &&
    pass "the job ran with its runtime merged under it: image and label from the runtime, 60 of its own steps, the runtime's model" ||
    fail "tiny-on-runtime: image/label '$image', step $(jp tiny-on-runtime '{.status.trainer.step}'), config: $config"
else fail "tiny-on-runtime: $(jp tiny-on-runtime '{.status}')"; dump; fi
rm -rf /tmp/meshwork-checkpoints/e2e/tiny-on-runtime

# ---- real training: one job killed mid-run, one clean run
# kill-me trains 400 steps (about 30 s on the tiny model, more under load): the checks between step
# 15 and the kill take seconds, and with 60 steps the job could finish first, its Pods gone before
# they were reached ("No route to host", no rank 1 to kill), as one CI-like run saw.
job kill-me 29610 400 "" | kubectl apply -f - >/dev/null
job train-ok 29620 30 '  mesh: {auto: true}' | kubectl apply -f - >/dev/null
if e2e_wait_for 300 "kill-me past its first checkpoint" bash -c "[ \"\$(kubectl -n e2e get tj kill-me -o jsonpath='{.status.trainer.step}')\" -ge 15 ] 2>/dev/null"; then
  # The rendezvous store of rank 0: its own Secret's token, the Pod's address only, no stranger.
  [ "$(k get secret kill-me-rendezvous -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}')" = TrainingJob/kill-me ] &&
    pass "the job's rendezvous token is in Secret kill-me-rendezvous, owned by the job" ||
    fail "rendezvous Secret: $(k get secret kill-me-rendezvous -o yaml 2>&1 | head -20)"
  pod_ip="$(k get pod kill-me-0 -o jsonpath='{.status.podIP}')"
  # Seen from inside the Pod's network namespace when it has its own (a loopback address: the host's).
  rank0="$(pgrep -f -- "--node-rank 0 --master-addr kill-me-0.kill-me.e2e.svc" | head -1)"
  if [ -z "$rank0" ]; then listening="(no rank 0 process found)"
  elif [[ "$pod_ip" == 127.* ]]; then listening="$(ss -Hltn "sport = :29610" | awk '{print $4}' | sort -u | tr '\n' ' ')"
  else listening="$(nsenter -t "$rank0" -n ss -Hltn "sport = :29610" | awk '{print $4}' | sort -u | tr '\n' ' ')"; fi
  [ -n "$pod_ip" ] && [ "$listening" = "$pod_ip:29610 " ] &&
    pass "rank 0's store listens on its Pod's address only ($listening)" || fail "store listens on '$listening', Pod IP $pod_ip"
  # A real EndpointSlice for the job's Service, from the controller manager, with the Pods'
  # addresses (the API server refuses loopback ones: without a Pod network there is none).
  slice() { kubectl -n e2e get endpointslices -l kubernetes.io/service-name=kill-me -o jsonpath='{.items[*].endpoints[*].addresses[*]}'; }
  if [[ "$pod_ip" == 127.* ]]; then
    echo "NOTE: Pods have loopback addresses (no Pod network here: see the control plane's log); EndpointSlices not checked"
  elif e2e_wait_for 30 "kill-me's EndpointSlice" bash -c "kubectl -n e2e get endpointslices -l kubernetes.io/service-name=kill-me -o jsonpath='{.items[*].endpoints[*].addresses[*]}' | tr ' ' '\n' | grep -qxF '$pod_ip'"; then
    pass "Service kill-me has an EndpointSlice with its Pods' addresses ($(slice))"
  else fail "EndpointSlice of kill-me: '$(slice)', rank 0 at $pod_ip"; fi
  answer="$(python3 - "$pod_ip" <<'PYEOF2'
import socket, struct, sys
s = socket.create_connection((sys.argv[1], 29610), timeout=10)
token = b"not-this-jobs-token"
s.sendall(b"MWRS" + struct.pack(">I", len(token)) + token)
reply = s.recv(4096)
print(reply[0], reply[5:].decode(errors="replace"))
PYEOF2
)"
  [[ "$answer" == "3 the token does not match this job's" ]] && pass "a client with another token is refused by rank 0's store" ||
    fail "wrong-token client got: $answer"
  pkill -9 -f -- "--node-rank 1 --master-addr kill-me-0.kill-me.e2e.svc" && pass "SIGKILL rank 1 of kill-me at step $(jp kill-me '{.status.trainer.step}')" ||
    fail "no kill-me rank 1 process to kill"
  e2e_wait_for 60 "kill-me restarts" bash -c "[ \"\$(kubectl -n e2e get tj kill-me -o jsonpath='{.status.restarts}')\" = 1 ]" ||
    fail "restarts: $(jp kill-me '{.status.restarts}')"
  if e2e_wait_for 400 "kill-me succeeds" phase_is kill-me Succeeded; then
    [ "$(jp kill-me '{.status.restarts}')" = 1 ] && pass "the whole gang restarted once and the job succeeded" ||
      fail "kill-me restarts: $(jp kill-me '{.status.restarts}')"
    log="$(k logs kill-me-0 2>&1)"
    [[ "$log" == *"restart generation 1"*"resumed from $work/ckpt/e2e/kill-me/"* ]] &&
      pass "the new gang resumed from the checkpoint ($(grep -o 'resumed from.*' <<<"$log" | sed 's|.*/||'))" ||
      fail "kill-me-0 log: $(head -n 12 <<<"$log")"
  else fail "kill-me did not succeed: $(jp kill-me '{.status}')"; dump; fi
else fail "kill-me did not reach step 15"; dump; fi

out="$(k scale tj train-ok --replicas 1 2>&1)"
[[ "$out" == *"with checkpoints on (or a runtimeRef, whose runtime may turn them on), replicas and mesh change only with elasticPolicy"* ]] &&
  pass "scaling a job with checkpoints is refused by the CRD's CEL rule" || fail "scale of a checkpointed job: $out"
if e2e_wait_for 400 "train-ok succeeds" phase_is train-ok Succeeded; then
  step="$(jp train-ok '{.status.trainer.step}')"
  tps="$(jp train-ok '{.status.trainer.tokensPerSecond}')"
  loss="$(jp train-ok '{.status.trainer.loss}')"
  final="$(k logs train-ok-0 | grep -o 'final loss [0-9.]*' | cut -d' ' -f3)"
  # Numerically: the status holds a JSON number (3.412), the log prints 4 decimals (3.4120).
  if [ "$step" = 30 ] && awk -v t="$tps" -v l="$loss" -v f="${final:-x}" 'BEGIN{exit !(t > 0 && f != "x" && l + 0 == f + 0)}'; then
    pass "Succeeded with step $step of 30, the final loss $loss of rank 0's log, $tps tokens/s in status"
  else fail "train-ok status.trainer: step=$step tps=$tps loss=$loss (log: final loss $final)"; fi
  # mesh: auto: the operator chose the whole plan when the gang started, recorded it in
  # status.plan with a PlanChosen Event, and every rank ran with its keys.
  shape="$(jp train-ok '{.status.meshShape}')"
  planned="$(jp train-ok '{.status.plan.meshShape} {.status.plan.worldSize} {.status.plan.mesh.dpReplicate} {.status.plan.mesh.dpShard} {.status.plan.mesh.tp} {.status.plan.mesh.pp}')"
  chosen_ev="$(k get events --field-selector involvedObject.name=train-ok,reason=PlanChosen -o jsonpath='{.items[*].message}')"
  read -r p_shape p_world p_r p_s p_t p_p <<<"$planned"
  cmd="$(k get pod train-ok-1 -o jsonpath='{.spec.containers[0].command}' 2>/dev/null)"
  parallelism="$(k logs train-ok-0 | grep -m1 '^parallelism: ' || true)"
  if [ "$shape" = "$p_shape" ] && [ "$p_world" = 2 ] && [ $((p_r * p_s * p_t * p_p)) = 2 ] &&
     [[ "$chosen_ev" == "planned "*" for 2 ranks on "* ]] && [[ "$cmd" != *dist.mesh=auto* ]] &&
     [[ "$cmd" == *"mesh.dp_replicate=$p_r"*"mesh.dp_shard=$p_s"*"mesh.tp=$p_t"*"mesh.pp=$p_p"* ]] &&
     [ -n "$(jp train-ok '{.status.plan.predicted.tokensPerSecondPerRank}')" ]; then
    pass "mesh auto: the operator planned $p_shape ($(jp train-ok '{.status.plan.description}')), every rank ran it (${parallelism:0:90}); Event: ${chosen_ev:0:120}"
  else fail "mesh auto: status.meshShape '$shape', status.plan '$planned', Event '$chosen_ev', rank 1's command $cmd"; fi
  [ "$(jp train-ok '{.status.restarts}')" = 0 ] && [ -n "$(jp train-ok '{.status.completionTime}')" ] &&
    pass "no restarts, completionTime set" || fail "train-ok: $(jp train-ok '{.status}')"
  ev="$(k get events --field-selector involvedObject.name=train-ok -o jsonpath='{range .items[*]}{.reason} {end}')"
  [[ "$ev" == *Created* && "$ev" == *Running* && "$ev" == *AllRanksSucceeded* ]] && pass "events Created, Running, AllRanksSucceeded" || fail "events: $ev"
  # A job that succeeds leaves no Warning on itself, its Pods or its Service (the endpoint
  # controllers refuse loopback Pod addresses with FailedToUpdateEndpointSlices).
  warn="$(k get events --field-selector type=Warning -o jsonpath='{range .items[*]}{.involvedObject.kind}/{.involvedObject.name} {.reason}: {.message}{"\n"}{end}' |
    grep -E '^[A-Za-z]+/train-ok(-[0-9]+)? ' || true)"
  if [ -z "$warn" ]; then pass "no Warning event on train-ok, its Pods or its Service"
  elif [[ "$(k get pod train-ok-0 -o jsonpath='{.status.podIP}' 2>/dev/null)" == 127.* ]] &&
    ! grep -qv ' FailedToUpdateEndpoint' <<<"$warn"; then
    echo "NOTE: Pods have loopback addresses (no Pod network here): the endpoint controllers' warnings are expected: $warn"
  else fail "Warning events of a job that succeeded: $warn"; fi
  cols="$(k get tj train-ok 2>&1)"
  [[ "$cols" == *PHASE*READY*STEP*PROGRESS*ETA*TOKENS/S*RESTARTS*AGE*train-ok*Succeeded*100.0%* ]] && pass "kubectl get shows the printer columns" || fail "get tj: $cols"
else fail "train-ok did not succeed: $(jp train-ok '{.status}')"; dump; fi

# ---- tensor parallelism through the operator: 2 Pods x 2 processes as dp_shard 2 x tp 2 (each tp
# group inside one Pod), checkpointing as every job here does.
job tp-ok 29640 20 '  processesPerReplica: 2
  mesh: {dpShard: 2, tp: 2}' | kubectl apply -f - >/dev/null
if e2e_wait_for 300 "tp-ok succeeds" phase_is tp-ok Succeeded; then
  line="$(k logs tp-ok-0 | grep -m1 '^parallelism:' || true)"
  [ "$(jp tp-ok '{.status.meshShape}')" = 1x2x2 ] && [ "$(jp tp-ok '{.status.mesh.tp}')" = 2 ] &&
    [[ "$line" == *"FSDP over mesh dp_replicate 1 x dp_shard 2 x tp 2 with sequence parallelism"* ]] &&
    [ "$(jp tp-ok '{.status.trainer.step}')" = 20 ] &&
    pass "a dp_shard 2 x tp 2 job trains through the operator (status mesh 1x2x2; ${line:0:110})" ||
    fail "tp-ok: meshShape $(jp tp-ok '{.status.meshShape}'), step $(jp tp-ok '{.status.trainer.step}'), rank 0: $line"
else fail "tp-ok did not succeed: $(jp tp-ok '{.status}')"; dump; fi

# ---- pipeline parallelism through the operator: 2 Pods as 2 stages (1F1B over 4 micro-batches),
# checkpointing as every job here does, the schedule in status.pipeline; and a schedule the shape
# cannot run, refused at admission by the trainer's own generator.
pp_job() {  # pp_job NAME PORT GRAD_ACCUM
  job "$1" "$2" 20 '  mesh: {dpShard: 1, pp: 2}' |
    sed "s/      schedule: {steps: 20, warmup_steps: 5}/      schedule: {steps: 20, warmup_steps: 5}\n      training: {grad_accum: $3}\n      pipeline: {schedule: 1f1b}/"
}
pp_job pp-ok 29650 4 | kubectl apply -f - >/dev/null
pp_job pp-few 29660 1 | kubectl apply -f - >/dev/null
if e2e_wait_for 60 "pp-few fails" phase_is pp-few Failed; then
  msg="$(jp pp-few '{.status.conditions[?(@.type=="Failed")].message}')"
  [ "$(reason_of pp-few Failed)" = InvalidSpec ] && [[ "$msg" == *"key 'pipeline.schedule'"*"training.grad_accum=1"* ]] && no_pods pp-few &&
    pass "1F1B with 1 micro-batch for 2 stages: Failed/InvalidSpec at admission naming pipeline.schedule, no Pods" ||
    fail "pp-few: reason $(reason_of pp-few Failed), message $msg, pods $(pods_of pp-few)"
else fail "pp-few did not fail: $(jp pp-few '{.status}')"; fi
if e2e_wait_for 300 "pp-ok succeeds" phase_is pp-ok Succeeded; then
  line="$(k logs pp-ok-0 | grep -m1 '^pipeline:' || true)"
  [ "$(jp pp-ok '{.status.meshShape}')" = pp2x1x1x1 ] && [ "$(jp pp-ok '{.status.mesh.pp}')" = 2 ] &&
    [[ "$line" == *"pp=2, 1f1b, 4 micro-batches"* ]] && [ "$(jp pp-ok '{.status.trainer.step}')" = 20 ] &&
    [ "$(jp pp-ok '{.status.pipeline.schedule}/{.status.pipeline.microBatches}/{.status.pipeline.scheduleBubble}')" = 1f1b/4/0.2 ] &&
    k logs pp-ok-0 | grep -q "checkpoint: saved .*/step-00000020 " &&
    pass "a 2-stage 1F1B pipeline trains and checkpoints through the operator (status mesh pp2x1x1x1, pipeline $(jp pp-ok '{.status.pipeline}'); ${line:0:90})" ||
    fail "pp-ok: meshShape $(jp pp-ok '{.status.meshShape}'), step $(jp pp-ok '{.status.trainer.step}'), pipeline $(jp pp-ok '{.status.pipeline}'), restarts $(jp pp-ok '{.status.restarts}')/$(jp pp-ok '{.status.uncountedRestarts}'), conditions $(jp pp-ok '{.status.conditions[*].message}'); rank 0: $line; its last lines: $(k logs pp-ok-0 | tail -4); rank 1's: $(k logs pp-ok-1 | tail -4)"
else fail "pp-ok did not succeed: $(jp pp-ok '{.status}')"; dump; fi

# ---- SIGKILL the leading operator mid-run
job op-kill 29630 40 "" | kubectl apply -f - >/dev/null
if e2e_wait_for 300 "op-kill trains" bash -c "[ \"\$(kubectl -n e2e get tj op-kill -o jsonpath='{.status.trainer.step}')\" -ge 3 ] 2>/dev/null"; then
  uids="$(k get pods -l meshwork.dev/job=op-kill -o jsonpath='{.items[*].metadata.uid}')"
  kill -9 "$pid_a"
  if e2e_wait_for 30 "operator b takes over" grep -q "became leader" "$work/op-b.log"; then
    pass "the standby took over after the leader was SIGKILLed"
  else fail "operator b did not take over: $(tail -5 "$work/op-b.log")"; fi
  start_operator a "$port_a"  # back, as a standby
  if e2e_wait_for 400 "op-kill succeeds" phase_is op-kill Succeeded; then
    after="$(k get pods -l meshwork.dev/job=op-kill -o jsonpath='{.items[*].metadata.uid}')"
    [ "$uids" = "$after" ] && [ "$(jp op-kill '{.status.restarts}')" = 0 ] &&
      pass "the job succeeded with the same 2 Pods: no duplicates, no restart" || fail "pods before: $uids, after: $after"
  else fail "op-kill did not succeed: $(jp op-kill '{.status}')"; dump; fi
  [ "$(metric "$port_a" meshwork_operator_leader)" = 0 ] && pass "the restarted replica is a standby" || fail "a leads again?"
else fail "op-kill did not start training"; dump; fi

# ---- operator metrics moved (kubeflow/training-operator#2408), on the replica that leads now
cmd_job after-takeover 'exit 0' '  runPolicy: {cleanPodPolicy: All}' | kubectl apply -f - >/dev/null
e2e_wait_for 60 "after-takeover succeeds" phase_is after-takeover Succeeded || fail "after-takeover: $(jp after-takeover '{.status}')"
e2e_wait_for 30 "after-takeover pods cleaned" no_pods after-takeover || fail "after-takeover pods: $(pods_of after-takeover)"
created="$(metric "$port_b" meshwork_operator_pods_created_total)"
deleted="$(metric "$port_b" meshwork_operator_pods_deleted_total)"
succ="$(metric "$port_b" 'meshwork_operator_reconcile_total{result="success"}')"
phase_ok="$(metric "$port_b" 'meshwork_operator_jobs{phase="Succeeded"}')"
if awk -v c="$created" -v d="$deleted" -v s="$succ" -v p="$phase_ok" 'BEGIN{exit !(c > 0 && d > 0 && s > 0 && p >= 1)}'; then
  pass "operator counters moved: pods created $created, deleted $deleted, reconciles $succ, jobs Succeeded $phase_ok"
else fail "operator metrics: created=$created deleted=$deleted success=$succ succeeded=$phase_ok"; fi

# ---- graceful shutdown releases the lease
kill -TERM "$pid_b"
wait "$pid_b"
rc=$?
[ "$rc" = 0 ] && pass "SIGTERM: the operator exits 0" || fail "SIGTERM exit code $rc"
if e2e_wait_for 10 "operator a takes over at once" bash -c "[ \$(grep -c 'became leader' '$work/op-a.log') -ge 2 ]"; then
  pass "the released lease was taken over within seconds"
else fail "no takeover after release: $(tail -5 "$work/op-a.log")"; fi

e2e_summary operator_e2e
