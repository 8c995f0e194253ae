#!/usr/bin/env bash
# prepare-data throughput (MB of input a second) by input format, tokenizer and thread count, and
# beside the Python a user would otherwise write (bench/peers/prepare_peer.py: PyPI's tokenizers of
# the crate's version, batches of 1,024 documents, the same llm.c file). The corpus is this
# repository's docs and the machine's license texts cut into documents of about 4 KiB at paragraph
# ends, repeated to CORPUS_MB, as JSON Lines and as Parquet (pyarrow, 4,096-row groups, snappy);
# the BPE tokenizer is a byte-level BPE with Llama 3's pre-tokenizer pattern trained on it by
# PyPI's trainer (VOCAB ids). Each run prepares the whole corpus once (cold process, warm page
# cache); REPEATS interleaved rounds; a configuration's figure is the median, min and max over them.
# usage: bench/prepare_data.sh [build-dir]
#   env: CORPUS_MB=40  VOCAB=16000  THREADS="1 2"  REPEATS=5
#        OUT=<file> (default bench/results/prepare_data.md; earlier results kept below)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
out="${OUT:-$root/bench/results/prepare_data.md}"
ref_dir="${MESHWORK_TOKENIZER_REF:-$root/.meshwork/tools/tokenizer-ref}"
arrow_dir="${MESHWORK_ARROW_PY:-$root/.meshwork/tools/arrow}"
corpus_mb=${CORPUS_MB:-40} vocab=${VOCAB:-16000}
threads_list=(${THREADS:-1 2})
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
repeats=${REPEATS:-5}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS '$repeats': expected a positive integer" >&2; exit 2; }
[ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 1; }
[ -f "$ref_dir/.installed" ] || { echo "no reference tokenizers under $ref_dir (scripts/setup.sh installs them)" >&2; exit 1; }
[ -f "$arrow_dir/.installed" ] || { echo "no pyarrow under $arrow_dir (scripts/setup.sh installs it)" >&2; exit 1; }
python=/usr/bin/python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
records="$tmp/records.tsv"  # config round seconds bytes tokens peak_mib

# The corpus (JSON Lines and Parquet) and the tokenizer.
# -S: only these packages; a system NumPy older than pyarrow wants would fail its import.
PYTHONPATH="$ref_dir:$arrow_dir" "$python" -S "$root/bench/peers/bench_corpus.py" "$tmp" "$vocab" "$corpus_mb" \
  "$root/docs" "$root/README.md" /usr/share/common-licenses

run() { # NAME (side/format/tokenizer/threads) REPEAT
  local name=$1 rep=$2 side format tok threads log="$tmp/run.log" rest
  IFS=/ read -r side format tok threads <<<"$name"
  local input="$tmp/corpus.$format" tokarg=bytes
  [ "$tok" = bpe ] && tokarg="$tmp/tokenizer.json"
  rm -f "$tmp/out.bin"
  if [ "$side" = meshwork ]; then
    if RAYON_NUM_THREADS=$threads "$bin" prepare-data --tokenizer "$tokarg" --field text --threads "$threads" \
         --progress-every 0 --out "$tmp/out.bin" "$input" >"$log" 2>&1; then
      rest="$(sed -nE 's/^read ([0-9.]+) MB of input in ([0-9.]+) s .*peak memory ([0-9]+) MiB.*/\2\t\1\t\3/p' "$log")"
      local tokens
      tokens="$(sed -nE 's/^prepared [0-9]+ documents with .*: ([0-9]+) tokens -> .*/\1/p' "$log")"
      IFS=$'\t' read -r secs mb peak <<<"$rest"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rep" "$secs" "$mb" "$tokens" "$peak" >>"$records"
    else
      echo "[prepare_data] $name, repeat $rep: failed: $(tail -2 "$log")" >&2
      return 0
    fi
  else
    local bos eos
    bos="$(PYTHONPATH="$ref_dir" "$python" -c 'import sys; from tokenizers import Tokenizer; t=Tokenizer.from_file(sys.argv[1]); print(t.token_to_id("<|begin_of_text|>"), t.token_to_id("<|end_of_text|>"))' "$tmp/tokenizer.json")"
    read -r bos eos <<<"$bos"
    if RAYON_NUM_THREADS=$threads PYTHONPATH="$ref_dir" /usr/bin/time -f '%M' -o "$tmp/rss" "$python" \
         "$root/bench/peers/prepare_peer.py" "$tmp/tokenizer.json" text "$input" "$tmp/out.bin" "$bos" "$eos" >"$log" 2>&1; then
      python3 - "$log" "$tmp/rss" "$name" "$rep" >>"$records" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
peak = int(open(sys.argv[2]).read().split()[-1]) // 1024
print("%s\t%s\t%.3f\t%.1f\t%d\t%d" % (sys.argv[3], sys.argv[4], r["seconds"], r["bytes"] / 1e6, r["tokens"], peak))
PY
    else
      echo "[prepare_data] $name, repeat $rep: failed: $(tail -2 "$log")" >&2
      return 0
    fi
  fi
  echo "[prepare_data] $name, repeat $rep: $(tail -1 "$records" | cut -f3) s" >&2
}
names=()
for t in "${threads_list[@]}"; do
  names+=("meshwork/jsonl/bytes/$t" "meshwork/parquet/bytes/$t" "meshwork/jsonl/bpe/$t" "meshwork/parquet/bpe/$t"
          "python/jsonl/bpe/$t")
