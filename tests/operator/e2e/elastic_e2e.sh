#!/usr/bin/env bash
# Elastic TrainingJobs (issue 48): a real 2-Pod training job with spec.elasticPolicy {1, 2} and
# checkpoints every 10 steps is scaled down to 1 Pod mid-run and back up to 2 with kubectl scale.
# Each resize starts a new gang at the new size that resumes from the latest checkpoint, resharded
# by the trainer, at the same global batch (8 rows a step: 2 ranks x 1 micro-batch of 4 rows, then
# 1 rank x 2 micro-batches): checks the CEL rules (a scale outside the range is refused, one
# inside accepted), status.elastic (sizes, resizes, the step each new gang resumed from: at or past
# the step reported before the scale, the old gang having saved on SIGTERM), the
# ResumedFromCheckpoint Events naming both sizes, the
# ranks' logs (resharded, the batch split), restarts 0, and that the job succeeds.
# With MESH tp2 the job is 2 Pods of 2 processes with mesh {tp: 2} and no dpShard: every gang keeps
# tensor parallelism over each Pod's 2 ranks, and shards (FSDP) over what its world leaves (2 Pods:
# 1x2x2, 1 Pod: 1x1x2); the checkpoint is resharded from 4 ranks to 2 and back.
# With MESH auto (mesh: {auto: true}) the operator plans each gang at its size (status.plan, a
# PlanChosen Event), and each new gang resumes from the checkpoint of the other plan, resharded;
# each gang's trainer refits the compute rate to its steps (its plan advice, status.calibration)
# and the next gang is planned at that rate (status.plan.calibrated, the Event).
# usage: elastic_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR [MESH: dp (default) | tp2 | auto]
set -uo pipefail

cp_bin="$1"
op_bin="$2"
train_bin="$3"
src="$4"
mesh_mode="${5:-dp}"
case "$mesh_mode" in
  dp) ppr=1; mesh_spec="" ;;
  tp2) ppr=2; mesh_spec="  mesh: {tp: 2}" ;;
  auto) ppr=1; mesh_spec="  mesh: {auto: true}" ;;
  *) echo "elastic_e2e.sh: MESH must be dp, tp2 or auto, got '$mesh_mode'" >&2; exit 2 ;;
esac
source "$src/tests/common/e2e_lib.sh"
e2e_require_kubectl
e2e_init
export PATH="$(dirname "$train_bin"):$PATH"
k() { timeout 60 kubectl --request-timeout=30s -n e2e "$@"; }
jp() { k get tj elastic -o jsonpath="$1" 2>/dev/null; }
finish() {
  if [ "$failed" -gt 0 ]; then
    echo "---- kubectl get tj,pods"; k get tj,pods -o wide 2>&1
    echo "---- status"; jp '{.status}'; echo
    echo "---- events"; k get events --field-selector involvedObject.name=elastic 2>&1 | tail -n 20
    echo "---- operator log"; tail -n 40 "$work/op.log"
  fi
  e2e_summary elastic_e2e
  exit $?
}

mkdir -p "$work/data" "$work/ckpt"
e2e_start_controlplane "$cp_bin" || exit 1
e2e_apply_crd "$src" || { fail "the CRD did not apply"; finish; }
kubectl create namespace e2e >/dev/null
"$train_bin" prepare-data --out "$work/data/train.bin" --val-out "$work/data/val.bin" "$src/README.md" "$src/docs" \
  >/dev/null || { fail "prepare-data"; finish; }
port="$(free_port)"
"$op_bin" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$port" --leader-elect false \
  --report-interval-s 2 --pod-delete-grace-s 5 >>"$work/op.log" 2>&1 &
e2e_track $!

master="$(free_port)"
kubectl apply -f - >/dev/null <<YAML
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata: {name: elastic, namespace: e2e}
spec:
  image: meshwork/trainer:e2e
  device: cpu
  replicas: 2
  processesPerReplica: $ppr
