#!/usr/bin/env bash
# meshwork-train as a user runs it: every bad input gets its message and exit code, a real run
# serves /metrics while it trains, and eval prints six significant digits.
# usage: cli_e2e.sh path/to/meshwork-train
set -uo pipefail

bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"; [ -n "${train_pid:-}" ] && kill "$train_pid" 2>/dev/null' EXIT
# shellcheck source=tests/common/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/checks.sh"
# expect NAME WANT_EXIT WANT_STDERR_SUBSTRING -- ARGS...: meshwork-train ARGS...
expect() {
  local name="$1" want_rc="$2" want_msg="$3"
  shift 4
  expect_exit "$name" "$want_rc" "$want_msg" -- "$bin" "$@"
}

small=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_hidden_layers=2
       --set data.seq_len=32 --set data.batch_size=4 --set metrics.port=-1 --set logging.every=1000)

# --- usage and config errors: exit 2 -------------------------------------------------------
expect "no command" 2 "missing command" --
expect "unknown command" 2 "unknown command 'trian'" -- trian
expect "unknown option" 2 "unknown option '--lr'" -- train --lr 3
expect "unknown key" 2 "unknown key 'optimizer.learning_rate'" -- train --set optimizer.learning_rate=1
expect "wrong type" 2 "key 'data.seq_len': expected an integer, got 'long'" -- train --set data.seq_len=long
expect "out of range" 2 "key 'optimizer.beta2'" -- train --set optimizer.beta2=1.5
expect "bad enum" 2 "key 'schedule.decay': must be one of cosine, linear, constant, got 'exp'" -- train --set schedule.decay=exp
expect "unknown preset" 2 "unknown preset 'llama9'" -- train --set model.preset=llama9
expect "set without =" 2 "expected key=value" -- train --set optimizer.lr
printf 'model:\n  preset: tiny\n   hidden_size: 3\n' >"$work/bad.yaml"
expect "yaml syntax" 2 "YAML syntax error at line" -- train --config "$work/bad.yaml"
expect "eval without weights" 2 "eval needs weights" -- eval --data x.bin
expect "bf16 residual without autocast" 2 "key 'training.residual_dtype': bf16 needs bf16 autocast, but training.dtype is 'fp32'" \
  -- train --set training.dtype=fp32 --set training.residual_dtype=bf16
expect "attention kernel the CPU lacks" 2 "key 'training.attention_backend': efficient" \
  -- train --set training.device=auto --set training.attention_backend=efficient "${small[@]}"
expect "an empty --config (an unset variable)" 2 "--config needs a file name" -- train --config ""
expect "a hex integer" 2 "key 'schedule.steps': expected an integer, got '0x10'" -- train --set schedule.steps=0x10
if [[ "$("$bin" config --set data.seq_len=0200 2>&1)" == *"seq_len: 200"* ]]; then
  pass "a zero-padded integer is decimal (seq_len 0200 is 200)"
else
  fail "zero-padded integer: $("$bin" config --set data.seq_len=0200 2>&1 | grep seq_len)"
fi
expect "libtorch's fused AdamW off CUDA" 2 "key 'optimizer.implementation': fused is libtorch's CUDA kernel" \
  -- train --set training.device=auto --set optimizer.implementation=fused "${small[@]}"

# --- input errors: exit 3 ------------------------------------------------------------------
expect "missing config file" 3 "$work/none.yaml" -- train --config "$work/none.yaml"
expect "missing token file" 3 "$work/none.bin" -- train --set data.train="$work/none.bin" "${small[@]}"
# llm.c's magic followed by a version that does not exist
python3 -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<3i", 20240520, 7, 100) + bytes(1012) + bytes(200))' >"$work/corrupt.bin"
expect "corrupt token file" 3 "$work/corrupt.bin" -- train --set data.train="$work/corrupt.bin" "${small[@]}"
expect "missing weights" 3 "$work/nohf" -- eval --weights "$work/nohf" --data "$work/none.bin"

# --- output paths found bad before training, not after: exit 4 ------------------------------
touch "$work/afile"
expect "an export path that is a file" 4 "key 'checkpoint.export_hf': cannot create directory '$work/afile'" \
  -- train "${small[@]}" --set schedule.steps=50 --set checkpoint.export_hf="$work/afile"
expect "a checkpoint dir under a file" 4 "key 'checkpoint.dir': cannot create directory '$work/afile/ck'" \
  -- train "${small[@]}" --set schedule.steps=50 --set checkpoint.dir="$work/afile/ck"
