#!/usr/bin/env bash
# prepare-data on every input format with the real meshwork-train: Parquet (written by PyPI's
# pyarrow, which scripts/setup.sh installs into .meshwork/tools/arrow) gives the same token file as
# JSON Lines and as plain text holding the same documents; malformed Parquet is refused naming the
# file and the column or row (exit 3), with nothing written; a large input is prepared in bounded
# memory and the same at 1 and 2 threads. Parquet checks print SKIP lines with the reason where
# pyarrow or this build's Parquet module is absent; the rest runs.
# usage: prepare_data_e2e.sh path/to/meshwork-train
set -uo pipefail

bin="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
arrow_dir="${MESHWORK_ARROW_PY:-$root/.meshwork/tools/arrow}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/common/checks.sh
source "$root/tests/common/checks.sh"
python=/usr/bin/python3
[ -x "$python" ] || python=python3

same_file() { # NAME A B
  if cmp -s "$2" "$3"; then pass "$1"; else fail "$1: $2 and $3 differ"; fi
}
# no_outputs NAME: nothing named out* (outputs or their temporaries) in $work/o
no_outputs() {
  if [ -z "$(ls -A "$work/o")" ]; then pass "$1: nothing written"; else fail "$1: left $(ls "$work/o")"; fi
}
mkdir -p "$work/o"

# --- Parquet ---------------------------------------------------------------------------------------
parquet=1
if ! [ -f "$arrow_dir/.installed" ]; then
  echo "SKIP: Parquet checks: no pyarrow under $arrow_dir (scripts/setup.sh installs it from PyPI)"
  parquet=0
# -S: only the wheel's packages; a system NumPy older than pyarrow wants would fail its import.
elif ! PYTHONPATH="$arrow_dir" "$python" -S "$root/tests/trainer/data/parquet_fixtures.py" "$work/in" 2>"$work/err"; then
  fail "writing the Parquet fixtures with pyarrow: $(tail -3 "$work/err")"
  parquet=0
else
  "$bin" prepare-data --field text --out "$work/probe.bin" "$work/in/bad/no-rows.parquet" >/dev/null 2>"$work/err"
  if [ $? -eq 5 ]; then
    echo "SKIP: Parquet checks: this meshwork-train has no Parquet module: $(cat "$work/err")"
    parquet=0
  fi
fi

if [ $parquet -eq 1 ]; then
  # Shards in a directory (sorted walk: part-0, part-1, part-2) against the same documents as JSON Lines.
  "$bin" prepare-data --field text --out "$work/pq.bin" --val-out "$work/pq_val.bin" "$work/in/shards" \
    >"$work/pq.log" 2>&1 || fail "prepare-data on Parquet shards: $(cat "$work/pq.log")"
  "$bin" prepare-data --field text --out "$work/jl.bin" --val-out "$work/jl_val.bin" "$work/in/same.jsonl" \
    >"$work/jl.log" 2>&1 || fail "prepare-data on JSON Lines: $(cat "$work/jl.log")"
  same_file "Parquet (3 shards: string, large_string, dictionary; zstd; 64-row groups) = JSON Lines: train" "$work/pq.bin" "$work/jl.bin"
  same_file "Parquet = JSON Lines: val" "$work/pq_val.bin" "$work/jl_val.bin"
  grep -q "^prepared 699 documents" "$work/pq.log" && pass "699 documents (the empty one skipped): $(head -1 "$work/pq.log")" ||
    fail "document count: $(cat "$work/pq.log")"

  expect_exit "Parquet without the column" 3 "no-column.parquet': has no column 'text' (its columns: body, id)" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" "$work/in/bad/no-column.parquet"
  expect_exit "Parquet column not a string" 3 "column 'text' is int64, not a string column" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" "$work/in/bad/not-string.parquet"
  expect_exit "Parquet binary column" 3 "column 'text' is binary, not a string column" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" "$work/in/bad/binary.parquet"
  expect_exit "Parquet null value" 3 "null-row.parquet': row 2 of column 'text' is null" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" "$work/in/bad/null-row.parquet"
  expect_exit "Parquet without rows" 3 "no text found" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" "$work/in/bad/no-rows.parquet"
  expect_exit "truncated Parquet" 3 "truncated.parquet'" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" "$work/in/bad/truncated.parquet"
  expect_exit "Parquet named without --field" 2 "is a Parquet file: name the column that holds the text with --field" -- \
    "$bin" prepare-data --out "$work/o/out.bin" "$work/in/shards/part-0.parquet"
  # A bad shard after good ones: the error, and no output at all.
  cp "$work/in/bad/null-row.parquet" "$work/in/shards/part-9.parquet"
  expect_exit "a bad shard last" 3 "part-9.parquet': row 2" -- \
    "$bin" prepare-data --field text --out "$work/o/out.bin" --val-out "$work/o/val.bin" "$work/in/shards"
  no_outputs "Parquet errors"
fi

