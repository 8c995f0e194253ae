#!/usr/bin/env bash
# The whole test suite: install and build (scripts/setup.sh), compile and link the CUDA flavor
# (scripts/cuda-flavor.sh: PyTorch 2.11 + CUDA 13 from PyPI into build-cuda/, nothing run; see
# docs/gpu.md), then every ctest label of the CPU build (unit, integration, e2e). Extra arguments
# go to ctest, e.g. scripts/test.sh -L unit
#
#   MESHWORK_CUDA_FLAVOR  1 (default): compile the CUDA flavor too; 0: skip it
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
if [ "${MESHWORK_CUDA_FLAVOR:-1}" != 0 ]; then
  "$root/scripts/cuda-flavor.sh"
fi
build_dir="${MESHWORK_BUILD_DIR:-$root/build}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
