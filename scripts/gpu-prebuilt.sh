#!/usr/bin/env bash
# The CUDA flavor that CI compiles on the CPU machine (scripts/cuda-flavor.sh -> build-cuda/),
# taken to a GPU machine and run there without building it again (a GPU machine's time is short;
# scripts/gpu-build.sh builds there from scratch instead). Two verbs:
#
#   scripts/gpu-prebuilt.sh pack          CPU machine: copies meshwork-train, the gpu test
#                                         executable, the gpu tests' CTest file (paths made
#                                         relative) and the two Debian libraries meshwork-train
#                                         links besides libtorch (yaml-cpp, prometheus-cpp-core)
#                                         into one folder laid out like a build folder (43 MiB on 2026-12-04: the
#                                         kernels' code for 3 GPU architectures)
#   scripts/gpu-prebuilt.sh run CMD...    GPU machine: runs CMD with LD_LIBRARY_PATH set to the
#                                         carried libraries, then the machine's own torch, CUDA
#                                         runtime and NCCL (from its python3's site-packages),
#                                         and the CTest file pointed at this checkout
#
#   MESHWORK_GPU_PREBUILT    the folder (default: .meshwork/gpu-prebuilt); carry it to the GPU
#   MESHWORK_CUDA_BUILD_DIR  what pack copies from (default: build-cuda)
#   PYTHON                   the GPU machine's python3 with torch (default: python3)
#
# e.g. on the GPU machine, from the checkout's root:
#   scripts/gpu-prebuilt.sh run ctest --test-dir .meshwork/gpu-prebuilt/tests/gpu -L gpu -j4
#   scripts/gpu-prebuilt.sh run bench/gpu_vs_pytorch.sh .meshwork/gpu-prebuilt
# The binaries were linked against PyPI's torch==2.11.0 (CUDA 13.0) and NCCL 2.28.9: the machine's
# torch must be that version (checked). docs/gpu.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prebuilt="${MESHWORK_GPU_PREBUILT:-$root/.meshwork/gpu-prebuilt}"
build_dir="${MESHWORK_CUDA_BUILD_DIR:-$root/build-cuda}"
python="${PYTHON:-python3}"
torch_version=2.11.0

log() { echo "[gpu-prebuilt] $*" >&2; }
die() { echo "[gpu-prebuilt] error: $*" >&2; exit 1; }

pack() {
  local bin="$build_dir/trainer/meshwork-train" test_bin="$build_dir/tests/gpu/fused_ops_gpu_test"
  [ -x "$bin" ] || die "no $bin: build the CUDA flavor first (scripts/cuda-flavor.sh)"
  [ -x "$test_bin" ] || die "no $test_bin: build every target of the CUDA flavor (scripts/cuda-flavor.sh)"
  [ -f "$build_dir/tests/gpu/CTestTestfile.cmake" ] || die "no CTest file in $build_dir/tests/gpu"
  rm -rf "$prebuilt.tmp"
  mkdir -p "$prebuilt.tmp/trainer" "$prebuilt.tmp/tests/gpu" "$prebuilt.tmp/lib"
  cp "$bin" "$prebuilt.tmp/trainer/"
  cp "$test_bin" "$prebuilt.tmp/tests/gpu/"
  # The build folder's and the source tree's absolute paths become placeholders that `run` fills.
  sed -e "s|$build_dir|@PREBUILT@|g" -e "s|$root|@ROOT@|g" "$build_dir/tests/gpu/CTestTestfile.cmake" \
    >"$prebuilt.tmp/tests/gpu/CTestTestfile.cmake.in"
  # The libraries meshwork-train needs that neither libtorch's wheels nor a GPU machine bring.
  local lib path
  for lib in libyaml-cpp.so.0.7 libprometheus-cpp-core.so.1.0; do
    path="$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')"
    [ -n "$path" ] || die "$lib not found on this machine (scripts/setup.sh installs it)"
    cp -L "$path" "$prebuilt.tmp/lib/$lib"
  done
  {
    echo "# made by scripts/gpu-prebuilt.sh pack on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "torch $torch_version"
  } >"$prebuilt.tmp/MANIFEST"
  rm -rf "$prebuilt"
  mv "$prebuilt.tmp" "$prebuilt"
  log "$prebuilt: $(du -sh "$prebuilt" | cut -f1); carry it to the GPU machine and use 'run' there"
}

run() {
  (($#)) || die "usage: $0 run COMMAND [ARGS...]"
  [ -f "$prebuilt/MANIFEST" ] || die "no $prebuilt: run '$0 pack' on the CPU machine and carry the folder here"
  local info site version
  info="$("$python" - <<'EOF'
import importlib.util, os, re
spec = importlib.util.find_spec("torch")  # found, not imported: importing needs every NVIDIA library
if spec is None or not spec.submodule_search_locations:
    raise SystemExit("")
torch_dir = spec.submodule_search_locations[0]
try:
    with open(os.path.join(torch_dir, "version.py")) as f:
        m = re.search(r"^__version__\b[^=]*=\s*'([^']+)'", f.read(), re.M)
except OSError:
    m = None
print(os.path.dirname(torch_dir), m.group(1) if m else "unknown")
EOF
)" || true
  [ -n "$info" ] || die "$python has no torch: set PYTHON to the python3 that holds PyTorch"
  read -r site version <<<"$info"
  [ "${version%%+*}" = "$torch_version" ] ||
    die "torch $version at $site: the carried binaries were linked against torch $torch_version; build here with scripts/gpu-build.sh"
  local dir paths="$prebuilt/lib"
  for dir in "$site/torch/lib" "$site/nvidia/cu13/lib" "$site/nvidia/nccl/lib"; do
    [ -d "$dir" ] || die "no $dir: the machine's torch lacks its NVIDIA wheels"
    paths="$paths:$dir"
  done
  export LD_LIBRARY_PATH="$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  sed -e "s|@PREBUILT@|$prebuilt|g" -e "s|@ROOT@|$root|g" \
    "$prebuilt/tests/gpu/CTestTestfile.cmake.in" >"$prebuilt/tests/gpu/CTestTestfile.cmake"
  log "$(sed -n 2p "$prebuilt/MANIFEST"), against torch $version at $site"
  exec "$@"
}

case "${1:-}" in
  pack) pack ;;
  run) shift; run "$@" ;;
  *) die "usage: $0 pack | run COMMAND [ARGS...]" ;;
esac
