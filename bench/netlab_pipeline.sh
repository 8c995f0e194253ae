#!/usr/bin/env bash
# Pipeline schedules side by side where stages sit on separate machines: pp = WORLD ranks, each
# in its own network namespace on a shaped link (bench/netlab/netlab.sh), pinned to its own core
# with one intra-op thread, the same global batch cut into M micro-batches, for every schedule in
# SCHEDULES and every M in MICRO. Runs follow the bench protocol (bench/protocol.py): REPEATS
# interleaved rounds, MEASURED steps per run after SKIP. Writes the step table, each rank's
# measured bubble against the formula (bench/netlab/pipeline_bubble.py) and every run's per-step
# records (bench/results/raw/). Needs root and a build (scripts/setup.sh).
# usage: bench/netlab_pipeline.sh [build-dir]
#   env: RATES="1gbit"  WORLD=2 (= mesh.pp)  PRESET=llama-100m  SEQ=256  BATCH=8 (global; every
#        M in MICRO must divide it)  SCHEDULES="gpipe 1f1b zb-h1"  MICRO="4"  REPEATS=5
#        MEASURED=20  SKIP=2  SETS="..." (extra flags, every run)
#        PEER="" (PyTorch's schedules run beside, each M in MICRO: "gpipe 1f1b"; configs
#        torch-<schedule>-m<M>, bench/peers/pipeline_peer.py on the CUDA flavor's PyPI torch)
#        OUT=<file> (default bench/results/netlab_pipeline.md; earlier results kept below)
#        RAW=<file.jsonl.gz>  LOGS=<dir>: keep every rank's log there
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
netlab="$root/bench/netlab/netlab.sh"
out="${OUT:-$root/bench/results/netlab_pipeline.md}"
rates=(${RATES:-1gbit})
world=${WORLD:-2}
preset=${PRESET:-llama-100m}
seq=${SEQ:-256}
batch=${BATCH:-8}
skip=${SKIP:-2}
read -r -a schedules <<<"${SCHEDULES:-gpipe 1f1b zb-h1}"
read -r -a micro <<<"${MICRO:-4}"
read -r -a both_sets <<<"${SETS:-}"
read -r -a peer_schedules <<<"${PEER:-}"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
steps=$((skip + measured))
for m in "${micro[@]}"; do
  [[ $m =~ ^[1-9][0-9]*$ ]] && ((batch % m == 0)) || { echo "MICRO: each a whole number dividing BATCH=$batch, got '$m'" >&2; exit 2; }
done
netlab_begin netlab_pipeline
((world <= cores)) || { echo "WORLD=$world needs $world cores for one core per rank; this machine has $cores" >&2; exit 2; }

