#!/usr/bin/env bash
# What a user sees with kubectl 1.37 when the TrainingJob CRD is on the real kube-apiserver
# (meshwork-cluster, no operator running), so the CRD's schema and CEL rules are enforced by the
# API server itself:
#   - the CRD is Established, `kubectl explain` shows its field docs, and every example job passes
#     a server-side dry run;
#   - bad TrainingJobs are refused with the server's message naming the field: each CEL rule (the
#     failurePolicy rules' too), the
#     schema's ranges and enums, unknown fields (strict field validation), and quantities
#     (the drill's `cpu: abc, memory: -5Gi` job);
#   - updates the CRD forbids (processesPerReplica; replicas with checkpoints on) are refused,
#     and the ones it allows are stored with a new generation;
#   - printer columns in `get` and `get -o wide`, `kubectl wait` on a status condition written
#     through the status subresource, the scale subresource;
#   - a Pod through the node agent: `kubectl run`, logs of the running Pod, describe with the
#     scheduler's event, delete stops its process.
# usage: kubectl_e2e.sh CLUSTER OPERATOR TRAIN SOURCE_DIR (OPERATOR and TRAIN are unused)
set -uo pipefail

cluster_bin="$1"
src="$4"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kube_bin
e2e_init
k() { timeout 60 kubectl --request-timeout=30s "$@"; }

e2e_start_controlplane "$cluster_bin" || exit 1
e2e_apply_crd "$src" && pass "CRD applied and Established" || fail "CRD: $(kubectl get crd -o yaml 2>&1 | tail -20)"

# The API server publishes a new CRD's OpenAPI a moment after it is Established.
e2e_wait_for 60 "the CRD's OpenAPI" kubectl explain trainingjob.spec.replicas >/dev/null
out="$(k explain trainingjob.spec.replicas 2>&1)"
[[ "$out" == *"FIELD: replicas <integer>"* && "$out" == *"DESCRIPTION"* ]] && pass "kubectl explain shows the CRD's field docs" ||
  fail "explain: $out"
examples=("$src"/examples/trainingjob-*.yaml "$src"/examples/trainingruntime-*.yaml)
n=${#examples[@]}
out="$(for f in "${examples[@]}"; do k apply --dry-run=server -f "$f" || echo "FAILED: $f"; done 2>&1)"
rc=0
[[ "$out" == *FAILED* ]] && rc=1
[ $rc = 0 ] && [ "$(grep -c 'created (server dry run)' <<<"$out")" = "$n" ] &&
  pass "all $n example files pass a server-side dry run" || fail "examples (rc $rc): $out"

# A valid job to derive the bad ones from (no operator runs: nothing acts on it).
job() {
  cat <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: ${1:-bad}
spec:
  image: ghcr.io/meshwork/trainer:0.1.0
  device: cpu
  replicas: 2
  processesPerReplica: 1
  resources: {requests: {cpu: "1", memory: 1Gi}}
  checkpoint: {path: /tmp/ckpt, every: 50}
  config: {inline: "model: {preset: tiny}"}
EOF
}
# refused DESCRIPTION SED_EXPRESSION EXPECTED...: the edited job is refused, the message has each
# EXPECTED, and nothing was stored.
refused() {
  local what="$1" edit="$2"
  shift 2
  local out rc
  out="$(job | sed -e "$edit" | k apply -f - 2>&1)"; rc=$?
  local missing=""
  for want in "$@"; do [[ "$out" == *"$want"* ]] || missing+=" [$want]"; done
  if [ $rc != 0 ] && [ -z "$missing" ] && ! k get trainingjob bad >/dev/null 2>&1; then
    pass "refused: $what"
  else
    fail "$what (rc $rc, missing$missing): $out"
    k delete trainingjob bad --wait=false >/dev/null 2>&1
  fi
}
refused "cpu: abc, memory: -5Gi" 's|cpu: "1", memory: 1Gi|cpu: abc, memory: "-5Gi"|' \
  'spec.resources.requests[cpu]: Invalid value: "abc": must be a non-negative quantity' \
  'spec.resources.requests[memory]: Invalid value: "-5Gi"'
refused "a mesh that does not multiply to the world" 's|^  checkpoint:.*|  mesh: {dpShard: 3}|' \
  "mesh: pp x dpReplicate x dpShard x tp must equal replicas x processesPerReplica"
refused "pp x dpShard that does not multiply to the world" 's|^  checkpoint:.*|  mesh: {dpShard: 2, pp: 2}|' \
  "mesh: pp x dpReplicate x dpShard x tp must equal replicas x processesPerReplica"
refused "pp: 0" 's|^  checkpoint:.*|  mesh: {dpShard: 2, pp: 0}|' \
  "spec.mesh.pp: Invalid value: 0: spec.mesh.pp in body should be greater than or equal to 1"
refused "pp: 2000" 's|^  checkpoint:.*|  mesh: {dpShard: 1, pp: 2000}|' \
  "spec.mesh.pp: Invalid value: 2000: spec.mesh.pp in body should be less than or equal to 1024"
refused "pp beside mesh auto" 's|^  checkpoint:.*|  mesh: {auto: true, pp: 2}|' \
  "set either auto: true (the trainer chooses the mesh) or the dims (dpShard, optionally dpReplicate, tp, pp), not both"
refused "pp on GPUs" 's|^  checkpoint:.*|  mesh: {dpShard: 1, pp: 2}|;s|device: cpu|device: gpu|' \
  "mesh: pp > 1 needs device: cpu"
# A tensor parallel group is tp consecutive ranks: it must fit in one Pod (2 x 1 x 2 = 2 ranks
# multiplies right; with 1 process per Pod the group would span 2 Pods).
refused "tp that does not divide processesPerReplica" 's|^  checkpoint:.*|  mesh: {dpShard: 1, tp: 2}|' \
  "mesh: tp must divide processesPerReplica (a tensor parallel group must be inside one Pod)"
refused "tp: 0" 's|^  checkpoint:.*|  mesh: {dpShard: 2, tp: 0}|' \
  "spec.mesh.tp: Invalid value: 0: spec.mesh.tp in body should be greater than or equal to 1"
refused "tp: 128" 's|^  checkpoint:.*|  mesh: {dpShard: 1, tp: 128}|' \
  "spec.mesh.tp: Invalid value: 128: spec.mesh.tp in body should be less than or equal to 64"
out="$(job tp | sed -e 's|processesPerReplica: 1|processesPerReplica: 2|' -e 's|^  checkpoint:.*|  mesh: {dpShard: 2, tp: 2}|' |
  k apply --dry-run=server -f - 2>&1)"
