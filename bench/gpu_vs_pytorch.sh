#!/usr/bin/env bash
# meshwork-train next to a PyTorch peer of the same model (bench/peers/llama_peer.py) on one GPU,
# side by side in one run: llama3-1b at batch 4 and 8 x 2048 and llama-100m at batch 16 x 2048,
# bf16 autocast over fp32 weights, synthetic tokens (the peer reproduces Meshwork's tokens and
# initial weights exactly). Four trainers each: meshwork-train with its defaults (a bf16 residual
# stream), meshwork-train with training.residual_dtype=fp32 (the peer's fp32 stream), the peer
# eager and the peer under torch.compile (model and loss compiled as one region). Every trainer
# runs REPEATS times, alternating (meshwork, peer eager, meshwork fp32, peer compile, then again),
# all with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (meshwork-train's default). Records the
# median steady tokens/s with its min and max, MFU in two attention conventions, peak memory and
# the final loss; a trainer that runs out of memory is recorded as OOM and not repeated.
# Writes bench/results/gpu_vs_pytorch.md. Needs a GPU, a CUDA build of meshwork-train
# (scripts/gpu-build.sh) and a python3 with a CUDA torch and numpy.
# usage: bench/gpu_vs_pytorch.sh [build-dir]   (default: build-gpu/ if it has meshwork-train, else build/)
#   PYTHON=python3  STEPS=20  SKIP=2 (steps left out of tokens/s)  LR=3e-4  RUN_TIMEOUT=900 (s per run)
#   REPEATS=3       runs of each trainer in each configuration, alternating
#   CONFIGS="llama3-1b-4 llama-100m-16 llama3-1b-8"   NAME-BATCH of the configurations, run in this
#                   order (each one's repeats before the next)
#   TRAINERS="meshwork peer-eager meshwork-fp32 peer-compile"   which trainers, in the order each
#                   repeat runs them (the table's rows keep their own order)
#   COMPILE_FOR="llama3-1b-4 ..."   NAME-BATCH of the configurations whose torch.compile peer runs
#                   (default all; a row left out says so): compiling takes 1-2 minutes a model, less
#                   on a repeat (Inductor's caches)
#   LOGS=DIR (every run's log and JSONL are written there and kept)
#   MESHWORK_SET="key=value ..." (config overrides for every meshwork-train run, named in the table's
#   header; e.g. training.fused_kernels=off)
#   PYTORCH_CUDA_ALLOC_CONF   a value of your own replaces expandable_segments:True for both
# The table is rewritten after every run, so a run cut short still leaves what it finished (a row's
# n says how many repeats it has).
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
repeats="${REPEATS:-3}"
configs="${CONFIGS:-llama3-1b-4 llama-100m-16 llama3-1b-8}"
trainers="${TRAINERS:-meshwork peer-eager meshwork-fp32 peer-compile}"
out="$root/bench/results/gpu_vs_pytorch.md"
# Both trainers' caching allocators: meshwork-train sets this itself when it is unset, the peer too;
# exported here so that the table's header names what both ran with.
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
if [ -n "${LOGS:-}" ]; then
  tmp="$LOGS"
  mkdir -p "$tmp"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
fi

die() { echo "[gpu_vs_pytorch] error: $1" >&2; exit "${2:-1}"; }
no_gpu() { die "no GPU: $1; this benchmark needs one CUDA device (nothing was written)" 5; }

# name | preset | batch | seq_len, by NAME-BATCH: the issue's two targets first (llama3-1b at
# batch 4 against torch.compile, llama-100m against eager), so that a lease cut short has them.
declare -A specs=(
  [llama3-1b-4]="llama3-1b|llama3-1b|4|2048"
  [llama-100m-16]="llama-100m|llama-100m|16|2048"
  [llama3-1b-8]="llama3-1b|llama3-1b|8|2048"
)
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || die "REPEATS=$repeats: a whole number >= 1" 2
for key in $configs; do
  [ -n "${specs[$key]+x}" ] || die "CONFIGS: unknown configuration '$key' (known: ${!specs[*]})" 2
done
for trainer in $trainers; do
  case "$trainer" in meshwork | meshwork-fp32 | peer-eager | peer-compile) ;;
    *) die "TRAINERS: unknown trainer '$trainer' (meshwork, meshwork-fp32, peer-eager, peer-compile)" 2 ;;
  esac
done

