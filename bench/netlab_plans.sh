#!/usr/bin/env bash
# The plan search's prediction against measured steps (issue 49): every plan the search scores for
# PRESET on WORLD netlab ranks (meshwork-simulate --auto --exhaustive: data parallel meshes with and
# without reshard-after-forward, pipelines with each schedule and micro-batching) is run on netlab
# at each rate in RATES, REPEATS interleaved rounds, and its measured step set beside the
# predicted one. Predicted with the profile cpu-gloo-local whose links are set to the netlab rate
# (each rank its own node, as netlab makes it): first at the profile's compute rate, then at the
# rate the trainer's plan advice refitted on one run of the search's choice (its first round),
# out of sample for every other plan. Every run also gives its own plan advice (the last step's
# `plan advice:` line, kept in the raw records). Writes bench/results/netlab_plans.md (earlier
# results kept below) and the per-step records under bench/results/raw/netlab_plans/.
# usage: bench/netlab_plans.sh [build-dir]
#   env: RATES="1gbit"  WORLD=2  PRESET=tiny  SEQ=256  BATCH=8 (global)  REPEATS=5  MEASURED=20
#        SKIP=2  OUT=<file>  RAW=<file.jsonl.gz>  LOGS=<dir>
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
simulate="$build/trainer/compiler/meshwork-simulate"
netlab="$root/bench/netlab/netlab.sh"
out="${OUT:-$root/bench/results/netlab_plans.md}"
rates=(${RATES:-1gbit})
world=${WORLD:-2}
preset=${PRESET:-tiny}
seq=${SEQ:-256}
batch=${BATCH:-8}
skip=${SKIP:-2}
both_sets=()
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
steps=$((skip + measured))
[ -x "$simulate" ] || { echo "no $simulate: build first (scripts/setup.sh)" >&2; exit 1; }
netlab_begin netlab_plans
((world <= cores)) || { echo "WORLD=$world needs $world cores for one core per rank; this machine has $cores" >&2; exit 2; }

# profile RATE [MFU]: cpu-gloo-local with both links at RATE (tc's spelling: bits/s), each rank a
# node, and the achieved MFU replaced when given. Its path.
profile() {
  local rate=$1 mfu=${2:-} bytes path
  bytes="$(python3 -c '
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", sys.argv[1])
if not m: sys.exit("RATES: " + sys.argv[1] + " is not N[k|m|g]bit")
print(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8)' "$rate")"
  path="$tmp/profile-$rate${mfu:+-mfu$mfu}.yaml"
  sed -e "s/^\(  bus_bytes_per_second:\).*/\1 $bytes/" -e "s/^gpus_per_node:.*/gpus_per_node: 1/" \
    -e "s/^name:.*/name: \"cpu-gloo-local, links at $rate (netlab)${mfu:+, MFU $mfu refitted}\"/" \
    ${mfu:+-e "s/^achieved_mfu:.*/achieved_mfu: $mfu/"} "$root/bench/profiles/cpu-gloo-local.yaml" >"$path"
  echo "$path"
}
# plans PROFILE FILE: every plan scored, one line each ("plan: ... | step S s | ... | keys: ...").
plans() {
  "$simulate" --auto --exhaustive --profile "$1" --model "$preset" --gpus "$world" --seq-len "$seq" \
    --global-batch "$batch" >"$2.full"
  grep '^plan: ' "$2.full" >"$2"
}

names=()
for rate in "${rates[@]}"; do
  plans "$(profile "$rate")" "$tmp/plans-$rate.txt"
  n="$(wc -l <"$tmp/plans-$rate.txt")"
  ((n > 0)) || { echo "meshwork-simulate scored no plan for $rate:" >&2; cat "$tmp/plans-$rate.txt.full" >&2; exit 1; }
  for ((i = 1; i <= n; i++)); do names+=("$rate/p$(printf '%02d' "$i")"); done
done
echo "[netlab-plans] ${#names[@]} rate x plan configurations x $repeats repeats, interleaved; $preset," \
  "world $world, $steps steps a run ($skip skipped); estimate (a guess):" \
  "$(bench_estimate $((${#names[@]} * repeats)) "$steps" "$([ "$preset" = llama-100m ] && echo 6 || echo 0.3)" 12)" >&2

