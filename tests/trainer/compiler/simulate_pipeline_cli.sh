#!/usr/bin/env bash
# meshwork-simulate --pp as a user runs it: a 3-D plan (pipeline x FSDP inside the stages x tp)
# prices each schedule with FSDP's gather and reduce-scatter and every rank's peak memory, and bad
# meshes exit 2 naming the flag.
# usage: simulate_pipeline_cli.sh path/to/meshwork-simulate
set -uo pipefail
sim="$1"
# shellcheck source=tests/common/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../common/checks.sh"

out="$("$sim" --profile h100-ib-400g --model llama3-70b --gpus 256 --tp 8 --pp 4 --microbatches 16 \
  --activation-checkpointing 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] && pass "70B on 256 x H100 as pp 4 x dp_shard 8 x tp 8 simulates" || fail "exit $rc"
grep -q "tp 8, dp_shard 8 x dp_replicate 1 (FSDP inside the stages)" <<<"$out" &&
  pass "the mesh line names FSDP inside the stages" || fail "no mesh line with dp_shard 8"
# Every schedule that runs the shape: a step that adds FSDP's exposed time to the program's, and
# a peak under the device's memory with every layer checkpointed.
for s in gpipe 1f1b zb-h1; do
  line="$(grep "^$s:" <<<"$out")"
  if [[ "$line" =~ step\ ([0-9.]+)\ s\ \(program\ ([0-9.]+)\ s,.*FSDP\ exposed\ ([0-9.]+)\ s\) ]] &&
     python3 -c "import sys; s, p, f = map(float, sys.argv[1:]); sys.exit(not (f > 0 and abs(s - p - f) < 2e-4))" \
       "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"; then
    pass "$s: step = program + FSDP exposed (${BASH_REMATCH[1]} s)"
  else
    fail "$s: $line"
  fi
done
grep "^1f1b:" <<<"$out" | grep -q "exceeds" && fail "1f1b with every layer checkpointed does not fit" ||
  pass "1f1b with every layer checkpointed fits the device"
# Without checkpointing GPipe holds every micro-batch's activations: it does not fit.
"$sim" --profile h100-ib-400g --model llama3-70b --gpus 256 --tp 8 --pp 4 --microbatches 16 \
  --pipeline-schedule gpipe 2>&1 | grep -q "exceeds 74.5 GiB device memory" &&
  pass "gpipe without checkpointing exceeds the device" || fail "gpipe without checkpointing fits"
# PipeMare: FSDP inside the stages does not compose with it (said on its line, or exit 2 when asked
# for alone); with replicas only, its steady step idles less than 1F1B's at the same micro-batches.
grep -q "^pipemare: *does not run this shape: pipemare updates each stage at its own time" <<<"$out" &&
  pass "pipemare says why it does not run with FSDP inside the stages" || fail "pipemare line: $(grep '^pipemare' <<<"$out")"
expect_exit "pipemare with --dp-shard 8" 2 "FSDP inside the stages (dp_shard 8)" -- \
  "$sim" --profile h100-ib-400g --model llama3-70b --gpus 256 --tp 8 --pp 4 --microbatches 16 --pipeline-schedule pipemare
rep="$("$sim" --profile h100-ib-400g --model llama3-70b --gpus 256 --tp 8 --pp 4 --microbatches 16 --dp-shard 1 \
  --activation-checkpointing 2>&1)"
bubble() { sed -nE "s/^$1: .*bubble ([0-9.]+)%.*/\1/p" <<<"$rep"; }
if [ -n "$(bubble pipemare)" ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]) / 2)" \
     "$(bubble pipemare)" "$(bubble 1f1b)"; then
  pass "pipemare's steady bubble ($(bubble pipemare)%) is under half 1f1b's ($(bubble 1f1b)%)"
else
  fail "pipemare's bubble: $(grep -E '^(pipemare|1f1b):' <<<"$rep")"
fi
expect_exit "--dp-shard that does not divide a stage's data parallel ranks" 2 \
  "--dp-shard: 3 does not divide the 8 data parallel ranks of a stage" -- \
  "$sim" --profile h100-ib-400g --model llama3-70b --gpus 256 --tp 8 --pp 4 --dp-shard 3
expect_exit "--dp-shard auto with --pp" 2 "--dp-shard auto does not go with --pp" -- \
  "$sim" --profile h100-ib-400g --model llama3-70b --gpus 256 --tp 8 --pp 4 --dp-shard auto
checks_done simulate_pipeline_cli
