#!/usr/bin/env bash
# CPU training throughput of `tiny` and the ~100M-parameter `llama-100m` preset on synthetic
# tokens, with peak memory, at 1 and 2 libtorch intra-op threads side by side in one run.
# Writes bench/results/cpu_train_throughput.md. Needs a build (scripts/setup.sh).
# usage: bench/train_throughput.sh [build-dir]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build}/trainer/meshwork-train"
out="$root/bench/results/cpu_train_throughput.md"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# name | preset | seq_len | batch | steps
runs=(
  "tiny|tiny|128|16|40"
  "llama-100m|llama-100m|256|4|6"
)

row() {  # parses the trainer's "done:" line into a table row
  local name="$1" threads="$2" log="$3"
  local line tps mfu peak params
  line="$(grep '^done:' "$log")"
  tps="$(sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' <<<"$line")"
  mfu="$(sed -E 's/.*mfu ([0-9.]+)%.*/\1/' <<<"$line")"
  peak="$(sed -E 's/.*peak mem ([0-9]+ MiB).*/\1/' <<<"$line")"
  params="$(sed -nE 's/^model: [^,]*, ([0-9.]+M) parameters.*/\1/p' "$log")"
  echo "| $name | $params | $threads | $tps | $mfu% | $peak |"
}

{
  echo "# CPU training throughput"
  echo
  echo "Command: \`bench/train_throughput.sh\` ($(date -u +%Y-%m-%d), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB;"
  echo "libtorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?') with BLAS $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 | sed 's|.*/x86_64-linux-gnu/||')."
  echo
  echo "Synthetic tokens, fp32, AdamW. tok/s excludes the first step; MFU is relative to the"
  echo "measured fp32 matmul peak of this CPU (metrics.device_profile=cpu); peak memory is the"
  echo "process's peak RSS."
  echo
  echo "| model | params | intra-op threads | tokens/s | MFU | peak RSS |"
  echo "| --- | --- | --- | --- | --- | --- |"
} >"$tmp/table.md"

for spec in "${runs[@]}"; do
  IFS='|' read -r name preset seq batch steps <<<"$spec"
  for threads in 1 2; do
    log="$tmp/$name-$threads.log"
    echo "[bench] $name, $threads thread(s), $steps steps" >&2
    "$bin" train --set model.preset="$preset" --set data.train=synthetic --set data.seq_len="$seq" \
      --set data.batch_size="$batch" --set schedule.steps="$steps" --set schedule.warmup_steps=1 \
      --set training.threads="$threads" --set metrics.port=-1 --set metrics.device_profile=cpu \
      --set logging.every=1000 >"$log" 2>&1
    row "$name" "$threads" "$log" >>"$tmp/table.md"
    echo "    $(grep '^done:' "$log")" >&2
  done
done
cp "$tmp/table.md" "$out"
cat "$out"
