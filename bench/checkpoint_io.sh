#!/usr/bin/env bash
# Checkpoints of llama-100m on CPU over Gloo: the stall a save adds to its step, synchronous
# (checkpoint.async false) beside asynchronous (true), and the load time and bytes read when a
# checkpoint written at world WRITE_WORLD resumes at the same world and at others (resharding).
# Under the protocol's interleaving (REPEATS rounds, every configuration once a round); each
# figure is the median [min, max] over the rounds (saves: over every save of every run).
# usage: bench/checkpoint_io.sh [build-dir]
#   env: PRESET=llama-100m  WORLDS="2 4" (saving runs)  WRITE_WORLD=2  READ_WORLDS="2 1 4"
#        STEPS=6  EVERY=2 (three saves a run)  SEQ=128  BATCH=4 (global)  REPEATS=5
#        OUT=<file> (default bench/results/checkpoint_io.md; earlier results kept below)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
out="${OUT:-$root/bench/results/checkpoint_io.md}"
preset=${PRESET:-llama-100m}
worlds=(${WORLDS:-2 4})
write_world=${WRITE_WORLD:-2}
read_worlds=(${READ_WORLDS:-2 1 4})
steps=${STEPS:-6}
every=${EVERY:-2}
seq=${SEQ:-128}
batch=${BATCH:-4}
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
MEASURED=${MEASURED:-1} bench_protocol_sizes
[ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
records="$tmp/records.tsv"  # kind config round value...
port=29700

train() { # WORLD CKPT_DIR LOG STEPS [--set ...]
  local world=$1 dir=$2 log=$3 n=$4
  shift 4
  local cmd=("$bin")
  port=$((port + 1))
  [ "$world" -gt 1 ] && cmd+=(launch --nproc "$world" --master-port "$port")
  cmd+=(train --set model.preset="$preset" --set data.train=synthetic --set data.seq_len="$seq"
        --set data.batch_size=$((batch / world)) --set schedule.steps="$n" --set schedule.warmup_steps=1
        --set metrics.port=-1 --set metrics.device_profile=cpu --set logging.every=1000 --set training.threads=1
        --set checkpoint.dir="$dir" --set checkpoint.every="$every" --set checkpoint.keep=1 "$@")
  "${cmd[@]}" >"$log" 2>&1
}

save_run() { # NAME REPEAT
  local name=$1 rep=$2 world=${1%%/*} mode=${1#*/} dir="$tmp/save-$rep-${1//\//-}" log="$tmp/save-$rep-${1//\//-}.log"
  if train "$world" "$dir" "$log" "$steps" --set checkpoint.async=$([ "$mode" = async ] && echo true || echo false); then
    # Sync: "saved ... in X s"; async: "the step stalled X s".
    grep -oE '(saved \S+ in|the step stalled) [0-9.]+ s' "$log" | grep -oE '[0-9.]+ s$' | while read -r v _; do
      printf 'save\t%s\t%s\t%s\n' "$name" "$rep" "$v" >>"$records"
    done
    echo "[checkpoint] $name, round $rep: $(grep -cE 'saved \S+ in|the step stalled' "$log") saves" >&2
  else
    echo "[checkpoint] $name, round $rep: failed: $(tail -2 "$log")" >&2
  fi
  rm -rf "$dir"
}

# The checkpoint every load reads: WRITE_WORLD ranks, STEPS steps, its last save.
source_dir="$tmp/written"
train "$write_world" "$source_dir" "$tmp/written.log" "$steps" || { cat "$tmp/written.log" >&2; exit 1; }
ckpt_mib="$(du -sm "$source_dir/$(cat "$source_dir/latest")" | cut -f1)"

load_run() { # NAME REPEAT: resume the written checkpoint at world NAME, train one more step
  local world=$1 rep=$2 dir="$tmp/load-$rep-$1" log="$tmp/load-$rep-$1.log"
  cp -r "$source_dir" "$dir"
  if train "$world" "$dir" "$log" $((steps + 1)) --set checkpoint.every=0 --set checkpoint.resume=auto; then
    local line
    line="$(grep -oE 'rank 0 read [0-9.]+ MiB of the checkpoint.s [0-9.]+ MiB, from [0-9]+ of [0-9]+ files, in [0-9.]+ s' "$log" | head -1)"
    read -r mib files secs < <(sed -E 's/rank 0 read ([0-9.]+) MiB .* from ([0-9]+) of .* in ([0-9.]+) s/\1 \2 \3/' <<<"$line")
    printf 'load\t%s\t%s\t%s\t%s\t%s\n' "$world" "$rep" "$secs" "$mib" "$files" >>"$records"
    echo "[checkpoint] load at world $world, round $rep: $line" >&2
  else
    echo "[checkpoint] load at world $world, round $rep: failed: $(tail -2 "$log")" >&2
  fi
  rm -rf "$dir"
}

names=()
for w in "${worlds[@]}"; do names+=("$w/sync" "$w/async"); done
for ((rep = 1; rep <= repeats; rep++)); do
  for n in "${names[@]}"; do save_run "$n" "$rep"; done
  for w in "${read_worlds[@]}"; do load_run "$w" "$rep"; done
done

table="$(python3 - "$records" "$write_world" "$ckpt_mib" <<'PY'
import statistics, sys
saves, loads = {}, {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "save":
        saves.setdefault(f[1], []).append(float(f[3]))
    else:
        loads.setdefault(f[1], []).append((float(f[3]), float(f[4]), int(f[5])))
def spread(v):
    return "%.3f [%.3f, %.3f]" % (statistics.median(v), min(v), max(v)) if v else "-"
print("| world | save | saves | stall per save (s): median [min, max] |")
print("|---|---|---|---|")
for name in sorted(saves, key=lambda n: (int(n.split("/")[0]), n)):
    w, mode = name.split("/")
    print("| %s | %s | %d | %s |" % (w, mode, len(saves[name]), spread(saves[name])))
for w in sorted({n.split("/")[0] for n in saves}, key=int):
    s, a = saves.get(w + "/sync"), saves.get(w + "/async")
    if s and a:
        print("\nWorld %s: the async stall is %.1f%% of the synchronous save's (medians)." % (w, 100 * statistics.median(a) / statistics.median(s)))
print()
print("| written at world %s (%s MiB on disk), read at world | runs | load (s): median [min, max] | MiB rank 0 read | files rank 0 read |" % (sys.argv[2], sys.argv[3]))
print("|---|---|---|---|---|")
for w in sorted(loads, key=int):
    v = loads[w]
    print("| %s%s | %d | %s | %.1f | %d |" % (w, " (same mesh)" if w == sys.argv[2] else " (resharded)", len(v),
                                           spread([x[0] for x in v]), statistics.median(x[1] for x in v),
                                           statistics.median(x[2] for x in v)))
PY
)"
{
  echo "# Checkpoint save stall (sync vs async) and load time with and without resharding, $preset on CPU: $repeats interleaved rounds"
  echo
  bench_command_line "bench/checkpoint_io.sh" "$root" PRESET WORLDS WRITE_WORLD READ_WORLDS STEPS EVERY SEQ BATCH REPEATS
  echo "Machine: $(bench_machine). Gloo, synthetic tokens, seq $seq, global batch $batch, fp32, training.threads=1;"
  echo "checkpoints on the local disk (page cache warm: a save's write returns once the kernel has the bytes, fsync included)."
  echo "A save's stall: synchronous, the whole save (rank 0's log: \"saved ... in X s\"); async, the wait for the"
  echo "previous save and the copy to host memory (\"the step stalled X s\"). A load: rank 0's LoadShards (headers, the"
  echo "pieces overlapping its shards, checksums), from the resume note."
  echo
  echo "$table"
  echo
  bench_earlier_results "$out"
} >"$tmp/out.md"
mv "$tmp/out.md" "$out"
echo "[checkpoint] wrote $out" >&2
