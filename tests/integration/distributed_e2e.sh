#!/usr/bin/env bash
# Sharded training as a user runs it: `meshwork-train launch --nproc N train ...` on Gloo gives
# the same loss at every step as one process on the same global batch (world 1, 2, 4 and HSDP
# 2x2, with parameter shapes that do not divide by the world size); a rank killed mid-run stops
# the job with the launcher naming it, and without the launcher the survivor exits on its own.
# usage: distributed_e2e.sh path/to/meshwork-train
set -uo pipefail

bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/common/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/checks.sh"

"$bin" prepare-data --out "$work/train.bin" /usr/share/common-licenses/GPL-3 >/dev/null || { echo "prepare-data failed"; exit 1; }

# intermediate_size 90 and 2 kv heads x 10 = 20 rows do not divide by 4: shards carry padding.
common=(--set model.hidden_size=40 --set model.intermediate_size=90 --set model.num_hidden_layers=2
        --set model.num_attention_heads=4 --set model.num_key_value_heads=2
        --set data.train="$work/train.bin" --set data.seq_len=64 --set schedule.steps=20
        --set metrics.port=-1 --set logging.every=100 --set optimizer.eps=1e-4 --set dist.timeout_seconds=60)
global_batch=8

# run NAME NPROC EXTRA...: trains with batch_size = global / nproc, losses to NAME.jsonl
run() {
  local name="$1" nproc="$2"
  shift 2
  port="$(free_port)"
  local cmd=(env MASTER_PORT="$port" "$bin")  # MASTER_PORT: a one-process FSDP run's store
  [ "$nproc" -gt 1 ] && cmd+=(launch --nproc "$nproc" --master-port "$port")
  cmd+=(train "${common[@]}" --set data.batch_size=$((global_batch / nproc)) --set logging.jsonl="$work/$name.jsonl" "$@")
  timeout 300 "${cmd[@]}" >"$work/$name.log" 2>&1
}

compare() {  # compare NAME: every step's loss within 1e-5 relative of the single process
  python3 "$(dirname "${BASH_SOURCE[0]}")/../common/compare_losses.py" "$work/single.jsonl" "$work/$1.jsonl" 20 1e-5
}

