#!/usr/bin/env bash
# Everything a short GPU lease is for, in one command on the GPU machine, from the CUDA flavor
# built on the CPU machine (scripts/cuda-flavor.sh && scripts/gpu-prebuilt.sh pack, the folder
# carried): the gpu tests, bench/gpu_vs_pytorch.sh, the A/Bs below, a profile (training.profile_out) and a
# compiled-FSDP trace (--trace-out) of llama3-1b at batch 4 x 2048, and the table's Meshwork row
# again with each attention kernel alone (training.attention_backend=flash and =cudnn: which
# is faster here, whichever SDPA picks by itself), with
# training.loss_gradient=recompute (the head's old backward) and with
# training.merge_projections=false (one GEMM per projection), with data.document_masking=true (the
# attention mask of packed documents: SDPA off FlashAttention), with training.fused_kernels=off (the
# composition instead of Meshwork's SwiGLU and RoPE kernels), with optimizer.implementation=fused
# (libtorch's AdamW kernel instead of Meshwork's) and with training.weight_copies=off (every weight
# cast each forward), for the A/Bs; then llama3-1b at
# larger batches until one does not fit. If the gpu test of those
# kernels fails, every later run takes training.fused_kernels=off (optimizer.implementation=fused
# where Meshwork's AdamW kernel is what failed, training.weight_copies=off where the weight
# copies are), and the log says so. Each part has a
# time cap, so that a lease that runs short still returns what finished. docs/gpu.md.
#
#   OUT          where session.log, the results table, the traces (.json.gz) and logs.tgz go
#                (default: a new folder under /tmp)
#   TEST_CAP=90 BENCH_CAP=420 AB_CAP=45 PROFILE_CAP=60 TRACE_CAP=60   seconds for each part (on an
#                H200 on 2026-11-27: the gpu tests took 17 s, each A/B 16 s, the profile 15 s, the
#                trace 16 s, a bench run 20-30 s and a model's first torch.compile 60-100 s more).
#                The bench runs four trainers a configuration REPEATS times: by those figures about
#                6 minutes for llama3-1b-4 at 3 repeats, 15-20 for its three configurations (not yet
#                measured). BENCH_CAP stops it where it is (the table keeps every finished run, each
#                row's n says how many): size it with CONFIGS and REPEATS
#   SESSION_CAP=570  seconds for the whole session (the device tool's 600 s a call, less packing):
#                    a part gets what is left when that is less than its cap, and is skipped (said in
#                    the log) when under 20 s are left
#   REPEATS CONFIGS TRAINERS COMPILE_FOR   passed to bench/gpu_vs_pytorch.sh (its header says what
#                each does; e.g. CONFIGS=llama3-1b-4 REPEATS=3 for the issue's target alone)
#   FIT_BATCHES="16 24" FIT_CAP=45   llama3-1b batches past the table's, run until one fails (out
#                of memory), for MFU at the batch that fits (issue 18's moonshot)
#   AB_LIST      the A/B settings, each KEY=VALUE run once (default: the seven above; the fp32
#                residual stream is a row of the bench's table, repeated); a lease too short for all
#                names the one it needs
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$(mktemp -d /tmp/gpu-session-XXXXXX)}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
run=(scripts/gpu-prebuilt.sh run)
pre=.meshwork/gpu-prebuilt
bin="$pre/trainer/meshwork-train"
log="$out/session.log"
t0=$SECONDS
stamp() { echo "=== [$((SECONDS - t0)) s] $*" | tee -a "$log"; }
deadline=$((SECONDS + ${SESSION_CAP:-570}))
# cap PART_CAP: prints PART_CAP or the seconds left before the deadline, whichever is less; fails
# (after logging it) when under 20 s are left.
cap() {
  local left=$((deadline - SECONDS))
  if ((left < 20)); then stamp "skipped: ${left} s left of SESSION_CAP"; return 1; fi
  echo $(($1 < left ? $1 : left))
}

stamp "start: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
if ! "${run[@]}" "$bin" devices --require-cuda 2>&1 | tee -a "$log"; then
  stamp "the prebuilt meshwork-train does not run here; libraries it misses:"
  "${run[@]}" ldd "$bin" 2>&1 | grep 'not found' | tee -a "$log"
  exit 1
fi

stamp "ctest -L gpu"
timeout -k 5 "$(cap "${TEST_CAP:-90}")" "${run[@]}" ctest --test-dir "$pre/tests/gpu" -L gpu -j4 --output-on-failure \
  >"$out/ctest.log" 2>&1
