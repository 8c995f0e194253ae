#!/usr/bin/env bash
# FSDP inside pipeline stages, two builds side by side on netlab: the same pp x dp_shard run
# (mesh.pp=PP, mesh.dp_shard=SHARD, PP x SHARD ranks, each in its own network namespace on a link
# shaped to RATE) by the build in BASE (say, a commit before a change) and the one in the first
# argument, interleaved round by round (bench/protocol.py). It compares schedules of the same
# algorithm: both builds train the same model on the same rows to the same losses. Writes the
# step table and the paired ratios (step time, exposed communication) and every run's per-step
# records (bench/results/raw/). Needs root and both builds.
# usage: BASE=other-build-dir bench/netlab_pipeline_fsdp.sh [build-dir]
#   env: BASE (required)  BASE_LABEL="what BASE is built from" (a commit: a build directory does not
#        record it)  RATES="1gbit"  PP=2  SHARD=2  PRESET=llama-100m  SEQ=128  BATCH=8 (global)
#        SCHEDULE=1f1b  MICRO=4  REPEATS=5  MEASURED=10  SKIP=2  SETS="..." (extra flags, every run)
#        OUT=<file> (default bench/results/netlab_pipeline_fsdp.md; earlier results kept below)
#        RAW=<file.jsonl.gz>  LOGS=<dir>: keep every rank's log there
# With more ranks than cores, ranks share cores (rank r on core r mod cores): the table says so.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
base="${BASE:?BASE: the build directory to compare with (e.g. a worktree built at an earlier commit)}"
bin="$build/trainer/meshwork-train"
declare -A bins=([base]="$base/trainer/meshwork-train" [build]="$bin")
netlab="$root/bench/netlab/netlab.sh"
out="${OUT:-$root/bench/results/netlab_pipeline_fsdp.md}"
rates=(${RATES:-1gbit})
pp=${PP:-2}
shard=${SHARD:-2}
preset=${PRESET:-llama-100m}
seq=${SEQ:-128}
batch=${BATCH:-8}
schedule=${SCHEDULE:-1f1b}
m=${MICRO:-4}
skip=${SKIP:-2}
read -r -a both_sets <<<"${SETS:-}"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
MEASURED=${MEASURED:-10}
bench_protocol_sizes
steps=$((skip + measured))
((batch % (shard * m) == 0)) || { echo "BATCH=$batch: must divide by SHARD x MICRO = $((shard * m))" >&2; exit 2; }
[ -x "${bins[base]}" ] || { echo "no ${bins[base]}: build BASE first" >&2; exit 1; }
netlab_begin netlab_pipeline_fsdp
world=$((pp * shard))

names=()
for rate in "${rates[@]}"; do for b in base build; do names+=("$rate/$b"); done; done
echo "[netlab-pp-fsdp] ${#rates[@]} rates x 2 builds x $repeats repeats, interleaved; $preset, pp $pp x dp_shard" \
  "$shard on $cores cores, $steps steps a run ($skip skipped)" >&2

current_rate=""
order=0
run_one() {
  local rate=${1%%/*} which=${1#*/} rep=$2 prefix status=ok
  order=$((order + 1))
  prefix="$tmp/$rate-$which-$rep"
  if [ "$rate" != "$current_rate" ]; then
    "$netlab" up "$world" "$rate"
    current_rate=$rate
  fi
  echo "[netlab-pp-fsdp] round $rep: $rate, $which" >&2
  # Each of the SHARD pipelines reads BATCH / SHARD rows a step, as MICRO micro-batches.
  bin="${bins[$which]}" netlab_run_world "$prefix" $((batch / shard / m)) --set dist.mesh=explicit \
    --set mesh.pp="$pp" --set mesh.dp_shard="$shard" --set pipeline.schedule="$schedule" \
    --set training.grad_accum="$m" || status=failed
  if [ "$status" = failed ]; then
    bench_tail_logs "$prefix"
  fi
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.rank0.log" "$status" --tag rate="$rate" --tag config="$which" \
    --tag repeat="$rep" --tag order="$order"
  [ "$status" = ok ]
}

bench_interleave run_one "${names[@]}"
"$netlab" down

{
  python3 "$root/bench/protocol.py" title "$raw" "Pipelines (pp x dp_shard) on netlab: two builds" --group rate,config
  echo
  bench_command_line "bench/netlab_pipeline_fsdp.sh" "$root" BASE BASE_LABEL RATES PP SHARD PRESET SEQ BATCH SCHEDULE MICRO REPEATS MEASURED SKIP SETS
  echo
  netlab_machine_lines
  echo "(training.threads=1), rank r on core r mod $cores: $world ranks on $cores cores$( ((world > cores)) && echo ", so ranks share cores (their compute is time-shared; the wire is not)")."
  echo "$preset, mesh.pp=$pp x mesh.dp_shard=$shard, pipeline.schedule $schedule, seq $seq, global batch $batch, each"
  echo "pipeline $((batch / shard)) rows a step in $m micro-batches; synthetic tokens, fp32, Gloo."
  echo "base: ${BASE_LABEL:-the build in $base} ($base); build: $(git -C "$root" rev-parse --short HEAD) ($build)."
  echo
  echo "Every run is $steps steps; its figures are over steps $((skip + 1))-$steps: the median step time, the"
  echo "median exposed communication per step (rank 0's time blocked: receives, FSDP's gathers and"
  echo "reduce-scatters) and rank 0's step peak tensors. Each cell: median [min, max] over the runs."
  echo "Raw per-step records: \`${raw_dest#"$root"/}\`."
  [ -z "${SETS:-}" ] || echo "Every run adds: \`${SETS}\`."
  echo
  python3 "$root/bench/protocol.py" table "$raw" --group rate,config
  echo
  echo "Paired by round (build against base):"
  echo
  python3 "$root/bench/protocol.py" paired "$raw" --by rate --base base --other build
} >"$tmp/table.md"

bench_write_results netlab-pp-fsdp