expect "logging.jsonl on a full disk" 4 "key 'logging.jsonl': writing step 1 to '/dev/full' failed" \
  -- train "${small[@]}" --set schedule.steps=3 --set logging.jsonl=/dev/full

# --- prepare-data never writes over what it reads or writes twice: exit 2 ------------------
printf 'some text to keep\n' >"$work/notes.txt"
expect "prepare-data --out is its input" 2 "--out '$work/notes.txt' is the input" \
  -- prepare-data --out "$work/notes.txt" "$work/notes.txt"
expect "prepare-data --val-out is --out by another name" 2 "train and val outputs are the same file" \
  -- prepare-data --out "$work/notes.txt" --val-out "$work/./notes.txt" "$work/notes.txt"
expect "prepare-data --val-fraction without --val-out" 2 "--val-fraction needs --val-out" \
  -- prepare-data --out "$work/t.bin" --val-fraction 0.5 "$work/notes.txt"
expect "prepare-data --format bogus" 2 "--format: 'bogus' is not a token format" \
  -- prepare-data --out "$work/t.bin" --format bogus "$work/notes.txt"
[ "$(cat "$work/notes.txt")" = "some text to keep" ] && pass "the input text is untouched" ||
  fail "the input text changed: $(head -c 100 "$work/notes.txt")"

# --- prepare-data, train with /metrics live, export, eval ----------------------------------
if "$bin" prepare-data --out "$work/train.bin" --val-out "$work/val.bin" /usr/share/common-licenses/GPL-3 \
    >"$work/prep.log" 2>&1 && grep -q "prepared 1 documents" "$work/prep.log"; then
  pass "prepare-data"
else
  fail "prepare-data: $(cat "$work/prep.log")"
fi

"$bin" train "${small[@]}" --set data.train="$work/train.bin" --set data.val="$work/val.bin" \
  --set eval.windows=4 --set schedule.steps=400 --set logging.every=20 \
  --set metrics.port=0 --set metrics.host=127.0.0.1 --set metrics.job=clitest \
  --set checkpoint.export_hf="$work/hf" >"$work/train.log" 2>&1 &
train_pid=$!
url=""
for _ in $(seq 1 100); do
  url="$(grep -o 'http://127.0.0.1:[0-9]*/metrics' "$work/train.log" | head -1)"
  [ -n "$url" ] && grep -q "^step 20/" "$work/train.log" && break
  sleep 0.2
done
if [ -n "$url" ] && body="$(curl -sf "$url")" &&
   grep -q '^meshwork_trainer_tokens_per_second{job="clitest",rank="0"} [1-9]' <<<"$body" &&
   grep -q '^meshwork_trainer_steps_total{job="clitest",rank="0"} [1-9]' <<<"$body"; then
  pass "/metrics served while training ($url)"
else
  fail "/metrics while training: url='$url'; $(head -c 600 <<<"${body:-}")"
fi
wait "$train_pid"
rc=$?
train_pid=""
if [ "$rc" -eq 0 ] && grep -q "^done: 400 steps" "$work/train.log" && [ -f "$work/hf/model.safetensors" ]; then
  pass "train ran to the end and exported"
else
  fail "train: exit $rc; $(tail -5 "$work/train.log")"
fi

eval_out="$("$bin" eval --weights "$work/hf" --data "$work/val.bin" --windows 4 --set data.seq_len=32 2>/dev/null)"
if [[ "$eval_out" =~ ^eval:\ loss\ [0-9]\.[0-9]{5}\ over\ 4\ windows\ of\ 32\ tokens ]]; then
  pass "eval prints six significant digits: $eval_out"
else
  fail "eval output: '$eval_out'"
fi
final_eval="$(grep -o 'eval after training: loss [0-9.]*' "$work/train.log" | awk '{print $5}')"
if [ -n "$final_eval" ] && [[ "$eval_out" == *"loss $final_eval over"* ]]; then
  pass "eval of the exported weights equals the trainer's final eval ($final_eval)"
else
  fail "eval '$eval_out' vs trainer's final eval '$final_eval'"
fi

# --- the metrics port taken: exit 5 --------------------------------------------------------
python3 -c 'import socket,time,sys; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)' >"$work/port" &
holder=$!
for _ in $(seq 1 50); do [ -s "$work/port" ] && break; sleep 0.1; done
port="$(cat "$work/port")"
expect "metrics port in use" 5 "127.0.0.1:$port" -- train "${small[@]}" --set metrics.host=127.0.0.1 --set metrics.port="$port"
kill "$holder" 2>/dev/null

checks_done cli_e2e