# --- preconditions: a GPU first, so a CPU machine gets the one message that matters ------------
command -v nvidia-smi >/dev/null || no_gpu "nvidia-smi is not installed"
nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi sees no device ($(nvidia-smi -L 2>&1 | head -1))"
[ -x "$bin" ] || die "no meshwork-train at $bin: build the CUDA flavor (scripts/gpu-build.sh) or name the build folder"
"$python" -c 'import numpy, torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  no_gpu "$python has no CUDA torch (and numpy), or its torch sees no device: set PYTHON"
"$bin" devices --require-cuda >"$tmp/devices.txt" 2>&1 ||
  no_gpu "$bin sees no CUDA device: is it the CPU flavor? build the CUDA one with scripts/gpu-build.sh"

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

# percent TPS FLOPS_PER_TOKEN PEAK_TFLOPS: MFU in percent, two decimals ("-" without a peak).
percent() {
  awk -v t="$1" -v f="$2" -v p="$3" 'BEGIN { if (p > 0) printf "%.2f", 100 * t * f / (p * 1e12); else printf "-" }'
}

# One run of meshwork-train (MODE default or fp32: training.residual_dtype=fp32). Sets result
# (empty when it ran) and tps, mfu, mfu_causal, alloc, reserved (GiB), loss, attention.
run_meshwork() {
  local mode="$1" preset="$2" batch="$3" seq="$4" log="$5" jsonl="$6" rc=0
  local residual=()
  [ "$mode" = fp32 ] && residual=(--set training.residual_dtype=fp32)
  timeout "$run_timeout" "$bin" train --set model.preset="$preset" --set data.train=synthetic \
    --set data.seq_len="$seq" --set data.batch_size="$batch" --set schedule.steps="$steps" \
    --set optimizer.lr="$lr" --set training.device=cuda --set training.dtype=bf16 \
    --set metrics.port=-1 --set logging.every=1 --set logging.jsonl="$jsonl" "${extra_sets[@]}" \
    "${residual[@]}" >"$log" 2>&1 || rc=$?
  result=""
  if [ "$rc" != 0 ]; then result="$(failure "$log" "$rc")"; return; fi
  grep -q '^done:' "$log" || { result="no done: line in its log"; return; }
  parse_run "$log"
  local peak_tflops reserved_mib
  peak_tflops="$(sed -nE 's/.*mfu vs ([0-9.]+) TFLOP\/s.*/\1/p' "$log")"
  tps="$(steady_tps "$jsonl" $((batch * seq)) || true)"  # none: recorded as a failed run below
  mfu="$(percent "$tps" "$flops" "$peak_tflops")"
  mfu_causal="$(percent "$tps" "$flops_causal" "$peak_tflops")"
  alloc="$(awk -v m="${peak% MiB}" 'BEGIN { printf "%.2f", m / 1024 }')" reserved="-"
  reserved_mib="$(sed -nE 's/.*reserved peak ([0-9]+) MiB.*/\1/p' <<<"$done_line")"
  [ -z "$reserved_mib" ] || reserved="$(awk -v m="$reserved_mib" 'BEGIN { printf "%.2f", m / 1024 }')"
  loss="$(sed -E 's/.*final loss ([0-9.]+).*/\1/' <<<"$done_line")"
  attention="$(sed -nE 's/^kernels: attention ([a-z_]+).*/\1/p' "$log")"
  residual_stream="$(sed -nE 's/^device:.*[ (]([a-z0-9]+) residual stream.*/\1/p' "$log")"
}

# peer_field LINE KEY: the value of KEY=VALUE in the peer's summary line.
peer_field() { sed -nE "s|.* $2=([^ ]+).*|\1|p" <<<"$1"; }

# One run of the peer (MODE eager or compile); sets what run_meshwork sets.
run_peer() {
  local mode="$1" preset="$2" batch="$3" seq="$4" log="$5" rc=0
  local compile=()
  [ "$mode" = compile ] && compile=(--compile)
  timeout "$run_timeout" "$python" "$peer" --preset "$preset" --batch "$batch" --seq "$seq" \
    --steps "$steps" --lr "$lr" --device cuda --dtype bf16 --skip "$skip" "${compile[@]}" \
    >"$log" 2>&1 || rc=$?
  result=""
  if [ "$rc" != 0 ]; then result="$(failure "$log" "$rc")"; return; fi
  local line
  line="$(grep '^peer:' "$log" || true)"
  [ -n "$line" ] || { result="no peer: line in its log"; return; }
  tps="$(peer_field "$line" 'tok/s')" loss="$(peer_field "$line" final_loss)"
  mfu="$(peer_field "$line" mfu)" mfu_causal="$(peer_field "$line" mfu_causal)"
  mfu="${mfu%\%}" mfu_causal="${mfu_causal%\%}"
  alloc="$(peer_field "$line" peak_alloc_gib)" reserved="$(peer_field "$line" peak_reserved_gib)"
  attention="$(peer_field "$line" sdpa)" residual_stream=fp32
}