if run single 1 --set checkpoint.export_hf="$work/single.hf"; then pass "single process"; else fail "single process: $(tail -3 "$work/single.log")"; fi
for spec in "fsdp2 2 --trace-out $work/fsdp2.trace.json" "fsdp4 4" "hsdp2x2 4 --set mesh.dp_replicate=2" \
    "fsdp2-noreshard-noprefetch 2 --set fsdp.reshard_after_forward=false --set fsdp.prefetch=false" \
    "fsdp2-accum2 2 --set training.grad_accum=2 --set data.batch_size=2" \
    "compiled2-auto 2 --set fsdp.mode=compiled --dump-plan --trace-out $work/compiled2.trace.json" \
    "compiled4-block 4 --set fsdp.mode=compiled --set fsdp.bucketing=block" \
    "compiled-hsdp2x2 4 --set fsdp.mode=compiled --set mesh.dp_replicate=2" \
    "compiled4-mesh-auto 4 --set fsdp.mode=compiled --set dist.mesh=auto" \
    "compiled2-none-inorder 2 --set fsdp.mode=compiled --set fsdp.bucketing=none --set fsdp.reorder=false" \
    "compiled2-budget-noreshard 2 --set fsdp.mode=compiled --set fsdp.memory_budget=1 --set fsdp.reshard_after_forward=false" \
    "fsdp1-single-process 1 --set fsdp.single_process=true" \
    "single-ckpt-all 1 --set training.activation_checkpointing=all" \
    "fsdp2-ckpt-all 2 --set training.activation_checkpointing=all" \
    "compiled2-ckpt-all 2 --set fsdp.mode=compiled --set training.activation_checkpointing=all" \
    "compiled2-ckpt-selective 2 --set fsdp.mode=compiled --set training.activation_checkpointing=selective" \
    "compiled1-single-process 1 --set fsdp.mode=compiled --set fsdp.single_process=true" \
    "tp2 2 --set mesh.tp=2 --set data.batch_size=$global_batch" \
    "tp2-nosp-ckpt-all 2 --set mesh.tp=2 --set mesh.sequence_parallel=false --set training.activation_checkpointing=all --set data.batch_size=$global_batch" \
    "fsdp2-tp2 4 --set mesh.tp=2 --set mesh.dp_shard=2 --set data.batch_size=$((global_batch / 2))" \
    "tp2-async4 2 --set mesh.tp=2 --set mesh.async_tp_chunks=4 --set data.batch_size=$global_batch" \
    "compiled-hsdp2-tp2 4 --set fsdp.mode=compiled --set mesh.tp=2 --set mesh.dp_replicate=2 --set mesh.dp_shard=1 --set data.batch_size=$((global_batch / 2))" \
    "pp2-1f1b 2 --set mesh.pp=2 --set training.grad_accum=4 --set data.batch_size=2" \
    "pp2-gpipe 2 --set mesh.pp=2 --set pipeline.schedule=gpipe --set training.grad_accum=2 --set data.batch_size=4" \
    "pp2-zb-h1 2 --set mesh.pp=2 --set pipeline.schedule=zb-h1 --set training.grad_accum=4 --set data.batch_size=2" \
    "pp2-zb-h1-fsdp2 4 --set mesh.pp=2 --set mesh.dp_shard=2 --set pipeline.schedule=zb-h1 --set training.grad_accum=2 --set data.batch_size=2" \
    "pp2-zb-h1-fsdp2-ckpt-all 4 --set mesh.pp=2 --set mesh.dp_shard=2 --set pipeline.schedule=zb-h1 --set training.activation_checkpointing=all --set training.grad_accum=2 --set data.batch_size=2" \
    "pp2-zb-h1-tp2-async2 4 --set mesh.pp=2 --set mesh.tp=2 --set mesh.async_tp_chunks=2 --set pipeline.schedule=zb-h1 --set training.grad_accum=2 --set data.batch_size=4" \
    "pp2-dp2 4 --set mesh.pp=2 --set mesh.dp_replicate=2 --set training.grad_accum=2 --set data.batch_size=2" \
    "pp2-hsdp2x2 8 --set mesh.pp=2 --set mesh.dp_replicate=2 --set mesh.dp_shard=2 --set training.grad_accum=2 --set data.batch_size=1" \
    "pp2-fsdp2 4 --set mesh.pp=2 --set mesh.dp_shard=2 --set training.grad_accum=2 --set data.batch_size=2 --set checkpoint.export_hf=$work/pp2-fsdp2.hf" \
    "pp2-tp2 4 --set mesh.pp=2 --set mesh.tp=2 --set training.grad_accum=2 --set data.batch_size=4" \
    "pp2-tp2-nosp 4 --set mesh.pp=2 --set mesh.tp=2 --set mesh.sequence_parallel=false --set training.grad_accum=2 --set data.batch_size=4" \
    "pp2-ckpt-all 2 --set mesh.pp=2 --set training.activation_checkpointing=all --set training.grad_accum=4 --set data.batch_size=2" \
    "pp2-zb-h1-ckpt-all 2 --set mesh.pp=2 --set pipeline.schedule=zb-h1 --set training.activation_checkpointing=all --set training.grad_accum=4 --set data.batch_size=2" \
    "pp2-fsdp2-compiled 4 --set mesh.pp=2 --set mesh.dp_shard=2 --set fsdp.mode=compiled --dump-plan --set training.grad_accum=2 --set data.batch_size=2" \
    "pp2-zb-h1-fsdp2-ckpt-all-compiled 4 --set mesh.pp=2 --set mesh.dp_shard=2 --set fsdp.mode=compiled --set pipeline.schedule=zb-h1 --set training.activation_checkpointing=all --set training.grad_accum=2 --set data.batch_size=2" \
    "pp2-fsdp2-tp2-compiled 8 --set mesh.pp=2 --set mesh.dp_shard=2 --set mesh.tp=2 --set fsdp.mode=compiled --set training.grad_accum=2 --set data.batch_size=2" \
    "pp2-fsdp2-tp2 8 --set mesh.pp=2 --set mesh.dp_shard=2 --set mesh.tp=2 --set training.grad_accum=2 --set data.batch_size=2 --set checkpoint.export_hf=$work/pp2-fsdp2-tp2.hf"; do
  read -r name nproc extra <<<"$spec"
  # shellcheck disable=SC2086
  if ! run "$name" "$nproc" $extra; then
    fail "$name: launch failed: $(tail -5 "$work/$name.log")"
  elif msg="$(compare "$name" 2>&1)"; then
    pass "$name equals single process: $msg"
  else
    fail "$name differs from single process: $msg"
  fi
