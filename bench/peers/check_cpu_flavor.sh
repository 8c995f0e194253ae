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
cache="${MESHWORK_CUDA_CACHE:-$root/.meshwork/tools/cuda-flavor}"
site="$cache/site" runtime="$cache/runtime"
python="${PEER_PYTHON:-}"
if [ -z "$python" ]; then
  python=python3
  [ -x /usr/bin/python3 ] && python=/usr/bin/python3
fi

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "[peer] error: $*" >&2; exit 1; }

[ -x "$bin" ] || fail "no meshwork-train at $bin"
[ -f "$site/torch/lib/libtorch.so" ] ||
  skip "no PyPI torch 2.11 under $site: scripts/cuda-flavor.sh unpacks it (scripts/test.sh runs it unless MESHWORK_CUDA_FLAVOR=0)"
[ -f "$site/torch/__init__.py" ] ||
  skip "$site/torch has libtorch but not torch's Python package, which scripts/cuda-flavor.sh unpacks with the whole wheel: run it again"
compgen -G "$runtime/nvidia/*/lib" >/dev/null ||
  skip "no NVIDIA runtime libraries under $runtime: importing the PyPI torch loads libtorch_cuda.so and what it links (cuBLAS, cuDNN, ...), even on the CPU; MESHWORK_CUDA_UNIT=1 scripts/cuda-flavor.sh unpacks them"
[ -f "$cache/python/.unpacked" ] ||
  skip "no pure-Python packages for torch under $cache/python (typing_extensions, sympy, mpmath): MESHWORK_CUDA_UNIT=1 scripts/cuda-flavor.sh unpacks them"
command -v "$python" >/dev/null || skip "no $python to run the peer"
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
  skip "$python is Python $("$python" -c 'import sys; print(*sys.version_info[:2], sep=".")'), the flavor's torch is CPython 3.11's (set PEER_PYTHON)"

# The libraries where scripts/cuda-flavor.sh finds them for its unit tests; set for the peer only
# (a launcher), not for meshwork-train, which keeps the libtorch it was built against. The
# flavor's Python packages come ahead of any older copies the system has (numpy is the system's).
lib_path="$site/torch/lib:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib"
for dir in "$runtime"/nvidia/*/lib; do lib_path="$lib_path:$dir"; done
python_path="$cache/python:$site"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/python" <<EOF
#!/bin/sh
PYTHONPATH='$python_path' LD_LIBRARY_PATH='$lib_path' PYTHONNOUSERSITE=1 exec '$python' "\$@"
EOF
chmod +x "$work/python"

"$work/python" -c 'import numpy' 2>/dev/null ||
  fail "$python has no numpy (Debian's python3-numpy: scripts/setup.sh installs it)"
if ! version="$("$work/python" -c 'import torch; print(torch.__version__)' 2>"$work/import.log")"; then
  tail -5 "$work/import.log" >&2
  fail "the flavor's torch under $site does not import with $python (above)"
fi
echo "[peer] torch $version from $site, $python"
"$root/bench/peers/check_cpu.sh" "$work/python" "$bin"
