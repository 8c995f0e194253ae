#!/usr/bin/env bash
# FSDP eager vs compiled where overlap is physically possible, as (step time, peak memory) points:
# every rank in its own network namespace on a shaped link (bench/netlab/netlab.sh: tc token
# bucket at each rate, both directions), pinned to its own core with one intra-op thread. At each
# rate, each eager configuration (reshard after forward on, off) beside compiled FSDP with
# fsdp.memory_budget set to that eager configuration's measured step peak, schedule-only (the
# same bytes as eager: no embedding rows, no split head) and full. Runs follow the bench protocol
# (bench/protocol.py): REPEATS interleaved rounds, MEASURED steps per run after SKIP. Writes the
# Pareto table with its verdicts (bench/netlab/pareto.py), the simulator judged out of sample
# (bench/netlab/simulator_oos.py), and every run's per-step records (bench/results/raw/).
# Needs root and a build (scripts/setup.sh).
# usage: bench/netlab_compiled_vs_eager.sh [build-dir]
#   env: RATES="500mbit 1gbit 4gbit"  WORLD=2  PRESET=llama-100m  SEQ=256  BATCH=4 (global)
#        REPEATS=5  MEASURED=20 (steps per run after SKIP)  SKIP=4 (steps 1-4: compiled runs steps
#        1-2 eager, plans before step 3 and re-plans before step 5; eager skips as many)
#        CONFIGS="eager-reshard eager-keep sched-vs-reshard full-vs-reshard sched-vs-keep full-vs-keep"
#        SETS="..." (extra trainer flags for every run)  COMPILED_SETS="..." (for the compiled runs)
#        BUDGET=model (default): compiled runs plan within the eager plan's predicted peak
#        (fsdp.memory_budget -1) with the faced configuration's reshard after forward; measured: within
#        the faced eager run's measured step peak less the static state
#        CAL_RATE=1gbit CAL_CONFIG=full-vs-reshard: the run the simulator is calibrated on (repeat 1)
#        OUT=<file> (default bench/results/netlab_compiled_vs_eager.md; the earlier results in it
#        are kept below the new ones)  RAW=<file.jsonl.gz> (default bench/results/raw/...)
#        LOGS=<dir>: keep every rank's log there  EST_STEP_SECONDS=<s>: the estimate's step time
#        SHARE_CORES=1: run a world larger than the core count anyway, rank r on core r % cores
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
simulate="$build/trainer/compiler/meshwork-simulate"
netlab="$root/bench/netlab/netlab.sh"
out="${OUT:-$root/bench/results/netlab_compiled_vs_eager.md}"
rates=(${RATES:-500mbit 1gbit 4gbit})
world=${WORLD:-2}
preset=${PRESET:-llama-100m}
seq=${SEQ:-256}
batch=${BATCH:-4}
skip=${SKIP:-4}
configs=(${CONFIGS:-eager-reshard eager-keep sched-vs-reshard full-vs-reshard sched-vs-keep full-vs-keep})
budget_rule=${BUDGET:-model}
case "$budget_rule" in model | measured) ;; *) echo "BUDGET: model or measured, got '$budget_rule'" >&2; exit 2 ;; esac
read -r -a compiled_sets <<<"${COMPILED_SETS:-}"
read -r -a both_sets <<<"${SETS:-}"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
steps=$((skip + measured))
netlab_begin netlab_compiled_vs_eager
if ((world > cores)) && [ "${SHARE_CORES:-0}" != 1 ]; then
  echo "WORLD=$world needs $world cores for one core per rank; this machine has $cores (SHARE_CORES=1 runs it anyway)" >&2
  exit 2
fi
for c in "${configs[@]}"; do
  case "$c" in
    eager-reshard | eager-keep | sched-vs-reshard | full-vs-reshard | sched-vs-keep | full-vs-keep) ;;
    *) echo "CONFIGS: unknown configuration '$c'" >&2; exit 2 ;;
  esac
done
# Within a round the eager configurations run first: the compiled ones take their budget from them.
mapfile -t configs < <(printf '%s\n' "${configs[@]}" | grep '^eager-'; printf '%s\n' "${configs[@]}" | grep -v '^eager-')
# The trainer writes its calibration (links, interference, traced compute and its fitted scale) only
# where it has fsdp.calibration_out; the out-of-sample simulator needs it (simulator_oos.py).
calibration_key=""
grep -qa 'fsdp.calibration_out' "$bin" && calibration_key=fsdp.calibration_out