done
# fsdp.single_process: one process ran the FSDP engine over a mesh of one (the GPU tests' path).
for name in fsdp1-single-process compiled1-single-process; do
  grep -q "FSDP over mesh dp_replicate 1 x dp_shard 1" "$work/$name.log" && pass "$name: FSDP over a mesh of one" ||
    fail "$name: not FSDP: $(grep parallelism "$work/$name.log")"
done
# Tensor parallelism: every rank reads the whole global batch (one data parallel rank).
grep -q "tensor parallel over mesh tp 2 with sequence parallelism (gloo)" "$work/tp2.log" && pass "tp2: tensor parallel with sequence parallelism" ||
  fail "tp2: not tensor parallel: $(grep parallelism "$work/tp2.log")"
grep -q "tensor parallel over mesh tp 2 (gloo)" "$work/tp2-nosp-ckpt-all.log" && pass "tp2-nosp-ckpt-all: tensor parallel without sequence parallelism" ||
  fail "tp2-nosp-ckpt-all: not plain tensor parallel: $(grep parallelism "$work/tp2-nosp-ckpt-all.log")"
grep -q "tensor parallel over mesh tp 2 with sequence parallelism overlapped in 4 chunks (gloo)" "$work/tp2-async4.log" &&
  pass "tp2-async4: overlapped tensor parallelism" || fail "tp2-async4: not overlapped: $(grep parallelism "$work/tp2-async4.log")"
# Tensor parallelism under FSDP/HSDP: a tp group reads one batch, the data parallel ranks their rows.
grep -q "FSDP over mesh dp_replicate 1 x dp_shard 2 x tp 2 with sequence parallelism" "$work/fsdp2-tp2.log" &&
  pass "fsdp2-tp2: FSDP over tensor parallel slices" || fail "fsdp2-tp2: not FSDP x tp: $(grep parallelism "$work/fsdp2-tp2.log")"
grep -q "FSDP over mesh dp_replicate 2 x dp_shard 1 x tp 2 with sequence parallelism" "$work/compiled-hsdp2-tp2.log" &&
  grep -q "compiled plan" "$work/compiled-hsdp2-tp2.log" && pass "compiled-hsdp2-tp2: a compiled plan over HSDP x tp" ||
  fail "compiled-hsdp2-tp2: not compiled HSDP x tp: $(grep -E "parallelism|compiled plan" "$work/compiled-hsdp2-tp2.log")"
# On CPU ranks the plan carries tensor parallelism's exchanges: the tp link calibrated, and the
# async_tp pass's choice for the 4 modules that exchange (embedding, 2 layers, head).
if grep -qE "; tp link [0-9]+ us \+ [0-9.]+ GB/s" "$work/compiled-hsdp2-tp2.log" &&
   grep -qE "^compiled plan chose: async TP on [0-9]+ of 4 modules with tensor parallel exchanges" "$work/compiled-hsdp2-tp2.log"; then
  pass "compiled-hsdp2-tp2: the plan prices TP's exchanges on a calibrated tp link"
