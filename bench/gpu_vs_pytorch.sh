#!/usr/bin/env bash
# meshwork-train next to a PyTorch peer of the same model (bench/peers/llama_peer.py, eager and
# torch.compile) on one GPU, side by side in one run: llama3-1b at batch 4 and 8 x 2048 and
# llama-100m at batch 16 x 2048, bf16 autocast over fp32 weights, synthetic tokens (the peer
# reproduces Meshwork's tokens and initial weights exactly). Records steady tokens/s, MFU, peak
# memory and the final loss; a configuration that runs out of memory is recorded as OOM.
# Writes bench/results/gpu_vs_pytorch.md. Needs a GPU, a CUDA build of meshwork-train
# (scripts/gpu-build.sh) and a python3 with a CUDA torch and numpy.
# usage: bench/gpu_vs_pytorch.sh [build-dir]   (default: build-gpu/ if it has meshwork-train, else build/)
#   PYTHON=python3  STEPS=20  SKIP=2 (steps left out of tokens/s)  LR=3e-4  RUN_TIMEOUT=900 (s per run)
#   LOGS=DIR (every run's log and JSONL are written there and kept)
#   MESHWORK_SET="key=value ..." (config overrides for every meshwork-train run, named in the table's
#   header; e.g. training.fused_kernels=off)
#   COMPILE_FOR="llama3-1b-4 llama3-1b-8 llama-100m-16" (NAME-BATCH of the rows whose torch.compile
#   peer runs, default all: torch.compile takes 1-2 minutes a model, a short GPU lease may not
#   have them; a row left out says so)
# The table is rewritten after every row, so a run cut short still leaves the rows it finished.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
build="${1:-}"
if [ -z "$build" ]; then
  build="$root/build"
  [ -x "$root/build-gpu/trainer/meshwork-train" ] && build="$root/build-gpu"
fi
bin="$build/trainer/meshwork-train"
peer="$root/bench/peers/llama_peer.py"
python="${PYTHON:-python3}"
steps="${STEPS:-20}" skip="${SKIP:-2}" lr="${LR:-3e-4}" run_timeout="${RUN_TIMEOUT:-900}"
out="$root/bench/results/gpu_vs_pytorch.md"
if [ -n "${LOGS:-}" ]; then
  tmp="$LOGS"
  mkdir -p "$tmp"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
fi

die() { echo "[gpu_vs_pytorch] error: $1" >&2; exit "${2:-1}"; }
no_gpu() { die "no GPU: $1; this benchmark needs one CUDA device (nothing was written)" 5; }

# --- preconditions: a GPU first, so a CPU machine gets the one message that matters ------------
command -v nvidia-smi >/dev/null || no_gpu "nvidia-smi is not installed"
nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi sees no device ($(nvidia-smi -L 2>&1 | head -1))"
[ -x "$bin" ] || die "no meshwork-train at $bin: build the CUDA flavor (scripts/gpu-build.sh) or name the build folder"
"$python" -c 'import numpy, torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  no_gpu "$python has no CUDA torch (and numpy), or its torch sees no device: set PYTHON"
"$bin" devices --require-cuda >"$tmp/devices.txt" 2>&1 ||
  no_gpu "$bin sees no CUDA device: is it the CPU flavor? build the CUDA one with scripts/gpu-build.sh"

# name | preset | batch | seq_len: the issue's two targets first (llama3-1b at batch 4 against
# torch.compile, llama-100m against eager), so that a lease cut short still has them.
runs=(
  "llama3-1b|llama3-1b|4|2048"
  "llama-100m|llama-100m|16|2048"
  "llama3-1b|llama3-1b|8|2048"
)

gib() { awk -v m="$1" 'BEGIN { printf "%.2f GiB", m / 1024 }'; }

# steady_tps JSONL TOKENS_PER_STEP: Meshwork's tokens/s over the steps after SKIP, from its
# per-step times: the same rule as the peer's summary.
steady_tps() {
  "$python" - "$1" "$2" "$skip" <<'EOF'
import json, sys
path, tokens, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = [json.loads(line) for line in open(path)]
steady = [s["step_seconds"] for s in steps if s["step"] > skip] or [steps[-1]["step_seconds"]]
print(f"{tokens * len(steady) / sum(steady):.0f}")
EOF
}