# --- plain text = JSON Lines of the same documents --------------------------------------------------
mkdir -p "$work/txt"
for i in 0 1 2 3 4; do printf 'text file %d\n  with  spaces\t\tand tabs\n' "$i" >"$work/txt/$i.txt"; done
: >"$work/txt.jsonl"
for i in 0 1 2 3 4; do
  "$python" -c 'import json,sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' "$work/txt/$i.txt" >>"$work/txt.jsonl"
done
"$bin" prepare-data --out "$work/txt.bin" "$work/txt" >/dev/null 2>&1 && \
  "$bin" prepare-data --field text --out "$work/txtjl.bin" "$work/txt.jsonl" >/dev/null 2>&1 &&
  same_file "plain text files = JSON Lines of the same documents" "$work/txt.bin" "$work/txtjl.bin" ||
  fail "prepare-data on text / JSON Lines"

# --- a large input: bounded memory, the same at 1 and 2 threads, a progress line --------------------
# 160 MB of JSON Lines: held whole as byte tokens it would take 480 MB more than its first quarter
# does (4 bytes a token); streamed, the peaks differ by the timing of the chunks in flight (tens
# of MB either way).
"$python" - "$work/big.jsonl" "$work/quarter.jsonl" <<'PY'
import json, sys
line = json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 40}) + "\n"
for path, size in ((sys.argv[1], 160_000_000), (sys.argv[2], 40_000_000)):
    with open(path, "w") as f:
        for _ in range(size // len(line)):
            f.write(line)
PY
for run in big:1 big:2 quarter:2; do
  name=${run%:*} threads=${run#*:}
  "$bin" prepare-data --field text --threads "$threads" --progress-every 0.5 --out "$work/$name$threads.bin" \
    "$work/$name.jsonl" >"$work/$name$threads.log" 2>"$work/$name$threads.err" ||
    fail "prepare-data on $name.jsonl, $threads threads: $(cat "$work/$name$threads.err")"
done
same_file "160 MB of JSON Lines: the same file at 1 and 2 threads" "$work/big1.bin" "$work/big2.bin"
peak_of() { sed -n 's/.*peak memory \([0-9]*\) MiB.*/\1/p' "$1"; }
peak=$(peak_of "$work/big2.log") quarter=$(peak_of "$work/quarter2.log")
if [ -n "$peak" ] && [ -n "$quarter" ] && [ "$peak" -lt $((quarter + 160)) ]; then
  pass "bounded memory: 160 MB in $peak MiB peak, 40 MB in $quarter MiB ($(tail -1 "$work/big2.log"))"
else
  fail "peak memory grows with the input: $peak MiB for 160 MB, $quarter MiB for 40 MB (want < +160)"
fi
grep -q "^prepare-data: [0-9]* documents, [0-9]* tokens, [0-9.]* MB in [0-9.]* s ([0-9.]* MB/s)" "$work/big1.err" &&
  pass "progress lines on stderr: $(head -1 "$work/big1.err")" || fail "no progress line: $(head -3 "$work/big1.err")"

# --- document masking: the separator the token file records, or the config's -----------------------
train=(train --set model.preset=tiny --set data.seq_len=64 --set data.batch_size=4 --set schedule.steps=3
       --set schedule.warmup_steps=1 --set training.device=cpu --set metrics.port=-1 --set logging.every=1)
if "$bin" "${train[@]}" --set data.train="$work/txt.bin" --set data.document_masking=true >"$work/mask.log" 2>&1 &&
   grep -q "^documents: masked in attention, each ended by token 257" "$work/mask.log"; then
  pass "data.document_masking: the separator from the token file's header (the byte vocabulary's <|eos|>, 257)"
else
  fail "training with data.document_masking: $(tail -5 "$work/mask.log")"
fi
"$bin" prepare-data --format raw_u16 --out "$work/raw.bin" "$work/txt" >/dev/null 2>&1
expect_exit "masking a raw token file" 2 "key 'data.document_masking': token file '$work/raw.bin' does not record" -- \
  "$bin" "${train[@]}" --set data.train="$work/raw.bin" --set data.token_format=raw_u16 --set data.document_masking=true
expect_exit "masking synthetic data" 2 "key 'data.document_masking': synthetic data records no document separator" -- \
  "$bin" "${train[@]}" --set data.document_masking=true
expect_exit "a separator past the vocabulary" 2 "key 'data.document_separator': 320 (from data.document_separator) is not below model.vocab_size 320" -- \
  "$bin" "${train[@]}" --set data.document_masking=true --set data.document_separator=320
if "$bin" "${train[@]}" --set data.train="$work/raw.bin" --set data.token_format=raw_u16 --set data.document_masking=true \
     --set data.document_separator=10 >"$work/mask2.log" 2>&1 && grep -q "ended by token 10" "$work/mask2.log"; then
  pass "data.document_separator names it for a file that does not record one"
else
  fail "data.document_separator: $(tail -5 "$work/mask2.log")"
fi

checks_done prepare_data_e2e
