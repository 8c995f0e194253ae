#!/usr/bin/env bash
# Tensor parallelism against FSDP where communication costs wire time: the same ranks and global
# batch as tp over the whole world (sequence parallel, as by default) and as FSDP (eager, FSDP2's
# defaults: reshard after forward, one reduce-scatter in flight), and tp with its all-gathers and
# reduce-scatters overlapped with their matmuls (async TP, mesh.async_tp_chunks), at each rate of
# a shaped link (bench/netlab/netlab.sh: every rank in its own network namespace, tc token bucket
# both ways, pinned to its own core with one intra-op thread). Runs follow the bench protocol
# (bench/protocol.py): REPEATS interleaved rounds, MEASURED steps per run after SKIP. Writes the
# table, async TP against plain TP round by round (step ratio, share of TP's exposed communication
# hidden) and every run's per-step records (bench/results/raw/).
# Needs root and a build (scripts/setup.sh).
# usage: bench/netlab_tp.sh [build-dir]
#   env: RATES="1gbit 4gbit"  WORLD=2  PRESET=llama-100m  SEQ=256  BATCH=4 (global: FSDP's ranks
#        take BATCH / WORLD each, the tp group all of it)  REPEATS=5  MEASURED=20  SKIP=2
#        ASYNC_CHUNKS="4" (one async configuration per value)  SETS="..." (extra flags, every run)
#        OUT=<file> (default bench/results/netlab_tp.md; earlier results kept below the new ones)
#        RAW=<file.jsonl.gz>  LOGS=<dir>: keep every rank's log there
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
netlab="$root/bench/netlab/netlab.sh"
out="${OUT:-$root/bench/results/netlab_tp.md}"
rates=(${RATES:-1gbit 4gbit})
world=${WORLD:-2}
preset=${PRESET:-llama-100m}
seq=${SEQ:-256}
batch=${BATCH:-4}
skip=${SKIP:-2}
read -r -a chunks <<<"${ASYNC_CHUNKS:-4}"
read -r -a both_sets <<<"${SETS:-}"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
steps=$((skip + measured))
((batch % world == 0)) || { echo "BATCH=$batch: must divide by WORLD=$world (FSDP's ranks split it)" >&2; exit 2; }
for n in "${chunks[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] && ((n > 1)) || { echo "ASYNC_CHUNKS: each a whole number > 1, got '$n'" >&2; exit 2; }
done
netlab_begin netlab_tp
((world <= cores)) || { echo "WORLD=$world needs $world cores for one core per rank; this machine has $cores" >&2; exit 2; }

configs=(fsdp tp)
for n in "${chunks[@]}"; do configs+=("tp-async$n"); done
names=()
for rate in "${rates[@]}"; do for c in "${configs[@]}"; do names+=("$rate/$c"); done; done
echo "[netlab-tp] ${#rates[@]} rates x ${#configs[@]} configurations x $repeats repeats, interleaved; $preset," \
  "world $world, $steps steps a run ($skip skipped); estimate (a guess):" \
  "$(bench_estimate $((${#names[@]} * repeats)) "$steps" "$([ "$preset" = llama-100m ] && echo 5 || echo 0.5)" 15)" >&2

current_rate=""
order=0
# run_one RATE/CONFIG REPEAT: one run, recorded in the raw records whatever its outcome.
run_one() {
  local rate=${1%%/*} config=${1#*/} rep=$2 prefix flags=() per_rank status=ok
  order=$((order + 1))
  prefix="$tmp/$rate-$config-$rep"
  if [ "$rate" != "$current_rate" ]; then
    "$netlab" up "$world" "$rate"
    current_rate=$rate
  fi
  case "$config" in
    fsdp) per_rank=$((batch / world)); flags=(--set fsdp.mode=eager) ;;
    tp | tp-async*)
      per_rank=$batch  # the tp group reads one batch
      flags=(--set dist.mesh=explicit --set mesh.tp="$world" --set mesh.dp_shard=1 --set mesh.dp_replicate=1
        --set mesh.sequence_parallel=true)
      [ "$config" = tp ] || flags+=(--set mesh.async_tp_chunks="${config#tp-async}") ;;
  esac
  echo "[netlab-tp] round $rep: $preset, world $world, $rate, $config" >&2
  netlab_run_world "$prefix" "$per_rank" "${flags[@]}" || status=failed
  if [ "$status" = failed ]; then
    bench_tail_logs "$prefix"
  fi
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.rank0.log" "$status" --tag rate="$rate" --tag config="$config" \
    --tag repeat="$rep" --tag order="$order"
  [ "$status" = ok ]
}

bench_interleave run_one "${names[@]}"
"$netlab" down

{
  python3 "$root/bench/protocol.py" title "$raw" "Tensor parallelism against FSDP on netlab, and async TP" --group rate,config
  echo
  bench_command_line "bench/netlab_tp.sh" "$root" RATES WORLD PRESET SEQ BATCH REPEATS MEASURED SKIP ASYNC_CHUNKS SETS
  echo
  netlab_machine_lines
  echo "(training.threads=1). $preset, world $world, seq $seq, global batch $batch, synthetic tokens, fp32, Gloo."
  echo
  echo "Protocol (bench/README.md): every rate and configuration once per round, $repeats rounds. Each run"
  echo "is $steps steps; its figures are over steps $((skip + 1))-$steps: the median step time, the median"
  echo "exposed communication per step (rank 0's time blocked in waits: FSDP's gathers and reduce-scatters,"
  echo "or tensor parallelism's collectives) and the step peak tensors (the most bytes rank 0's tensors held"
  echo "within one step, static state included). Each cell is the median [min, max] over the runs."
  echo "Raw per-step records: \`${raw_dest#"$root"/}\`."
  echo
  echo "Configurations: \`fsdp\`: fsdp.mode=eager over the $world ranks (FSDP2's defaults), data.batch_size"
  echo "$((batch / world)) a rank. \`tp\`: mesh.tp=$world (tensor parallelism over the world, sequence parallel,"
  echo "no data parallel dim), the tp group reading all $batch sequences. \`tp-asyncN\`: the same with"
  echo "mesh.async_tp_chunks=N (each region's all-gather and reduce-scatter split into N chunks that"
  echo "overlap the neighbouring chunk's matmul). The same global batch and the same numbers in all."
  [ -z "${SETS:-}" ] || echo "Every run adds: \`${SETS}\`."
  echo
  python3 "$root/bench/protocol.py" table "$raw" --group rate,config
  for n in "${chunks[@]}"; do
    echo
    echo "Async TP in $n chunks against plain TP, round by round:"
    echo
    python3 "$root/bench/protocol.py" paired "$raw" --by rate --base tp --other "tp-async$n"
  done
  echo
  echo "Tensor parallelism against FSDP, round by round (a different algorithm, not a schedule):"
  echo
  python3 "$root/bench/protocol.py" paired "$raw" --by rate --base fsdp --other tp
} >"$tmp/table.md"

bench_write_results netlab-tp
