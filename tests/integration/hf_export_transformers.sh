#!/usr/bin/env bash
# An HF export loads in PyPI transformers with its tokenizer (scripts/setup.sh installs transformers
# into .meshwork/tools/transformers; torch is the CUDA flavor's PyPI torch 2.11, run on the CPU):
# a tiny Llama trained on text prepared with a byte-level BPE tokenizer (trained by PyPI's
# tokenizers on the docs, tests/trainer/data/tokenizer_reference.py) and exported with
# data.tokenizer set; AutoTokenizer must give meshwork-train's ids on the corpus, and
# AutoModelForCausalLM must score the validation windows as `meshwork-train eval --weights` does
# (within 1e-4, fp32). Skips (exit 77, saying why) without transformers, the reference tokenizers,
# the flavor's torch, or this build's Hugging Face tokenizer support.
# usage: hf_export_transformers.sh path/to/meshwork-train
set -uo pipefail

bin="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tf_dir="${MESHWORK_TRANSFORMERS:-$root/.meshwork/tools/transformers}"
ref_dir="${MESHWORK_TOKENIZER_REF:-$root/.meshwork/tools/tokenizer-ref}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/common/checks.sh
source "$root/tests/common/checks.sh"
skip() { echo "SKIPPED: $*"; exit 77; }
# shellcheck disable=SC2317
die() { echo "FAIL: $*"; exit 1; }

[ -f "$tf_dir/.installed" ] || skip "no transformers under $tf_dir (scripts/setup.sh installs it from PyPI)"
[ -f "$ref_dir/.installed" ] || skip "no reference tokenizers under $ref_dir (scripts/setup.sh installs them)"
"$bin" tokenize --tokenizer "$root/tests/trainer/data/testdata/wordlevel/tokenizer.json" --info >/dev/null 2>&1 ||
  skip "this meshwork-train reads no tokenizer.json"
# In a subshell: pypi_torch.sh's fail() ends the script, checks.sh's counts a check.
# shellcheck source=bench/peers/pypi_torch.sh
( fail() { die "$*"; }; source "$root/bench/peers/pypi_torch.sh"; pypi_torch_python "$work/python" "$tf_dir" ) ||
  exit $?

PYTHONPATH="$ref_dir" /usr/bin/python3 "$root/tests/trainer/data/tokenizer_reference.py" train "$root/docs" "$work/tok" \
  >"$work/ref.log" 2>&1 || die "training the reference tokenizer: $(tail -3 "$work/ref.log")"
tok="$work/tok/llama3-bpe/tokenizer.json"
vocab="$("$bin" tokenize --tokenizer "$tok" --info | awk '/^vocab_size /{print $2}')"
[ -n "$vocab" ] || die "no vocabulary size from tokenize --info"

"$bin" prepare-data --tokenizer "$tok" --out "$work/train.bin" --val-out "$work/val.bin" "$root/docs" \
  >"$work/prep.log" 2>&1 || die "prepare-data: $(tail -3 "$work/prep.log")"
"$bin" train --set model.preset=tiny --set model.vocab_size="$vocab" --set data.seq_len=64 --set data.batch_size=8 \
  --set data.train="$work/train.bin" --set data.tokenizer="$tok" --set schedule.steps=30 --set schedule.warmup_steps=5 \
  --set training.device=cpu --set metrics.port=-1 --set logging.every=10 --set checkpoint.export_hf="$work/hf" \
  >"$work/train.log" 2>&1 || die "training: $(tail -5 "$work/train.log")"
[ -f "$work/hf/tokenizer.json" ] && [ -f "$work/hf/tokenizer_config.json" ] &&
  pass "the export carries tokenizer.json and tokenizer_config.json" || fail "the export lacks the tokenizer: $(ls "$work/hf")"

eval_line="$("$bin" eval --weights "$work/hf" --data "$work/val.bin" --windows 8 --set data.seq_len=64 \
  --set training.device=cpu 2>"$work/eval.err")" || die "meshwork-train eval: $(tail -3 "$work/eval.err")"
loss="$(sed -nE 's/^eval: loss ([0-9.]+) over.*/\1/p' <<<"$eval_line")"
[ -n "$loss" ] || die "no loss in: $eval_line"

docs=("$root"/docs/*.md)
"$bin" tokenize --tokenizer "$work/hf" "${docs[@]}" >"$work/ids.txt" 2>"$work/tok.err" ||
  die "meshwork-train tokenize of the export: $(cat "$work/tok.err")"
if "$work/python" "$root/tests/integration/hf_export_check.py" "$work/hf" "$work/val.bin" 64 8 "$loss" "$work/ids.txt" \
     "${docs[@]}" >"$work/check.log" 2>&1; then
  grep -E '^(PASS|FAIL)' "$work/check.log"
  passed=$((passed + $(grep -c '^PASS' "$work/check.log")))
else
  tail -20 "$work/check.log"
  failed=$((failed + 1))
fi
checks_done hf_export_transformers