else
  fail "compiled-hsdp2-tp2: no tp link or no TP exchanges in the plan: $(grep -E "^compiled plan" "$work/compiled-hsdp2-tp2.log")"
fi
# training.activation_checkpointing: all recomputes every layer (said on the parallelism line and,
# compiled, in the plan); auto lets the plan checkpoint layers to fit fsdp.memory_budget (1 MiB
# here: below eager's peak; at data.seq_len 32 the activations fit it since the output head
# keeps no logits).
for name in single-ckpt-all fsdp2-ckpt-all compiled2-ckpt-all; do
  grep -q "activation checkpointing: every layer" "$work/$name.log" && pass "$name: every layer checkpointed" ||
    fail "$name: checkpointing not reported: $(grep parallelism "$work/$name.log")"
done
grep -q "activation checkpointing: layers 0, 2, 4, ... (selective" "$work/compiled2-ckpt-selective.log" &&
  pass "compiled2-ckpt-selective: every 2nd layer checkpointed" ||
  fail "compiled2-ckpt-selective: checkpointing not reported: $(grep parallelism "$work/compiled2-ckpt-selective.log")"
if line="$(grep -m1 -E '^compiled plan chose: activation checkpointing on [1-9]' "$work/compiled2-budget-noreshard.log")"; then
  pass "compiled2-budget-noreshard: ${line:0:160}"
else
  fail "compiled2-budget-noreshard: the plan checkpointed nothing under a 1 MiB budget: $(grep '^compiled plan chose' "$work/compiled2-budget-noreshard.log")"
fi
# Pipeline stages: every rank reads the whole global batch, as the schedule's micro-batches.
for name in pp2-1f1b pp2-gpipe pp2-zb-h1; do
  grep -q "^pipeline: pp=2, ${name#pp2-}, [24] micro-batches a step, 2 stages of layers \[0,1) \[1,2)" "$work/$name.log" &&
    pass "$name: two pipeline stages" || fail "$name: not a pipeline: $(grep -E '^(pipeline|parallelism)' "$work/$name.log")"
done
# Two replicas of a 2-stage pipeline: each reads its rows (2 x accum 2 x ranks 2), the stages'
# gradients averaged over dp_replicate.
grep -q "^pipeline: pp=2, 1f1b, 2 micro-batches a step, .*; 2 data parallel pipelines .*each stage's gradients averaged over dp_replicate 2" "$work/pp2-dp2.log" &&
  grep -q "batch 2 x accum 2 x ranks 2 = " "$work/pp2-dp2.log" &&
  pass "pp2-dp2: two replicas of a two-stage pipeline" ||
  fail "pp2-dp2: not replicated pipelines: $(grep -E '^(pipeline|data)' "$work/pp2-dp2.log")"
# FSDP inside each of 2 stages over dp_shard 2: each group's parameters gathered for the step, its
# gradients reduce-scattered (the communication line counts both).
grep -q "^pipeline: pp=2, 1f1b, 2 micro-batches a step, .*; 2 data parallel pipelines .*FSDP inside each stage over dp_shard 2" "$work/pp2-fsdp2.log" &&
  grep -qE "^communication \(rank 0\): all_gather [1-9][0-9]* calls .* reduce_scatter [1-9]" "$work/pp2-fsdp2.log" &&
  pass "pp2-fsdp2: FSDP inside two pipeline stages" ||
  fail "pp2-fsdp2: not FSDP inside stages: $(grep -E '^(pipeline|communication)' "$work/pp2-fsdp2.log")"