done
command -v /usr/bin/time >/dev/null || { echo "[prepare_data] /usr/bin/time missing: the Python peer's peak memory is 0" >&2; }
for ((rep = 1; rep <= repeats; rep++)); do
  for n in "${names[@]}"; do run "$n" "$rep"; done
done

table="$(python3 - "$records" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, rep, secs, mb, tokens, peak = line.rstrip("\n").split("\t")
    runs.setdefault(name, {})[rep] = (float(secs), float(mb), int(tokens), int(peak))
def spread(v):
    return "%.1f [%.1f, %.1f]" % (statistics.median(v), min(v), max(v))
print("| side | input | tokenizer | threads | runs | MB/s: median [min, max] | Mtokens/s (median) | peak MiB (median) | meshwork / python MB/s, paired per round |")
print("|---|---|---|---|---|---|---|---|---|")
for name, rs in runs.items():
    side, fmt, tok, threads = name.split("/")
    mbs = [mb / s for s, mb, _, _ in rs.values()]
    mtok = statistics.median(t / 1e6 / s for s, _, t, _ in rs.values())
    ratio = ""
    peer = runs.get("python/jsonl/%s/%s" % (tok, threads))
    if side == "meshwork" and peer:
        pairs = [(rs[k][1] / rs[k][0]) / (peer[k][1] / peer[k][0]) for k in rs if k in peer]
        if pairs:
            ratio = "%.2fx [%.2f, %.2f]" % (statistics.median(pairs), min(pairs), max(pairs))
    print("| %s | %s | %s | %s | %d | %s | %.2f | %d | %s |" % (side, fmt, tok, threads, len(rs), spread(mbs), mtok,
                                                             statistics.median(p for *_, p in rs.values()), ratio))
PY
)"
{
  echo "# prepare-data throughput by input, tokenizer and threads, beside a Python script using PyPI tokenizers: $repeats interleaved rounds, one whole preparation a run"
  echo
  bench_command_line "bench/prepare_data.sh" "$root" CORPUS_MB VOCAB THREADS REPEATS
  echo "Machine: $(bench_machine). Corpus: $(grep -c . "$tmp/corpus.jsonl") documents, $corpus_mb MB of text (JSON Lines $(du -m "$tmp/corpus.jsonl" | cut -f1) MiB, Parquet $(du -m "$tmp/corpus.parquet" | cut -f1) MiB)."
  echo "MB/s is MB of input a second: the JSON Lines file's bytes, the Parquet column's text. Threads: --threads and"
  echo "RAYON_NUM_THREADS for meshwork-train, RAYON_NUM_THREADS for the Python side (which parses JSON on one thread)."
  echo "Peak memory: meshwork-train's own report (ru_maxrss; about 150 MiB of it libtorch and the process), /usr/bin/time's for Python."
  echo
  echo "$table"
  echo
  bench_earlier_results "$out"
} >"$tmp/out.md"
mv "$tmp/out.md" "$out"
cat "$out" | head -24
