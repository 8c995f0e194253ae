#!/usr/bin/env bash
# Tokenization throughput: meshwork-train's Hugging Face tokenizer (the Rust crate behind its C ABI)
# beside PyPI's `tokenizers` of the same version, on the same machine, corpus and thread count.
# The corpus is this repository's docs and the machine's license texts cut into documents of about
# 4 KiB at paragraph ends; the tokenizer is a byte-level BPE with Llama 3's pre-tokenizer pattern
# trained on that corpus by PyPI's trainer (VOCAB ids). Each run encodes every document as one batch
# MEASURED times after SKIP warm-up passes (the bench protocol, bench/protocol.py: REPEATS
# interleaved rounds, each configuration's figure the median over its runs, with min and max).
# usage: bench/tokenizer_throughput.sh [build-dir]
#   env: THREADS="1 2" (RAYON_NUM_THREADS for both sides)  VOCAB=16000  REPEATS=5  MEASURED=20  SKIP=2
#        OUT=<file> (default bench/results/tokenizer_throughput.md; earlier results kept below)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
out="${OUT:-$root/bench/results/tokenizer_throughput.md}"
ref_dir="${MESHWORK_TOKENIZER_REF:-$root/.meshwork/tools/tokenizer-ref}"
threads_list=(${THREADS:-1 2})
vocab=${VOCAB:-16000}
skip=${SKIP:-2}
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
[ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 1; }
[ -f "$ref_dir/.installed" ] || { echo "no reference tokenizers under $ref_dir (scripts/setup.sh installs them)" >&2; exit 1; }
python=/usr/bin/python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
raw="$tmp/raw.jsonl"

# The corpus and the tokenizer.
PYTHONPATH="$ref_dir" "$python" "$root/bench/peers/bench_corpus.py" "$tmp" "$vocab" 0 "$root/docs" "$root/README.md" \
  /usr/share/common-licenses
docs=("$tmp"/docs/*.txt)

run() {
  local name=$1 rep=$2 side threads log="$tmp/${1//\//-}.$2.log" steps="$tmp/${1//\//-}.$2.jsonl" status=ok
  side=${name%%/*} threads=${name#*/}
  if [ "$side" = meshwork ]; then
    RAYON_NUM_THREADS=$threads "$bin" tokenize --tokenizer "$tmp/tokenizer.json" --time $((skip + measured)) "${docs[@]}" \
      >"$steps" 2>"$log" || status=failed
  else
    RAYON_NUM_THREADS=$threads PYTHONPATH="$ref_dir" "$python" "$root/bench/peers/tokenize_peer.py" \
      "$tmp/tokenizer.json" $((skip + measured)) "${docs[@]}" >"$steps" 2>"$log" || status=failed
  fi
  echo "[tokenizer] $name, repeat $rep: $status" >&2
  bench_record "$raw" "$skip" "$steps" "$log" "$status" --tag side="$side" --tag threads="$threads" \
    --tag repeat="$rep" --tag config="$name"
}
names=()
for t in "${threads_list[@]}"; do names+=("meshwork/$t" "python/$t"); done
bench_interleave run "${names[@]}"

# Throughput from each run's median pass: MB/s and tokens/s; the ratio per round, paired.
table="$(python3 - "$raw" <<'PY'
import json, statistics, sys
records = [json.loads(l) for l in open(sys.argv[1])]
runs = {}
size = {}
for r in records:
    if r["kind"] == "run" and r["status"] == "ok":
        runs.setdefault((r["threads"], r["side"]), {})[int(r["repeat"])] = r["step_s"]
    elif r["kind"] == "step":
        size[(r["threads"], r["side"])] = (r["bytes"], r["tokens"])
print("| Threads | Side | MB/s: median [min, max] over runs | Mtokens/s (median) | meshwork / python throughput, paired per round: median [min, max] |")
print("|---|---|---|---|---|")
for threads in sorted({k[0] for k in runs}, key=int):
    for side in ("meshwork", "python"):
        rs = runs.get((threads, side), {})
        if not rs:
            continue
        nbytes, tokens = size[(threads, side)]
        mbs = [nbytes / 1e6 / s for s in rs.values()]
        mtok = statistics.median(tokens / 1e6 / s for s in rs.values())
        ratio = ""
        if side == "meshwork":
            py = runs.get((threads, "python"), {})
            pairs = [py[k] / rs[k] for k in rs if k in py]
            if pairs:
                ratio = "%.3fx [%.3f, %.3f]" % (statistics.median(pairs), min(pairs), max(pairs))
        print("| %s | %s | %.2f [%.2f, %.2f] | %.3f | %s |" % (threads, side, statistics.median(mbs), min(mbs), max(mbs),
                                                          mtok, ratio))
PY
)"
{
  python3 "$root/bench/protocol.py" title "$raw" "Tokenization throughput, meshwork-train vs PyPI tokenizers (same crate version, same threads)"
  echo
  bench_command_line "bench/tokenizer_throughput.sh" "$root" THREADS VOCAB REPEATS MEASURED SKIP
  echo "Machine: $(bench_machine). Corpus: ${#docs[@]} documents of about 4 KiB (docs/, README.md, /usr/share/common-licenses);"
  echo "byte-level BPE with Llama 3's pattern, $vocab ids, trained on it. A pass encodes every document as one batch"
  echo "(encode_batch_fast on both sides: no offsets); the figure is the median pass of each run."
  echo
  echo "$table"
  echo
  bench_earlier_results "$out"
} >"$tmp/out.md"
mv "$tmp/out.md" "$out"
stamp="$(date -u +%Y%m%dT%H%M%SZ)-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
python3 "$root/bench/protocol.py" finish "$raw" "$(dirname "$out")/raw/tokenizer_throughput/$stamp.jsonl.gz"
echo "[tokenizer] wrote $out" >&2
