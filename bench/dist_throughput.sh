#!/usr/bin/env bash
# Sharded (FSDP, eager schedule) training on CPU over Gloo: `tiny` and `llama-100m` at world
# size 1, 2 and 4 side by side in one run, same global batch. Records global tokens/s,
# exposed communication, bytes sent per collective and memory per rank.
# Writes bench/results/cpu_fsdp_world_sizes.md. Needs a build (scripts/setup.sh).
# usage: bench/dist_throughput.sh [build-dir]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build}/trainer/meshwork-train"
out="$root/bench/results/cpu_fsdp_world_sizes.md"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

# name | preset | seq_len | global batch | steps
runs=(
  "tiny|tiny|128|16|30"
  "llama-100m|llama-100m|256|4|5"
)

{
  echo "# FSDP on CPU (Gloo): world size 1, 2, 4"
  echo
  bench_command_line bench/dist_throughput.sh "$root"
  echo
  echo "Machine: $(bench_machine). All ranks share"
  echo "these cores, so world > 1 measures the cost of sharding (communication, copies), not a"
  echo "speed-up: there is no extra hardware to spread over."
  echo "Synthetic tokens, fp32; the same global batch at every world size. tok/s is global and"
  echo "excludes the first step; exposed comm is rank 0's time blocked on collectives over the"
  echo "run; bytes are what rank 0 sent; peak RSS is rank 0's process; param bytes are rank 0's"
  echo "parameter shards (gradients the same, AdamW state twice that)."
  echo
  echo "| model | world | tok/s | exposed comm | all-gather sent | reduce-scatter sent | param bytes / rank | peak RSS rank 0 |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$tmp/table.md"

port=29900
for spec in "${runs[@]}"; do
  IFS='|' read -r name preset seq batch steps <<<"$spec"
  for world in 1 2 4; do
    port=$((port + 1))
    log="$tmp/$name-$world.log"
    echo "[bench] $name, world $world, $steps steps" >&2
    cmd=("$bin")
    [ "$world" -gt 1 ] && cmd+=(launch --nproc "$world" --master-port "$port")
    cmd+=(train --set model.preset="$preset" --set data.train=synthetic --set data.seq_len="$seq"
          --set data.batch_size=$((batch / world)) --set schedule.steps="$steps" --set schedule.warmup_steps=1
          --set metrics.port=-1 --set metrics.device_profile=cpu --set logging.every=1000)
    "${cmd[@]}" >"$log" 2>&1
    parse_run "$log"
    pbytes="$(sed -nE 's/.*parameters on this rank ([0-9.]+ MiB).*/\1/p' "$log")"
    ag="$(sed -nE 's/.*all_gather [0-9]+ calls ([0-9]+ MiB) sent.*/\1/p' <<<"$comm")"
    rs="$(sed -nE 's/.*reduce_scatter [0-9]+ calls ([0-9]+ MiB) sent.*/\1/p' <<<"$comm")"
    echo "| $name | $world | $tps | ${exposed:-0} | ${ag:--} | ${rs:--} | $pbytes | $peak |" >>"$tmp/table.md"
    echo "    $done_line" >&2
  done
done
cp "$tmp/table.md" "$out"
cat "$out"
