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
"$root/scripts/setup.sh"
if [ "${MESHWORK_CUDA_FLAVOR:-1}" != 0 ]; then
  MESHWORK_CUDA_UNIT="${MESHWORK_CUDA_UNIT:-1}" "$root/scripts/cuda-flavor.sh"
fi
build_dir="${MESHWORK_BUILD_DIR:-$root/build}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