[[ "$out" == *"created (server dry run)"* ]] && pass "tp 2 with 2 Pods of 2 (dpShard 2) is accepted" || fail "tp 2: $out"
out="$(job pp | sed -e 's|^  checkpoint:.*|  mesh: {dpShard: 1, pp: 2}|' | k apply --dry-run=server -f - 2>&1)"
[[ "$out" == *"created (server dry run)"* ]] && pass "pp 2 over 2 Pods on the CPU is accepted" || fail "pp 2: $out"
refused "mesh auto with dpShard" 's|^  checkpoint:.*|  mesh: {auto: true, dpShard: 2}|' \
  "set either auto: true (the trainer chooses the mesh) or the dims"
refused "a mesh without dpShard in a job that is not elastic" 's|^  checkpoint:.*|  mesh: {tp: 1}|' \
  "mesh: an explicit mesh sets dpShard, except in an elastic job"
refused "both inline and configMapRef" 's|config: {inline: "model: {preset: tiny}"}|config: {inline: x, configMapRef: {name: c}}|' \
  "spec.config: Invalid value" "set exactly one of inline and configMapRef"
refused "a relative checkpoint path" 's|path: /tmp/ckpt|path: ckpt|' "spec.checkpoint" "path must be absolute"
refused "permanentExitCodes without ExitCode" 's|^  checkpoint:.*|  runPolicy: {restartPolicy: OnFailure, permanentExitCodes: [3]}|' \
  "permanentExitCodes needs restartPolicy ExitCode"
refused "exit code 0 as permanent" 's|^  checkpoint:.*|  runPolicy: {restartPolicy: ExitCode, permanentExitCodes: [0]}|' \
  "0 is success, not a permanent failure"
refused "a failurePolicy rule that matches nothing" 's|^  checkpoint:.*|  runPolicy: {failurePolicy: {rules: [{action: FailJob}]}}|' \
  "a rule needs at least one of onExitCodes, onPodConditions and onMessagePattern"
refused "a failurePolicy rule for exit code 0" \
  's|^  checkpoint:.*|  runPolicy: {failurePolicy: {rules: [{action: FailJob, onExitCodes: {values: [0, 3]}}]}}|' \
  "0 is success; it cannot be In a failure rule"
refused "an unknown failurePolicy action" \
  's|^  checkpoint:.*|  runPolicy: {failurePolicy: {rules: [{action: Retry, onExitCodes: {values: [3]}}]}}|' \
  'action: Unsupported value: "Retry"'
# What the operator's parser refuses must be refused at apply time too: an edit of a running job
# that the API server stored and the operator could not parse would fail the job.
refused "a bounded repetition in onMessagePattern" \
  's|^  checkpoint:.*|  runPolicy: {failurePolicy: {rules: [{action: FailJob, onMessagePattern: "exit code [0-9]{3}"}]}}|' \
  "has a bounded repetition ({m,n}), which is not supported"