# FSDP inside the stages: from the second step on (the first counts each group's gradient
# accumulations), a group's reduce-scatter starts inside the program once the step's last backward
# through it has run: on rank 0 at least decoder layer 0's (its stage's embedding, tied to the
# head, waits for the stages' exchange), with tensor parallelism too (the replicated norms' shards
# are reduced over tp after the reduce-scatters).
overlapped() {  # overlapped NAME: rank 0's count per step, space-separated
  python3 -c 'import json, sys; print(" ".join(str(json.loads(l).get("pipeline_overlapped_reduce_scatters", "none")) for l in open(sys.argv[1])))' "$work/$1.jsonl"
}
for name in pp2-fsdp2 pp2-zb-h1-fsdp2 pp2-zb-h1-fsdp2-ckpt-all pp2-hsdp2x2 pp2-fsdp2-tp2; do
  counts="$(overlapped "$name")"
  if [[ "$counts" =~ ^0(\ [1-9][0-9]*){19}$ ]]; then
    pass "$name: reduce-scatters start inside the program from step 2 on (${counts:0:12}...)"
  else
    fail "$name: reduce-scatters inside the program per step: '$counts'"
  fi
done
# Compiled: the program's rs ops start them inside it from the first step on, and --dump-plan
# prints the program with its FSDP ops (rank 0: the embedding's unit 0, tied, has no rs).
for name in pp2-fsdp2-compiled pp2-zb-h1-fsdp2-ckpt-all-compiled pp2-fsdp2-tp2-compiled; do
  counts="$(overlapped "$name")"
  if [[ "$counts" =~ ^[1-9][0-9]*(\ [1-9][0-9]*){19}$ ]]; then
    pass "$name: reduce-scatters start inside the program from step 1 on (${counts:0:12}...)"
  else
    fail "$name: reduce-scatters inside the program per step: '$counts'"
  fi
done
grep -qE "^rank 0: ag0@0 ag1@0 F0@0 .* B1@0 rs1@0$" "$work/pp2-fsdp2-compiled.log" &&
  grep -qE "^rank 1: ag0@1 ag1@1 ra0@1 .* sg1@1 rs0@1$" "$work/pp2-fsdp2-compiled.log" &&
  pass "pp2-fsdp2-compiled: --dump-plan prints the program with its FSDP ops" ||
  fail "pp2-fsdp2-compiled: no program with FSDP ops printed: $(grep -A3 '== pipeline program' "$work/pp2-fsdp2-compiled.log")"
for name in pp2-ckpt-all pp2-zb-h1-ckpt-all; do
  grep -q "^parallelism: pipeline: .*activation checkpointing: every layer" "$work/$name.log" &&
    pass "$name: every layer checkpointed inside the stages" ||
    fail "$name: checkpointing not reported: $(grep '^parallelism' "$work/$name.log")"
done
# Tensor parallelism inside the stages, alone and with FSDP (3-D: pp 2 x dp_shard 2 x tp 2).
grep -q "^pipeline: pp=2, 1f1b, 2 micro-batches a step, .*; tensor parallel over tp 2 with sequence parallelism inside each stage" "$work/pp2-tp2.log" &&
  grep -q "^pipeline: pp=2, .*FSDP inside each stage over dp_shard 2 .*; tensor parallel over tp 2" "$work/pp2-fsdp2-tp2.log" &&
  pass "pp2-tp2, pp2-fsdp2-tp2: tensor parallelism inside pipeline stages, with FSDP too" ||
  fail "pp2-tp2, pp2-fsdp2-tp2: $(grep -h '^pipeline' "$work/pp2-tp2.log" "$work/pp2-fsdp2-tp2.log")"
# Their exports (every stage's shards and slices gathered to rank 0) evaluate as the single process's does.
eval_loss() { "$bin" eval --weights "$1" --data "$work/train.bin" --windows 8 --set data.seq_len=64 2>&1 | sed -n 's/^eval: loss \([0-9.]*\) .*/\1/p'; }
single_eval="$(eval_loss "$work/single.hf")"
for name in pp2-fsdp2 pp2-fsdp2-tp2; do
  got="$(eval_loss "$work/$name.hf")"
  if [ -n "$single_eval" ] && python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-4 * abs(a))" "$single_eval" "$got"; then
    pass "$name's export evaluates as the single process's ($got vs $single_eval)"
  else
    fail "$name's export: eval loss '$got', single process's '$single_eval'"
  fi
