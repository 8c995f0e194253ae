#!/usr/bin/env bash
# The cost of data.document_masking on this machine: training steps with and without the mask,
# side by side (the bench protocol, bench/protocol.py: REPEATS interleaved rounds, each run's
# figure the median of MEASURED steps after SKIP, a configuration's the median, min and max over
# its runs). Synthetic tokens with data.document_separator set (the mask's cost does not depend on
# where documents end: it is made and applied whole). On the CPU flavor (libtorch 1.13) attention
# is spelled out, so the mask replaces the causal one; on CUDA it moves SDPA off FlashAttention,
# which is what bench/gpu_session.sh should measure there.
# usage: bench/document_mask.sh [build-dir]
#   env: PRESET=tiny SEQ=512 BATCH=8 THREADS=2 REPEATS=5 MEASURED=20 SKIP=3
#        OUT=<file> (default bench/results/document_mask.md; earlier results kept below)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
out="${OUT:-$root/bench/results/document_mask.md}"
preset=${PRESET:-tiny} seq=${SEQ:-512} batch=${BATCH:-8} threads=${THREADS:-2} skip=${SKIP:-3}
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
[ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
raw="$tmp/raw.jsonl"

run() { # NAME REPEAT
  local name=$1 rep=$2 status=ok prefix="$tmp/$1.$2"
  "$bin" train --set model.preset="$preset" --set data.train=synthetic --set data.seq_len="$seq" \
    --set data.batch_size="$batch" --set schedule.steps=$((skip + measured)) --set schedule.warmup_steps=1 \
    --set training.device=cpu --set training.threads="$threads" --set metrics.port=-1 --set logging.every=1000 \
    --set data.document_masking=$([ "$name" = masked ] && echo true || echo false) --set data.document_separator=1 \
    --set logging.jsonl="$prefix.jsonl" >"$prefix.log" 2>&1 || status=failed
  echo "[document_mask] $name, repeat $rep: $status" >&2
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.log" "$status" --tag config="$name" --tag repeat="$rep"
}
bench_interleave run causal masked

ratio="$(python3 - "$raw" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "run" and r.get("status") == "ok":
        runs.setdefault(r["config"], {})[r["repeat"]] = r["step_s"]
pairs = [runs["masked"][k] / runs["causal"][k] for k in runs.get("masked", {}) if k in runs.get("causal", {})]
if pairs:
    print("masked / causal step time, paired per round: %.3fx [%.3f, %.3f]" % (statistics.median(pairs), min(pairs), max(pairs)))
PY
)"
{
  python3 "$root/bench/protocol.py" title "$raw" "Document masking's cost, $preset on CPU (seq $seq, batch $batch)"
  echo
  bench_command_line "bench/document_mask.sh" "$root" PRESET SEQ BATCH THREADS REPEATS MEASURED SKIP
  echo "Machine: $(bench_machine). fp32, training.threads=$threads, synthetic tokens, data.document_separator=1."
  echo
  python3 "$root/bench/protocol.py" table "$raw"
  echo
  echo "$ratio"
  echo
  bench_earlier_results "$out"
} >"$tmp/out.md"
python3 "$root/bench/protocol.py" finish "$raw" "$root/bench/results/raw/document_mask.jsonl.gz"
mv "$tmp/out.md" "$out"
cat "$out" | head -20