refused "a back-reference in onMessagePattern" \
  's|^  checkpoint:.*|  runPolicy: {failurePolicy: {rules: [{action: FailJob, onMessagePattern: "(a)\\\\1"}]}}|' \
  "has a back-reference"
refused "backoffLimit past the operator's 2^20" 's|^  checkpoint:.*|  runPolicy: {backoffLimit: 2000000}|' \
  "spec.runPolicy.backoffLimit: Invalid value: 2000000"
refused "activeDeadlineSeconds past int32" 's|^  checkpoint:.*|  runPolicy: {activeDeadlineSeconds: 3000000000}|' \
  "spec.runPolicy.activeDeadlineSeconds: Invalid value"
out="$(job esc | sed -e 's|^  checkpoint:.*|  runPolicy: {failurePolicy: {rules: [{action: FailJob, onMessagePattern: "NCCL.*timeout \\\\{x"}]}}|' |
  k apply -f - 2>&1)" && pass "an escaped brace in onMessagePattern is accepted" || fail "escaped brace: $out"
k delete trainingjob esc --wait=false >/dev/null 2>&1
refused "successPolicy: Rank1" 's|^  checkpoint:.*|  runPolicy: {successPolicy: Rank1}|' 'successPolicy: Unsupported value: "Rank1"'
refused "a Volcano queue with Coscheduling" \
  's|^  checkpoint:.*|  runPolicy: {schedulingPolicy: {gangAdmission: Coscheduling, queue: research}}|' \
  "queue is Volcano's: set it with gangAdmission Volcano"
refused "gangAdmission: Yunikorn" 's|^  checkpoint:.*|  runPolicy: {schedulingPolicy: {gangAdmission: Yunikorn}}|' \
  'gangAdmission: Unsupported value: "Yunikorn"'
refused "replicas: 0" 's|replicas: 2|replicas: 0|' "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"
refused "elasticPolicy with a mesh that fixes dpShard" 's|^  replicas: 2|  replicas: 2\n  elasticPolicy: {maxReplicas: 2}\n  mesh: {dpShard: 2}|' \
  "leave it out with elasticPolicy"
out="$(job elastic-mesh | sed -e 's|^  replicas: 2|  replicas: 2\n  elasticPolicy: {minReplicas: 1, maxReplicas: 2}\n  mesh: {tp: 2}|' \
  -e 's|processesPerReplica: 1|processesPerReplica: 2|' | k apply --dry-run=server -f - 2>&1)"
[[ "$out" == *"created (server dry run)"* ]] && pass "an elastic job with mesh {tp: 2} and no dpShard is accepted" ||
  fail "elastic tp 2: $out"
refused "elasticPolicy minReplicas over maxReplicas" 's|^  replicas: 2|  replicas: 2\n  elasticPolicy: {minReplicas: 3, maxReplicas: 2}|' \
  "minReplicas must not exceed maxReplicas"
refused "replicas outside elasticPolicy" 's|^  replicas: 2|  replicas: 2\n  elasticPolicy: {maxReplicas: 1}|' \
  "replicas must be within elasticPolicy's minReplicas and maxReplicas"
refused "device: tpu" 's|device: cpu|device: tpu|' 'spec.device: Unsupported value: "tpu"'
refused "an unknown field" 's|^  device: cpu|  device: cpu\n  replica: 2|' 'unknown field "spec.replica"'

# Updates: what the CRD forbids and what it allows.
job ok | k apply -f - >/dev/null 2>&1 && pass "a valid TrainingJob is created" || fail "create ok: $(job ok | k apply -f - 2>&1)"
out="$(job ok | sed 's|processesPerReplica: 1|processesPerReplica: 2|' | k apply -f - 2>&1)"
[[ "$out" == *"processesPerReplica is immutable; create a new TrainingJob"* ]] && pass "processesPerReplica is immutable" ||
  fail "ppr update: $out"
out="$(job ok | sed 's|replicas: 2|replicas: 4|' | k apply -f - 2>&1)"
[[ "$out" == *"with checkpoints on (or a runtimeRef, whose runtime may turn them on), replicas and mesh change only with elasticPolicy"* ]] &&
  pass "replicas fixed while checkpointing without elasticPolicy" || fail "replicas update: $out"
# Elastic: replicas move within elasticPolicy's range while checkpointing, not beyond it.
elastic() { job el | sed "s|^  replicas: 2|  replicas: $1\n  elasticPolicy: {minReplicas: 1, maxReplicas: 4}|"; }
elastic 2 | k apply -f - >/dev/null 2>&1 && out="$(elastic 4 | k apply -f - 2>&1)" &&
  [ "$(k get trainingjob el -o jsonpath='{.spec.replicas}')" = 4 ] &&
  pass "an elastic job's replicas change within its range while checkpointing (2 -> 4)" || fail "elastic resize: $out"