done
if run pp2-world4 4 --set mesh.pp=2 --set mesh.dp_shard=3 --set training.grad_accum=2; then
  fail "mesh.pp=2 x mesh.dp_shard=3 on a world of 4 trained"
elif grep -q "key 'mesh.pp': 2 pipeline ranks x mesh.dp_replicate=1 x mesh.dp_shard=3 x mesh.tp=1 = 6 ranks, but the world is 4 processes" "$work/pp2-world4.log"; then
  pass "mesh.pp=2 x mesh.dp_shard=3 on a world of 4 is refused by name"
else
  fail "mesh.pp=2 x mesh.dp_shard=3 on a world of 4: $(tail -3 "$work/pp2-world4.log")"
fi
if run pp2-one-process 1 --set mesh.pp=2; then
  fail "mesh.pp=2 on one process trained"
elif grep -q "key 'mesh.pp': 2 pipeline ranks, but the world is 1 process" "$work/pp2-one-process.log"; then
  pass "mesh.pp=2 on one process is refused by name"
else
  fail "mesh.pp=2 on one process: $(tail -3 "$work/pp2-one-process.log")"
fi
if run pp2-1f1b-too-few 2 --set mesh.pp=2 --set training.grad_accum=1; then
  fail "1f1b with fewer micro-batches than stages trained"
elif grep -q "key 'pipeline.schedule': pipeline schedule 1f1b with pp 2, 1 virtual stages and 1 micro-batches: needs at least as many micro-batches as pp.*training.grad_accum=1" "$work/pp2-1f1b-too-few.log"; then
  pass "1f1b with 1 micro-batch over 2 stages is refused naming pipeline.schedule and training.grad_accum"
else
  fail "1f1b with too few micro-batches: $(tail -3 "$work/pp2-1f1b-too-few.log")"
fi
grep -q "FSDP over mesh dp_replicate 2 x dp_shard 2" "$work/hsdp2x2.log" && pass "HSDP mesh 2x2 in use" ||
  fail "HSDP mesh not reported: $(grep parallelism "$work/hsdp2x2.log")"
# dist.mesh: auto: rank 0 simulated every mesh of 4, chose one, and every rank trained on it.
if chose="$(grep -m1 '^mesh: auto chose' "$work/compiled4-mesh-auto.log")" &&
   [ "$(grep -c '^  [0-9]* x [0-9]*: compiled step' "$work/compiled4-mesh-auto.log")" = 3 ] &&
   grep -q "FSDP over mesh dp_replicate $(sed -E 's/^mesh: auto chose ([0-9]+)x([0-9]+) .*/\1 x dp_shard \2/' <<<"$chose")" \
     "$work/compiled4-mesh-auto.log"; then
  pass "dist.mesh auto: ${chose:0:160}"
else
  fail "dist.mesh auto: no choice of 3 candidates, or not the mesh in use: $(grep -E '^mesh|parallelism' "$work/compiled4-mesh-auto.log")"
fi
# A profile rank 0 cannot load fails every rank alike, naming the key, with the config exit code.
if run mesh-auto-bad-profile 2 --set dist.mesh=auto --set dist.hardware_profile=nosuch-profile; then
  fail "dist.mesh auto with an unknown profile trained"
