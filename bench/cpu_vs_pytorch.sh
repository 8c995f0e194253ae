#!/usr/bin/env bash
# One process, one core, side by side: meshwork-train against the PyTorch peer
# (bench/peers/llama_peer.py on the CUDA flavor's PyPI torch, run on the CPU) on the same model,
# initial weights, synthetic rows and optimizer, each pinned to core 0 with one intra-op thread.
# What the kernels and the framework cost without any parallelism: the baseline a CPU comparison
# of a parallel schedule (bench/netlab_pipeline.sh PEER=...) is read against. Runs follow the
# bench protocol (bench/protocol.py): REPEATS interleaved rounds, MEASURED steps per run after SKIP.
# usage: bench/cpu_vs_pytorch.sh [build-dir]
#   env: PRESET=llama-100m  SEQ=128  BATCH=1  REPEATS=5  MEASURED=20  SKIP=2
#        SETS="..." (meshwork-train flags)  OUT=<file> (default bench/results/cpu_vs_pytorch.md)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build}/trainer/meshwork-train"
out="${OUT:-$root/bench/results/cpu_vs_pytorch.md}"
preset=${PRESET:-llama-100m}
seq=${SEQ:-128}
batch=${BATCH:-1}
skip=${SKIP:-2}
read -r -a sets <<<"${SETS:-}"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_protocol_sizes
steps=$((skip + measured))
bench_begin cpu_vs_pytorch
skip() { echo "cpu_vs_pytorch: $*" >&2; exit 77; }
fail() { echo "cpu_vs_pytorch: $*" >&2; exit 1; }
# shellcheck source=bench/peers/pypi_torch.sh
source "$root/bench/peers/pypi_torch.sh"
pypi_torch_python "$tmp/python"

# run_one CONFIG REPEAT: one run, recorded whatever its outcome.
run_one() {
  local config=$1 rep=$2 prefix="$tmp/$1-$2" status=ok
  echo "[cpu-vs-pytorch] round $rep: $config" >&2
  if [ "$config" = meshwork ]; then
    taskset -c 0 "$bin" train --set model.preset="$preset" --set data.train=synthetic --set data.seq_len="$seq" \
      --set data.batch_size="$batch" --set schedule.steps="$steps" --set schedule.warmup_steps=1 \
      --set training.threads=1 --set metrics.port=-1 --set metrics.device_profile=cpu --set logging.every=1000 \
      --set logging.jsonl="$prefix.jsonl" "${sets[@]}" >"$prefix.log" 2>&1 || status=failed
  else
    taskset -c 0 "$tmp/python" "$root/bench/peers/llama_peer.py" --preset "$preset" --batch "$batch" --seq "$seq" \
      --steps "$steps" --warmup 1 --threads 1 --device cpu --dtype fp32 >"$prefix.log" 2>&1 || status=failed
    # Its step lines ("step 3/22 | loss 5.2317 | ... | 812.3 ms") as logging.jsonl's records.
    python3 -c '
import json, re, sys
for line in open(sys.argv[1]):
    m = re.match(r"step (\d+)/\d+ \| loss ([0-9.]+) .*\| ([0-9.]+) ms", line)
    if m:
        print(json.dumps({"step": int(m[1]), "loss": float(m[2]), "step_seconds": float(m[3]) / 1e3}))
' "$prefix.log" >"$prefix.jsonl"
  fi
  [ "$status" = ok ] || tail -n 5 "$prefix.log" >&2
  bench_record "$raw" "$skip" "$prefix.jsonl" "$prefix.log" "$status" --tag config="$config" --tag repeat="$rep" \
    --tag rate=cpu
  [ "$status" = ok ]
}

bench_interleave run_one meshwork pytorch
{
  python3 "$root/bench/protocol.py" title "$raw" "One process on one core: meshwork-train against PyTorch" --group config
  echo
  bench_command_line "bench/cpu_vs_pytorch.sh" "$root" PRESET SEQ BATCH REPEATS MEASURED SKIP SETS
  echo
  echo "Machine: $(bench_machine), libtorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?') (BLAS"
  echo "$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 | sed 's|.*/x86_64-linux-gnu/||')) for meshwork-train; the peer on torch"
  echo "$("$tmp/python" -c 'import torch; print(torch.__version__)') (PyPI, its own BLAS). Each process pinned to core 0, one intra-op thread;"
  echo "$preset, $batch row(s) of $seq tokens a step, synthetic tokens, fp32, AdamW; the same initial weights"
  echo "and rows (bench/peers/README.md). Figures over steps $((skip + 1))-$steps of each run, the median step;"
  echo "each cell the median [min, max] over the runs."
  echo
  python3 "$root/bench/protocol.py" table "$raw" --group config
  echo
  python3 "$root/bench/protocol.py" paired "$raw" --by rate --base meshwork --other pytorch
  echo
  python3 "$root/bench/protocol.py" losses "$raw" --base meshwork --other pytorch
} >"$tmp/table.md"
bench_write_results cpu-vs-pytorch
