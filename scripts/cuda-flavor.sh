#!/usr/bin/env bash
# The CUDA flavor compiled and linked on a machine without a GPU, as CI does it (scripts/test.sh):
# fetches from PyPI the PyTorch wheel of the GPU machines (torch 2.11.0, CUDA 13) and the NVIDIA
# wheels whose headers and libraries the trainer compiles and links against, unpacks them into a
# cached prefix laid out like site-packages, configures build-cuda/ against it (control plane off)
# and builds what scripts/gpu-build.sh builds on a GPU machine: meshwork-train and every test
# executable, the gpu-labelled ones included (about 5 minutes on 2 cores without ccache). With
# MESHWORK_CUDA_UNIT=1 it then runs that build's unit tests here on the CPU, against libtorch 2.11
# (below); the gpu-labelled tests need a GPU (scripts/gpu-prebuilt.sh, scripts/gpu-build.sh).
#
#   MESHWORK_CUDA_BUILD_DIR  build folder (default: build-cuda)
#   MESHWORK_CUDA_CACHE      where the wheels are downloaded and unpacked (default: .meshwork/tools/cuda-flavor)
#   MESHWORK_CUDA_TARGET     what to build (default: all; e.g. meshwork-train)
#   MESHWORK_BUILD_TYPE      CMake build type (default: Release)
#   MESHWORK_JOBS            parallel compile jobs (default: nproc)
#   MESHWORK_CUDA_UNIT       1: then run the CUDA flavor's unit tests (ctest -L unit) here, on the
#                            CPU, against libtorch 2.11: downloads the rest of the NVIDIA libraries
#                            libtorch loads (about 1.4 GB of wheels, libraries only unpacked) so
#                            its executables start without a GPU. Catches what only libtorch 2.x
#                            does (it once crashed every checkpoint prune). Default 0
#                            (scripts/test.sh sets 1)
#   MESHWORK_CUDA_TESTS      0: configure without the tests (no GoogleTest needed; what the GPU
#                            trainer image builds). Default 1
#   MESHWORK_CUDA_KEEP_WHEELS 1: keep the downloaded wheels after unpacking them (default 0:
#                            removed, about 2 GB)
#   PYTHON                   the python3 whose pip downloads the wheels (default: python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MESHWORK_CUDA_BUILD_DIR:-$root/build-cuda}"
cache="${MESHWORK_CUDA_CACHE:-$root/.meshwork/tools/cuda-flavor}"
target="${MESHWORK_CUDA_TARGET:-all}"
build_type="${MESHWORK_BUILD_TYPE:-Release}"
jobs="${MESHWORK_JOBS:-$(nproc)}"
python="${PYTHON:-python3}"
case "${MESHWORK_CUDA_TESTS:-1}" in
  1) tests=ON ;;
  0) tests=OFF ;;
  *) echo "[cuda-flavor] error: MESHWORK_CUDA_TESTS='$MESHWORK_CUDA_TESTS': must be 0 or 1" >&2; exit 2 ;;
esac
if [ "$tests" = OFF ] && [ "${MESHWORK_CUDA_UNIT:-0}" = 1 ]; then
  echo "[cuda-flavor] error: MESHWORK_CUDA_UNIT=1 runs the unit tests, which MESHWORK_CUDA_TESTS=0 leaves out" >&2
  exit 2
fi

# The GPU machines' PyTorch and, of the NVIDIA wheels its METADATA requires, those whose files the
# trainer compiles or links against: the CUDA runtime (cuda-toolkit[cudart]==13.0.2 pins
# nvidia-cuda-runtime 13.0.96), its crt/ headers (nvidia-cuda-crt, which cuda_runtime_api.h includes
# and torch does not require), CCCL (nvidia-cuda-cccl: cuda_fp16.h, included by nccl.h, includes
# its <nv/target>) and NCCL; and nvcc of the same CUDA release (nvidia-cuda-nvcc, with
# nvidia-nvvm's cicc and libdevice), which compiles the trainer's own kernels
# (trainer/model/fused_kernels.cu): both unpack into the runtime's nvidia/cu13, where
# cmake/cuda.cmake looks for bin/nvcc. The others (cuBLAS, cuDNN, cuFFT, cuSPARSE, cuSPARSELt, cuRAND,
# cuFile, CUPTI, NVSHMEM: large wheels) are libtorch's own run-time dependencies, which nothing
# here includes or calls: see the linker flag below.
wheels=(
  torch==2.11.0
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-nccl-cu13==2.28.9
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
)