# The estimate: llama-100m's step was about 4.2 s of compute and 2 s of exposed wire at 1 Gbit/s (inversely
# with the rate; bench/results/netlab_compiled_vs_eager.md); other presets need EST_STEP_SECONDS.
est_step=${EST_STEP_SECONDS:-$(python3 -c '
import re, sys
preset, rates = sys.argv[1], sys.argv[2:]
def gbit(r):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", r.lower())
    return float(m.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1}[m.group(2)]
print(f"{sum(4.2 + 2.0 / gbit(r) for r in rates) / len(rates):.1f}" if preset == "llama-100m" else "1.0")
' "$preset" "${rates[@]}")}
# Start-up, the link calibration and planning: about 30 s a run at llama-100m, a few at tiny.
est_overhead=$([ "$preset" = llama-100m ] && echo 30 || echo 5)
names=()
for rate in "${rates[@]}"; do for c in "${configs[@]}"; do names+=("$rate/$c"); done; done
echo "[netlab] ${#rates[@]} rates x ${#configs[@]} configurations x $repeats repeats, interleaved; $preset, world $world," \
  "$steps steps a run ($skip skipped); estimate (a guess; EST_STEP_SECONDS=$est_step):" \
  "$(bench_estimate $((${#names[@]} * repeats)) "$steps" "$est_step" "$est_overhead")" >&2
((repeats >= 5 && measured >= 20)) || echo "[netlab] fewer than 5 repeats x 20 measured steps: the table will say so" >&2

# run_world PREFIX FLAGS...: every rank in its namespace (netlab_run_world in bench/lib.sh).
run_world() {
  local prefix=$1
  shift
  netlab_run_world "$prefix" $((batch / world)) "$@"
}

# budget_for RATE EAGER_CONFIG: fsdp.memory_budget (MiB, dynamic) for the compiled runs that face
# EAGER_CONFIG at RATE: the step peak tensors of its first ok run there (round 1's, unless that
# failed) less the static state (parameters, gradients and AdamW's two moments: 4 x the parameters
# on this rank), so that the plan may hold what that eager run held. One figure serves every
# repeat, so that all repeats of a compiled configuration are the same configuration (the step peak
# of an eager configuration is the same in every round: a step allocates the same tensors; the
# table shows its spread).
budget_for() {
  local peak params
  peak="$(python3 "$root/bench/protocol.py" get "$raw" step_peak_mib --where rate="$1" --where config="$2")" || return 1
  params="$(python3 "$root/bench/protocol.py" get "$raw" facts.params_mib --where rate="$1" --where config="$2")" || return 1
  python3 -c 'import sys; print(int(float(sys.argv[1]) - 4 * float(sys.argv[2])))' "$peak" "$params"
}

current_rate=""
order=0
# run_one RATE/CONFIG REPEAT: one run, recorded in the raw records whatever its outcome.
run_one() {
  local rate=${1%%/*} config=${1#*/} rep=$2 prefix flags=() mode budget="" faces="" status=ok reason=""
  order=$((order + 1))
  prefix="$tmp/$rate-$config-$rep"
  if [ "$rate" != "$current_rate" ]; then
    "$netlab" up "$world" "$rate"
    current_rate=$rate
  fi
  case "$config" in
    eager-reshard) mode=eager; flags=(--set fsdp.reshard_after_forward=true) ;;
    eager-keep) mode=eager; flags=(--set fsdp.reshard_after_forward=false) ;;
    sched-vs-*) mode=compiled; faces=eager-${config#sched-vs-}
      flags=(--set fsdp.embedding_rows=false --set fsdp.vocab_parallel_head=false) ;;
    full-vs-*) mode=compiled; faces=eager-${config#full-vs-} ;;
  esac
  flags+=(--set fsdp.mode="$mode")
  local raf=true
  [ "$faces" != eager-keep ] || raf=false
  if [ "$mode" = compiled ] && [ "$budget_rule" = model ]; then
    # The eager plan's predicted peak (fsdp.memory_budget -1), with the faced configuration's
    # reshard after forward: the planner's memory model errs alike for both plans, so the budget
    # holds the compiled plan where the faced eager run was.
    flags+=(--set fsdp.memory_budget=-1 --set fsdp.reshard_after_forward="$raf" "${compiled_sets[@]}")
    [ -z "$calibration_key" ] || flags+=(--set "$calibration_key=$prefix.calibration")
  elif [ "$mode" = compiled ]; then
    if ! budget="$(budget_for "$rate" "$faces")"; then
      reason="no measured step peak of $faces at $rate (repeat 1) to set fsdp.memory_budget from"
      echo "[netlab] $rate $config repeat $rep: skipped: $reason" >&2
      : >"$prefix.jsonl"
      bench_record "$raw" "$skip" "$prefix.jsonl" /dev/null failed --reason "$reason" --tag rate="$rate" \
        --tag config="$config" --tag mode="$mode" --tag repeat="$rep" --tag order="$order" --tag faces="$faces"
      return 1
    fi
    flags+=(--set fsdp.memory_budget="$budget" "${compiled_sets[@]}")
    [ -z "$calibration_key" ] || flags+=(--set "$calibration_key=$prefix.calibration")
  fi
  echo "[netlab] round $rep: $preset, world $world, $rate, $config${budget:+, fsdp.memory_budget=$budget}" >&2
  run_world "$prefix" "${flags[@]}" || status=failed
  if [ "$status" = failed ]; then
    bench_tail_logs "$prefix"
  fi
  grep -hE '^(compiled plan|re-plan)' "$prefix.rank0.log" | sed 's/^/    /' >&2 || true
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.rank0.log" "$status" --tag rate="$rate" --tag config="$config" \
    --tag mode="$mode" --tag repeat="$rep" --tag order="$order" ${faces:+--tag faces="$faces"} \
    ${budget:+--tag budget_mib="$budget"} $([ "$mode" = compiled ] && [ "$budget_rule" = model ] && echo "--tag budget=eager-plan --tag raf=$raf") \
    --attach calibration="$prefix.calibration"
  [ "$status" = ok ]
}