# failure LOG RC: "OOM", "timeout" or "failed (exit RC)"
failure() {
  if grep -qiE 'out of memory|result=oom' "$1"; then echo OOM
  elif [ "$2" = 124 ]; then echo "timeout (${run_timeout} s)"
  else echo "failed (exit $2)"; fi
}

extra_sets=()
for kv in ${MESHWORK_SET:-}; do extra_sets+=(--set "$kv"); done

# Sets tps, mfu, alloc, reserved, loss (or result) for one Meshwork run.
run_meshwork() {
  local preset="$1" batch="$2" seq="$3" log="$4" jsonl="$5" flops="$6" rc=0
  timeout "$run_timeout" "$bin" train --set model.preset="$preset" --set data.train=synthetic \
    --set data.seq_len="$seq" --set data.batch_size="$batch" --set schedule.steps="$steps" \
    --set optimizer.lr="$lr" --set training.device=cuda --set training.dtype=bf16 \
    --set metrics.port=-1 --set logging.every=1 --set logging.jsonl="$jsonl" "${extra_sets[@]}" >"$log" 2>&1 || rc=$?
  result=""
  if [ "$rc" != 0 ]; then result="$(failure "$log" "$rc")"; return; fi
  parse_run "$log"
  local peak_tflops mib
  peak_tflops="$(sed -nE 's/.*mfu vs ([0-9.]+) TFLOP\/s.*/\1/p' "$log")"
  tps="$(steady_tps "$jsonl" $((batch * seq)))"
  mfu="$(awk -v t="$tps" -v f="$flops" -v p="$peak_tflops" 'BEGIN { printf "%.1f%%", 100 * t * f / (p * 1e12) }')"
  mib="$(sed -E 's/ MiB//' <<<"$peak")"
  alloc="$(gib "$mib")" reserved="-"
  local reserved_mib
  reserved_mib="$(sed -nE 's/.*reserved peak ([0-9]+) MiB.*/\1/p' <<<"$done_line")"
  [ -z "$reserved_mib" ] || reserved="$(gib "$reserved_mib")"
  loss="$(sed -E 's/.*final loss ([0-9.]+).*/\1/' <<<"$done_line")"
  attention="$(sed -nE 's/^kernels: attention ([a-z_]+).*/\1/p' "$log")"
}

# peer_field LINE KEY: the value of KEY=VALUE in the peer's summary line.
peer_field() { sed -nE "s|.* $2=([^ ]+).*|\1|p" <<<"$1"; }

# Sets tps, mfu, alloc, reserved, loss (or result) for one peer run.
run_peer() {
  local preset="$1" batch="$2" seq="$3" log="$4" rc=0
  shift 4
  timeout "$run_timeout" "$python" "$peer" --preset "$preset" --batch "$batch" --seq "$seq" \
    --steps "$steps" --lr "$lr" --device cuda --dtype bf16 --skip "$skip" "$@" >"$log" 2>&1 || rc=$?
  result=""
  if [ "$rc" != 0 ]; then result="$(failure "$log" "$rc")"; return; fi
  local line
  line="$(grep '^peer:' "$log")"
  tps="$(peer_field "$line" 'tok/s')" mfu="$(peer_field "$line" mfu)" loss="$(peer_field "$line" final_loss)"
  alloc="$(peer_field "$line" peak_alloc_gib) GiB" reserved="$(peer_field "$line" peak_reserved_gib) GiB"
  attention="$(peer_field "$line" sdpa)"
  mfu="$(awk -v m="${mfu%\%}" 'BEGIN { printf "%.1f%%", m }')"
}

gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
torch_version="$("$python" -c 'import torch; print(torch.__version__)')"
{
  echo "# meshwork-train vs PyTorch on one GPU"
  echo
  bench_command_line bench/gpu_vs_pytorch.sh "$root"
  echo
  echo "Machine: $gpu (name, memory, driver); host $(bench_machine). PyTorch $torch_version for the"
  echo "peer; meshwork-train: $(head -1 "$tmp/devices.txt")."
  echo
  echo "One GPU, one process, bf16 autocast over fp32 weights, fused AdamW in the peer, no activation"
  echo "checkpointing, synthetic tokens, $steps steps at lr $lr. Both start from the same weights (the peer"
  echo "reproduces meshwork-train's seeded init) and see the same tokens, so the final losses should"
  echo "be close. tokens/s: the steps after step $skip, their tokens over the sum of their step times"
  echo "(Meshwork's from logging.jsonl, the peer's from its own), so torch.compile's first steps are left"
  echo "out of both. MFU: Meshwork's formula (6N + attention FLOPs per token) over the dense bf16 peak"
  echo "meshwork-train uses. Peak memory: the CUDA caching allocator's peak allocated and reserved"
  echo "(Meshwork's from its done line). Meshwork ÷ row: Meshwork's tokens/s over the row's."
  echo "attention: the SDPA kernel each ran (meshwork-train's kernels: line, the peer's sdpa=; both SDPA's own choice)."
  echo "meshwork-train's config: the defaults$([ -z "${MESHWORK_SET:-}" ] || echo ", with $MESHWORK_SET") (with the fused kernels, a bf16 residual stream: training.residual_dtype; the peer keeps Hugging Face's fp32 stream)."
  echo
  echo "| model | batch x seq | trainer | tokens/s | MFU | peak allocated | peak reserved | final loss | attention | Meshwork ÷ row |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$tmp/table.md"
mkdir -p "$(dirname "$out")"

for spec in "${runs[@]}"; do
  IFS='|' read -r name preset batch seq <<<"$spec"
  flops="$("$python" "$peer" --preset "$preset" --seq "$seq" --dry-run | sed -nE 's/.*flops_per_token=([0-9.e+]+).*/\1/p')"
  key="$name-$batch"
  echo "[bench] $name, batch $batch x $seq: meshwork-train" >&2
  run_meshwork "$preset" "$batch" "$seq" "$tmp/$key-mw.log" "$tmp/$key-mw.jsonl" "$flops"
  mw_tps=""
  if [ -z "$result" ]; then
    mw_tps="$tps"
    echo "| $name | $batch x $seq | meshwork-train | $tps | $mfu | $alloc | $reserved | $loss | $attention | 1.00 |" >>"$tmp/table.md"
  else
    echo "| $name | $batch x $seq | meshwork-train | $result | | | | | | |" >>"$tmp/table.md"
    echo "    meshwork-train: $result: $(tail -1 "$tmp/$key-mw.log")" >&2
  fi
  for mode in eager compile; do
    if [ "$mode" = compile ] && [ -n "${COMPILE_FOR+x}" ] && ! grep -qw -- "$key" <<<"$COMPILE_FOR"; then
      echo "| $name | $batch x $seq | PyTorch $mode | not run (COMPILE_FOR) | | | | | | |" >>"$tmp/table.md"
      continue
    fi
    echo "[bench] $name, batch $batch x $seq: PyTorch $mode" >&2
    extra=()
    [ "$mode" = compile ] && extra=(--compile)
    run_peer "$preset" "$batch" "$seq" "$tmp/$key-$mode.log" "${extra[@]}"
    if [ -z "$result" ]; then
      ratio="-"
      [ -n "$mw_tps" ] && ratio="$(awk -v a="$mw_tps" -v b="$tps" 'BEGIN { printf "%.2f", a / b }')"
      echo "| $name | $batch x $seq | PyTorch $mode | $tps | $mfu | $alloc | $reserved | $loss | $attention | $ratio |" >>"$tmp/table.md"
    else
      echo "| $name | $batch x $seq | PyTorch $mode | $result | | | | | | |" >>"$tmp/table.md"
      echo "    PyTorch $mode: $result: $(tail -1 "$tmp/$key-$mode.log")" >&2
    fi
    cp "$tmp/table.md" "$out"
  done
done
cat "$out"