log() { echo "[cuda-flavor] $*"; }
die() { echo "[cuda-flavor] error: $*" >&2; exit 1; }

# unzip and pip are not among setup.sh's packages: install them the same way if missing.
missing=()
command -v unzip >/dev/null || missing+=(unzip)
"$python" -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || die "$tool not found: run scripts/setup.sh first"
done

# --- download and unpack: pinned wheels for CPython 3.11 on x86-64 Linux, whatever python runs
# pip (the C++ files in them are the same for every CPython version), unpacked into site/torch and
# site/nvidia as pip would lay them out in site-packages, so that libtorch's RPATH
# ($ORIGIN/../../nvidia/cu13/lib, .../nvidia/nccl/lib) finds them at link time. The torch wheel is
# unpacked whole (its Python packages torch, torchgen and functorch too, about 100 MB more than
# libtorch): the PyTorch peer runs on it (bench/peers/check_cpu_flavor.sh). A stamp names the
# wheels unpacked: when it matches (and the Python package is there), nothing is downloaded. The
# wheels are removed once unpacked unless MESHWORK_CUDA_KEEP_WHEELS=1.
site="$cache/site"
stamp="$site/.unpacked"
# fetch SPEC...: pip downloads the wheels into $cache/wheels (skipping files already there); prints
# each one's path, in order.
fetch() {
  mkdir -p "$cache/wheels"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$cache/wheels" \
    --implementation cp --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_25_x86_64 \
    --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "$@" >&2 || die "pip could not download $* (is PyPI reachable?)"
  local spec name version match
  for spec in "$@"; do
    name="${spec%%==*}"; version="${spec##*==}"
    match=("$cache"/wheels/"${name//-/_}-${version}"-*.whl)
    [ -f "${match[0]}" ] || die "no wheel for $spec in $cache/wheels after pip download"
    echo "${match[0]}"
  done
}
drop_wheels() {
  [ "${MESHWORK_CUDA_KEEP_WHEELS:-0}" = 1 ] || rm -rf "$cache/wheels"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${wheels[*]}" ] || [ ! -f "$site/torch/__init__.py" ]; then
  log "downloading ${wheels[*]} into $cache/wheels"
  mapfile -t files < <(fetch "${wheels[@]}")
  ((${#files[@]} == ${#wheels[@]})) || die "pip did not download ${wheels[*]}"
  du -ch "${files[@]}" | tail -1 | sed 's/^/[cuda-flavor] wheels: /'
  log "unpacking into $site"
  rm -rf "$site"
  mkdir -p "$site"
  for f in "${files[@]}"; do
    case "$(basename "$f")" in
      torch-*) unzip -q -o "$f" -d "$site" ;;
      *) unzip -q -o "$f" 'nvidia/*' -d "$site" ;;
    esac
  done
  echo "${wheels[*]}" >"$stamp"
  drop_wheels
fi
[ -f "$site/torch/share/cmake/Torch/TorchConfig.cmake" ] || die "no TorchConfig.cmake under $site/torch"

# --- configure and build --------------------------------------------------------------------
# -Wl,--allow-shlib-undefined: linking against libtorch_cuda.so makes ld follow its DT_NEEDED
#   libraries (cuBLAS, cuDNN, ...) to check that its own undefined symbols resolve. Those wheels
#   are not downloaded (see above), so that check is off for the executables here; it skips only
#   symbols undefined inside shared libraries: every symbol our own code uses (libtorch, libcudart,
#   libnccl) must still resolve. On a GPU machine (scripts/gpu-build.sh) the check stays on.
# TORCH_LIBRARY: TorchConfig would otherwise report Debian's libtorch.so, which it finds first
#   (cmake/torch.cmake makes sure the libraries linked are the wheel's).
# PRE_TEST: gtest_discover_tests lists a test executable's cases when ctest runs, not right after
#   the link, since these executables cannot start here (no cuBLAS, cuDNN, ..., no driver).
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build_dir/build.ninja" ]; then
  log "configuring $build_dir ($build_type) against $site/torch"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${launcher[@]}" \
    -DCMAKE_PREFIX_PATH="$site/torch/share/cmake" -DTORCH_LIBRARY="$site/torch/lib/libtorch.so" \
    -DMESHWORK_WITH_CUDA=ON -DMESHWORK_BUILD_CONTROLPLANE=OFF -DMESHWORK_BUILD_TESTS="$tests" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--allow-shlib-undefined" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST
elif ! grep -qx "MESHWORK_BUILD_TESTS:BOOL=$tests" "$build_dir/CMakeCache.txt"; then
  # A folder configured with the other MESHWORK_CUDA_TESTS: switch it, or a unit run would find
  # no tests at all.
  log "reconfiguring $build_dir with MESHWORK_BUILD_TESTS=$tests"
  cmake -S "$root" -B "$build_dir" -DMESHWORK_BUILD_TESTS="$tests" >/dev/null
fi
log "building $target with $jobs jobs"
start=$SECONDS
cmake --build "$build_dir" --target "$target" -j "$jobs"
log "built $target in $((SECONDS - start)) s: $build_dir/trainer/meshwork-train"

[ "${MESHWORK_CUDA_UNIT:-0}" = 1 ] || exit 0

# --- the unit tests on the CPU, against libtorch 2.11 ----------------------------------------
# libtorch_cuda.so and libtorch_cpu.so need these at load time even when no GPU is used; the
# versions are those torch 2.11.0's METADATA pins (cuda-toolkit 13.0.2, cuDNN, cuSPARSELt,
# NVSHMEM). Only their lib/ folders are unpacked (cuDNN: only its loader, libcudnn.so.9, which
# opens its engines when first used: never, here).
runtime_wheels=(
  nvidia-cublas==13.1.0.3 nvidia-cuda-cupti==13.0.85 nvidia-cufft==12.0.0.61
  nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 nvidia-cusparse==12.6.3.3
  nvidia-nvjitlink==13.0.88 nvidia-cudnn-cu13==9.19.0.56 nvidia-cusparselt-cu13==0.8.0
  nvidia-nvshmem-cu13==3.4.5
)
runtime="$cache/runtime"
runtime_stamp="$runtime/.unpacked"
if [ ! -f "$runtime_stamp" ] || [ "$(cat "$runtime_stamp")" != "${runtime_wheels[*]}" ]; then
  log "downloading the NVIDIA libraries libtorch loads: ${runtime_wheels[*]}"
  mapfile -t files < <(fetch "${runtime_wheels[@]}")
  ((${#files[@]} == ${#runtime_wheels[@]})) || die "pip did not download ${runtime_wheels[*]}"
  log "unpacking their libraries into $runtime"
  rm -rf "$runtime"
  mkdir -p "$runtime"
  for f in "${files[@]}"; do
    case "$(basename "$f")" in
      nvidia_cudnn_cu13-*) unzip -q -o "$f" 'nvidia/cudnn/lib/libcudnn.so.*' -d "$runtime" ;;
      *) unzip -q -o "$f" 'nvidia/*/lib/*' -d "$runtime" ;;
    esac
  done
  echo "${runtime_wheels[*]}" >"$runtime_stamp"
  drop_wheels
fi
# The pure-Python packages that importing torch and building its optimizers import, for the
# PyTorch peer (the ctest llama_peer_same_losses, bench/peers/check_cpu_flavor.sh), in versions
# torch 2.11's METADATA accepts: Debian 12's are too old (typing_extensions 4.4 has no TypeIs,
# sympy 1.11 no equal_valued). Unpacked into python/, which that test puts ahead of site/.
python_wheels=(typing_extensions==4.16.0 sympy==1.14.0 mpmath==1.3.0)
python_dir="$cache/python"
python_stamp="$python_dir/.unpacked"
if [ ! -f "$python_stamp" ] || [ "$(cat "$python_stamp")" != "${python_wheels[*]}" ]; then
  log "downloading the pure-Python packages torch imports: ${python_wheels[*]}"
  mapfile -t files < <(fetch "${python_wheels[@]}")
  ((${#files[@]} == ${#python_wheels[@]})) || die "pip did not download ${python_wheels[*]}"
  rm -rf "$python_dir"
  mkdir -p "$python_dir"
  for f in "${files[@]}"; do unzip -q -o "$f" -d "$python_dir"; done
  echo "${python_wheels[*]}" >"$python_stamp"
  drop_wheels
fi

lib_path="$site/torch/lib:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib"
for dir in "$runtime"/nvidia/*/lib; do lib_path="$lib_path:$dir"; done
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing="$(ldd "$build_dir/trainer/meshwork-train" | grep 'not found' || true)"
[ -z "$missing" ] || die "libraries still missing for meshwork-train: $missing"
log "the CUDA flavor's unit tests on the CPU (libtorch $("$build_dir/trainer/meshwork-train" devices | sed -n 's/^libtorch //p'))"
ctest --test-dir "$build_dir" -L unit --no-tests=error --output-on-failure -j "$jobs"
