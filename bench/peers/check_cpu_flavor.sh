#!/usr/bin/env bash
# check_cpu.sh as a ctest test (tests/integration: llama_peer_same_losses): the PyTorch peer under
# the PyPI torch 2.11 that scripts/cuda-flavor.sh unpacks, against a meshwork-train binary, so that
# the peer the GPU benchmark uses cannot drift from the model it is compared with. Where that torch
# cannot be imported (no CUDA flavor, MESHWORK_CUDA_FLAVOR=0; a flavor without its NVIDIA runtime
# libraries and pure-Python packages, MESHWORK_CUDA_UNIT=0) it prints SKIPPED and why, and exits
# 77 (ctest: Skipped). The flavor's cache: site/ (the torch wheel, unpacked whole, and the nvidia/
# libraries it links), runtime/ (the NVIDIA libraries libtorch loads) and python/ (typing_extensions,
# sympy, mpmath: Debian 12's are older than torch 2.11 accepts).
# usage: bench/peers/check_cpu_flavor.sh MESHWORK_TRAIN
#   MESHWORK_CUDA_CACHE  the flavor's cache, as scripts/cuda-flavor.sh (default: .meshwork/tools/cuda-flavor)
#   PEER_PYTHON          a CPython 3.11 (the wheel's) with numpy (default: /usr/bin/python3, Debian
#                        12's, whose numpy scripts/setup.sh installs; else python3)
#   STEPS=10 TOL=1e-4 KEEP=1   passed to check_cpu.sh
set -euo pipefail

[ $# -eq 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
bin="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "[peer] error: $*" >&2; exit 1; }
[ -x "$bin" ] || fail "no meshwork-train at $bin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=bench/peers/pypi_torch.sh
source "$root/bench/peers/pypi_torch.sh"
pypi_torch_python "$work/python"
if ! version="$("$work/python" -c 'import torch; print(torch.__version__)' 2>"$work/import.log")"; then
  tail -5 "$work/import.log" >&2
  fail "the CUDA flavor's torch does not import (above)"
fi
echo "[peer] torch $version (the CUDA flavor's, bench/peers/pypi_torch.sh)"
"$root/bench/peers/check_cpu.sh" "$work/python" "$bin"
