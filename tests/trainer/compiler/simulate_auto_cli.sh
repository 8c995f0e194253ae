#!/usr/bin/env bash
# meshwork-simulate --auto as a user runs it: the whole plan chosen for a model on a cluster, with
# the runners-up and the reasons the others lost; contradictory or impossible requests exit 2
# naming the value.
# usage: simulate_auto_cli.sh path/to/meshwork-simulate
set -uo pipefail
sim="$1"
# shellcheck source=tests/common/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../common/checks.sh"

out="$("$sim" --profile h100-ib-400g --model llama3-8b --gpus 64 --global-batch 128 --seq-len 8192 --auto 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] && pass "8B on 64 x H100: a plan is chosen" || fail "exit $rc"
if [[ "$(grep -A1 '^chosen: ' <<<"$out")" =~ peak\ ([0-9.]+)\ of\ ([0-9.]+)\ GiB\ \|\ ([0-9]+)\ tok/s/GPU ]] &&
   python3 -c "import sys; p, d, t = map(float, sys.argv[1:]); sys.exit(not (p <= d and t > 0))" \
     "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"; then
  pass "the choice fits the device (${BASH_REMATCH[1]} of ${BASH_REMATCH[2]} GiB) at ${BASH_REMATCH[3]} tok/s/GPU"
else
  fail "no chosen line with a peak within the device: $(grep -A1 '^chosen: ' <<<"$out")"
fi
grep -q "^runners-up (scored):" <<<"$out" && grep -q "^out before scoring:" <<<"$out" &&
  grep -q "x out of memory, e.g. " <<<"$out" && pass "runners-up and the reasons plans lost are printed" ||
  fail "runners-up or reasons missing"
# Pinned: every scored plan keeps tp 8.
pinned="$("$sim" --profile h100-ib-400g --model llama3-8b --gpus 64 --global-batch 128 --seq-len 8192 --auto --tp 8 2>&1)"
scored="$(grep -E '^(chosen: |  [0-9]+\. )' <<<"$pinned")"
[ -n "$scored" ] && ! grep -vq "tp 8 x" <<<"$scored" && pass "--tp 8 pins every scored plan" ||
  fail "a scored plan without tp 8: $scored"
# --exhaustive: every plan scored, one line each with its keys, fastest first.
every="$("$sim" --profile cpu-gloo-local --model tiny --gpus 2 --global-batch 8 --seq-len 256 --auto --exhaustive 2>&1)"
lines="$(grep -c '^plan: .* | step [0-9.]* s | peak [0-9.]* GiB | keys: mesh: {dp_replicate: ' <<<"$every")"
sorted="$(grep '^plan: ' <<<"$every" | sed 's/.* | step \([0-9.]*\) s .*/\1/' | sort -g -c 2>&1 && echo yes)"
[ "$lines" -ge 4 ] && [ "$sorted" = yes ] && grep -q "^plan: $(grep -m1 '^chosen: ' <<<"$every" | cut -d' ' -f2- | sed 's/[][().*]/./g')" <<<"$every" &&
  pass "--exhaustive lists $lines plans with their keys, fastest first, the chosen one first" ||
  fail "--exhaustive: $lines plan lines, sorted '$sorted': $(grep -m3 '^plan: \|^chosen: ' <<<"$every")"
expect_exit "--exhaustive without --auto" 2 "--exhaustive needs --auto" -- \
  "$sim" --profile h100-ib-400g --model llama3-8b --gpus 8 --exhaustive
expect_exit "--auto without --global-batch" 2 "--auto needs --global-batch N" -- \
  "$sim" --profile h100-ib-400g --model llama3-8b --gpus 8 --auto
expect_exit "--auto with --batch" 2 "--batch does not go with --auto" -- \
  "$sim" --profile h100-ib-400g --model llama3-8b --gpus 8 --auto --global-batch 8 --batch 2
expect_exit "--global-batch without --auto" 2 "--global-batch needs --auto" -- \
  "$sim" --profile h100-ib-400g --model llama3-8b --gpus 8 --global-batch 8
expect_exit "a tp that does not divide the heads" 2 "tp 3" -- \
  "$sim" --profile h100-ib-400g --model llama3-8b --gpus 24 --global-batch 24 --auto --tp 3
expect_exit "a model no plan of 8 GPUs holds" 2 "no plan of 8 GPUs fits 74.5 GiB a GPU: the closest, tp" -- \
  "$sim" --profile h100-ib-400g --model llama3-405b --gpus 8 --global-batch 8 --seq-len 8192 --auto
checks_done simulate_auto_cli
