#!/usr/bin/env bash
# FSDP eager (hooks, FSDP2-like) vs compiled (schedule compiler, bucketing auto + reorder) on
# CPU over Gloo, side by side in one run: tiny and llama-100m at world 2 and 4, same global
# batch. Records tok/s, exposed communication, collectives per step, peak RSS per rank and the
# compiled plan's predicted step time next to the measured one (simulator error).
# Writes bench/results/cpu_compiled_vs_eager.md. Needs a build (scripts/setup.sh).
# usage: bench/compiled_vs_eager.sh [build-dir]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build}/trainer/meshwork-train"
out="$root/bench/results/cpu_compiled_vs_eager.md"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

# name | preset | seq_len | global batch | steps
runs=(
  "tiny|tiny|128|16|30"
  "llama-100m|llama-100m|256|4|6"
)

{
  echo "# FSDP eager vs compiled on CPU (Gloo)"
  echo
  bench_command_line bench/compiled_vs_eager.sh "$root"
  echo
  echo "Machine: $(bench_machine); all ranks share them."
  echo "Synthetic tokens, fp32, same global batch. tok/s is global, excluding step 1 (compiled runs"
  echo "steps 1-2 eager, traces step 2, and compiles before step 3, which is inside the tok/s). Measured"
  echo "step is the median step time from step 4 on (steady state: no compile), from rank 0's step log."
  echo "Collectives/step and predicted step time come from rank 0's plan summary; exposed comm is"
  echo "rank 0's time blocked in waits over the run; peak RSS is rank 0's process."
  echo
  echo "| model | world | mode | tok/s | exposed comm | collectives/step | peak RSS rank 0 | predicted step | measured step |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$tmp/table.md"

port=29950
for spec in "${runs[@]}"; do
  IFS='|' read -r name preset seq batch steps <<<"$spec"
  for world in 2 4; do
    for mode in eager compiled; do
      port=$((port + 1))
      log="$tmp/$name-$world-$mode.log"
      echo "[bench] $name, world $world, $mode" >&2
      "$bin" launch --nproc "$world" --master-port "$port" train --set model.preset="$preset" \
        --set data.train=synthetic --set data.seq_len="$seq" --set data.batch_size=$((batch / world)) \
        --set schedule.steps="$steps" --set schedule.warmup_steps=1 --set metrics.port=-1 \
        --set metrics.device_profile=cpu --set logging.every=1000 --set fsdp.mode="$mode" \
        --set logging.jsonl="$tmp/$name-$world-$mode.jsonl" >"$log" 2>&1
      parse_run "$log"
      plan="$(grep -m1 '^compiled plan:' "$log" || true)"
      if [ -n "$plan" ]; then
        colls="$(sed -nE 's/.* ([0-9]+) collectives\/step \(eager ([0-9]+)\).*/\1 (eager plan \2)/p' <<<"$plan")"
        predicted="$(sed -nE 's/.*predicted step ([0-9.]+ s).*/\1/p' <<<"$plan")"
      else
        colls="per layer + root"
        predicted="-"
      fi
      measured="$(python3 -c '
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
late = [s["step_seconds"] for s in steps if s["step"] >= 4]
print(f"{statistics.median(late):.4f} s" if late else "-")' "$tmp/$name-$world-$mode.jsonl")"
      echo "| $name | $world | $mode | $tps | ${exposed:-0} | $colls | $peak | $predicted | $measured |" >>"$tmp/table.md"
      echo "    $done_line" >&2
    done
  done
done
mkdir -p "$(dirname "$out")"
cp "$tmp/table.md" "$out"
cat "$out"