echo "ctest exit $?" | tee -a "$log"
grep -E "tests passed|Failed|\*\*\*" "$out/ctest.log" | tee -a "$log"
# Kernels that fail their equality test must not run the benchmarks: the composition does instead.
# Meshwork's AdamW kernel failing alone (its cases are named MeshworkAdamW*) turns off only it:
# libtorch's fused AdamW instead; the weight copies' case (WeightCopies*) only the copies.
sets=()
if grep -qE "gpu_fused_ops .*(Failed|Exception|Timeout)" "$out/ctest.log"; then
  grep -E "^\[  FAILED  \]|Failure" "$out/ctest.log" | head -20 | tee -a "$log"
  off=()
  grep -E "^\[  FAILED  \] FusedOpsGpu\.MeshworkAdamW" "$out/ctest.log" >/dev/null && off+=(optimizer.implementation=fused)
  grep -E "^\[  FAILED  \] FusedOpsGpu\.WeightCopies" "$out/ctest.log" >/dev/null && off+=(training.weight_copies=off)
  grep -E "^\[  FAILED  \] FusedOpsGpu\." "$out/ctest.log" | grep -vqE "MeshworkAdamW|WeightCopies" &&
    off+=(training.fused_kernels=off)
  [ "${#off[@]}" -gt 0 ] || off=(training.fused_kernels=off optimizer.implementation=fused)  # crashed: no names
  stamp "gpu_fused_ops failed: every run below takes ${off[*]}"
  for kv in "${off[@]}"; do sets+=(--set "$kv"); done
  export MESHWORK_SET="${off[*]}"
fi

stamp "bench/gpu_vs_pytorch.sh"
c=$(cap "${BENCH_CAP:-420}") && LOGS="$out/bench" RUN_TIMEOUT="${RUN_TIMEOUT:-150}" timeout -k 5 "$c" \
  "${run[@]}" bench/gpu_vs_pytorch.sh "$pre" >"$out/bench.log" 2>&1
echo "bench exit $?" | tee -a "$log"
cp bench/results/gpu_vs_pytorch.md "$out/" 2>/dev/null && cat "$out/gpu_vs_pytorch.md" | tee -a "$log"

# data.document_separator is read only under data.document_masking (one of the A/Bs: the mask's cost).
one_b=(--set model.preset=llama3-1b --set data.train=synthetic --set data.seq_len=2048 --set data.batch_size=4
       --set training.device=cuda --set training.dtype=bf16 --set metrics.port=-1 --set logging.every=1
       --set data.document_separator=1 "${sets[@]}")
for ab in ${AB_LIST:-optimizer.implementation=fused training.weight_copies=off training.attention_backend=flash training.attention_backend=cudnn training.loss_gradient=recompute training.merge_projections=false training.fused_kernels=off data.document_masking=true}; do
  stamp "A/B: llama3-1b batch 4 with $ab (the table's row has the defaults)"
  c=$(cap "${AB_CAP:-45}") && timeout -k 5 "$c" "${run[@]}" "$bin" train "${one_b[@]}" --set schedule.steps=8 --set "$ab" \
    >"$out/ab-${ab#training.}-llama3-1b.log" 2>&1
  echo "$ab exit $?" | tee -a "$log"
  grep -E '^(device:|kernels:|step [5-8]/|done|meshwork-train: error)' "$out/ab-${ab#training.}-llama3-1b.log" | tee -a "$log"
done

# The issue's moonshot is MFU at the batch that fits: llama3-1b at larger batches (the table stops
# at 8), smallest first, until one runs out of memory.
for b in ${FIT_BATCHES:-16 24}; do
  stamp "batch that fits: llama3-1b batch $b x 2048, the defaults"
  c=$(cap "${FIT_CAP:-45}") || break
  timeout -k 5 "$c" "${run[@]}" "$bin" train "${one_b[@]}" --set data.batch_size="$b" --set schedule.steps=8 \
    >"$out/fit-b$b-llama3-1b.log" 2>&1
  rc=$?
  echo "batch $b exit $rc" | tee -a "$log"
  grep -E '^(step [5-8]/|done)' "$out/fit-b$b-llama3-1b.log" | tee -a "$log"
  ((rc == 0)) || break
done

stamp "profile: llama3-1b batch 4, steps 3-5"
c=$(cap "${PROFILE_CAP:-60}") && timeout -k 5 "$c" "${run[@]}" "$bin" train "${one_b[@]}" --set schedule.steps=6 \
  --set training.profile_steps=3 --profile-out "$out/profile-llama3-1b.json" >"$out/profile-llama3-1b.log" 2>&1
echo "profile exit $?" | tee -a "$log"
grep -E '^(profile|kernels):' "$out/profile-llama3-1b.log" | tee -a "$log"

stamp "compiled FSDP on one rank (NCCL), llama3-1b batch 4: plan and trace of step 3"
c=$(cap "${TRACE_CAP:-60}") && timeout -k 5 "$c" "${run[@]}" "$bin" train "${one_b[@]}" --set schedule.steps=8 \
  --set fsdp.single_process=true --set fsdp.mode=compiled --trace-out "$out/trace-llama3-1b-compiled.json" \
  >"$out/fsdp-compiled-llama3-1b.log" 2>&1
echo "fsdp compiled exit $?" | tee -a "$log"
grep -E '^(compiled plan|done)' "$out/fsdp-compiled-llama3-1b.log" | tee -a "$log"
# Few files back (the device tool returns 8 at most, 16 MiB each): the traces gzipped (Perfetto
# opens .json.gz), every log in one archive.
gzip -f "$out"/*.json 2>/dev/null
(cd "$out" && tar czf logs.tgz ctest.log bench.log bench ./*-llama3-1b.log 2>/dev/null &&
  rm -rf ctest.log bench.log bench ./*-llama3-1b.log)
stamp "end: $out"