elif [ "$(grep -c "dist.hardware_profile': no built-in hardware profile 'nosuch-profile'" "$work/mesh-auto-bad-profile.log")" -ge 2 ]; then
  pass "dist.mesh auto with an unknown profile: both ranks name dist.hardware_profile"
else
  fail "dist.mesh auto with an unknown profile: $(tail -5 "$work/mesh-auto-bad-profile.log")"
fi
# Compiled runs really ran a plan; --dump-plan printed the IR after every pass.
for name in compiled2-auto compiled4-block compiled-hsdp2x2 compiled2-none-inorder compiled2-budget-noreshard compiled1-single-process compiled2-ckpt-all; do
  if line="$(grep -m1 '^compiled plan:' "$work/$name.log")"; then pass "$name: ${line:0:160}"; else fail "$name: no compiled plan in the log"; fi
  # fsdp.replan (default): after two compiled steps, one refit and re-plan.
  if line="$(grep -m1 '^re-plan:' "$work/$name.log")"; then pass "$name: ${line:0:200}"; else fail "$name: no re-plan line in the log"; fi
done
if grep -q "^== reorder ==" "$work/compiled2-auto.log" && grep -q "^== insert_frees ==" "$work/compiled2-auto.log"; then
  pass "--dump-plan prints the IR after each pass"
else
  fail "--dump-plan output missing"
fi

# --trace-out: one Chrome trace of step 3 with both ranks' compute and communication lanes; every
# module's forward and backward on the compute lane, one communication span per collective of
# the step (eager, FSDP2's defaults: 4 all-gathers, the root and both layers, layer 0 again for
# its backward but not the last layer, + 3 reduce-scatters; compiled: the plan's count).
check_trace() {  # check_trace FILE COLLECTIVES_PER_RANK
  python3 - "$1" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
want_comm = int(sys.argv[2])
events = doc["traceEvents"]
lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
assert names == {"rank 0", "rank 1"}, names
for pid in (0, 1):
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
    by_lane = {}
    for e in spans:
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        by_lane.setdefault(lanes[(pid, e["tid"])], []).append(e)
    compute = {e["name"].split(" (")[0] for e in by_lane["compute"]}
    for need in ["fwd embed", "fwd layers.0", "fwd layers.1", "bwd layers.0", "bwd layers.1", "bwd embed"]:
        assert need in compute, (pid, need, compute)
    comm = by_lane["communication"]
    assert len(comm) == want_comm, (pid, len(comm), want_comm, [e["name"] for e in comm])
    assert all(int(e["args"]["bytes"]) > 0 for e in comm)
    step = by_lane["step"][0]
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end <= step["ts"] + step["dur"] + 1, (end, step)
print(f"{len(events)} events, 2 ranks, {want_comm} collectives per rank")
PY
}
if msg="$(check_trace "$work/fsdp2.trace.json" 7 2>&1)"; then pass "eager --trace-out: $msg"; else fail "eager --trace-out: $msg"; fi
planned="$(sed -n 's/^compiled plan:.*; \([0-9]*\) collectives\/step.*/\1/p' "$work/compiled2-auto.log" | head -1)"
if msg="$(check_trace "$work/compiled2.trace.json" "${planned:-0}" 2>&1)"; then
  pass "compiled --trace-out: $msg"
else
  fail "compiled --trace-out: $msg"
fi

# training.memory_limit_mib: ranks whose device holds 56 MiB of tensors. Activations dominate
# here (8 layers, seq 256; eager's step peak is about 80 MiB). Eager FSDP has no plan and runs out
# (exit 5, naming the key); compiled FSDP warms up with every layer checkpointed, then plans
# within the limit (checkpointing some layers) and trains to the single process's losses.
deep=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=8
      --set data.seq_len=256 --set training.loss_chunk_mib=1 --set schedule.steps=8)
if run deep-single 1 "${deep[@]}"; then pass "deep model, single process"; else fail "deep-single: $(tail -3 "$work/deep-single.log")"; fi
if run deep-eager2-limit 2 "${deep[@]}" --set training.memory_limit_mib=56; then
  fail "eager FSDP trained within 56 MiB: the limit is not below its peak ($(grep -o 'step peak tensors [0-9]* MiB' "$work/deep-eager2-limit.log"))"