out="$(elastic 5 | k apply -f - 2>&1)"
[[ "$out" == *"replicas must be within elasticPolicy's minReplicas and maxReplicas"* ]] &&
  pass "an elastic job's replicas stay within its range" || fail "elastic 5: $out"
out="$(elastic 4 | sed 's|maxReplicas: 4|maxReplicas: 8|' | k apply -f - 2>&1)"
[[ "$out" == *"elasticPolicy cannot be added, removed or changed"* ]] &&
  pass "a checkpointing job's elasticPolicy is fixed (maxReplicas sets its global batch)" || fail "elasticPolicy edit: $out"
out="$(job ok | sed "s|^  replicas: 2|  replicas: 2\n  elasticPolicy: {maxReplicas: 4}|" | k apply -f - 2>&1)"
[[ "$out" == *"elasticPolicy cannot be added, removed or changed"* ]] &&
  pass "elasticPolicy cannot be added to a checkpointing job" || fail "elasticPolicy added: $out"
out="$(job ok | sed 's|^  device: cpu|  device: cpu\n  managedBy: kueue.x-k8s.io/multikueue|' | k apply -f - 2>&1)"
[[ "$out" == *"managedBy cannot be added or removed; create a new TrainingJob"* ]] && pass "managedBy cannot be added" ||
  fail "managedBy update: $out"
job ok | sed 's|every: 50|every: 25|' | k apply -f - >/dev/null 2>&1
out="$(k get trainingjob ok -o jsonpath='{.metadata.generation} {.spec.checkpoint.every} {.spec.runPolicy.backoffLimit} {.spec.imagePullPolicy}' 2>&1)"
[[ "$out" == "2 25 "* ]] && pass "an allowed update is stored as generation 2 (defaults: $out)" || fail "update: $out"

# Columns, status, wait, scale.
out="$(k get trainingjobs 2>&1)"
[[ "$out" == *"NAME"*"PHASE"*"READY"*"STEP"*"PROGRESS"*"ETA"*"TOKENS/S"*"RESTARTS"*"AGE"* && "$out" == *ok* ]] &&
  pass "get shows the printer columns" || fail "columns: $out"
k patch trainingjob ok --subresource=status --type=merge \
  -p '{"status":{"phase":"Running","ready":"2/2","trainer":{"step":42},"conditions":[{"type":"Running","status":"True","reason":"GangRunning","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}' >/dev/null 2>&1
out="$(k wait trainingjob/ok --for=condition=Running --timeout=20s 2>&1)"
[[ "$out" == *"condition met"* ]] && pass "kubectl wait on a condition written through the status subresource" || fail "wait: $out"
out="$(k get trainingjob ok --no-headers 2>&1)"
[[ "$out" == *Running*2/2*42* ]] && pass "columns show the status: $(echo $out | cut -c1-60)" || fail "status columns: $out"
out="$(k get trainingjob ok -o wide 2>&1)"
[[ "$(head -1 <<<"$out" | wc -w)" -gt "$(k get trainingjob ok 2>&1 | head -1 | wc -w)" ]] && pass "-o wide adds the priority-1 columns" ||
  fail "wide: $out"
k apply -f - >/dev/null 2>&1 <<EOF
$(job elastic | sed '/checkpoint:/d')
EOF
out="$(k scale trainingjob elastic --replicas=4 2>&1; k get trainingjob elastic -o jsonpath='{.spec.replicas}')"
[[ "$out" == *scaled*4 ]] && pass "kubectl scale through the scale subresource" || fail "scale: $out"

# A Pod through the node agent.
k run sleeper --image=busybox --restart=Never --command -- sh -c 'echo started; exec sleep 6017' >/dev/null 2>&1
e2e_wait_for 60 "sleeper Running" bash -c '[ "$(kubectl get pod sleeper -o jsonpath={.status.phase})" = Running ]' &&
  pass "kubectl run: the Pod runs on the node agent" || fail "run: $(k get pod sleeper -o yaml 2>&1 | tail -20)"
e2e_wait_for 20 "sleeper's log" bash -c 'kubectl logs sleeper | grep -q started' && pass "kubectl logs of a running Pod" ||
  fail "logs: $(k logs sleeper 2>&1)"
out="$(k describe pod sleeper 2>&1)"
[[ "$out" == *"Status:"*"Running"* && "$out" == *"Scheduled"*"default-scheduler"* ]] &&
  pass "describe pod: its phase and the scheduler's event" || fail "describe: $out"
pid="$(pgrep -f 'sleep 6017' | head -1)"
k delete pod sleeper --grace-period=1 >/dev/null 2>&1
e2e_wait_for 30 "sleeper's process gone" bash -c "! kill -0 ${pid:-0} 2>/dev/null" && [ -n "$pid" ] &&
  pass "delete stops the Pod's process" || fail "delete: pid '$pid' still there"

e2e_summary kubectl_e2e