current_rate=""
order=0
# run_one RATE/pNN REPEAT: plan NN of RATE's list, run with its keys, recorded whatever its outcome.
run_one() {
  local rate=${1%%/*} config=${1#*/} rep=$2 prefix status=ok line sets=() kv
  order=$((order + 1))
  prefix="$tmp/$rate-$config-$rep"
  if [ "$rate" != "$current_rate" ]; then
    "$netlab" up "$world" "$rate"
    current_rate=$rate
  fi
  line="$(sed -n "$((10#${config#p}))p" "$tmp/plans-$rate.txt")"
  echo "[netlab-plans] round $rep: $rate, $config: ${line%% | *}" >&2
  # "keys: mesh: {dp_replicate: 1, dp_shard: 2, ...}; data: {...}" as --set section.key=value.
  while IFS= read -r kv; do sets+=(--set "$kv"); done < <(python3 -c '
import re, sys
keys = sys.argv[1].split(" | keys: ", 1)[1]
for part in keys.split("; "):
    section, body = part.split(": ", 1)
    for kv in body.strip("{}").split(", "):
        k, v = kv.split(": ", 1)
        print(f"{section}.{k}={v}")' "$line")
  netlab_run_world "$prefix" 1 --set dist.mesh=explicit --set dist.hardware_profile="$tmp/profile-$rate.yaml" \
    --set dist.advise_after_steps="$steps" "${sets[@]}" || status=failed
  [ "$status" = ok ] || bench_tail_logs "$prefix"
  grep -h '^plan advice' "$prefix.rank0.log" >"$prefix.advice" || echo "plan advice: none in the log" >"$prefix.advice"
  sed 's/^/    /' "$prefix.advice" >&2
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.rank0.log" "$status" --tag rate="$rate" --tag config="$config" \
    --tag repeat="$rep" --tag order="$order" --attach advice="$prefix.advice"
  [ "$status" = ok ]
}

bench_interleave run_one "${names[@]}"
"$netlab" down

# The compute rate the advice refitted on the search's choice (p01), round 1, per rate: the plans
# predicted again at it.
refits=()
for rate in "${rates[@]}"; do
  mfu="$(python3 "$root/bench/netlab/plan_prediction.py" fitted-mfu "$raw" --rate "$rate" --config p01 --repeat 1)"
  if [ -n "$mfu" ]; then
    plans "$(profile "$rate" "$mfu")" "$tmp/refit-$rate.txt"
    refits+=(--refit "$rate=$tmp/refit-$rate.txt=$mfu")
  fi
done

{
  python3 "$root/bench/protocol.py" title "$raw" "The plan search's prediction against measured steps on netlab" --group rate,config
  echo
  bench_command_line "bench/netlab_plans.sh" "$root" RATES WORLD PRESET SEQ BATCH REPEATS MEASURED SKIP
  echo
  netlab_machine_lines
  echo "(training.threads=1). $preset, $world ranks, seq $seq, global batch $batch, synthetic tokens, fp32, Gloo."
  echo "Plans: every plan \`meshwork-simulate --auto --exhaustive\` scores for them (each rank its own node,"
  echo "as netlab makes them: no tp, which stays within a node), run with the plan's config keys."
  echo "Predicted: the search's score (the quick plan, or the pipeline simulator) with the profile"
  echo "cpu-gloo-local (its compute figures placeholders) with both links at the netlab rate; then at the"
  echo "achieved MFU the trainer's plan advice refitted on the search's choice (p01), round 1 (out of"
  echo "sample for every other plan). Measured: the protocol's median step of each run; each cell the"
  echo "median [min, max] over the runs. Raw records: \`${raw_dest#"$root"/}\`."
  echo
  args=()
  for rate in "${rates[@]}"; do args+=(--plans "$rate=$tmp/plans-$rate.txt"); done
  python3 "$root/bench/netlab/plan_prediction.py" report "$raw" "${args[@]}" "${refits[@]}"
} >"$tmp/table.md"

bench_write_results netlab-plans