$mesh_spec
  elasticPolicy: {minReplicas: 1, maxReplicas: 2}
  masterPort: $master
  metricsPort: $(free_port)
  checkpoint: {path: $work/ckpt, every: 10}
  runPolicy: {backoffLimit: 0}
  config:
    inline: |
      model: {preset: tiny}
      data: {train: $work/data/train.bin, seq_len: 64, batch_size: 4}
      schedule: {steps: 400, warmup_steps: 5}
      training: {threads: 1}
      logging: {every: 5}
YAML
step() { jp '{.status.trainer.step}'; }
at_least() { local s; s="$(step)"; [ -n "$s" ] && [ "$s" -ge "$1" ] && [ "$(jp '{.status.trainer.generation}')" = "$2" ]; }
resumed() { [ "$(jp '{.status.elastic.lastResize.generation}')" = "$1" ] && [ -n "$(jp '{.status.elastic.lastResize.resumedFromStep}')" ]; }

out="$(k scale tj elastic --replicas 3 2>&1)"
[[ "$out" == *"replicas must be within elasticPolicy's minReplicas and maxReplicas"* ]] &&
  pass "a scale outside elasticPolicy is refused by the CRD's CEL rule" || fail "scale to 3: $out"

# resize GENERATION_BEFORE TO_REPLICAS: waits for a step past a checkpoint, scales, and checks the
# new gang: the step it resumed from, the Event, its logs.
resize() {
  local gen="$1" to="$2" from s0 resumed_at expect_from
  from="$(jp '{.spec.replicas}')"
  if ! e2e_wait_for 300 "generation $gen past step $(( (gen + 1) * 20 ))" at_least $(( (gen + 1) * 20 )) "$gen"; then
    fail "generation $gen did not reach step $(( (gen + 1) * 20 )): step $(step), $(jp '{.status.conditions[*].message}')"
    finish
  fi
  if [ "$mesh_mode" = auto ]; then
    # The trainer's plan advice (dist.advise_after_steps, 10): its refitted compute rate, scraped
    # into status.calibration, prices the next gang's plan.
    if e2e_wait_for 60 "generation $gen's refitted compute rate in status.calibration" \
      bash -c "[ \"\$(kubectl -n e2e get tj elastic -o jsonpath='{.status.calibration.generation}')\" = $gen ]"; then
      pass "gang $gen's plan advice: status.calibration $(jp '{.status.calibration}')"
    else
      fail "no status.calibration from generation $gen: '$(jp '{.status.calibration}')'"
    fi
  fi
  s0="$(step)"
  out="$(k scale tj elastic --replicas "$to" 2>&1)"
  [[ "$out" == *scaled* ]] && pass "kubectl scale $from -> $to accepted at reported step $s0" || { fail "scale to $to: $out"; finish; }
  if ! e2e_wait_for 180 "the $to-Pod gang reports where it resumed" resumed $((gen + 1)); then
    fail "no resumedFromStep for generation $((gen + 1)): $(jp '{.status.elastic}')"; finish
  fi
  resumed_at="$(jp '{.status.elastic.lastResize.resumedFromStep}')"
  # The old gang's Pods got SIGTERM when they were deleted: they saved the step they stopped at
  # (checkpoint.save_on_terminate), at or past the step reported before the scale.
  [ "$resumed_at" -ge "$s0" ] && [ "$(jp '{.status.elastic.lastResize.fromReplicas}')" = "$from" ] &&
    [ "$(jp '{.status.elastic.lastResize.toReplicas}')" = "$to" ] && [ "$(jp '{.status.elastic.replicas}')" = "$to" ] &&
    pass "status.elastic: $from -> $to replicas, resumed from step $resumed_at (scaled at reported step $s0: the old gang saved where it stopped, no step lost)" ||
    fail "status.elastic after the scale at $s0: $(jp '{.status.elastic}')"
  msg="$(k get events --field-selector involvedObject.name=elastic,reason=ResumedFromCheckpoint -o jsonpath='{.items[*].message}')"
  [[ "$msg" == *"the new gang at $to replicas (resized from $from) resumed from the checkpoint of step $resumed_at of 400"* ]] &&
    pass "Event ResumedFromCheckpoint names both sizes and the step" || fail "events: $msg"
  log="$(k logs elastic-0 2>&1)"
  [[ "$log" == *"resharded: the checkpoint was written by world size $((from * ppr))"*"this run is $((to * ppr))"* ]] &&
    pass "rank 0 resharded the checkpoint of $((from * ppr)) ranks to $((to * ppr))" ||
    fail "elastic-0 log: $(grep -m3 'resume' <<<"$log")"
  if [ "$mesh_mode" = tp2 ]; then
    [ "$(jp '{.status.meshShape}')" = "1x${to}x2" ] && [[ "$(k get pod elastic-0 -o yaml)" == *"mesh.dp_shard=$to"*"mesh.tp=2"* ]] &&
      pass "the $to-Pod gang keeps tp 2 and shards over $to (status.meshShape 1x${to}x2, the trainer's overrides)" ||
      fail "mesh after the scale to $to: $(jp '{.status.meshShape}'), $(k get pod elastic-0 -o yaml | grep -o 'mesh\.[a-z_]*=[0-9]*' | tr '\n' ' ')"
  fi
  if [ "$mesh_mode" = auto ]; then
    local planned ev
    planned="$(jp '{.status.plan.worldSize} {.status.plan.meshShape} {.status.meshShape}')"
    ev="$(k get events --field-selector involvedObject.name=elastic,reason=PlanChosen -o jsonpath='{.items[*].message}')"
    [[ "$planned" =~ ^$to\ ([^ ]+)\ ([^ ]+)$ ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] &&
      [[ "$ev" == *" for $to ranks on "* ]] &&
      pass "the $to-Pod gang runs the plan chosen for it: $(jp '{.status.plan.description}')" ||
      fail "plan after the scale to $to: '$planned', Events '$ev'"
    [ "$(jp '{.status.plan.calibrated.generation}')" = "$gen" ] && [[ "$ev" == *"at the compute rate gang $gen measured, MFU "* ]] &&
      pass "the $to-Pod gang was planned at the rate gang $gen measured: $(jp '{.status.plan.calibrated}')" ||
      fail "status.plan.calibrated after the scale to $to: '$(jp '{.status.plan.calibrated}')', Events '$ev'"
    [[ "$log" == *"batch: training.global_batch_size 8 rows a step"* ]] &&
      pass "the global batch stays 8 rows: $(grep -o 'batch: training.global_batch_size.*' <<<"$log")" ||
      fail "batch line: $(grep 'batch' <<<"$log" | head -3)"
    return
  fi
  [[ "$log" == *"batch: training.global_batch_size 8 rows a step = $to data parallel rank"*"x $(( 8 / (4 * to) )) micro-batch"* ]] &&
    pass "the global batch stays 8 rows: $(grep -o 'batch: training.global_batch_size.*' <<<"$log")" ||
    fail "batch line: $(grep 'batch' <<<"$log" | head -3)"
}

resize 0 1
resize 1 2
if e2e_wait_for 400 "elastic succeeds" bash -c "[ \"\$(kubectl -n e2e get tj elastic -o jsonpath='{.status.phase}')\" = Succeeded ]"; then
  [ "$(jp '{.status.restarts}')" = 0 ] && [ "$(jp '{.status.elastic.resizes}')" = 2 ] &&
    [ "$(jp '{.status.elastic.globalBatchSize}')" = 8 ] && [ "$(step)" = 400 ] &&
    pass "the job succeeded at step 400 after 2 resizes, restarts 0, global batch 8" ||
    fail "after success: $(jp '{.status}')"
else
  fail "elastic did not succeed: $(jp '{.status.phase}') $(jp '{.status.conditions[*].message}')"
fi
finish
