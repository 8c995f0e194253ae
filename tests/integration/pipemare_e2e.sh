#!/usr/bin/env bash
# PipeMare (pipeline.schedule: pipemare) through the launcher, as a user runs it: one step (then
# the drain at the end) is 1F1B's step exactly, since nothing has updated yet; over 60 steps it
# trains to within 5% of 1F1B's loss on the same batches; two replicas of the pipeline
# (dp_replicate 2) give the losses of one pipeline reading both replicas' rows; an evaluation
# between steps and checkpoints (each drains the pipeline) run; what it does not compose with
# exits 2 naming the key.
# usage: pipemare_e2e.sh path/to/meshwork-train
set -uo pipefail

bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/common/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/checks.sh"

"$bin" prepare-data --out "$work/train.bin" /usr/share/common-licenses/GPL-3 >/dev/null || { echo "prepare-data failed"; exit 1; }

common=(--set model.hidden_size=40 --set model.intermediate_size=90 --set model.num_hidden_layers=2
        --set model.num_attention_heads=4 --set model.num_key_value_heads=2 --set model.tie_word_embeddings=false
        --set data.train="$work/train.bin" --set data.seq_len=64 --set metrics.port=-1 --set logging.every=100
        --set optimizer.eps=1e-4 --set dist.timeout_seconds=60 --set mesh.pp=2 --set training.grad_accum=2)

run() {  # run NAME NPROC EXTRA...: losses to NAME.jsonl, output to NAME.log
  local name="$1" nproc="$2"
  shift 2
  port="$(free_port)"
  timeout 300 "$bin" launch --nproc "$nproc" --master-port "$port" train "${common[@]}" \
    --set logging.jsonl="$work/$name.jsonl" "$@" >"$work/$name.log" 2>&1
}
compare() {  # compare A B STEPS TOLERANCE
  python3 "$(dirname "${BASH_SOURCE[0]}")/../common/compare_losses.py" "$work/$1.jsonl" "$work/$2.jsonl" "$3" "$4"
}
eval_loss() { "$bin" eval --weights "$1" --data "$work/train.bin" --windows 8 --set data.seq_len=64 2>&1 | sed -n 's/^eval: loss \([0-9.]*\) .*/\1/p'; }

# One step: every forward runs on the initial weights and the drain applies each stage's one update.
one=(--set schedule.steps=1 --set optimizer.grad_clip=0 --set data.batch_size=4)
if run one-1f1b 2 "${one[@]}" --set checkpoint.export_hf="$work/one-1f1b.hf" &&
   run one-pipemare 2 "${one[@]}" --set pipeline.schedule=pipemare --set checkpoint.export_hf="$work/one-pipemare.hf"; then
  msg="$(compare one-1f1b one-pipemare 1 1e-6)" && pass "one step: pipemare's loss is 1f1b's: $msg" || fail "one step's loss: $msg"
  a="$(eval_loss "$work/one-1f1b.hf")" b="$(eval_loss "$work/one-pipemare.hf")"
  if [ -n "$a" ] && python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * a)" "$a" "$b"; then
    pass "one step: pipemare's export after its drain evaluates as 1f1b's ($b vs $a)"
  else
    fail "one step's export: pipemare '$b', 1f1b '$a'"
  fi
else
  fail "one step: $(tail -3 "$work/one-1f1b.log" "$work/one-pipemare.log")"
fi

# Sixty steps from the same initial weights on the same batches.
long=(--set schedule.steps=60 --set schedule.warmup_steps=10 --set data.batch_size=4)
if run long-1f1b 2 "${long[@]}" && run long-pipemare 2 "${long[@]}" --set pipeline.schedule=pipemare; then
  if line="$(python3 - "$work/long-1f1b.jsonl" "$work/long-pipemare.jsonl" <<'PY'
import json, sys
def last(path):
    losses = [json.loads(l)["loss"] for l in open(path)]
    return losses[0], sum(losses[-5:]) / 5
(first, sync), (_, asynchronous) = last(sys.argv[1]), last(sys.argv[2])
print(f"last 5 steps' mean loss: pipemare {asynchronous:.4f}, 1f1b {sync:.4f} (step 1: {first:.4f})")
sys.exit(0 if abs(asynchronous - sync) <= 0.05 * sync and sync < 0.9 * first else 1)
PY
)"; then pass "60 steps: pipemare within 5% of 1f1b; $line"; else fail "60 steps: $line"; fi
  grep -q "^pipeline: pp=2, pipemare (asynchronous, no flush: .*delays in updates per stage \[1, 0\]" "$work/long-pipemare.log" &&
    pass "pipemare's pipeline line gives the stages' delays" || fail "pipemare's pipeline line: $(grep '^pipeline' "$work/long-pipemare.log")"
else
  fail "60 steps: $(tail -3 "$work/long-1f1b.log" "$work/long-pipemare.log")"
fi

# Two replicas of the pipeline read 2 rows each of a micro-batch's 4: the losses of one pipeline reading all 4.
rep=(--set schedule.steps=10 --set pipeline.schedule=pipemare)
if run rep-one 2 "${rep[@]}" --set data.batch_size=4 && run rep-two 4 "${rep[@]}" --set data.batch_size=2 --set mesh.dp_replicate=2; then
  msg="$(compare rep-one rep-two 10 1e-5)" && pass "pipemare x dp_replicate 2 equals one pipeline: $msg" ||
    fail "pipemare x dp_replicate 2: $msg"
else
  fail "pipemare with replicas: $(tail -3 "$work/rep-one.log" "$work/rep-two.log")"
fi

# An evaluation between steps (micro-batches in flight) and checkpoints (each drains first).
if run evals 2 --set schedule.steps=8 --set pipeline.schedule=pipemare --set data.batch_size=4 --set data.val="$work/train.bin" \
     --set eval.every=3 --set eval.windows=4 --set checkpoint.dir="$work/ckpt" --set checkpoint.every=4; then
  grep -q "^eval at step 6: loss " "$work/evals.log" && grep -q "checkpoint: saved .*step-0*8" "$work/evals.log" &&
    pass "pipemare evaluates between steps and checkpoints" || fail "pipemare evals/checkpoints: $(grep -E '^(eval|checkpoint)' "$work/evals.log")"
else
  fail "pipemare with evaluations and checkpoints: $(tail -3 "$work/evals.log")"
fi

# What it does not compose with (config: one process suffices; the tied table: the engine, two ranks).
expect_exit "pipemare with mesh.dp_shard 2" 2 "key 'mesh.dp_shard': 2 beside pipeline.schedule: pipemare" -- \
  "$bin" train "${common[@]}" --set pipeline.schedule=pipemare --set mesh.dp_shard=2
expect_exit "pipemare with mesh.tp 2" 2 "key 'mesh.tp': 2 beside pipeline.schedule: pipemare" -- \
  "$bin" train "${common[@]}" --set pipeline.schedule=pipemare --set mesh.tp=2
port="$(free_port)"
expect_exit "pipemare with a tied table" 2 "key 'model.tie_word_embeddings': true, but under pipeline.schedule: pipemare" -- \
  timeout 120 "$bin" launch --nproc 2 --master-port "$port" train "${common[@]}" --set pipeline.schedule=pipemare \
  --set model.tie_word_embeddings=true --set schedule.steps=1

checks_done pipemare_e2e
