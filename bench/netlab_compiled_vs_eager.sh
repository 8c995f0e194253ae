#!/usr/bin/env bash
# FSDP eager vs compiled where overlap is physically possible: every rank in its own network
# namespace on a shaped link (bench/netlab/netlab.sh: tc token bucket at each rate, both
# directions), pinned to its own core with one intra-op thread, so communication is wire time
# and compute does not wait for a core. Side by side in one run, at each link rate: step time,
# exposed communication, memory (peak RSS, and the most tensor memory one step held once the
# schedule settled), and the compiled plan's predictions (its own calibration of the link: step
# time, and peak memory as static + peak dynamic) next to the measured figures.
# Writes bench/results/netlab_compiled_vs_eager.md. Needs root and a build (scripts/setup.sh).
# usage: bench/netlab_compiled_vs_eager.sh [build-dir]
#   env: RATES="500mbit 1gbit 4gbit"  WORLDS="2"  PRESET=llama-100m  SEQ=256  BATCH=4 (global)  STEPS=8
#        OUT=<file> (default bench/results/netlab_compiled_vs_eager.md)
#        LOGS=<dir>: keep every rank's log and step JSONL there (default: removed with the run)
#        COMPILED_SETS="--set fsdp.memory_budget=1536" (extra trainer flags for the compiled runs)
#        SETS="--set training.memory_limit_mib=1400" (extra trainer flags for both modes)
#        SHARE_CORES=1: run worlds larger than the core count anyway, rank r on core r % cores (the
#        ranks of a core then take turns: communication is no longer free of CPU time)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build}/trainer/meshwork-train"
netlab="$root/bench/netlab/netlab.sh"
out="${OUT:-$root/bench/results/netlab_compiled_vs_eager.md}"
rates=(${RATES:-500mbit 1gbit 4gbit})
worlds=(${WORLDS:-2})
preset=${PRESET:-llama-100m}
seq=${SEQ:-256}
batch=${BATCH:-4}
steps=${STEPS:-8}
read -r -a compiled_sets <<<"${COMPILED_SETS:-}"
read -r -a both_sets <<<"${SETS:-}"
tmp="$(mktemp -d)"
trap '"$netlab" down; [ -z "${LOGS:-}" ] || { mkdir -p "$LOGS" && cp "$tmp"/* "$LOGS"/; }; rm -rf "$tmp"' EXIT
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

[ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 1; }
"$netlab" check || exit $?
cores=$(nproc)

# run_world WORLD MODE LOGPREFIX: every rank in its namespace, rank r on core r (mod the cores);
# waits for all.
run_world() {
  local world=$1 mode=$2 prefix=$3 r pids=() rc=0 extra=("${both_sets[@]}")
  [ "$mode" = compiled ] && extra+=("${compiled_sets[@]}")
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$("$netlab" addr 0)" MASTER_PORT=29500 \
      "$netlab" exec "$r" taskset -c "$((r % cores))" "$bin" train --set model.preset="$preset" \
      --set data.train=synthetic --set data.seq_len="$seq" --set data.batch_size=$((batch / world)) \
      --set schedule.steps="$steps" --set schedule.warmup_steps=1 --set training.threads=1 \
      --set dist.gloo_hostname="$("$netlab" addr "$r")" --set dist.timeout_seconds=600 \
      --set metrics.port=-1 --set metrics.device_profile=cpu --set logging.every=1000 \
      --set fsdp.mode="$mode" --set logging.jsonl="$prefix.jsonl" "${extra[@]}" >"$prefix.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || rc=$?; done
  return $rc
}

median_step() {  # median_step JSONL KEY: median of KEY over the steps from step 4 on (no compile, no warm-up)
  python3 -c '
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
late = [s[sys.argv[2]] for s in steps if s["step"] >= 4]
print(f"{statistics.median(late):.3f}" if late else "-")' "$1" "${2:-step_seconds}"
}