configs=()
for s in "${schedules[@]}"; do for m in "${micro[@]}"; do configs+=("$s-m$m"); done; done
if ((${#peer_schedules[@]})); then
  # The peer's Python (skip and fail end the bench: it was asked for).
  skip() { echo "PEER: $*" >&2; exit 77; }
  fail() { echo "PEER: $*" >&2; exit 1; }
  # shellcheck source=bench/peers/pypi_torch.sh
  source "$root/bench/peers/pypi_torch.sh"
  pypi_torch_python "$tmp/python"
  for s in "${peer_schedules[@]}"; do
    [[ $s =~ ^(gpipe|1f1b)$ ]] || { echo "PEER: gpipe or 1f1b, got '$s'" >&2; exit 2; }
    for m in "${micro[@]}"; do configs+=("torch-$s-m$m"); done
  done
fi
names=()
for rate in "${rates[@]}"; do for c in "${configs[@]}"; do names+=("$rate/$c"); done; done
echo "[netlab-pp] ${#rates[@]} rates x ${#configs[@]} configurations x $repeats repeats, interleaved; $preset," \
  "pp $world, $steps steps a run ($skip skipped); estimate (a guess):" \
  "$(bench_estimate $((${#names[@]} * repeats)) "$steps" "$([ "$preset" = llama-100m ] && echo 6 || echo 0.5)" 15)" >&2

# run_peer PREFIX SCHEDULE M: PyTorch's pipeline over the same ranks, cores and links as
# netlab_run_world's (one intra-op thread each), rank 0's steps in PREFIX.jsonl.
run_peer() {
  local prefix=$1 schedule=$2 m=$3 r pids=() rc=0
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world MASTER_ADDR="$("$netlab" addr 0)" MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 \
      "$netlab" exec "$r" taskset -c "$((r % cores))" "$tmp/python" "$root/bench/peers/pipeline_peer.py" \
      --preset "$preset" --schedule "$schedule" --batch "$batch" --microbatches "$m" --seq "$seq" --steps "$steps" \
      --threads 1 --jsonl "$prefix.jsonl" >"$prefix.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || rc=$?; done
  return $rc
}

current_rate=""
order=0
# run_one RATE/CONFIG REPEAT: one run, recorded in the raw records whatever its outcome.
run_one() {
  local rate=${1%%/*} config=${1#*/} rep=$2 prefix status=ok schedule m
  order=$((order + 1))
  prefix="$tmp/$rate-$config-$rep"
  if [ "$rate" != "$current_rate" ]; then
    "$netlab" up "$world" "$rate"
    current_rate=$rate
  fi
  schedule=${config%-m*}
  m=${config##*-m}
  echo "[netlab-pp] round $rep: $preset, pp $world, $rate, $schedule, $m micro-batches" >&2
  # Every pipeline rank reads the whole global batch: M micro-batches of BATCH / M rows.
  if [[ $schedule == torch-* ]]; then
    run_peer "$prefix" "${schedule#torch-}" "$m" || status=failed
  else
    netlab_run_world "$prefix" $((batch / m)) --set dist.mesh=explicit --set mesh.pp="$world" --set mesh.dp_shard=1 \
      --set pipeline.schedule="$schedule" --set training.grad_accum="$m" || status=failed
  fi
  if [ "$status" = failed ]; then
    bench_tail_logs "$prefix"
  fi
  grep -h '^pipeline bubble' "$prefix.rank0.log" | sed 's/^/    /' >&2 || true
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.rank0.log" "$status" --tag rate="$rate" --tag config="$config" \
    --tag repeat="$rep" --tag order="$order"
  [ "$status" = ok ]
}

bench_interleave run_one "${names[@]}"
"$netlab" down

{
  python3 "$root/bench/protocol.py" title "$raw" "Pipeline schedules on netlab: step time and measured bubble" --group rate,config
  echo
  bench_command_line "bench/netlab_pipeline.sh" "$root" RATES WORLD PRESET SEQ BATCH SCHEDULES MICRO PEER REPEATS MEASURED SKIP SETS
  echo
  netlab_machine_lines
  echo "(training.threads=1). $preset, mesh.pp=$world (stages balanced by FLOPs), seq $seq, global batch $batch"
  echo "in M micro-batches (training.grad_accum), synthetic tokens, fp32, Gloo."
  echo
  echo "Protocol (bench/README.md): every rate and configuration once per round, $repeats rounds. Each run"
  echo "is $steps steps; its figures are over steps $((skip + 1))-$steps: the median step time, the median"
  echo "exposed communication per step (rank 0's time blocked in receives) and the step peak tensors of"
  echo "rank 0 (stage 0). Each cell is the median [min, max] over the runs. Raw per-step records:"
  echo "\`${raw_dest#"$root"/}\`."
  echo
  echo "Configurations: \`<schedule>-m<M>\`: pipeline.schedule over M micro-batches of $batch / M rows."
  echo "ZB-H1's I and W split each backward at its weight-gradient nodes (docs/compiler.md, \"The"
  echo "executor\"): I + W is B's work; \`training.loss_gradient: auto\` stores the head's logit"
  echo "gradient under zb-h1 (recomputed under the others, on the CPU)."
  [ -z "${SETS:-}" ] || echo "Every run adds: \`${SETS}\`."
  if ((${#peer_schedules[@]})); then
    echo "\`torch-<schedule>-m<M>\`: PyTorch's own pipeline (torch.distributed.pipelining's ScheduleGPipe or"
    echo "Schedule1F1B, torch $("$tmp/python" -c 'import torch; print(torch.__version__)'), CPU) over the same ranks, cores and links:"
    echo "bench/peers/pipeline_peer.py, the same model, initial weights, synthetic rows, optimizer and stage"
    echo "cut; the head's logit gradient stored (autograd's), the tied table's two copies summed after the"
    echo "program. Its steps have no exposed-communication or peak figures (\"-\")."
  fi
  echo
  python3 "$root/bench/protocol.py" table "$raw" --group rate,config
  echo
  echo "Measured bubble per rank: idle seconds of its program per second of its forwards and backwards,"
  echo "over the measured steps of each run (median [min, max] over the runs), against the formula:"
  echo
  python3 "$root/bench/netlab/pipeline_bubble.py" "$raw" --pp "$world"
  for s in "${peer_schedules[@]}"; do
    for m in "${micro[@]}"; do
      echo
      echo "Meshwork against PyTorch, round by round (\`$s-m$m\` the base, \`torch-$s-m$m\` the other):"
      echo
      python3 "$root/bench/protocol.py" paired "$raw" --by rate --base "$s-m$m" --other "torch-$s-m$m"
      echo
      python3 "$root/bench/protocol.py" losses "$raw" --base "$s-m$m" --other "torch-$s-m$m"
    done
  done
} >"$tmp/table.md"

bench_write_results netlab-pp