# The runs so far, one a line, tab-separated: key name batch seq trainer repeat result tps mfu
# mfu_causal alloc reserved loss attention residual_stream (result "ok" or why not).
runs="$tmp/runs.tsv"
: >"$runs"
record() {
  printf '%s\t' "$key" "$name" "$batch" "$seq" "$trainer" "$r" "${result:-ok}" "${tps:--}" \
    "${mfu:--}" "${mfu_causal:--}" "${alloc:--}" "${reserved:--}" "${loss:--}" "${attention:--}" >>"$runs"
  printf '%s\n' "${residual_stream:--}" >>"$runs"
}

# render: the table's rows from the runs so far: one a configuration and trainer, in the order
# meshwork-train, its fp32-stream row, PyTorch eager, PyTorch compile.
render() {
  "$python" - "$runs" "$repeats" "$configs" "$trainers" "${COMPILE_FOR-__all__}" <<'EOF'
import statistics, sys
path, repeats, configs, trainers, compile_for = sys.argv[1:6]
rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
label = {"meshwork": "meshwork-train", "meshwork-fp32": "meshwork-train, residual fp32",
         "peer-eager": "PyTorch eager", "peer-compile": "PyTorch compile"}
order = [t for t in label if t in trainers.split()]

def number(text):
    try:
        return float(text)
    except ValueError:  # "-": not in that run's log
        return None

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None

def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else fmt.format(lo) + "-" + fmt.format(hi)

def largest(gib):
    gib = [v for v in gib if v is not None]
    return f"{max(gib):.2f} GiB" if gib else "-"

for key in configs.split():
    mine = [r for r in rows if r[0] == key]
    if not mine:
        continue
    name, batch, seq = mine[0][1:4]
    medians = {}
    lines = []
    for trainer in order:
        if (trainer == "peer-compile" and compile_for != "__all__"
                and key not in compile_for.split()):
            lines.append(f"| {name} | {batch} x {seq} | {label[trainer]} | not run (COMPILE_FOR) |"
                         + " |" * 10)
            continue
        runs = [r for r in mine if r[4] == trainer]
        if not runs:
            continue
        ok = [r for r in runs if r[6] == "ok"]
        failed = [r[6] for r in runs if r[6] != "ok"]
        if not ok:
            lines.append(f"| {name} | {batch} x {seq} | {label[trainer]} | {failed[0]} |" + " |" * 10)
            continue
        tps = [float(r[7]) for r in ok]
        medians[trainer] = statistics.median(tps)
        n = f"{len(ok)}/{repeats}" + (f" ({failed[0]})" if failed else "")
        mfu = median(number(r[8]) for r in ok)
        mfu_causal = median(number(r[9]) for r in ok)
        alloc = [number(r[10]) for r in ok]
        reserved = [number(r[11]) for r in ok]
        losses = [number(r[12]) for r in ok]
        cells = [name, f"{batch} x {seq}", label[trainer], f"{medians[trainer]:.0f}",
                 f"{min(tps):.0f}-{max(tps):.0f}", n,
                 "-" if mfu is None else f"{mfu:.1f}%",
                 "-" if mfu_causal is None else f"{mfu_causal:.1f}%",
                 largest(alloc), largest(reserved), spread(losses, "{:.4f}"), ok[0][13], ok[0][14]]
        lines.append((trainer, "| " + " | ".join(cells) + " |"))
    base = medians.get("meshwork")
    for line in lines:
        if isinstance(line, str):
            print(line)
            continue
        trainer, text = line
        ratio = f"{base / medians[trainer]:.2f}" if base else "-"
        print(f"{text} {ratio} |")
EOF
}

gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
torch_version="$("$python" -c 'import torch; print(torch.__version__)')"
{
  echo "# meshwork-train vs PyTorch on one GPU"
  echo
  bench_command_line bench/gpu_vs_pytorch.sh "$root"
  echo "Settings: REPEATS=$repeats STEPS=$steps SKIP=$skip TRAINERS=\"$trainers\"${COMPILE_FOR+ COMPILE_FOR=\"$COMPILE_FOR\"}."
  echo
  echo "Machine: $gpu (name, memory, driver); host $(bench_machine). PyTorch $torch_version for the"
  echo "peer; meshwork-train: $(head -1 "$tmp/devices.txt")."
  echo
  echo "One GPU, one process, bf16 autocast over fp32 weights, fused AdamW in the peer, no activation"
  echo "checkpointing, synthetic tokens, $steps steps at lr $lr, PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF"
  echo "for both. Both start from the same weights (the peer reproduces meshwork-train's seeded init) and"
  echo "see the same tokens, so the final losses should be close. Each trainer ran $repeats times, the trainers"
  echo "alternating within each repeat (in the order $trainers). tokens/s: the steps after step $skip,"
  echo "their tokens over the sum of their step times (Meshwork's from logging.jsonl, the peer's from its"
  echo "own), so torch.compile's first steps are left out of both; the median of the repeats, then their"
  echo "min-max; n: the repeats that ran. MFU (median): Meshwork's formula, 6N + 12·layers·hidden·seq"
  echo "FLOPs a token (every attention score counted), over the dense bf16 peak meshwork-train uses; MFU"
  echo "causal: the attention term halved (6·layers·hidden·seq: only the scores the causal mask keeps),"
  echo "as llm.c counts. Peak memory: the CUDA caching allocator's peak allocated and reserved, the"
  echo "largest over the repeats (Meshwork's from its done line). Final loss: over the repeats."
  echo "attention: the SDPA kernel each ran (meshwork-train's kernels: line, the peer's sdpa=; both SDPA's"
  echo "own choice). stream: the residual stream's dtype (meshwork-train's device: line; the peer's is"
  echo "Hugging Face's fp32). Meshwork ÷ row: meshwork-train's median tokens/s (its defaults) over the row's."
  echo "The PyTorch compile row compiles the model and the loss (final norm, head, cross-entropy) as one"
  echo "region. meshwork-train's config: the defaults$([ -z "${MESHWORK_SET:-}" ] || echo ", with $MESHWORK_SET") (with the fused kernels, a bf16 residual stream), and in the residual fp32 rows training.residual_dtype=fp32."
  echo
  echo "| model | batch x seq | trainer | tokens/s | min-max | n | MFU | MFU causal | peak allocated | peak reserved | final loss | attention | stream | Meshwork ÷ row |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$tmp/head.md"
mkdir -p "$(dirname "$out")"

for key in $configs; do
  IFS='|' read -r name preset batch seq <<<"${specs[$key]}"
  dry="$("$python" "$peer" --preset "$preset" --seq "$seq" --dry-run)"
  flops="$(sed -nE 's/.*flops_per_token=([0-9.e+]+).*/\1/p' <<<"$dry")"
  flops_causal="$(sed -nE 's/.*flops_per_token_causal=([0-9.e+]+).*/\1/p' <<<"$dry")"
  declare -A stopped=()  # trainers that failed in this configuration: not repeated
  for ((r = 1; r <= repeats; r++)); do
    for trainer in $trainers; do
      [ -z "${stopped[$trainer]+x}" ] || continue
      if [ "$trainer" = peer-compile ] && [ -n "${COMPILE_FOR+x}" ] && ! grep -qw -- "$key" <<<"$COMPILE_FOR"; then
        continue
      fi
      echo "[bench] $name, batch $batch x $seq: $trainer, repeat $r/$repeats" >&2
      log="$tmp/$key-$trainer-r$r.log"
      tps="" mfu="" mfu_causal="" alloc="" reserved="" loss="" attention="" residual_stream=""
      case "$trainer" in
        meshwork) run_meshwork default "$preset" "$batch" "$seq" "$log" "$tmp/$key-$trainer-r$r.jsonl" ;;
        meshwork-fp32) run_meshwork fp32 "$preset" "$batch" "$seq" "$log" "$tmp/$key-$trainer-r$r.jsonl" ;;
        peer-eager) run_peer eager "$preset" "$batch" "$seq" "$log" ;;
        peer-compile) run_peer compile "$preset" "$batch" "$seq" "$log" ;;
      esac
      [ -n "$result" ] || [[ "$tps" =~ ^[0-9.]+$ ]] || result="no tokens/s from its log"
      if [ -n "$result" ]; then
        stopped[$trainer]=1
        echo "    $trainer: $result: $(tail -1 "$log")" >&2
      fi
      record
      { cat "$tmp/head.md"; render; } >"$tmp/table.md"
      cp "$tmp/table.md" "$out"
    done
  done
  unset stopped
done
cat "$out"
