#!/usr/bin/env bash
# PipeMare (pipeline.schedule: pipemare) beside the synchronous 1F1B on real text: the project's
# corpus (the license texts, the README and docs/, as scripts/demo.sh prepares it: a 320-id
# byte-level BPE trained on it, a held-out validation split), the tiny preset untied (PipeMare
# refuses a tied table), pp 2 over 2 processes, the same global batch (BATCH rows of SEQ tokens)
# every step in M micro-batches, for STEPS steps. Every configuration runs once per seed
# (training.seed: the initial weights and the batch order; SEEDS, one round each, interleaved), so
# each PipeMare run has a 1F1B run on the same weights and batches. Reports each configuration's
# held-out loss after training (eval.windows windows of the validation split), the last 20 steps'
# training loss, the step time and each rank's measured bubble, with the paired difference of the
# held-out loss from 1F1B at the same M (for M = 1, which 1F1B cannot run at pp 2: 1F1B at M = 2,
# the same tokens a step). Nothing is tuned on these runs: PipeMare runs with its defaults.
# usage: bench/pipemare.sh [build-dir]
#   env: STEPS=300  SEEDS="1 2 3 4 5"  BATCH=8  SEQ=128  SKIP=5  EVAL_WINDOWS=128
#        CONFIGS="1f1b-m2 pipemare-m2 pipemare-nocorr-m2 1f1b-m4 pipemare-m4 pipemare-m1"
#        SETS="..." (extra flags, every run: an ablation, e.g. --set optimizer.grad_clip=0)
#        OUT=<file> (default bench/results/pipemare.md; earlier results kept below)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="$build/trainer/meshwork-train"
out="${OUT:-$root/bench/results/pipemare.md}"
steps=${STEPS:-300}
read -r -a seeds <<<"${SEEDS:-1 2 3 4 5}"
batch=${BATCH:-8}
seq=${SEQ:-128}
skip=${SKIP:-5}
eval_windows=${EVAL_WINDOWS:-128}
read -r -a configs <<<"${CONFIGS:-1f1b-m2 pipemare-m2 pipemare-nocorr-m2 1f1b-m4 pipemare-m4 pipemare-m1}"
read -r -a all_sets <<<"${SETS:-}"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
repeats=${#seeds[@]}
[ -x "$bin" ] || { echo "no $bin: build first (scripts/setup.sh)" >&2; exit 2; }
for c in "${configs[@]}"; do
  [[ $c =~ ^(1f1b|gpipe|zb-h1|pipemare|pipemare-nocorr)-m([1-9][0-9]*)$ ]] && ((batch % BASH_REMATCH[2] == 0)) ||
    { echo "CONFIGS: <schedule>-m<M> with M dividing BATCH=$batch, got '$c'" >&2; exit 2; }
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
raw="$tmp/raw.jsonl"
raw_dest="$root/bench/results/raw/pipemare-$(date -u +%Y%m%d-%H%M%S).jsonl.gz"

corpus=()
for f in GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 GFDL-1.3 MPL-2.0 Artistic; do
  [ -f "/usr/share/common-licenses/$f" ] && corpus+=("/usr/share/common-licenses/$f")
done
corpus+=("$root/README.md" "$root/docs")
"$bin" train-tokenizer --vocab-size 320 --out "$tmp/tokenizer" "${corpus[@]}" >"$tmp/tokenizer.log" 2>&1
"$bin" prepare-data --tokenizer "$tmp/tokenizer" --out "$tmp/train.bin" --val-out "$tmp/val.bin" "${corpus[@]}" \
  >"$tmp/prepare.log" 2>&1
echo "[pipemare] ${#configs[@]} configurations x ${#seeds[@]} seeds, interleaved, $steps steps a run;" \
  "estimate (a guess): $(bench_estimate $((${#configs[@]} * repeats)) "$steps" 0.14 5)" >&2

order=0
run_one() {
  local config=$1 rep=$2 seed=${seeds[$(($2 - 1))]} status=ok schedule m extra=() prefix eval_loss
  order=$((order + 1))
  schedule=${config%-m*}
  m=${config##*-m}
  if [ "$schedule" = pipemare-nocorr ]; then
    schedule=pipemare
    extra=(--set pipeline.discrepancy_correction=false)
  fi
  prefix="$tmp/$config-$rep"
  echo "[pipemare] round $rep (seed $seed): $config" >&2
  timeout 1800 "$bin" launch --nproc 2 --master-port $((29600 + order % 200)) train \
    --set model.preset=tiny --set model.tie_word_embeddings=false --set data.train="$tmp/train.bin" \
    --set data.val="$tmp/val.bin" --set eval.windows="$eval_windows" --set data.seq_len="$seq" \
    --set data.batch_size=$((batch / m)) --set training.grad_accum="$m" --set mesh.pp=2 \
    --set pipeline.schedule="$schedule" --set schedule.steps="$steps" --set training.seed="$seed" \
    --set training.threads=1 --set metrics.port=-1 --set logging.every=1000 --set logging.jsonl="$prefix.jsonl" \
    "${extra[@]}" "${all_sets[@]}" >"$prefix.log" 2>&1 || status=failed
  [ "$status" = ok ] || tail -n 5 "$prefix.log" >&2
  eval_loss="$(sed -n 's/^eval after training: loss \([0-9.]*\)$/\1/p' "$prefix.log")"
  grep -h '^pipeline bubble' "$prefix.log" | sed 's/^/    /' >&2 || true
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.log" "$status" --tag config="$config" --tag repeat="$rep" \
    --tag seed="$seed" --tag order="$order" --tag eval_loss="${eval_loss:-nan}"
  [ "$status" = ok ]
}

bench_interleave run_one "${configs[@]}"

{
  python3 "$root/bench/protocol.py" title "$raw" "PipeMare beside 1F1B on real text: held-out loss, step time and bubble" --group config
  echo
  bench_command_line "bench/pipemare.sh" "$root" STEPS SEEDS BATCH SEQ SKIP EVAL_WINDOWS CONFIGS SETS
  echo
  echo "Machine: $(bench_machine); 2 processes (pp 2), training.threads=1 each, Gloo over loopback."
  echo "Model: tiny (4 layers, hidden 128, vocab 320), untied; stages [0,2) [2,4). Data: the project's"
  echo "corpus ($(grep -o '[0-9.]* MB of input' "$tmp/prepare.log" | head -1)), a 320-id byte-level BPE trained on it,"
  echo "its validation split held out. Global batch $batch x $seq tokens every step in M micro-batches;"
  echo "$steps steps (the default schedule: warm-up then cosine decay), optimizer defaults (AdamW, grad_clip 1)."
  echo "PipeMare with its defaults: learning-rate rescheduling over schedule.warmup_steps (its delays"
  echo "are at most 1 at pp 2, so it changes nothing), discrepancy correction with decay 0.5;"
  echo "\`pipemare-nocorr\` without the correction."
  [ -z "${SETS:-}" ] || echo "Every run adds: \`${SETS}\`."
  echo
  echo "Each configuration ran once per seed (SEEDS: the initial weights and the batch order), the"
  echo "configurations interleaved within a seed's round. Step time, exposed communication and step"
  echo "peak tensors (rank 0, stage 0) are each run's median over steps $((skip + 1))-$steps, then the"
  echo "median [min, max] over the seeds:"
  echo
  python3 "$root/bench/protocol.py" table "$raw" --group config
  echo
  python3 "$root/bench/pipemare_quality.py" "$raw" --skip "$skip"
} >"$tmp/table.md"

bench_write_results pipemare
