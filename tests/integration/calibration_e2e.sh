#!/usr/bin/env bash
# A compiled run's calibration (fsdp.calibration_out) read back by meshwork-simulate --calibration:
# with the run's own options it predicts what the run's plan line predicted (the same plans from the
# same inputs), other link rates move only the communication, and bad input is refused with its
# exit code.
# usage: calibration_e2e.sh path/to/meshwork-train path/to/meshwork-simulate
set -uo pipefail

train="$1" simulate="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/common/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/checks.sh"
expect() { expect_exit "$@"; }

# A free port for each launch: other tests launch ranks on this machine at the same time.

run=(--set model.preset=tiny --set data.train=synthetic --set data.seq_len=32 --set data.batch_size=2
     --set schedule.steps=3 --set metrics.port=-1 --set logging.every=1000 --set fsdp.mode=compiled
     --set fsdp.memory_budget=64 --set fsdp.replan=false)

"$train" launch --nproc 2 --master-port "$(free_port)" train "${run[@]}" --set fsdp.calibration_out="$work/run.calibration" >"$work/train.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] || [ ! -s "$work/run.calibration" ]; then
  fail "a compiled run writes its calibration (exit $rc): $(tail -n 5 "$work/train.log")"
else
  pass "a compiled run writes its calibration"
fi
[ "$(head -n 1 "$work/run.calibration" 2>/dev/null)" = "meshwork-calibration 1" ] &&
  pass "the file starts with its header" || fail "header: $(head -n 1 "$work/run.calibration" 2>/dev/null)"

# The run's plan line: "predicted step C s (eager E)". The simulator, from the file, with the run's
# options (fsdp.memory_budget 64; the other fsdp keys at their defaults) makes the same plans.
plan_line="$(grep -m1 '^compiled plan:' "$work/train.log")"
want_compiled="$(sed -nE 's/.*predicted step ([0-9.]+) s \(eager ([0-9.]+)\).*/\1/p' <<<"$plan_line")"
want_eager="$(sed -nE 's/.*predicted step ([0-9.]+) s \(eager ([0-9.]+)\).*/\2/p' <<<"$plan_line")"
sim="$("$simulate" --calibration "$work/run.calibration" --memory-budget-mib 64 2>&1)"
got_eager="$(sed -nE 's/^eager: +step ([0-9.]+) s.*/\1/p' <<<"$sim")"
got_compiled="$(sed -nE 's/^compiled: +step ([0-9.]+) s.*/\1/p' <<<"$sim")"
if [ -n "$want_eager" ] && [ "$got_eager" = "$want_eager" ] && [ "$got_compiled" = "$want_compiled" ]; then
  pass "the simulator predicts the run's own plans: eager $got_eager s, compiled $got_compiled s"
else
  fail "simulated eager '$got_eager' compiled '$got_compiled', the run's plan line eager '$want_eager' compiled '$want_compiled'
$plan_line
$sim"
fi

# Faster links: the eager step cannot take longer, and the compute is the same (a link 1000x as
# fast leaves about the compute alone).
fast="$("$simulate" --calibration "$work/run.calibration" --link-scale 1000 2>&1)"
fast_eager="$(sed -nE 's/^eager: +step ([0-9.]+) s.*/\1/p' <<<"$fast")"
if [ -n "$fast_eager" ] && python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$fast_eager" "$got_eager"; then
  pass "a link 1000x as fast: eager $fast_eager s <= $got_eager s"
else
  fail "--link-scale 1000: eager '$fast_eager' against '$got_eager': $fast"
fi

# --- bad input ----------------------------------------------------------------------------------
expect "calibration of an eager run" 2 "key 'fsdp.calibration_out'" -- \
  "$train" train --set fsdp.calibration_out="$work/x.calibration"
expect "calibration into a folder that cannot be made" 4 "key 'fsdp.calibration_out'" -- \
  "$train" launch --nproc 2 --master-port "$(free_port)" train "${run[@]}" --set fsdp.calibration_out=/proc/no/such/dir/x.calibration
expect "simulate: no such calibration file" 3 "--calibration" -- "$simulate" --calibration "$work/missing"
printf 'meshwork-calibration 1\nmesh 2 1\nshard_link 0 fast\n' >"$work/bad.calibration"
expect "simulate: a malformed calibration" 3 "calibration line 3" -- "$simulate" --calibration "$work/bad.calibration"
expect "simulate: a profile flag with --calibration" 2 "--gpus does not go with --calibration" -- \
  "$simulate" --calibration "$work/run.calibration" --gpus 8
expect "simulate: a calibration flag without --calibration" 2 "--link-scale needs --calibration" -- \
  "$simulate" --profile cpu-gloo-local --model tiny --gpus 2 --link-scale 2
expect "simulate: a bad link scale" 2 "--link-scale: expected a positive number, got '0'" -- \
  "$simulate" --calibration "$work/run.calibration" --link-scale 0
expect "simulate: a bad boolean" 2 "--embedding-rows: expected true or false, got 'yes'" -- \
  "$simulate" --calibration "$work/run.calibration" --embedding-rows yes

checks_done calibration_e2e