# The commit the runs start from: a run takes hours, and commits landing meanwhile are not what ran.
cmdline="$(bench_command_line "bench/netlab_compiled_vs_eager.sh" "$root" RATES WORLD PRESET SEQ BATCH REPEATS \
  MEASURED SKIP CONFIGS BUDGET SETS COMPILED_SETS CAL_RATE CAL_CONFIG SHARE_CORES)"
bench_interleave run_one "${names[@]}"
"$netlab" down

{
  python3 "$root/bench/protocol.py" title "$raw" "FSDP eager vs compiled on netlab, (step time, peak) points" --group rate,config
  echo
  echo "$cmdline"
  echo
  netlab_machine_lines
  echo "(training.threads=1). $preset, world $world, seq $seq, global batch $batch, synthetic tokens, fp32, Gloo."
  echo
  echo "Protocol (bench/README.md): the configurations below ran interleaved, round by round (every rate"
  echo "and configuration once per round, $repeats rounds). Each run is $steps steps; its figures are over steps"
  echo "$((skip + 1))-$steps (eager skips as many steps as compiled, which runs steps 1-2 eager, plans before step 3"
  echo "and re-plans before step 5): the median step time, the median exposed communication (rank 0's time"
  echo "blocked in waits) per step, and the step peak tensors (the most bytes rank 0's tensors held within"
  echo "one step: libtorch's CPU allocator, counted; static state included). Each cell is the median"
  echo "[min, max] of the runs' figures. Raw per-step records and the logs' facts of every run:"
  echo "\`${raw_dest#"$root"/}\`."
  echo
  echo "Configurations: \`eager-reshard\` / \`eager-keep\`: fsdp.mode=eager with fsdp.reshard_after_forward"
  echo "true / false (eager has no coarser units than one module: no third configuration). \`sched-vs-X\`:"
  echo "compiled, schedule-only (\`fsdp.embedding_rows=false fsdp.vocab_parallel_head=false\`: the same bytes"
  echo "as eager, only when they move differs); \`full-vs-X\`: compiled with those two on (the defaults). Both"
  if [ "$budget_rule" = model ]; then
    echo "with \`fsdp.memory_budget=-1\` (the eager plan's predicted peak) and eager-X's \`fsdp.reshard_after_forward\`:"
    echo "the plan may hold what the planner's memory model says eager-X holds. (BUDGET=measured gives it"
    echo "eager-X's measured step peak less the static state instead; the model then errs on the compiled"
    echo "plan alone: it predicted eager's peak 50 MiB and the compiled plan's 55-73 MiB under the measured"
    echo "ones, so a plan filling a measured budget ran past eager's peak by about that.)"
  else
    echo "with \`fsdp.memory_budget\` = the step peak tensors of eager-X's first run at that rate (round 1's)"
    echo "less the static state (4 x the parameters on a rank, which the budget leaves out: it bounds the"
    echo "dynamic part), so the plan may hold what eager-X held; one budget for every repeat (bench/README.md)."
  fi
  [ -z "${COMPILED_SETS:-}" ] || echo "Compiled runs add: \`${COMPILED_SETS}\`."
  [ -z "${SETS:-}" ] || echo "Every run adds: \`${SETS}\`."
  [ "${SHARE_CORES:-0}" != 1 ] || echo "SHARE_CORES=1: rank r on core r % $cores; ranks share cores."
  echo
  python3 "$root/bench/netlab/pareto.py" "$raw"
  echo
  python3 "$root/bench/netlab/simulator_oos.py" "$raw" --simulate "$simulate" --cal-rate "${CAL_RATE:-1gbit}" \
    --cal-config "${CAL_CONFIG:-full-vs-reshard}" --cal-repeat 1 || echo "(simulator_oos.py failed: see stderr)"
} >"$tmp/table.md"

python3 "$root/bench/protocol.py" finish "$raw" "$raw_dest"
mkdir -p "$(dirname "$out")"
if [ -s "$out" ]; then
  # The earlier results stay below the new ones, their title a section heading.
  { cat "$tmp/table.md"; echo; echo "## Earlier results"; echo; sed '1{/^# /d}' "$out"; } >"$tmp/with_earlier.md"
  cp "$tmp/with_earlier.md" "$out"
else
  cp "$tmp/table.md" "$out"
fi
cat "$tmp/table.md"
echo "[netlab] wrote $out and $raw_dest" >&2
