# The PyPI torch 2.11 that scripts/cuda-flavor.sh unpacks, as a Python to run scripts with on the
# CPU (the peer's check, the transformers check of HF exports). Source it, with skip() and fail()
# defined and $root set; then `pypi_torch_python LAUNCHER [PYTHONPATH_FIRST]` writes LAUNCHER, a
# script that runs that Python with the flavor's packages (PYTHONPATH_FIRST ahead of them), or
# calls skip with the reason where the flavor is absent or incomplete (no CUDA flavor,
# MESHWORK_CUDA_FLAVOR=0; a flavor without its NVIDIA runtime libraries and pure-Python packages,
# MESHWORK_CUDA_UNIT=0). The flavor's cache: site/ (the torch wheel, unpacked whole, and the nvidia/
# libraries it links), runtime/ (the NVIDIA libraries libtorch loads) and python/ (typing_extensions,
# sympy, mpmath: Debian 12's are older than torch 2.11 accepts).
#   MESHWORK_CUDA_CACHE  the flavor's cache, as scripts/cuda-flavor.sh (default: .meshwork/tools/cuda-flavor)
#   PEER_PYTHON          a CPython 3.11 (the wheel's) with numpy (default: /usr/bin/python3, Debian
#                        12's, whose numpy scripts/setup.sh installs; else python3)
# shellcheck shell=bash

pypi_torch_python() {
  local launcher=$1 first=${2:-}
  local cache="${MESHWORK_CUDA_CACHE:-$root/.meshwork/tools/cuda-flavor}"
  local site="$cache/site" runtime="$cache/runtime" python="${PEER_PYTHON:-}"
  if [ -z "$python" ]; then
    python=python3
    [ -x /usr/bin/python3 ] && python=/usr/bin/python3
  fi
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

  # The libraries where scripts/cuda-flavor.sh finds them for its unit tests; set for this Python
  # only (a launcher), not for meshwork-train, which keeps the libtorch it was built against. The
  # flavor's Python packages come ahead of any older copies the system has (numpy is the system's
  # unless PYTHONPATH_FIRST brings one).
  local lib_path="$site/torch/lib:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib" dir
  for dir in "$runtime"/nvidia/*/lib; do lib_path="$lib_path:$dir"; done
  local python_path="$cache/python:$site"
  [ -n "$first" ] && python_path="$first:$python_path"
  printf '#!/bin/sh\nPYTHONPATH=%s LD_LIBRARY_PATH=%s PYTHONNOUSERSITE=1 exec %s "$@"\n' \
    "'$python_path'" "'$lib_path'" "'$python'" >"$launcher"
  chmod +x "$launcher"
  "$launcher" -c 'import numpy' 2>/dev/null ||
    fail "$python has no numpy (Debian's python3-numpy: scripts/setup.sh installs it)"
}
