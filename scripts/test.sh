#!/usr/bin/env bash
# The whole test suite: install and build (scripts/setup.sh), build the CUDA flavor and run its
# unit tests on the CPU against libtorch 2.11 (scripts/cuda-flavor.sh: PyTorch 2.11 + CUDA 13 from
# PyPI into build-cuda/; see docs/gpu.md), then every ctest label of the CPU build (unit,
# integration, e2e). Extra arguments go to the CPU build's ctest, e.g. scripts/test.sh -L unit
#
#   MESHWORK_CUDA_FLAVOR  1 (default): build the CUDA flavor too; 0: skip it
#   MESHWORK_CUDA_UNIT    1 (default): and run its unit tests on the CPU; 0: compile only
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A first run needs about 12 GB on the checkout's disk at its peak (the Go build of the Kubernetes
# components, whose caches are removed after it; then the CUDA flavor's libraries and builds). Say
# so up front: a full disk otherwise shows as a compiler's "no space left on device".
free_kib="$(df -Pk "$root" | awk 'NR == 2 {print $4}')"
echo "[test] $((free_kib / 1024 / 1024)) GiB free on the disk holding $root (a first run needs about 12 GB)"
# Each phase's wall time, so a run that comes close to a time limit says where the time went.
phase_start=$SECONDS
phase_done() {
  echo "[test] $1 took $(((SECONDS - phase_start) / 60)) min $(((SECONDS - phase_start) % 60)) s (total $((SECONDS / 60)) min)"
  phase_start=$SECONDS
}
"$root/scripts/setup.sh"
phase_done "set-up (packages, Kubernetes components, CPU build)"
if [ "${MESHWORK_CUDA_FLAVOR:-1}" != 0 ]; then
  MESHWORK_CUDA_UNIT="${MESHWORK_CUDA_UNIT:-1}" "$root/scripts/cuda-flavor.sh"
  phase_done "the CUDA flavor"
fi
build_dir="${MESHWORK_BUILD_DIR:-$root/build}"
status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@" || status=$?
phase_done "ctest"
exit "$status"