{
  echo "# FSDP eager vs compiled on netlab (shaped links, one core per rank)"
  echo
  bench_command_line "bench/netlab_compiled_vs_eager.sh" "$root"
  echo
  echo "Machine: $(bench_machine). Each rank in its own network namespace, its link shaped to the rate"
  echo "in both directions (tc tbf; bench/netlab/netlab.sh), pinned to its own core, training.threads=1."
  echo "$preset, seq $seq, global batch $batch, $steps steps, synthetic tokens, fp32, Gloo."
  echo "Measured step: median of rank 0's steps from step 4 on (compiled runs steps 1-2 eager, traces"
  echo "step 2 and plans before step 3). Exposed comm per step: the median of rank 0's time blocked in waits in"
  echo "each step, from step 4 on; over the run: its total, steps 1-2, the calibration and the compile included. Predicted"
  echo "steps: the compiled plan's summary line (the simulator on the trainer's own link calibration),"
  echo "for the compiled plan and for the eager plan. Step peak tensors: the most bytes rank 0's tensors held"
  echo "within one step (libtorch's CPU allocator, counted), over the steps after the schedule settled (eager:"
  echo "from step 2; compiled: from step 5, after the re-plan); predicted: the plan line's static + peak dynamic."
  [ -z "${COMPILED_SETS:-}" ] || echo "Compiled runs add: \`${COMPILED_SETS}\`."
  [ -z "${SETS:-}" ] || echo "Both modes add: \`${SETS}\`."
  [ "${SHARE_CORES:-0}" != 1 ] || echo "SHARE_CORES=1: a world larger than $cores cores puts rank r on core r % $cores; those ranks share a core."
  echo
  echo "| link | world | mode | measured step (s) | predicted step (s) | exposed comm per step (s) | exposed comm over the run | tok/s | peak RSS rank 0 | step peak tensors | predicted peak |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$tmp/table.md"

for world in "${worlds[@]}"; do
  if ((world > cores)) && [ "${SHARE_CORES:-0}" != 1 ]; then
    echo "| - | $world | - | skipped: $cores cores cannot give $world ranks a core each | | | | | | | |" >>"$tmp/table.md"
    continue
  fi
  for rate in "${rates[@]}"; do
    "$netlab" up "$world" "$rate"
    declare -A predicted=()
    for mode in eager compiled; do
      prefix="$tmp/$rate-$world-$mode"
      echo "[netlab] $preset, world $world, $rate, $mode" >&2
      if ! run_world "$world" "$mode" "$prefix"; then
        why="$(cat "$prefix".rank*.log | grep -m1 -oE 'out of device memory[^(]*' || true)"
        echo "| $rate | $world | $mode | failed: ${why:-see the log} | | | | | | | |" >>"$tmp/table.md"
        for f in "$prefix".rank*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
        continue
      fi
      parse_run "$prefix.rank0.log"
      plan="$(grep -m1 '^compiled plan:' "$prefix.rank0.log" || true)"
      if [ -n "$plan" ]; then
        predicted[compiled]="$(sed -nE 's/.*predicted step ([0-9.]+) s \(eager ([0-9.]+)\).*/\1/p' <<<"$plan")"
        predicted[eager]="$(sed -nE 's/.*predicted step ([0-9.]+) s \(eager ([0-9.]+)\).*/\2/p' <<<"$plan")"
        # "peak dynamic A MiB (eager B MiB) + static S MiB": each plan's peak is its dynamic + S.
        read -r dyn_c dyn_e stat < <(sed -nE 's/.*peak dynamic ([0-9]+) MiB \(eager ([0-9]+) MiB\) \+ static ([0-9]+) MiB.*/\1 \2 \3/p' <<<"$plan") || true
        [ -n "${stat:-}" ] && predicted[mem_compiled]="$((dyn_c + stat)) MiB" && predicted[mem_eager]="$((dyn_e + stat)) MiB"
        echo "    $plan" >&2
        grep -E '^(compiled plan chose|re-plan):' "$prefix.rank0.log" | sed 's/^/    /' >&2 || true
      fi
      echo "| $rate | $world | $mode | $(median_step "$prefix.jsonl") | @$mode@ | $(median_step "$prefix.jsonl" exposed_comm_seconds) | ${exposed:-0} | $tps | $peak | ${step_peak:--} | @mem_$mode@ |" >>"$tmp/table.md"
      echo "    $done_line" >&2
    done
    # Predictions come from the compiled run's plan line: fill both rows of this rate.
    sed -i -e "s|@eager@|${predicted[eager]:--}|" -e "s|@compiled@|${predicted[compiled]:--}|" \
      -e "s|@mem_eager@|${predicted[mem_eager]:--}|" -e "s|@mem_compiled@|${predicted[mem_compiled]:--}|" "$tmp/table.md"
    unset predicted
    "$netlab" down
  done
done
mkdir -p "$(dirname "$out")"
cp "$tmp/table.md" "$out"
cat "$out"