elif [ $? -eq 5 ] && grep -q "out of device memory: .*training.memory_limit_mib is 56" "$work/deep-eager2-limit.log"; then
  pass "eager FSDP past training.memory_limit_mib: exit 5, $(grep -m1 -o 'out of device memory: [^(]*' "$work/deep-eager2-limit.log")"
else
  fail "eager FSDP past the limit: not an out-of-device-memory exit 5: $(tail -3 "$work/deep-eager2-limit.log")"
fi
if ! run deep-compiled2-limit 2 "${deep[@]}" --set fsdp.mode=compiled --set training.memory_limit_mib=56; then
  fail "compiled FSDP within 56 MiB: $(tail -3 "$work/deep-compiled2-limit.log")"
elif msg="$(python3 "$(dirname "${BASH_SOURCE[0]}")/../common/compare_losses.py" "$work/deep-single.jsonl"               "$work/deep-compiled2-limit.jsonl" 8 1e-5 2>&1)"; then
  pass "compiled FSDP within 56 MiB equals single process: $msg; $(grep -m1 -o 'activation checkpointing on [0-9]* of [0-9]*'     "$work/deep-compiled2-limit.log"), $(grep -o 'step peak tensors [0-9]* MiB' "$work/deep-compiled2-limit.log")"
else
  fail "compiled FSDP within 56 MiB differs from single process: $msg"
fi

# A rank killed mid-run: the launcher stops the job, names the rank and the signal, exits 137.
port="$(free_port)"
"$bin" launch --nproc 2 --master-port "$port" train "${common[@]}" --set data.batch_size=4 \
  --set schedule.steps=100000 --set logging.every=5 >"$work/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 1 300); do grep -q "^step 10/" "$work/kill.log" && break; sleep 0.1; done
victim="$(pgrep -P "$launcher" | sort -n | tail -1)"
start=$(date +%s)
if [ -n "$victim" ]; then kill -9 "$victim"; fi
wait "$launcher"
rc=$?
took=$(($(date +%s) - start))
if [ -n "$victim" ] && [ "$rc" -eq 137 ] && grep -q "was killed by signal 9" "$work/kill.log" && [ "$took" -lt 60 ]; then
  pass "killed rank: launcher exit 137 after ${took}s: $(grep -m1 'killed by signal' "$work/kill.log")"
else
  fail "killed rank: victim '$victim', exit $rc after ${took}s; $(tail -5 "$work/kill.log")"
fi
if pgrep -f "$work/train.bin" >/dev/null; then fail "ranks left running after the launcher exited"; else pass "no rank left running"; fi

# Without the launcher (ranks started as a scheduler would, from torchrun's variables): when a
# peer is killed, every surviving rank notices on its own, within the collective timeout, and
# exits with the "unavailable" code (5) and a message naming the failed collective.
for victim_rank in 1 0; do
  port="$(free_port)"
  pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$bin" train "${common[@]}" --set data.batch_size=4 --set schedule.steps=100000 --set logging.every=5 \
      --set dist.timeout_seconds=30 >"$work/direct$r.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1 300); do grep -q "^step 10/" "$work/direct0.log" && break; sleep 0.1; done
  survivor=$((1 - victim_rank))
  start=$(date +%s)
  kill -9 "${pids[$victim_rank]}"
  wait "${pids[$survivor]}"
  rc=$?
  took=$(($(date +%s) - start))
  wait "${pids[$victim_rank]}" 2>/dev/null
  if [ "$rc" -eq 5 ] && [ "$took" -le 35 ] && grep -q "error:.*\(gloo\|Gloo\|collective\|connection\|Connection\)" "$work/direct$survivor.log"; then
    pass "rank $victim_rank killed: rank $survivor exits 5 after ${took}s: $(grep -m1 'error' "$work/direct$survivor.log" | cut -c1-200)"
  else
    fail "rank $victim_rank killed: rank $survivor exit $rc after ${took}s; $(tail -3 "$work/direct$survivor.log")"
  fi
done

checks_done distributed_e2e
